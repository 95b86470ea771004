#include "server/central_dp.h"

#include <cmath>
#include <stdexcept>

namespace xsilo::server {

privacy::Mechanism round_mechanism(const CentralDpConfig& c) {
  return privacy::SubsampledGaussian{c.sample_rate, c.noise_multiplier};
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
  return silo_level_record("central",
                           {{"noise_multiplier", c.noise_multiplier},
                            {"clip_norm", c.clip_norm},
                            {"denominator", c.denominator},
                            {"noise_stddev", noise_stddev(c)},
                            {"sample_rate", c.sample_rate}},
                           c.delta, c.epsilon, spent);
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
  const privacy::Mechanism m =
      privacy::SubsampledGaussian{p["sample_rate"].get<double>(), p["noise_multiplier"].get<double>()};
  privacy::validate(m);
  return m;
}

void add_gaussian_noise(std::span<float> step, double stddev, crypto::NoiseSource& noise) {
  for (auto& v : step) v = static_cast<float>(static_cast<double>(v) + stddev * noise.gaussian());
}

}  // namespace xsilo::server
