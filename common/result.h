// One result type for the whole tree: a value, or the error that explains why there is none;
// close to C++23's std::expected (GCC 12 in C++20 has no <expected>), and [[nodiscard]], so a
// failure cannot be dropped silently. Header-only and free of every other header of ours, so
// that crypto/ and robust/ may use it too (docs/architecture.md, layer rule 2).
//
//   Result<Outbox> share(...);          // return value;  or  return Error("why");
//   Status settle(...);                 // return {};     or  return Error("why");
//
//   auto out = client.share(u1);
//   if (!out) return Error("key list: " + out.error().message());
//   send(*out);
//
// The error type is a parameter (proto::Status and proto::Result carry a proto::Error: a wire
// error code with its sentence); it defaults to Error, a sentence a user can act on. value() and
// error() on the wrong side throw std::logic_error: a bug in the caller, never a protocol outcome.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace xsilo {

// Why an operation failed: one sentence for logs, the audit record or the peer. Never a secret.
class Error {
 public:
  explicit Error(std::string message) : message_(std::move(message)) {}
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

template <class T, class E = Error>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::remove_cv_t<T>, E>, "a Result's value and error types must differ");

 public:
  using value_type = T;
  using error_type = E;

  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit, like std::expected
  Result(E error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT

  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  T& value() & { return check(), std::get<0>(v_); }
  const T& value() const& { return check(), std::get<0>(v_); }
  T&& value() && { return check(), std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const E& error() const& {
    if (has_value()) throw std::logic_error("Result::error() on a value");
    return std::get<1>(v_);
  }
  E& error() & {
    if (has_value()) throw std::logic_error("Result::error() on a value");
    return std::get<1>(v_);
  }

 private:
  void check() const {
    if (!has_value()) throw std::logic_error("Result::value() on an error");
  }

  std::variant<T, E> v_;
};

// Success without a value, or the error: what "" meant in the string-returning methods.
template <class E>
class [[nodiscard]] Result<void, E> {
 public:
  using value_type = void;
  using error_type = E;

  Result() = default;  // success
  Result(E error) : error_(std::move(error)) {}  // NOLINT: implicit, like std::expected

  bool has_value() const { return !error_.has_value(); }
  explicit operator bool() const { return has_value(); }
  void value() const {
    if (error_) throw std::logic_error("Result::value() on an error");
  }
  const E& error() const {
    if (!error_) throw std::logic_error("Result::error() on a success");
    return *error_;
  }

 private:
  std::optional<E> error_;
};

using Status = Result<void>;

}  // namespace xsilo
