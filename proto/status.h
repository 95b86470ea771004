// Protocol errors are values: a peer's bad message becomes a Status that is logged and
// answered with an Error message, never an exception that could take a daemon down.
#pragma once

#include <string>
#include <utility>

#include "common/result.h"
#include "proto/xsilo.pb.h"

namespace xsilo::proto {

// Why a step of the protocol failed: the error code the wire carries and a sentence a user can
// act on (what an Error message answers with).
class Error {
 public:
  Error(wire::ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  wire::ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  wire::ErrorCode code_;
  std::string message_;
};

inline Error error(wire::ErrorCode code, std::string message) { return Error(code, std::move(message)); }

// The tree's one result type (common/result.h) with a wire error code beside the sentence:
// success or the Error of a step with nothing to return, and a value or its Error.
using Status = xsilo::Result<void, Error>;
template <class T>
using Result = xsilo::Result<T, Error>;

}  // namespace xsilo::proto
