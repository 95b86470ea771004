#include "silo_agent/update.h"

#include <algorithm>
#include <cmath>

#include "crypto/hash.h"

namespace xsilo::agent {

namespace {

// What every upload carries besides its values: the sample count, the metrics, and the weight,
// which is the sample count capped at the plan's max_weight.
RoundOutput output_of(const TrainResult& r, const wire::TrainingPlan& plan) {
  if (r.num_samples == 0) throw TrainerError(wire::TRAINER_NO_SAMPLES, "the trainer reported no training samples");
  RoundOutput out;
  out.num_samples = r.num_samples;
  out.metrics = r.metrics;
  out.privacy = r.privacy;
  out.weight = static_cast<double>(r.num_samples);
  if (plan.max_weight() > 0) out.weight = std::min(out.weight, static_cast<double>(plan.max_weight()));
  return out;
}

}  // namespace

RoundOutput form_update(const Model& global, const Model& local, const TrainResult& r, const wire::TrainingPlan& plan,
                        std::shared_ptr<Model> reuse) {
  RoundOutput out = output_of(r, plan);
  // Reuse last round's buffer when nothing else holds it: no fresh pages every round.
  if (reuse && reuse.use_count() == 1 && reuse->same_layout(global)) {
    out.update = std::move(reuse);
  } else {
    out.update = std::make_shared<Model>(global.zeros_like());
  }
  const auto g = global.flat();
  const auto l = local.flat();
  auto u = out.update->flat();
  const auto w = static_cast<float>(out.weight);
  bool finite = true, weighted_finite = true;
  for (std::size_t i = 0; i < u.size(); ++i) {
    u[i] = (l[i] - g[i]) * w;
    finite = finite && std::isfinite(l[i]);
    weighted_finite = weighted_finite && std::isfinite(u[i]);
  }
  if (!finite) {
    for (const auto& t : local.tensors()) {
      const auto v = local.tensor(t.name);
      if (std::any_of(v.begin(), v.end(), [](float x) { return !std::isfinite(x); })) {
        throw TrainerError(wire::TRAINER_NON_FINITE, "the trained model has NaN or infinite values in tensor " + t.name);
      }
    }
  }
  if (!weighted_finite) {
    // Finite weights whose difference, times the weight, leaves float32 (3e38 and the like):
    // refused here, not left for the server to find (review N8).
    for (const auto& t : local.tensors()) {
      const auto v = out.update->tensor(t.name);
      if (std::any_of(v.begin(), v.end(), [](float x) { return !std::isfinite(x); })) {
        throw TrainerError(wire::TRAINER_NON_FINITE, "the update (weight " + std::to_string(out.weight) +
                                                         " x (trained - global)) overflows float32 in tensor " + t.name);
      }
    }
  }
  return out;
}

std::uint64_t RoundOutput::bytes() const {
  if (update) return update->bytes();
  return elements(layout) * sizeof(float);
}

RoundOutput form_streamed_update(StreamedTraining t, std::vector<TensorInfo> layout, const wire::TrainingPlan& plan,
                                 std::size_t chunk_elems) {
  RoundOutput out = output_of(t.result, plan);
  if (!t.delta) throw TrainerError("the trainer streamed no delta");
  out.stream = std::move(t.delta);
  out.layout = std::move(layout);
  const std::size_t d = out.bytes() / sizeof(float);
  std::vector<float> chunk(std::max<std::size_t>(1, std::min(chunk_elems, d)));
  crypto::Sha256 sha;
  for (std::size_t first = 0; first < d; first += chunk.size()) {
    const std::span<float> piece(chunk.data(), std::min(chunk.size(), d - first));
    fill_streamed_update(out, first, piece);
    if (!std::all_of(piece.begin(), piece.end(), [](float v) { return std::isfinite(v); })) {
      throw TrainerError(wire::TRAINER_NON_FINITE, "the streamed update has NaN or infinite values");
    }
    sha.update(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(piece.data()), piece.size() * 4));
  }
  out.sha256 = crypto::to_hex(sha.finish());
  return out;
}

void fill_streamed_update(const RoundOutput& out, std::size_t first, std::span<float> values) {
  out.stream->fill(first, values);
  const auto w = static_cast<float>(out.weight);
  for (auto& v : values) v *= w;
}

void apply_momentum(Model& update, double weight, Model& momentum, double beta) {
  if (!momentum.same_layout(update)) momentum = update.zeros_like();
  auto u = update.flat();
  auto m = momentum.flat();
  const double keep = beta, take = 1.0 - beta;
  for (std::size_t i = 0; i < u.size(); ++i) {
    const double next = keep * m[i] + take * (static_cast<double>(u[i]) / weight);
    m[i] = static_cast<float>(next);
    u[i] = static_cast<float>(next * weight);
  }
}

RoundOutput run_round(Trainer& trainer, const Model& global, const TrainTask& task, std::shared_ptr<Model> reuse) {
  const auto eval = trainer.evaluate(global, task);
  if (!task.plan.train()) {
    RoundOutput out;
    out.metrics = eval;
    return out;
  }
  Model local = global.zeros_like();
  const TrainResult r = trainer.train(global, task, local);
  RoundOutput out = form_update(global, local, r, task.plan, std::move(reuse));
  out.metrics.set_eval_loss(eval.eval_loss());
  out.metrics.set_eval_accuracy(eval.eval_accuracy());
  out.metrics.set_eval_samples(eval.eval_samples());
  return out;
}

}  // namespace xsilo::agent
