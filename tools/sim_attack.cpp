#include "tools/sim_attack.h"

#include <cmath>
#include <limits>
#include <random>

namespace xsilo::tools {

AttackConfig parse_attack(const ConfigNode& node, bool need_honest) {
  AttackConfig a;
  a.kind = node.one_of("kind", "", {"", "sign_flip", "gaussian", "scaling", "alie", "ipm", "label_flip", "nan", "mimic",
                                    "model_replacement", "skip_clipping", "unclipped_lie"});
  a.scale = node.number("scale", 1.0, 0.0, 1e6);
  a.sigma = node.number("sigma", 1.0, 0.0, 1e6);
  a.factor = node.number("factor", 10.0, -1e6, 1e6);
  a.z = node.number("z", 1.0, -100, 100);
  a.epsilon = node.number("epsilon", 0.5, -1e6, 1e6);
  a.boost = node.number("boost", 1.0, 0.0, 1e6);
  for (const auto& h : node.child_list("honest")) {
    a.honest.push_back({h.str_required("silo"), h.path("train", "")});
    h.finish();
  }
  node.finish();
  if (need_honest && a.needs_honest() && a.honest.empty()) {
    node.fail("honest", a.kind + " needs the honest silos' data (the sim fills this in)");
  }
  return a;
}

namespace {

double norm_of(std::span<const float> v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s);
}

// Mimic: the honest silo farthest from the honest mean along the honest deltas' direction of
// largest variance (their covariance's top eigenvector, by power iteration from the sum of the
// deviations, so that every attacker picks the same silo).
std::size_t mimic_target(const std::vector<std::vector<float>>& honest) {
  const std::size_t n = honest.size(), d = honest.front().size();
  std::vector<double> mean(d, 0.0);
  for (const auto& h : honest) {
    for (std::size_t k = 0; k < d; ++k) mean[k] += h[k] / double(n);
  }
  std::vector<std::vector<double>> dev(n, std::vector<double>(d));
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t k = 0; k < d; ++k) dev[i][k] = honest[i][k] - mean[k];
  }
  std::vector<double> z(d, 0.0), next(d);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t k = 0; k < d; ++k) z[k] += (i % 2 ? -1.0 : 1.0) * dev[i][k];
  }
  std::vector<double> proj(n);
  for (int it = 0; it < 50; ++it) {  // z <- sum_i dev_i <dev_i, z>, normalised
    for (std::size_t i = 0; i < n; ++i) {
      proj[i] = 0;
      for (std::size_t k = 0; k < d; ++k) proj[i] += dev[i][k] * z[k];
    }
    std::fill(next.begin(), next.end(), 0.0);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t k = 0; k < d; ++k) next[k] += proj[i] * dev[i][k];
    }
    double len = 0;
    for (double v : next) len += v * v;
    len = std::sqrt(len);
    if (len == 0) break;
    for (std::size_t k = 0; k < d; ++k) z[k] = next[k] / len;
  }
  std::size_t best = 0;
  double best_proj = -1;
  for (std::size_t i = 0; i < n; ++i) {
    double p = 0;
    for (std::size_t k = 0; k < d; ++k) p += dev[i][k] * z[k];
    if (std::abs(p) > best_proj) best_proj = std::abs(p), best = i;
  }
  return best;
}

}  // namespace

void apply_attack(const AttackConfig& a, std::span<float> delta, std::uint64_t seed,
                  const std::function<std::vector<std::vector<float>>()>& honest_deltas) {
  if (a.kind == "sign_flip") {
    for (auto& v : delta) v = static_cast<float>(-a.scale * v);
  } else if (a.kind == "scaling" || a.kind == "skip_clipping") {
    for (auto& v : delta) v = static_cast<float>(a.factor * v);
  } else if (a.kind == "gaussian") {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> g(0.0f, static_cast<float>(a.sigma));
    for (auto& v : delta) v = g(rng);
  } else if (a.kind == "nan") {
    for (auto& v : delta) v = std::numeric_limits<float>::quiet_NaN();
  } else if (a.kind == "alie" || a.kind == "ipm") {
    const auto honest = honest_deltas();
    const auto n = static_cast<double>(honest.size());
    for (std::size_t k = 0; k < delta.size(); ++k) {
      double mean = 0, sq = 0;
      for (const auto& h : honest) mean += h[k];
      mean /= n;
      for (const auto& h : honest) sq += (h[k] - mean) * (h[k] - mean);
      const double sd = std::sqrt(sq / n);
      delta[k] = static_cast<float>(a.kind == "alie" ? mean - a.z * sd : -a.epsilon * mean);
    }
  } else if (a.kind == "mimic") {
    const auto honest = honest_deltas();
    const auto& target = honest[mimic_target(honest)];
    std::copy(target.begin(), target.end(), delta.begin());
  } else if (a.kind == "model_replacement") {
    // Against the honest mean, at boost x the largest honest norm: as long as any honest update
    // is, so a norm bound that keeps the honest updates keeps this one whole.
    const auto honest = honest_deltas();
    std::vector<double> mean(delta.size(), 0.0);
    double largest = 0;
    for (const auto& h : honest) {
      for (std::size_t k = 0; k < delta.size(); ++k) mean[k] += h[k] / double(honest.size());
      largest = std::max(largest, norm_of(h));
    }
    double len = 0;
    for (double v : mean) len += v * v;
    len = std::sqrt(len);
    const double scale = len > 0 ? a.boost * largest / len : 0.0;
    for (std::size_t k = 0; k < delta.size(); ++k) delta[k] = static_cast<float>(-scale * mean[k]);
  }
  // label_flip acts on the training data instead (see tools/sim_agent.cpp).
}

}  // namespace xsilo::tools
