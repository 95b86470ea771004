// The agent's side of the trainer protocol (docs/trainer-protocol.md) without I/O: the framing
// of control messages (a 4-byte big-endian length, then a JSON object of at most 1 MiB) and the
// checks of what a trainer says. ExternalTrainer feeds it the bytes it reads from the socket;
// the fuzz target `trainer` feeds it anything. Nothing here throws on what a trainer sends: a
// bad message is an error string, which the agent turns into a failed round.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "proto/xsilo.pb.h"
#include "silo_agent/trainer.h"

namespace xsilo::agent::trainer_protocol {

inline constexpr int kVersion = 1;
inline constexpr std::size_t kMaxMessage = std::size_t{1} << 20;
inline constexpr int kMaxDepth = 64;  // nesting of a message's JSON

// One message framed for the socket.
std::string frame(const nlohmann::json& message);

// Reassembles messages from bytes as they arrive, cut anywhere.
class Reader {
 public:
  void feed(std::string_view bytes) { in_.append(bytes); }
  // The next complete message; nullopt while it is incomplete. A message over the limit, not
  // JSON, nested deeper than kMaxDepth or not an object sets `error` (and the reader stays
  // failed: the stream has lost its framing).
  std::optional<nlohmann::json> next(std::string& error);
  std::size_t buffered() const { return in_.size(); }

 private:
  std::string in_;
  std::string failed_;
};

// A hello: success when it is one and speaks our protocol, else why not (naming the trainer's
// protocol and SDK). `protocol` gets the version it claims (0 if none), either way.
Status check_hello(const nlohmann::json& hello, std::int64_t& protocol);

// An answer to task `id`: success for its result; else the trainer's own error message, or what
// is wrong with the answer.
Status check_result(const nlohmann::json& answer, std::uint64_t id);

// What a train result names. The weights must be a file directly in `exchange` whose name does
// not start with a dot. `num_samples` is 0 when absent or not a non-negative integer: the
// caller refuses that once it has checked the weights.
struct TrainAnswer {
  std::filesystem::path weights;
  std::uint64_t num_samples = 0;
  double loss = 0;
  nlohmann::json metrics = nlohmann::json::object();  // the trainer's own metrics, for the log
  // "privacy": the DP-SGD this round ran (docs/privacy.md): sample rate, noise multiplier, steps
  // and clip norm, as the SDK reads them off Opacus's PrivacyEngine.
  std::optional<DpSgdReport> dp;
};
// Success with `out` filled, or why the result is refused; `out.weights` is set as soon as it is
// read, so that a caller can remove a file of the exchange folder a refused result named.
Status parse_train_answer(const nlohmann::json& result, const std::filesystem::path& exchange, TrainAnswer& out);

// An evaluate result's metrics (missing or non-finite values are 0).
wire::TrainMetrics parse_eval_metrics(const nlohmann::json& result);

}  // namespace xsilo::agent::trainer_protocol
