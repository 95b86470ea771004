// Local training: mini-batch SGD over a silo's rows for a number of epochs (the built-in trainer).
#pragma once

#include <cstdint>
#include <span>

#include "common/dataset.h"
#include "common/mlp.h"

namespace xsilo::agent {

struct TrainOptions {
  std::uint32_t epochs = 1;
  std::uint32_t batch_size = 32;
  float learning_rate = 0.1f;
  float weight_decay = 0.0f;
  std::uint64_t seed = 0;  // shuffling; the server derives it from the round
};

struct TrainStats {
  double mean_loss = 0;
  std::uint64_t steps = 0;
};

// Updates `params` in place. The row order of each epoch is a permutation drawn from
// `seed`, so two runs with the same inputs give the same model bit for bit.
TrainStats train_sgd(const Network& net, std::span<float> params, const Dataset& data,
                     const TrainOptions& opts);

// The seed a silo uses in a round: mixes the federation seed, the round and the silo name so
// silos shuffle differently and runs repeat exactly.
std::uint64_t round_seed(std::uint64_t base, std::uint64_t round, const std::string& silo);

}  // namespace xsilo::agent
