// What the session's parts share: the fault hook a simulation reaches in through, and the
// results its worker jobs return (silo_agent/session.h composes the parts).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>

#include "crypto/fixed_point.h"
#include "proto/xsilo.pb.h"
#include "protocol/masked.h"
#include "silo_agent/trainer.h"
#include "silo_agent/update.h"

namespace xsilo::agent {

// Where simulations reach into a silo: crashes at a protocol step and Byzantine updates. The
// production agent runs the defaults, which do nothing.
enum class SecureStep { KeysSent, SharesSent };
class FaultHook {
 public:
  virtual ~FaultHook() = default;
  // The session has just queued the message of `step`; true: this process is about to die, and
  // the session ignores everything from now on.
  virtual bool after_sent(SecureStep, std::uint64_t /*round*/) { return false; }
  // The update about to be uploaded (weight * delta, trained from `global`), after the agent's
  // own checks; a simulated Byzantine silo changes it here. Runs on the worker thread.
  virtual void tamper(const TrainTask& /*task*/, const Model& /*global*/, std::span<float> /*update*/,
                      double /*weight*/) {}
  // Whether tamper() changes updates: a tampered update needs the model in memory, so the
  // session does not stream (Trainer::streams()) for such a hook.
  virtual bool tampers() const { return false; }
  // Every message the session sends, before it leaves; `secure_session` is the secure group's
  // session string ("" outside secure aggregation). A simulated hostile silo rewrites its
  // protocol messages here.
  virtual void outgoing(wire::Envelope& /*e*/, const std::string& /*secure_session*/) {}
  // A secure round's fixed-point encoding of the update, about to run (worker thread): a
  // simulated Byzantine silo that skips its clipping widens `codec` here; and the encoded words,
  // before the masks: one that lies in its unclipped count (adaptive clipping) rewrites them.
  virtual void encoding(crypto::FixedPointParams& /*codec*/) {}
  virtual void encoded(protocol::MaskedVector& /*words*/, const crypto::FixedPointParams& /*codec*/) {}
};

struct TrainDone {
  std::optional<RoundOutput> out;
  std::string error;  // for the silo's log only
  wire::FailureReason failure = wire::FAILURE_UNSPECIFIED;  // what the server is told
  bool fatal = false;  // the trainer cannot go on: the agent exits
};
struct MaskDone {
  std::shared_ptr<protocol::MaskedVector> words;
  std::string sha256;
  std::string error;
  // The fixed-point codec's clipping: the delta's norm, and the setup's clip norm when the delta
  // was above it and scaled down to it (0: not clipped). The silo's own log says so.
  double norm = 0;
  double clipped_to = 0;
};
using SessionJobResult = std::variant<TrainDone, MaskDone>;

}  // namespace xsilo::agent
