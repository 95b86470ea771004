#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>

#include "tools/bench.h"

namespace xsilo::tools {

std::string fmt(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

void print_table(const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> w(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) {
    w[c] = header[c].size();
    for (const auto& r : rows) w[c] = std::max(w[c], c < r.size() ? r[c].size() : 0);
  }
  auto line = [&](const std::vector<std::string>& r) {
    std::cout << "|";
    for (std::size_t c = 0; c < w.size(); ++c) {
      const std::string cell = c < r.size() ? r[c] : "";
      std::cout << " " << cell << std::string(w[c] - cell.size(), ' ') << " |";
    }
    std::cout << "\n";
  };
  line(header);
  std::cout << "|";
  for (auto x : w) std::cout << std::string(x + 2, '-') << "|";
  std::cout << "\n";
  for (const auto& r : rows) line(r);
  std::cout.flush();
}

double openssl_speed(const std::string& evp, const std::string& label) {
  const std::string cmd = "openssl speed -evp " + evp + " -bytes 16384 -seconds 2 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return 0;
  char line[512];
  double rate = 0;
  while (std::fgets(line, sizeof line, p)) {
    double k = 0;
    char name[64];
    if (std::sscanf(line, "%63s %lfk", name, &k) == 2 && std::string(name).find(label) != std::string::npos) {
      rate = k * 1000.0;
    }
  }
  ::pclose(p);
  return rate;
}

}  // namespace xsilo::tools
