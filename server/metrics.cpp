#include "server/metrics.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace xsilo::server {

std::string metrics_header() {
  return "round,committed,selected,reported,dropped,train_loss,fed_eval_loss,fed_eval_accuracy,"
         "seconds,upload_bytes,edges\n";
}

std::string to_csv(const MetricsRow& r) {
  char line[512];
  std::snprintf(line, sizeof line, "%llu,%d,%zu,%zu,%zu,%.6f,%.6f,%.6f,%.3f,%llu,%zu\n",
                static_cast<unsigned long long>(r.round), r.committed ? 1 : 0, r.selected, r.reported, r.dropped,
                r.train_loss, r.fed_eval_loss, r.fed_eval_accuracy, r.seconds,
                static_cast<unsigned long long>(r.upload_bytes), r.edges);
  return line;
}

std::vector<MetricsRow> read_metrics(const std::filesystem::path& path) {
  std::vector<MetricsRow> rows;
  std::ifstream in(path, std::ios::binary);
  if (!in) return rows;
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  std::size_t at = 0, line_no = 0;
  while (true) {
    const auto nl = text.find('\n', at);
    if (nl == std::string::npos) break;  // nothing, or a row still being written
    const std::string line = text.substr(at, nl - at);
    at = nl + 1;
    if (++line_no == 1) continue;  // header
    MetricsRow r;
    unsigned long long round = 0, bytes = 0;
    int committed = 0;
    if (std::sscanf(line.c_str(), "%llu,%d,%zu,%zu,%zu,%lf,%lf,%lf,%lf,%llu,%zu", &round, &committed, &r.selected,
                    &r.reported, &r.dropped, &r.train_loss, &r.fed_eval_loss, &r.fed_eval_accuracy, &r.seconds,
                    &bytes, &r.edges) != 11) {
      throw std::runtime_error(path.string() + ":" + std::to_string(line_no) + ": not a metrics row: " + line);
    }
    r.round = round;
    r.upload_bytes = bytes;
    r.committed = committed != 0;
    rows.push_back(r);
  }
  return rows;
}

}  // namespace xsilo::server
