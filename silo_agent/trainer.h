// What trains a silo's model: the agent hands a trainer the round's global model and task and
// gets back the locally trained model, the sample count and metrics. The agent forms the
// delta, clips, encodes, masks and uploads it, whatever trained it.
//
//   BuiltinTrainer   logistic regression or an MLP on the silo's CSV data, alone or with local
//                    workers (silo_agent/builtin_trainer.h)
//   ExternalTrainer  the hospital's own training script (PyTorch first) through the Python SDK
//                    (silo_agent/external_trainer.h, docs/trainer-protocol.md)
//
// Simulation tools (attacks, the synthetic trainer of benchmarks) implement the same
// interface outside the agent (tools/sim_agent.*).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "common/model.h"
#include "proto/xsilo.pb.h"

namespace xsilo::agent {

struct TrainTask {
  std::uint64_t round = 0;
  std::string silo;            // this silo's certificate name
  wire::TrainingPlan plan;     // the server's training block (plan.extra_json: every key as given)
};

// The DP-SGD a trainer ran this round (record-level privacy, docs/privacy.md): what Opacus's
// PrivacyEngine holds. The agent's own accountant turns it into epsilon.
struct DpSgdReport {
  double sample_rate = 0;       // Poisson sampling rate q
  double noise_multiplier = 0;  // sigma
  std::uint64_t steps = 0;
  double clip_norm = 0;
};

struct TrainResult {
  std::uint64_t num_samples = 0;
  wire::TrainMetrics metrics;  // train_loss, train_seconds
  std::optional<DpSgdReport> dp;  // set by a trainer that ran DP-SGD
  wire::PrivacySpend privacy;     // set by the agent's budget (silo_agent/privacy_budget.h)
};

// A round the trainer could not do: the silo is a dropout for it. `fatal`: the agent cannot go
// on (the trainer failed too many rounds in a row). `what()` is for the silo's own log (it may
// quote the trainer's output); the server gets only `reason()` and its fixed text
// (protocol/failure.h).
class TrainerError : public std::runtime_error {
 public:
  explicit TrainerError(const std::string& what, bool fatal = false, wire::FailureReason reason = wire::AGENT_INTERNAL)
      : std::runtime_error(what), fatal_(fatal), reason_(reason) {}
  TrainerError(wire::FailureReason reason, const std::string& what, bool fatal = false)
      : TrainerError(what, fatal, reason) {}
  bool fatal() const { return fatal_; }
  wire::FailureReason reason() const { return reason_; }

 private:
  bool fatal_;
  wire::FailureReason reason_;
};

// A delta made piece by piece, never held whole: the synthetic trainer of benchmarks, so that
// a silo of a model of billions of parameters holds no copy of it (see Trainer::streams()).
class DeltaStream {
 public:
  virtual ~DeltaStream() = default;
  // Writes delta elements [first, first + out.size()) of the flat model; the same values on
  // every call.
  virtual void fill(std::size_t first, std::span<float> out) const = 0;
};

struct StreamedTraining {
  std::shared_ptr<const DeltaStream> delta;
  TrainResult result;
};

class Trainer {
 public:
  virtual ~Trainer() = default;
  // Evaluates `model` on the silo's test data: the eval_* fields (eval_samples 0: no test data).
  virtual wire::TrainMetrics evaluate(const Model& model, const TrainTask& task) = 0;
  // Trains from `global`; on return `local` (same layout) holds the model after local training.
  // Throws TrainerError.
  virtual TrainResult train(const Model& global, const TrainTask& task, Model& local) = 0;
  // A trainer that needs neither the global model nor a local copy (its delta depends on the
  // task only) says so: in plain rounds (no secure aggregation, compression or silo momentum)
  // the agent then hashes the model as it arrives, keeps none of it, calls train_streamed()
  // instead of evaluate() and train(), and uploads the delta as it is made.
  virtual bool streams() const { return false; }
  // The round's delta for a model of `elements` floats. Throws TrainerError.
  virtual StreamedTraining train_streamed(const TrainTask& /*task*/, std::size_t /*elements*/) {
    throw TrainerError("this trainer cannot stream its update");
  }
  // From any thread: the agent is stopping; work in progress may end early with an error.
  virtual void cancel() {}
};

}  // namespace xsilo::agent
