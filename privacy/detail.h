// Shared by the accountant's files only: +infinity and the one way they refuse a parameter.
#pragma once

#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

namespace xsilo::privacy::detail {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// Throws std::invalid_argument "privacy: WHAT, got VALUE".
[[noreturn]] inline void fail(const std::string& what, double got) {
  std::ostringstream s;
  s << "privacy: " << what << ", got " << got;
  throw std::invalid_argument(s.str());
}

}  // namespace xsilo::privacy::detail
