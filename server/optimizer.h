// Server optimizers (Reddi et al., "Adaptive Federated Optimization", ICLR 2021). Each takes
// the weighted mean of the silos' model deltas as a pseudo-gradient step:
//   fedavg:  x += lr * d
//   fedavgm: m = momentum * m + d;                     x += lr * m
//   fedadam: m = b1 m + (1-b1) d; v = b2 v + (1-b2) d^2; x += lr * m / (sqrt(v) + tau)
#pragma once

#include <span>
#include <string>

#include "common/model.h"

namespace xsilo::server {

struct OptimizerConfig {
  std::string kind = "fedavg";
  float lr = 1.0f;
  float momentum = 0.9f;
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float tau = 1e-3f;
  // Keep the last aggregate step (the mean delta it was given) in the state: centered clipping
  // starts each round from it. Set by the server config, not by users.
  bool keep_last_step = false;
};

class ServerOptimizer {
 public:
  ServerOptimizer(OptimizerConfig cfg, const Model& layout);
  // model += step(delta). `model` and `delta` may not alias.
  void step(std::span<float> model, std::span<const float> delta);
  // In place: on return `delta_then_model` holds model + step(delta).
  void step_into(std::span<const float> model, std::span<float> delta_then_model);

  const OptimizerConfig& config() const { return cfg_; }
  // State to checkpoint: "m" and "v" tensors (absent for fedavg), and "last_step" when kept.
  Model state() const;
  // Throws std::runtime_error on a layout mismatch. A tensor the state lacks (a checkpoint of
  // another optimizer, or from before "last_step" was kept) starts from zeros, as the first
  // round does.
  void load_state(const Model& state);
  // The last aggregate step taken (empty before the first, or when not kept).
  std::span<const float> last_step() const { return last_; }

 private:
  OptimizerConfig cfg_;
  std::size_t size_ = 0;  // the model's
  std::vector<float> m_, v_, last_;
};

}  // namespace xsilo::server
