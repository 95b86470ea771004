// A silo's round, from the trainer's output to what goes on the wire: weight * (local - global),
// the weight being the sample count capped at the plan's max_weight, checked finite.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/model.h"
#include "proto/xsilo.pb.h"
#include "silo_agent/trainer.h"

namespace xsilo::agent {

struct RoundOutput {
  std::shared_ptr<Model> update;   // weight * delta; null after an evaluate-only round
  std::uint64_t num_samples = 0;
  double weight = 0;
  std::string sha256;              // of the update bytes as sent (compressed: as the server decodes them)
  wire::TrainMetrics metrics;
  wire::PrivacySpend privacy;      // record-level privacy: this round's spend (mechanism empty: none)
  // A compressed plain upload: its encoded chunks (`update` holds what they decode to).
  std::shared_ptr<const std::vector<wire::TensorChunk>> encoded;
  std::uint64_t encoded_bytes = 0;
  // Secure RANDOM_K: the coordinates of `update` that are masked and sent.
  std::shared_ptr<const std::vector<std::uint64_t>> kept;
  // Error feedback: the residual once this upload has left (it becomes the silo's only then),
  // and its SHA-256 (the upload's line of sent.jsonl names it: silo_state.h).
  std::shared_ptr<Model> residual_next;
  std::string residual_sha256;
  // A streamed round (Trainer::streams()): the upload is weight * what `stream` makes, laid
  // out as `layout`; `update` is null.
  std::shared_ptr<const DeltaStream> stream;
  std::vector<TensorInfo> layout;
  // The bytes of the update as the silo holds it (before compression or masking).
  std::uint64_t bytes() const;
};

// The upload for `local` trained from `global` (`reuse`, when given and not shared, becomes the
// update buffer). Throws TrainerError when the trained model has NaN or infinite values or no
// samples.
RoundOutput form_update(const Model& global, const Model& local, const TrainResult& r, const wire::TrainingPlan& plan,
                        std::shared_ptr<Model> reuse = nullptr);

// A streamed round's output: weight as form_update() sets it, and the SHA-256 of the upload,
// made chunk by chunk of `chunk_elems` elements (the delta is made again when it is sent).
// Throws TrainerError when the delta has NaN or infinite values or there are no samples.
RoundOutput form_streamed_update(StreamedTraining t, std::vector<TensorInfo> layout, const wire::TrainingPlan& plan,
                                 std::size_t chunk_elems);

// The upload of a streamed round, element `first` on: weight * delta.
void fill_streamed_update(const RoundOutput& out, std::size_t first, std::span<float> values);

// Silo momentum (Karimireddy, He, Jaggi, ICML 2021, "Learning from history"): with delta =
// update / weight, m <- beta m + (1 - beta) delta, and the update becomes weight * m. `momentum`
// is the silo's state across rounds; a layout it does not match is reset to zeros first.
void apply_momentum(Model& update, double weight, Model& momentum, double beta);

// One silo's round with its trainer: evaluate the global model, train, form the update (its
// sha256 is left to the caller, who may still change the update).
RoundOutput run_round(Trainer& trainer, const Model& global, const TrainTask& task,
                      std::shared_ptr<Model> reuse = nullptr);

}  // namespace xsilo::agent
