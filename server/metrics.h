// One row of the server's metrics.csv per round: its writer and its reader, so that whoever
// reads the file (xsilo sim, tests, an operator's script) reads it the way it was written.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace xsilo::server {

struct MetricsRow {
  std::uint64_t round = 0;
  bool committed = false;
  std::size_t selected = 0, reported = 0, dropped = 0;
  double train_loss = 0, fed_eval_loss = 0, fed_eval_accuracy = 0;
  double seconds = 0;
  std::uint64_t upload_bytes = 0;
  std::size_t edges = 0;  // edges that carried at least one participant
};

// The header line and one row, each ending in a newline.
std::string metrics_header();
std::string to_csv(const MetricsRow& row);
// The rows of a metrics file; a last line still being written (no newline yet) is left out.
// Throws std::runtime_error naming the file and line for a line it cannot read.
std::vector<MetricsRow> read_metrics(const std::filesystem::path& path);

}  // namespace xsilo::server
