#include "silo_agent/sgd.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

namespace xsilo::agent {

TrainStats train_sgd(const Network& net, std::span<float> params, const Dataset& data,
                     const TrainOptions& opts) {
  TrainStats stats;
  if (data.rows == 0) return stats;
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

std::uint64_t round_seed(std::uint64_t base, std::uint64_t round, const std::string& silo) {
  // FNV-1a over the silo name, mixed with splitmix64.
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : silo) h = (h ^ c) * 1099511628211ull;
  std::uint64_t z = base ^ (round * 0x9e3779b97f4a7c15ull) ^ h;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace xsilo::agent
