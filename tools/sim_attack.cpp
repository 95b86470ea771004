#include "tools/sim_attack.h"

#include <cmath>
#include <limits>
#include <random>

namespace xsilo::tools {

AttackConfig parse_attack(const ConfigNode& node, bool need_honest) {
  AttackConfig a;
  a.kind = node.one_of("kind", "", {"", "sign_flip", "gaussian", "scaling", "alie", "ipm", "label_flip", "nan"});
  a.scale = node.number("scale", 1.0, 0.0, 1e6);
  a.sigma = node.number("sigma", 1.0, 0.0, 1e6);
  a.factor = node.number("factor", 10.0, -1e6, 1e6);
  a.z = node.number("z", 1.0, -100, 100);
  a.epsilon = node.number("epsilon", 0.5, -1e6, 1e6);
  for (const auto& h : node.child_list("honest")) {
    a.honest.push_back({h.str_required("silo"), h.path("train", "")});
    h.finish();
  }
  node.finish();
  if (need_honest && (a.kind == "alie" || a.kind == "ipm") && a.honest.empty()) {
    node.fail("honest", a.kind + " needs the honest silos' data (the sim fills this in)");
  }
  return a;
}

void apply_attack(const AttackConfig& a, std::span<float> delta, std::uint64_t seed,
                  const std::function<std::vector<std::vector<float>>()>& honest_deltas) {
  if (a.kind == "sign_flip") {
    for (auto& v : delta) v = static_cast<float>(-a.scale * v);
  } else if (a.kind == "scaling") {
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
  }
  // label_flip acts on the training data instead (see tools/sim_agent.cpp).
}

}  // namespace xsilo::tools
