#include "server/distributed_dp.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "protocol/secagg_wire.h"
#include "server/central_dp.h"

namespace xsilo::server {

double distributed_l2(const DistributedDpConfig& c, double gamma) {
  return crypto::rounded_l2_bound(gamma * c.clip_norm, c.padded, c.beta);
}

double distributed_l1(const DistributedDpConfig& c, double gamma) {
  const double l2 = distributed_l2(c, gamma);
  return std::min(std::sqrt(static_cast<double>(c.padded)) * l2, l2 * l2);
}

namespace {

// The round's mechanism at gamma, mu and h (0: no count word).
privacy::SkellamSum mechanism_at(const DistributedDpConfig& c, double gamma, double variance, std::uint64_t h) {
  const double l2 = distributed_l2(c, gamma), count = static_cast<double>(h);
  return privacy::SkellamSum{distributed_l1(c, gamma) + count, std::sqrt(l2 * l2 + count * count), variance};
}

// h for the count's sigma_b at mu: the largest whole h (at least 1) with sqrt(mu) / (2 h) >= sigma_b,
// so that the count's noise in count units is never below the one asked for (rounding h to the
// nearest would lower it by up to h / (h + 1/2) half the time); with sqrt(mu) < 2 sigma_b, h = 1.
std::uint64_t count_scale_for(double variance, double count_stddev) {
  return static_cast<std::uint64_t>(std::max(1.0, std::floor(std::sqrt(variance) / (2 * count_stddev))));
}

// The smallest z in [lo, hi] at which `eps(z)` stays within epsilon (eps falling as z grows, up
// to h's rounding): bisection on log z, the answer always one whose epsilon was computed and fit.
template <class Eps>
double smallest_multiplier(const Eps& eps, double epsilon, double lo, double hi) {
  if (eps(hi) > epsilon) {
    throw std::invalid_argument("no noise multiplier up to " + std::to_string(hi) + " reaches the budget");
  }
  if (eps(lo) <= epsilon) return lo;
  double a = std::log(lo), b = std::log(hi);
  for (int i = 0; i < 100 && b - a > 1e-10; ++i) {
    const double mid = (a + b) / 2;
    (eps(std::exp(mid)) <= epsilon ? b : a) = mid;
  }
  return std::exp(b);
}

}  // namespace

privacy::Mechanism round_mechanism(const DistributedDpConfig& c) {
  return mechanism_at(c, c.gamma, c.variance, c.count_scale);
}

double round_noise_multiplier(const DistributedDpConfig& c) {
  const auto m = std::get<privacy::SkellamSum>(round_mechanism(c));
  return std::sqrt(m.variance) / m.l2;
}

double count_noise_stddev(const DistributedDpConfig& c) {
  return c.count_scale > 0 ? std::sqrt(c.variance) / (2 * static_cast<double>(c.count_scale)) : 0.0;
}

DistributedDpConfig at_clip_norm(DistributedDpConfig c, double clip_norm) {
  if (clip_norm == c.clip_norm) return c;
  // gamma' = gamma C0 / C, moved by ulps to the largest whose product with C (as the mechanism
  // computes it: distributed_l2) is not above gamma C0: the planned product itself for most C, one
  // ulp below it where no gamma' reaches it. A product an ulp above would cost the round more than
  // z was chosen for, and could refuse the last planned round at a random C.
  const double planned = c.gamma * c.clip_norm;
  double gamma = planned / clip_norm;
  while (gamma * clip_norm > planned) gamma = std::nextafter(gamma, 0.0);
  while (std::nextafter(gamma, HUGE_VAL) * clip_norm <= planned) gamma = std::nextafter(gamma, HUGE_VAL);
  c.gamma = gamma;
  c.clip_norm = clip_norm;
  return c;
}

bool fits_another_round(const DistributedDpConfig& c, const privacy::Ledger& spent) {
  return privacy::Accountant::replay(spent).steps_within(round_mechanism(c), c.epsilon, c.delta, 1) >= 1;
}

double skellam_noise_multiplier_for(double epsilon, double delta, double l1, double l2, std::uint64_t rounds) {
  auto eps = [&](double z) {
    privacy::Accountant a;
    a.compose(privacy::SkellamSum{l1, l2, z * z * l2 * l2}, rounds);
    return a.epsilon(delta).epsilon;
  };
  return smallest_multiplier(eps, epsilon, 1e-3, 1e6);
}

double ring_reach(const DistributedDpConfig& c, double gamma, double variance) {
  const double n = static_cast<double>(c.max_group), P = static_cast<double>(c.padded);
  const double k = std::sqrt(2 * std::log(4 * n * P / kWrapFailure));
  const double L = std::log(4 * P / kWrapFailure);
  const double V = 2 * variance;
  const double t = L / 3 + std::sqrt(L * L / 9 + 2 * L * V);
  return n * (gamma * c.clip_norm * k / std::sqrt(P) + 1) + t;
}

std::vector<double> spread_kept(std::vector<double> decoded, const std::vector<std::uint64_t>& kept, std::size_t d) {
  if (decoded.size() < kept.size()) throw std::invalid_argument("a kept sum with fewer values than kept coordinates");
  std::vector<double> out(d + decoded.size() - kept.size(), 0.0);
  for (std::size_t i = 0; i < kept.size(); ++i) out.at(kept[i]) = decoded[i];
  std::copy(decoded.begin() + static_cast<std::ptrdiff_t>(kept.size()), decoded.end(),
            out.begin() + static_cast<std::ptrdiff_t>(d));
  return out;
}

void finalize_distributed_dp(DistributedDpConfig& c, std::size_t d) {
  if (c.max_group < 1) throw std::invalid_argument("distributed DP: no group size");
  c.dim = d;
  c.padded = crypto::padded_length(d);
  const bool chosen = c.rounds > 0;
  const double fixed_z = c.noise_multiplier;
  // sigma_b at gamma: the config's, or central mode's default from the round's multiplier (with
  // `rounds`, the one the update alone would need; else z sqrt(0.9), as central mode).
  auto sigma_b_at = [&](double gamma) {
    if (c.count_stddev > 0) return c.count_stddev;
    const double z_round = chosen ? skellam_noise_multiplier_for(c.epsilon, c.delta, distributed_l1(c, gamma),
                                                                 distributed_l2(c, gamma), c.rounds)
                                  : fixed_z * std::sqrt(0.9);
    return default_count_stddev(c.denominator, z_round);
  };
  // The update's z at gamma: fixed, or chosen so that `rounds` rounds of the whole vector (with
  // the count word when adaptive) stay within the budget.
  auto z_at = [&](double gamma) {
    if (!chosen) return fixed_z;
    if (!c.counts_unclipped) {
      return skellam_noise_multiplier_for(c.epsilon, c.delta, distributed_l1(c, gamma), distributed_l2(c, gamma),
                                          c.rounds);
    }
    const double sigma_b = sigma_b_at(gamma), l2 = distributed_l2(c, gamma);
    auto eps = [&](double z_round) {
      const double z = update_noise_multiplier(z_round, sigma_b), mu = z * z * l2 * l2;
      privacy::Accountant a;
      a.compose(mechanism_at(c, gamma, mu, count_scale_for(mu, sigma_b)), c.rounds);
      return a.epsilon(c.delta).epsilon;
    };
    // The round's multiplier stays below 2 sigma_b (else the count alone spends the round).
    const double ceiling = 2 * sigma_b * (1 - 1e-9);
    double z_round = 0;
    try {
      // The planned rounds within epsilon less a relative kPlanMargin: C moves, so the rounds are
      // composed as distinct steps whose sum's rounding may differ from `rounds` times one.
      z_round = smallest_multiplier(eps, c.epsilon * (1 - kPlanMargin), std::min(1e-3, ceiling / 2), ceiling);
    } catch (const std::invalid_argument&) {
      char why[240];
      std::snprintf(why, sizeof why,
                    "count_stddev %.6g leaves no room for the update's noise: %llu rounds need a round's noise "
                    "multiplier above 2 count_stddev; raise count_stddev or leave it out",
                    sigma_b, static_cast<unsigned long long>(c.rounds));
      throw std::invalid_argument(why);
    }
    return update_noise_multiplier(z_round, sigma_b);
  };
  auto mu_at = [&](double gamma, double z) { return z * z * distributed_l2(c, gamma) * distributed_l2(c, gamma); };
  const double limit = std::ldexp(1.0, static_cast<int>(c.bits) - 1) - 1;
  auto fits = [&](double gamma) { return ring_reach(c, gamma, mu_at(gamma, z_at(gamma))) <= limit; };
  // The smallest gamma worth having: gamma C = sqrt(P), the rounding's noise norm.
  const double floor_gamma = std::sqrt(static_cast<double>(c.padded)) / c.clip_norm;
  if (!fits(floor_gamma)) {
    const double z = z_at(floor_gamma);
    char why[400];
    std::snprintf(why, sizeof why,
                  "%u bits cannot hold the sum: at gamma %.4g (gamma clip_norm = sqrt(%zu), the rounding's own noise) "
                  "a coordinate of %zu silos' sum with noise multiplier %.4g reaches %.4g, above 2^%u - 1; use more "
                  "bits, fewer rounds or a larger epsilon",
                  c.bits, floor_gamma, c.padded, c.max_group, z, ring_reach(c, floor_gamma, mu_at(floor_gamma, z)),
                  c.bits - 1);
    throw std::invalid_argument(why);
  }
  // Bisection on log gamma: the reach grows with gamma (signal and noise both scale with it).
  double lo = std::log(floor_gamma), hi = std::log(floor_gamma) + 60;
  for (int i = 0; i < 80 && hi - lo > 1e-6; ++i) {
    const double mid = (lo + hi) / 2;
    (fits(std::exp(mid)) ? lo : hi) = mid;
  }
  c.gamma = std::exp(lo);
  c.noise_multiplier = z_at(c.gamma);
  c.variance = mu_at(c.gamma, c.noise_multiplier);
  c.count_scale = 0;
  if (c.counts_unclipped) {
    c.count_scale = count_scale_for(c.variance, sigma_b_at(c.gamma));
    // The count word's sum, n h plus the noise, is read in the whole masking ring (crypto/skellam.h).
    const double reach = static_cast<double>(c.max_group) * static_cast<double>(c.count_scale) +
                         (ring_reach(c, 0, c.variance) - static_cast<double>(c.max_group));
    if (!(reach <= std::ldexp(1.0, static_cast<int>(c.ring) - 1) - 1)) {
      char why[240];
      std::snprintf(why, sizeof why,
                    "the unclipped count word (scale %llu, %zu silos, noise variance %.4g) reaches %.4g, beyond the "
                    "masking ring of 2^%u; use more secure.bits or a larger count_stddev",
                    static_cast<unsigned long long>(c.count_scale), c.max_group, c.variance, reach, c.ring);
      throw std::invalid_argument(why);
    }
  }
}

crypto::SkellamParams skellam_params(const DistributedDpConfig& c, std::uint32_t min_survivors,
                                     std::uint64_t rotation_seed) {
  crypto::SkellamParams p;
  p.ring = c.ring;
  p.bits = c.bits;
  p.clip_norm = c.clip_norm;
  p.gamma = c.gamma;
  p.silo_variance = c.variance / static_cast<double>(std::max<std::uint32_t>(1, min_survivors));
  p.beta = c.beta;
  p.rotation_seed = rotation_seed;
  p.count_scale = c.count_scale;
  return p;
}

wire::SkellamSetup signed_part(const DistributedDpConfig& c, std::uint64_t rotation_seed) {
  wire::SkellamSetup s;
  s.set_bits(c.bits);
  s.set_gamma(c.gamma);
  s.set_variance(c.variance);
  s.set_clip_norm(c.clip_norm);
  s.set_beta(c.beta);
  s.set_rotation_seed(rotation_seed);
  s.set_count_scale(c.count_scale);
  return s;
}

DistributedDpConfig as_signed(const DistributedDpConfig& budget, const wire::SkellamSetup& k, std::size_t padded) {
  DistributedDpConfig c = budget;
  c.bits = k.bits();
  c.gamma = k.gamma();
  c.variance = k.variance();
  c.clip_norm = k.clip_norm();
  c.beta = k.beta();
  c.padded = padded;
  c.count_scale = k.count_scale();
  c.counts_unclipped = c.count_scale > 0;
  // The update's multiplier (the round's, with the count word, is in the record: privacy_fields).
  c.noise_multiplier = crypto::skellam_noise_multiplier(c.variance, c.gamma, c.clip_norm, c.padded, c.beta);
  return c;
}

nlohmann::json round_privacy_record(const DistributedDpConfig& budget, const wire::SkellamSetup& k, std::size_t padded,
                                    const privacy::Ledger& spent) {
  const DistributedDpConfig c = as_signed(budget, k, padded);
  const auto m = std::get<privacy::SkellamSum>(round_mechanism(c));
  // `noise_multiplier`, l1 and l2 are always the round's (the whole vector's, the count word
  // included), as in central mode; with adaptive clipping the update's own multiplier is
  // `update_noise_multiplier`, and the count's part is count_scale h and count_stddev.
  nlohmann::json fields = {{"noise_multiplier", round_noise_multiplier(c)},
                           {"variance", c.variance},
                           {"gamma", c.gamma},
                           {"bits", c.bits},
                           {"clip_norm", c.clip_norm},
                           {"padded_length", c.padded},
                           {"beta", c.beta},
                           {"rotation_seed", k.rotation_seed()},
                           {"setup_sha256", protocol::skellam_sha256(k, c.padded)},
                            {"l1", m.l1},
                            {"l2", m.l2},
                            {"denominator", c.denominator},
                            {"n_min", "each group's min_survivors (its secure setup): every member adds variance / n_min"}};
  if (c.count_scale > 0) {
    fields["count_scale"] = c.count_scale;
    fields["count_stddev"] = count_noise_stddev(c);
    fields["update_noise_multiplier"] = c.noise_multiplier;
  }
  return silo_level_record("skellam", std::move(fields), c.delta, c.epsilon, spent);
}

std::optional<privacy::Mechanism> recorded_skellam_mechanism(const nlohmann::json& record) {
  const auto it = record.find("privacy");
  if (it == record.end() || !it->is_object() || it->value("mechanism", "") != "skellam") return std::nullopt;
  const auto& p = *it;
  for (const char* key : {"gamma", "clip_norm", "padded_length", "beta", "variance", "delta", "epsilon", "bits",
                          "rotation_seed"}) {
    if (!p.contains(key) || !p[key].is_number()) {
      throw std::invalid_argument(std::string("its privacy part has no number \"") + key + "\"");
    }
  }
  if (!p.contains("setup_sha256") || !p["setup_sha256"].is_string()) {
    throw SetupMismatch("its privacy part names no setup_sha256: nothing ties its parameters to the setup "
                                "the silos were sent");
  }
  wire::SkellamSetup k;
  k.set_bits(p["bits"].get<std::uint32_t>());
  k.set_gamma(p["gamma"].get<double>());
  k.set_variance(p["variance"].get<double>());
  k.set_clip_norm(p["clip_norm"].get<double>());
  k.set_beta(p["beta"].get<double>());
  k.set_rotation_seed(p["rotation_seed"].get<std::uint64_t>());
  // Adaptive clipping's count word: its scale is part of the signed setup (and of its hash), so a
  // record cannot drop it and keep its setup_sha256; a record whose C adapted states it.
  if (p.contains("count_scale")) {
    if (!p["count_scale"].is_number_unsigned() || p["count_scale"].get<std::uint64_t>() == 0) {
      throw std::invalid_argument("its privacy part's count_scale is not a whole number above 0");
    }
    k.set_count_scale(p["count_scale"].get<std::uint64_t>());
  } else if (const auto r = record.find("robust");
             r != record.end() && r->is_object() && r->contains("adaptive_clip")) {
    throw std::invalid_argument("its clip norm adapted to a count of unclipped updates (robust.adaptive_clip) but its "
                                "privacy part states no count_scale: the count's release is not accounted");
  }
  DistributedDpConfig c;
  c.padded = p["padded_length"].get<std::size_t>();
  if (protocol::skellam_sha256(k, c.padded) != p["setup_sha256"].get<std::string>()) {
    throw SetupMismatch("its privacy part's bits, gamma, variance, clip_norm, beta, rotation_seed and "
                                "padded_length are not the signed setup it names (setup_sha256 " +
                                p["setup_sha256"].get<std::string>() + ")");
  }
  if (c.padded == 0 || (c.padded & (c.padded - 1)) != 0 || !(k.beta() > 0 && k.beta() < 1) || !(k.gamma() > 0) ||
      !(k.clip_norm() > 0)) {
    throw std::invalid_argument("its privacy part has a padded_length, beta, gamma or clip_norm out of range");
  }
  c = as_signed(c, k, c.padded);
  const privacy::Mechanism m = round_mechanism(c);
  privacy::validate(m);
  // What a reader may take the spend from (docs/privacy.md) must be what the signed setup gives:
  // a record stating a larger multiplier or smaller sensitivities would let it under-count.
  const auto& s = std::get<privacy::SkellamSum>(m);
  auto stated = [&](const char* key, double want) {
    if (!p.contains(key) || !p[key].is_number()) {
      throw std::invalid_argument(std::string("its privacy part has no number \"") + key + "\"");
    }
    const double got = p[key].get<double>();
    if (!(std::abs(got - want) <= 1e-9 * std::abs(want))) {
      char why[240];
      std::snprintf(why, sizeof why, "its privacy part's %s %.12g is not the %.12g its signed setup gives", key, got,
                    want);
      throw std::invalid_argument(why);
    }
  };
  stated("noise_multiplier", round_noise_multiplier(c));
  stated("l1", s.l1);
  stated("l2", s.l2);
  if (c.count_scale > 0) {
    stated("count_stddev", count_noise_stddev(c));
    stated("update_noise_multiplier", c.noise_multiplier);
  }
  return m;
}

std::optional<privacy::Mechanism> distributed_mechanism_of(const nlohmann::json& record) {
  if (record.value("event", "") != "round") return std::nullopt;
  const std::string status = record.value("status", "");
  if (status == "committed") return recorded_skellam_mechanism(record);
  // An aborted round whose noisy sums were unmasked spent as much as a committed one.
  if (status != "aborted" || !record.contains("privacy") || !record["privacy"].is_object()) return std::nullopt;
  const auto revealed = record["privacy"].find("sums_revealed");
  if (revealed == record["privacy"].end()) return std::nullopt;
  if (!revealed->is_number_unsigned()) throw std::invalid_argument("its privacy part's sums_revealed is not a count");
  if (revealed->get<std::uint64_t>() == 0) return std::nullopt;
  return recorded_skellam_mechanism(record);
}

std::optional<privacy::Mechanism> silo_level_mechanism_of(const nlohmann::json& record) {
  if (auto m = central_mechanism_of(record)) return m;
  return distributed_mechanism_of(record);
}

namespace {

// The setup_sha256 a record's privacy part names ("" when none).
std::string setup_named(const nlohmann::json& record) {
  const auto p = record.find("privacy");
  if (p == record.end() || !p->is_object()) return "";
  const auto s = p->find("setup_sha256");
  return s != p->end() && s->is_string() ? s->get<std::string>() : "";
}

std::string shown(const std::string& setup) { return setup.empty() ? "no setup" : "setup " + setup; }

}  // namespace

bool UnmaskingWatch::closes(const nlohmann::json& record) const {
  return begun_ && record.value("event", "") == "round" && begun_->round == record.value("round", std::uint64_t{0});
}

std::optional<UnmaskCharge> UnmaskingWatch::take(const nlohmann::json& record) {
  const std::string event = record.value("event", "");
  const auto round = record.value("round", std::uint64_t{0});
  const bool closes_it = closes(record);
  if (event != kUnmaskBegun && event != "round" && event != "federation_start") return std::nullopt;
  if (closes_it && setup_named(record) != begun_->setup) {
    throw SetupMismatch("its round record names " + shown(setup_named(record)) +
                                ", but the unmask_begun record it closes names " + shown(begun_->setup) +
                                ": the round would be charged at another setup than the one it unmasked under");
  }
  std::optional<UnmaskCharge> charge;
  if (begun_ && !closes_it) {
    charge = UnmaskCharge{begun_->round, begun_->mechanism, true};
  } else if (closes_it && !distributed_mechanism_of(record)) {
    // Aborted after the server asked for unmask shares, before any sum was revealed (too few
    // answered, a group failed): the shares it holds may unmask a sum; the round spent.
    charge = UnmaskCharge{begun_->round, begun_->mechanism, false};
  }
  begun_.reset();
  if (event == kUnmaskBegun) {
    const auto m = recorded_skellam_mechanism(record);
    if (!m) throw std::invalid_argument("its unmask_begun record has no distributed-DP (skellam) privacy part");
    begun_ = Begun{round, *m, setup_named(record)};
  }
  return charge;
}

std::optional<privacy::Mechanism> UnmaskingWatch::open() const {
  return begun_ ? std::optional<privacy::Mechanism>(begun_->mechanism) : std::nullopt;
}

}  // namespace xsilo::server
