#include "silo_agent/training_job.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "common/finite.h"
#include "common/safetensors.h"
#include "crypto/hash.h"
#include "protocol/compression.h"
#include "silo_agent/silo_state.h"
#include "silo_agent/update.h"

namespace xsilo::agent {

namespace {

// The model received against the SHA-256 its RoundStart announced.
void check_model_sha(const std::string& announced, const std::string& received) {
  if (received != announced) throw TrainerError(wire::MODEL_MISMATCH, "the model received does not match the SHA-256 the round announced");
}

// A silo's state across rounds (momentum, error feedback): loaded from `file` on first use, zeros
// when missing, unreadable or of another layout than `like`.
Model& silo_state(std::optional<Model>& state, const std::filesystem::path& file, const Model& like, const char* what) {
  if (!state && !file.empty() && std::filesystem::exists(file)) {
    try {
      state = load_safetensors(file);
    } catch (const std::exception& e) {
      spdlog::warn("{} {} unreadable ({}); starting from zeros", what, file.string(), e.what());
    }
  }
  if (state && !all_finite(state->flat())) {
    spdlog::warn("{} {} has NaN or infinite values; starting from zeros", what, file.string());
    state.reset();
  }
  if (!state || !state->same_layout(like)) state = like.zeros_like();
  return *state;
}

// The upload becomes weight * momentum; the momentum is kept (durably, when there is a file) so
// that a restarted agent goes on from it.
void with_momentum(RoundOutput& out, std::optional<Model>& state, const std::filesystem::path& file,
                   const wire::TrainingPlan& plan) {
  Model& momentum = silo_state(state, file, *out.update, "momentum");
  apply_momentum(*out.update, out.weight, momentum, plan.silo_momentum());
  if (!file.empty()) save_safetensors(file, momentum, {{"xsilo.silo_momentum", std::to_string(plan.silo_momentum())}});
}

// Compresses the upload (docs/compression.md). With error feedback the residual after this
// upload is computed aside: it replaces the silo's (and its file) only when the upload leaves, so
// an update that never left takes nothing from the residual.
// `seed`: the silo's own randomness for the encoding (unbiased rounding, random-k's coordinates).
void with_compression(RoundOutput& out, const wire::Compression& c, bool secure, std::optional<Model>& state,
                      const std::filesystem::path& file, std::size_t chunk_bytes, std::uint64_t seed) {
  std::span<float> rs;
  // A non-finite update (only a silo that skips its own checks sends one) never enters the
  // error feedback: it goes out as it is, and the receiver refuses it.
  const auto u = out.update->flat();
  const bool finite = all_finite(u);
  if (c.error_feedback() && finite) {
    out.residual_next = std::make_shared<Model>(silo_state(state, file, *out.update, "error feedback"));
    rs = out.residual_next->flat();
  }
  if (secure) {
    out.kept = std::make_shared<const std::vector<std::uint64_t>>(
        protocol::keep_shared_random_k(c, out.update->flat(), rs, out.update->tensors()));
  } else {
    auto enc = protocol::compress_update(c, out.update->flat(), rs, out.update->tensors(), chunk_bytes / sizeof(float),
                                         seed);
    out.encoded_bytes = enc.bytes;
    out.encoded = std::make_shared<const std::vector<wire::TensorChunk>>(std::move(enc.chunks));
  }
}

// A round's training job: nothing when the round moved on before it started (on_job_done
// drops it); a TrainerError keeps whether the trainer can go on; any other failure is the
// round's error.
template <class Train>
TrainDone training_job(const std::atomic<std::uint64_t>& live, std::uint64_t gen, std::uint64_t round, Train&& train) {
  TrainDone r;
  if (live != gen) {
    r.error = "round " + std::to_string(round) + " moved on before its training started";
    return r;
  }
  try {
    r.out = train();
  } catch (const TrainerError& e) {
    r.error = e.what();
    r.fatal = e.fatal();
    r.failure = e.reason();
  } catch (const std::exception& e) {
    r.error = e.what();
    r.failure = wire::AGENT_INTERNAL;
  }
  return r;
}

}  // namespace

TrainDone TrainingJob::operator()() {
  return training_job(*live, generation, task.round, [&] {
    if (!sha.empty()) check_model_sha(sha, crypto::sha256_hex(model->flat()));
    auto out = run_round(*trainer, *model, task, std::move(spare));
    if (out.update && task.plan.silo_momentum() > 0) {
      // Momentum would carry a trained round into later uploads whether or not that round's
      // update ever left (and was charged): refused under a privacy budget.
      if (!out.privacy.mechanism().empty()) {
        throw TrainerError(wire::TRAINER_MISCONFIGURED,
                           "the server's plan asks for silo momentum, which a silo under a privacy budget does not run "
                           "(it would release rounds its budget never charged: docs/privacy.md)");
      }
      with_momentum(out, *momentum, momentum_file, task.plan);
    }
    if (out.update) {
      hook->tamper(task, *model, out.update->flat(), out.weight);
      if (protocol::compressed(compression)) {
        with_compression(out, compression, secure, *residual, residual_file, chunk_bytes, seed);
      }
      if (out.residual_next) {
        // Staged, not yet the silo's: it becomes the error feedback with the upload's line of
        // sent.jsonl, before the upload leaves (silo_state.h).
        out.residual_sha256 = crypto::sha256_hex(out.residual_next->flat());
        if (!residual_file.empty()) {
          save_safetensors(staged_path(residual_file), *out.residual_next,
                           {{"xsilo.compression", protocol::describe(compression)},
                            {"xsilo.round", std::to_string(task.round)}});
        }
      }
      out.sha256 = crypto::sha256_hex(out.update->flat());
    }
    return out;
  });
}

// The upload's SHA-256 is taken as the delta is made (it is made again when it is sent).
TrainDone StreamedTrainingJob::operator()() {
  return training_job(*live, generation, task.round, [&] {
    if (!sha.empty()) check_model_sha(sha, received_sha);
    const std::size_t d = elements(layout);
    return form_streamed_update(trainer->train_streamed(task, d), std::move(layout), task.plan, chunk_elems);
  });
}

}  // namespace xsilo::agent
