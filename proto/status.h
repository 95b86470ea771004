// Protocol errors are values: a peer's bad message becomes a Status that is logged and
// answered with an Error message, never an exception that could take a daemon down.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "proto/xsilo.pb.h"

namespace xsilo::proto {

struct Status {
  wire::ErrorCode code = wire::ERROR_UNSPECIFIED;
  std::string message;

  static Status ok() { return {}; }
  bool is_ok() const { return code == wire::ERROR_UNSPECIFIED && message.empty(); }
  explicit operator bool() const { return is_ok(); }
};

inline Status error(wire::ErrorCode code, std::string message) {
  return Status{code, std::move(message)};
}

// A value or the Status that explains why there is none.
template <class T>
class Result {
 public:
  Result() : v_(Status{wire::INTERNAL, "no result"}) {}
  Result(T value) : v_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}   // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() { return std::get<0>(v_); }
  const T& value() const { return std::get<0>(v_); }
  T& operator*() { return value(); }
  T* operator->() { return &value(); }
  const Status& status() const { return std::get<1>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace xsilo::proto
