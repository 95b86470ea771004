#include "silo_agent/sgd.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "crypto/noise.h"

namespace xsilo::agent {

std::uint64_t dp_steps_per_epoch(double sample_rate) {
  return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::llround(1.0 / sample_rate)));
}

namespace {

// The first row at or after `from` that a Poisson sample of rate q takes.
std::size_t next_in_sample(crypto::NoiseSource& rng, double q, std::size_t from) {
  if (q >= 1.0) return from;
  const double gap = std::floor(std::log1p(-rng.uniform()) / std::log1p(-q));
  return gap >= 1e18 ? std::numeric_limits<std::size_t>::max() : from + static_cast<std::size_t>(gap);
}

TrainStats train_dp_sgd(const Network& net, std::span<float> params, const Dataset& data, const TrainOptions& opts) {
  TrainStats stats;
  const auto& dp = opts.dp;
  crypto::NoiseSource rng(dp.noise_key);
  std::vector<float> grad(params.size()), sum(params.size());
  const double expected_batch = dp.sample_rate * static_cast<double>(data.rows);
  const double sd = dp.noise_multiplier * dp.clip_norm;
  double loss_sum = 0;
  std::uint64_t examples = 0;
  const std::uint64_t steps = dp_steps_per_epoch(dp.sample_rate) * opts.epochs;
  for (std::uint64_t step = 0; step < steps; ++step) {
    std::fill(sum.begin(), sum.end(), 0.0f);
    // Each row in with probability q: the gaps between sampled rows are geometric, so a step
    // costs its batch, not a draw per row.
    for (std::size_t r = next_in_sample(rng, dp.sample_rate, 0); r < data.rows;
         r = next_in_sample(rng, dp.sample_rate, r + 1)) {
      loss_sum += net.loss_and_grad(params, data.row(r), &data.y[r], 1, grad);
      ++examples;
      double sq = 0;
      for (float g : grad) sq += static_cast<double>(g) * g;
      const double norm = std::sqrt(sq);
      // A gradient that overflowed has no norm to clip to: the row adds nothing (NaN compares
      // false and would pass unclipped; an infinite norm would scale inf by 0).
      if (!std::isfinite(norm)) continue;
      const float scale = norm > dp.clip_norm ? static_cast<float>(dp.clip_norm / norm) : 1.0f;
      for (std::size_t k = 0; k < sum.size(); ++k) sum[k] += scale * grad[k];
    }
    for (std::size_t k = 0; k < params.size(); ++k) {
      const double noisy = (static_cast<double>(sum[k]) + sd * rng.gaussian()) / expected_batch;
      params[k] -= opts.learning_rate * (static_cast<float>(noisy) + opts.weight_decay * params[k]);
    }
    ++stats.steps;
  }
  stats.examples = examples;
  stats.mean_loss = loss_sum / static_cast<double>(std::max<std::uint64_t>(1, examples));
  return stats;
}

}  // namespace

TrainStats train_sgd(const Network& net, std::span<float> params, const Dataset& data,
                     const TrainOptions& opts) {
  TrainStats stats;
  if (data.rows == 0) return stats;
  if (opts.dp.on()) return train_dp_sgd(net, params, data, opts);
  std::vector<std::size_t> order(data.rows);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(opts.seed);
  std::vector<float> grad(params.size());
  std::vector<float> xb;
  std::vector<int> yb;
  double loss_sum = 0;
  const std::size_t bs = std::max<std::uint32_t>(1, opts.batch_size);
  for (std::uint32_t e = 0; e < opts.epochs; ++e) {
    std::shuffle(order.begin(), order.end(), rng);
    for (std::size_t start = 0; start < data.rows; start += bs) {
      const std::size_t n = std::min(bs, data.rows - start);
      xb.resize(n * data.features);
      yb.resize(n);
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t r = order[start + i];
        std::copy(data.row(r), data.row(r) + data.features, xb.begin() + static_cast<long>(i * data.features));
        yb[i] = data.y[r];
      }
      loss_sum += net.loss_and_grad(params, xb.data(), yb.data(), n, grad);
      for (std::size_t k = 0; k < params.size(); ++k) {
        params[k] -= opts.learning_rate * (grad[k] + opts.weight_decay * params[k]);
      }
      ++stats.steps;
    }
  }
  stats.mean_loss = loss_sum / static_cast<double>(std::max<std::uint64_t>(1, stats.steps));
  return stats;
}

}  // namespace xsilo::agent
