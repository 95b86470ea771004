#include "server/central_dp.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace xsilo::server {

privacy::Mechanism round_mechanism(const CentralDpConfig& c) {
  return privacy::SubsampledGaussian{c.sample_rate, round_noise_multiplier(c.noise_multiplier, c.count_stddev)};
}

double round_noise_multiplier(double z, double count_stddev) {
  if (count_stddev <= 0) return z;
  const double b = 2 * count_stddev;  // the count's multiplier: its sensitivity is 1/2
  return 1 / std::sqrt(1 / (z * z) + 1 / (b * b));
}

double update_noise_multiplier(double z_round, double count_stddev) {
  const double b = 2 * count_stddev;
  if (!(b > z_round)) {
    throw std::invalid_argument(fmt::format("count_stddev {:g} leaves no room for the update's noise: the round's "
                                            "noise multiplier {:g} needs 2 count_stddev above it",
                                            count_stddev, z_round));
  }
  return 1 / std::sqrt(1 / (z_round * z_round) - 1 / (b * b));
}

double default_count_stddev(double denominator, double z_round) {
  return std::max(denominator / 20, std::sqrt(10.0) / 2 * z_round);
}

double noise_stddev(const CentralDpConfig& c) { return c.noise_multiplier * c.clip_norm / c.denominator; }

double epsilon_of(const privacy::Ledger& spent, double delta) {
  if (spent.steps.empty()) return 0;
  return privacy::Accountant::replay(spent).epsilon(delta).epsilon;
}

bool fits_another_round(const CentralDpConfig& c, const privacy::Ledger& spent) {
  return privacy::Accountant::replay(spent).steps_within(round_mechanism(c), c.epsilon, c.delta, 1) >= 1;
}

double noise_multiplier_for_rounds(double epsilon, double delta, double sample_rate, std::uint64_t rounds) {
  return privacy::noise_multiplier_for(epsilon, delta, sample_rate, rounds);
}

nlohmann::json silo_level_record(const char* mechanism, nlohmann::json fields, double delta, double max_epsilon,
                                 const privacy::Ledger& spent) {
  fields["level"] = "silo";
  fields["mechanism"] = mechanism;
  fields["delta"] = delta;
  fields["epsilon"] = epsilon_of(spent, delta);
  fields["max_epsilon"] = max_epsilon;
  fields["rounds_spent"] = spent.count();
  return fields;
}

nlohmann::json round_privacy_record(const CentralDpConfig& c, const privacy::Ledger& spent) {
  // `noise_multiplier` is always the round's, the one its spend is computed from, so that a reader
  // that knows nothing of adaptive clipping computes the right epsilon from it; with adaptive
  // clipping the update's own (smaller) multiplier is `update_noise_multiplier`.
  nlohmann::json fields = {{"noise_multiplier", round_noise_multiplier(c.noise_multiplier, c.count_stddev)},
                           {"clip_norm", c.clip_norm},
                           {"denominator", c.denominator},
                           {"noise_stddev", noise_stddev(c)},
                           {"sample_rate", c.sample_rate}};
  if (c.count_stddev > 0) {  // and clip_norm is the round's adaptive C
    fields["count_stddev"] = c.count_stddev;
    fields["update_noise_multiplier"] = c.noise_multiplier;
  }
  return silo_level_record("central", std::move(fields), c.delta, c.epsilon, spent);
}

std::optional<privacy::Mechanism> central_mechanism_of(const nlohmann::json& record) {
  if (record.value("event", "") != "round" || record.value("status", "") != "committed") return std::nullopt;
  const auto it = record.find("privacy");
  if (it == record.end() || !it->is_object() || it->value("mechanism", "") != "central") return std::nullopt;
  const auto& p = *it;
  for (const char* key : {"sample_rate", "noise_multiplier", "delta", "epsilon"}) {
    if (!p.contains(key) || !p[key].is_number()) {
      throw std::invalid_argument(std::string("its privacy part has no number \"") + key + "\"");
    }
  }
  // Adaptive clipping released a noisy count of unclipped updates with the step: its noise is part
  // of the round's mechanism, and a round that adapted C without stating it spent more than it says.
  double count_stddev = 0;
  if (p.contains("count_stddev")) {
    if (!p["count_stddev"].is_number() || !(p["count_stddev"].get<double>() > 0)) {
      throw std::invalid_argument("its privacy part's count_stddev is not a number above 0");
    }
    count_stddev = p["count_stddev"].get<double>();
  } else if (const auto r = record.find("robust"); r != record.end() && r->is_object() && r->contains("adaptive_clip")) {
    throw std::invalid_argument("its clip norm adapted to a count of unclipped updates (robust.adaptive_clip) but its "
                                "privacy part states no count_stddev: the count's release is not accounted");
  }
  const double z = p["noise_multiplier"].get<double>();
  if (!(z > 0)) throw std::invalid_argument("its privacy part's noise_multiplier is not above 0");
  double z_round = z;
  if (count_stddev > 0) {
    // The round's multiplier is recomputed from the update's and the count's noise, and the stated
    // one must be it: a larger one would let a reader of noise_multiplier alone under-count.
    if (!p.contains("update_noise_multiplier") || !p["update_noise_multiplier"].is_number() ||
        !(p["update_noise_multiplier"].get<double>() > 0)) {
      throw std::invalid_argument("its privacy part states count_stddev without a number update_noise_multiplier above 0");
    }
    z_round = round_noise_multiplier(p["update_noise_multiplier"].get<double>(), count_stddev);
    if (std::abs(z - z_round) > 1e-9 * z_round) {
      throw std::invalid_argument(fmt::format("its privacy part's noise_multiplier {:.12g} is not the round's {:.12g} "
                                              "(from update_noise_multiplier and count_stddev)",
                                              z, z_round));
    }
  }
  const privacy::Mechanism m = privacy::SubsampledGaussian{p["sample_rate"].get<double>(), z_round};
  privacy::validate(m);
  return m;
}

void add_gaussian_noise(std::span<float> step, double stddev, crypto::NoiseSource& noise) {
  for (auto& v : step) v = static_cast<float>(static_cast<double>(v) + stddev * noise.gaussian());
}

}  // namespace xsilo::server
