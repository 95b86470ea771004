// Local training: mini-batch SGD over a silo's rows for a number of epochs (the built-in trainer).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>

#include "common/dataset.h"
#include "common/mlp.h"

namespace xsilo::agent {

// DP-SGD (Abadi et al., CCS 2016), as Opacus runs it: each step takes a Poisson sample of the
// rows (every row in with probability sample_rate, drawn afresh), clips each sampled row's
// gradient to clip_norm in L2, adds Gaussian noise of standard deviation noise_multiplier *
// clip_norm to every coordinate of the sum and divides by the expected batch size, sample_rate
// * rows. An epoch is dp_steps_per_epoch() steps. The sample and the noise come from a
// crypto::NoiseSource under a fresh key (never from the round's seed, which the server
// chooses); tests fix the key. Weight decay, which reads no data, is applied as without DP.
struct DpSgdOptions {
  double clip_norm = 0;  // > 0: DP-SGD
  double noise_multiplier = 0;
  double sample_rate = 0;
  std::optional<std::array<std::uint8_t, 32>> noise_key;  // tests only
  bool on() const { return clip_norm > 0; }
};

// round(1 / sample_rate), at least 1: an epoch sees every row once in expectation.
std::uint64_t dp_steps_per_epoch(double sample_rate);

struct TrainOptions {
  std::uint32_t epochs = 1;
  std::uint32_t batch_size = 32;
  float learning_rate = 0.1f;
  float weight_decay = 0.0f;
  std::uint64_t seed = 0;  // shuffling; the server derives it from the round
  DpSgdOptions dp;         // on: DP-SGD instead of shuffled mini-batches
};

struct TrainStats {
  double mean_loss = 0;
  std::uint64_t steps = 0;
  std::uint64_t examples = 0;  // DP-SGD: the rows its Poisson samples took, all steps together
};

// Updates `params` in place. The row order of each epoch is a permutation drawn from
// `seed`, so two runs with the same inputs give the same model bit for bit (with DP-SGD: the
// same noise key too).
TrainStats train_sgd(const Network& net, std::span<float> params, const Dataset& data,
                     const TrainOptions& opts);


}  // namespace xsilo::agent
