// Protocol errors are values: a peer's bad message becomes a Status that is logged and
// answered with an Error message, never an exception that could take a daemon down.
#pragma once

#include <string>
#include <utility>

#include "common/result.h"
#include "proto/xsilo.pb.h"

namespace xsilo::proto {

struct [[nodiscard]] Status {
  wire::ErrorCode code = wire::ERROR_UNSPECIFIED;
  std::string message;

  static Status ok() { return {}; }
  bool is_ok() const { return code == wire::ERROR_UNSPECIFIED && message.empty(); }
  explicit operator bool() const { return is_ok(); }
};

inline Status error(wire::ErrorCode code, std::string message) {
  return Status{code, std::move(message)};
}

// A value or the Status that explains why there is none: the tree's one result type
// (common/result.h) with a wire error code beside the sentence. ok()/status() of the old
// proto::Result are has_value()/error() here, as in std::expected.
template <class T>
using Result = xsilo::Result<T, Status>;

}  // namespace xsilo::proto
