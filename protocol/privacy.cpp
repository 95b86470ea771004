#include "protocol/privacy.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "privacy/accountant.h"

namespace xsilo::protocol {

namespace {

privacy::Accountant replay(std::span<const wire::PrivacySpend> spends) {
  privacy::Accountant acc;
  for (const auto& s : spends) {
    acc.compose(privacy::SubsampledGaussian{s.sample_rate(), s.noise_multiplier()}, s.steps());
  }
  return acc;
}

}  // namespace

nlohmann::json privacy_json(const wire::PrivacySpend& p) {
  return {{"mechanism", p.mechanism()},   {"sample_rate", p.sample_rate()}, {"noise_multiplier", p.noise_multiplier()},
          {"steps", p.steps()},           {"clip_norm", p.clip_norm()},     {"delta", p.delta()},
          {"epsilon", p.epsilon()},       {"max_epsilon", p.max_epsilon()}};
}

Status check_privacy(const wire::PrivacySpend& p) {
  if (p.mechanism() != kDpSgd) return Error("privacy.mechanism must be \"dp_sgd\", not \"" + p.mechanism() + "\"");
  if (!(p.sample_rate() > 0 && p.sample_rate() <= 1)) return Error("privacy.sample_rate must be in (0, 1]");
  if (!(p.noise_multiplier() > 0) || !std::isfinite(p.noise_multiplier())) {
    return Error("privacy.noise_multiplier must be > 0 and finite");
  }
  if (p.steps() == 0) return Error("privacy.steps must be at least 1");
  if (!(p.delta() > 0 && p.delta() < 1)) return Error("privacy.delta must be in (0, 1)");
  if (!(p.epsilon() >= 0) || !std::isfinite(p.epsilon())) return Error("privacy.epsilon must be >= 0 and finite");
  if (!(p.clip_norm() >= 0) || !(p.max_epsilon() >= 0)) {
    return Error("privacy.clip_norm and max_epsilon must be >= 0");
  }
  return {};
}

wire::PrivacySpend privacy_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::invalid_argument("privacy must be an object");
  auto num = [&](const char* key) -> double {
    if (!j.contains(key) || !j.at(key).is_number()) {
      throw std::invalid_argument(std::string("privacy.") + key + " must be a number");
    }
    return j.at(key).get<double>();
  };
  wire::PrivacySpend p;
  if (!j.contains("mechanism") || !j.at("mechanism").is_string()) {
    throw std::invalid_argument("privacy.mechanism must be a string");
  }
  p.set_mechanism(j.at("mechanism").get<std::string>());
  p.set_sample_rate(num("sample_rate"));
  p.set_noise_multiplier(num("noise_multiplier"));
  if (!j.contains("steps") || !j.at("steps").is_number_integer() ||
      (!j.at("steps").is_number_unsigned() && j.at("steps").get<std::int64_t>() < 1)) {
    throw std::invalid_argument("privacy.steps must be a whole number");
  }
  p.set_steps(j.at("steps").get<std::uint64_t>());
  p.set_clip_norm(num("clip_norm"));
  p.set_delta(num("delta"));
  p.set_epsilon(num("epsilon"));
  p.set_max_epsilon(num("max_epsilon"));
  if (const auto st = check_privacy(p); !st) throw std::invalid_argument(st.error().message());
  return p;
}

struct DpSgdAccount::State {
  privacy::Accountant acc;
};
DpSgdAccount::DpSgdAccount() : state_(std::make_unique<State>()) {}
DpSgdAccount::~DpSgdAccount() = default;
DpSgdAccount::DpSgdAccount(DpSgdAccount&&) noexcept = default;
DpSgdAccount& DpSgdAccount::operator=(DpSgdAccount&&) noexcept = default;

void DpSgdAccount::add(const wire::PrivacySpend& s) {
  state_->acc.compose(privacy::SubsampledGaussian{s.sample_rate(), s.noise_multiplier()}, s.steps());
  ++rounds_;
}

double DpSgdAccount::epsilon(double delta) const { return rounds_ ? state_->acc.epsilon(delta).epsilon : 0; }

double dp_sgd_epsilon(std::span<const wire::PrivacySpend> spends, double delta) {
  if (spends.empty()) return 0;
  return replay(spends).epsilon(delta).epsilon;
}

double dp_sgd_noise_for(std::span<const wire::PrivacySpend> spent, double q, std::uint64_t steps,
                        std::uint64_t rounds, double max_epsilon, double delta) {
  if (steps == 0 || rounds == 0 || rounds > std::numeric_limits<std::uint64_t>::max() / steps) return 0;
  const privacy::Accountant base = replay(spent);
  auto fits = [&](double sigma) {
    privacy::Accountant acc = base;
    acc.compose(privacy::SubsampledGaussian{q, sigma}, steps * rounds);
    return acc.epsilon(delta).epsilon <= max_epsilon;
  };
  double hi = 1e4;
  if (!fits(hi)) return 0;
  double lo = 1e-2;
  if (fits(lo)) return lo;
  // Epsilon falls as sigma grows: bisect on log sigma between a sigma that misses and one that fits.
  while (hi / lo > 1 + 1e-6) {
    const double mid = std::sqrt(lo * hi);
    (fits(mid) ? hi : lo) = mid;
  }
  return hi;
}

}  // namespace xsilo::protocol
