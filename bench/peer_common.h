// Shared by the peer programs of `xsilo bench allreduce`: the sizes to time, how many
// iterations each gets, and the one result line rank 0 prints per size.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace xsilo_bench {

// argv[first..]: sizes in bytes.
inline std::vector<std::size_t> sizes_from(int argc, char** argv, int first) {
  std::vector<std::size_t> out;
  for (int i = first; i < argc; ++i) out.push_back(std::strtoull(argv[i], nullptr, 10));
  return out;
}

// Enough iterations to time a size well without making the big ones take minutes.
inline int iterations_for(std::size_t bytes) {
  const std::size_t budget = std::size_t{512} << 20;  // bytes reduced per size
  const std::size_t n = budget / (bytes ? bytes : 1);
  return static_cast<int>(n < 3 ? 3 : (n > 1000 ? 1000 : n));
}

inline void print_result(std::size_t bytes, double seconds_per_iteration) {
  std::printf("RESULT %zu %.9f\n", bytes, seconds_per_iteration);
  std::fflush(stdout);
}

inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace xsilo_bench
