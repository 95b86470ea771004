// The server config's "privacy" block: silo-level differential privacy, central mode
// (server/central_dp.h), and the combinations that would void its guarantee.
#include "server/config_privacy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/config.h"
#include "protocol/compression.h"
#include "robust/rule.h"

namespace xsilo::server {

namespace {

// W by default: the silos a round asks for, or every silo the allow-list names.
double default_denominator(const ConfigNode& root, const ConfigNode& p, const ServerConfig& c) {
  if (c.selection.silos_per_round > 0) return static_cast<double>(c.selection.silos_per_round);
  const auto listed = root.child("allow").str_list("silo");
  const bool any = std::find(listed.begin(), listed.end(), "*") != listed.end();
  if (!c.expected_silos.empty() && !any) return static_cast<double>(c.expected_silos.size());
  p.fail("denominator", "is required when neither selection.silos_per_round nor a list of silos in allow.silo says "
                        "how many silos a round expects (the mean's fixed denominator W: one silo moves the step by "
                        "at most clip_norm / W)");
}

// The budget keys both silo-level modes read alike: epsilon, delta, C, W, and the noise (a fixed
// z, or the rounds the smallest z must last).
template <class Dp>
void read_budget(const ConfigNode& root, const ConfigNode& p, const ServerConfig& c, Dp& dp) {
  if (!p.has("epsilon")) p.fail("epsilon", "is required: the federation's privacy budget");
  dp.epsilon = p.number("epsilon", 0, 1e-3, 1e3);
  dp.delta = p.number("delta", 1e-5, 1e-300, 0.1);
  if (dp.delta <= 0) p.fail("delta", "must be above 0");
  dp.clip_norm = p.number("clip_norm", 1.0, 1e-9, 1e9);
  if (p.has("rounds") && p.has("noise_multiplier")) {
    p.fail("noise_multiplier", "and rounds both set the noise: keep one (rounds: the smallest noise that lasts them)");
  }
  dp.denominator = p.has("denominator") ? p.number("denominator", 1, 1, 1 << 30) : default_denominator(root, p, c);
  if (p.has("noise_multiplier")) {
    dp.noise_multiplier = p.number("noise_multiplier", 1, 1e-3, 1e6);
  } else {
    dp.rounds = static_cast<std::uint64_t>(p.integer("rounds", static_cast<std::int64_t>(c.rounds), 1, 1 << 30));
  }
}

// What central DP cannot be combined with, each with its reason.
void refuse_voiding_combinations(const ConfigNode& root, const ConfigNode& p, const ServerConfig& c) {
  if (c.secure.on()) {
    p.fail("mode", "central needs the server to clip each silo's update, but with secure." +
                       std::string(name(c.secure.mode)) +
                       " the server never sees one (only masked sums); the mode for secure aggregation is "
                       "\"distributed\" (noise added by the silos inside the masked ring)");
  }
  const auto ag = root.child("aggregation");
  const auto& a = c.aggregation;
  if (a.rule.rule != robust::Rule::FedAvg) {
    ag.fail("rule", std::string(robust::name(a.rule.rule)) +
                        " cannot be combined with central DP: the noise is calibrated to one silo moving the mean of "
                        "clipped updates by clip_norm / W, and a robust rule's output moves otherwise (Krum and "
                        "median jump from one input to another, centered clipping iterates; a trimmed mean moves by "
                        "2 clip_norm / (n - 2f) with n the round's own inputs, not a fixed denominator). Use fedavg");
  }
  if (a.rule.nnm || a.rule.bucket > 1) {
    ag.fail(a.rule.nnm ? "nnm" : "bucket", "mixes or groups the inputs before the mean, so one silo reaches more than "
                                           "its own clipped share of the step; central DP needs plain fedavg");
  }
  if (a.clip_norm > 0) {
    ag.fail("clip_norm", "central DP clips every update to privacy.clip_norm; remove aggregation.clip_norm");
  }
  if (c.allow.allows_role(wire::EDGE)) {
    root.child("allow").fail("edge", "edges send one partial sum per region, so the server cannot clip each silo's "
                                     "update as central DP needs; remove allow.edge");
  }
}

// The most silos one secure group's sum may hold: every silo a round selects, at most.
// n, the most silos one group's sum may hold, which gamma is sized for: a round's selection bounds
// every group (a group is a part of it), so n is the most silos a round may select. `max_silos`
// may only raise it: one below what a round can select, or with no bound on the selection (every
// connected silo of allow.silo "*"), is refused, so that no group is ever larger than gamma's n.
std::size_t max_group(const ConfigNode& root, const ConfigNode& p, const ServerConfig& c) {
  const auto& s = c.selection;
  const auto listed = root.child("allow").str_list("silo");
  const bool any = std::find(listed.begin(), listed.end(), "*") != listed.end();
  std::size_t selectable = 0;  // 0: unbounded
  if (s.silos_per_round > 0) {
    selectable =
        static_cast<std::size_t>(std::ceil(static_cast<double>(s.silos_per_round) * (1 + s.over_selection) - 1e-9));
  } else if (!c.expected_silos.empty() && !any) {
    selectable = c.expected_silos.size();
  }
  if (!p.has("max_silos")) {
    if (selectable == 0) {
      p.fail("max_silos", "is required when neither selection.silos_per_round nor a list of silos in allow.silo says "
                          "how many silos a round may hold (the ring must hold the sum of that many silos' updates)");
    }
    return selectable;
  }
  const auto n = static_cast<std::size_t>(p.integer("max_silos", 2, 1, 1 << 20));
  if (selectable == 0) {
    p.fail("max_silos", "bounds nothing while a round selects every connected silo (allow.silo \"*\" and no "
                        "selection.silos_per_round): set selection.silos_per_round so that a round selects at most " +
                            std::to_string(n));
  }
  if (selectable > n) {
    p.fail("max_silos", std::to_string(n) + " is below the " + std::to_string(selectable) +
                            " silos a round may select (selection.silos_per_round with over_selection, or allow.silo): "
                            "a group that large could wrap the ring gamma was sized for");
  }
  return n;
}

// What distributed DP cannot be combined with, each with its reason.
void refuse_voiding_distributed(const ConfigNode& root, const ConfigNode& p, const ServerConfig& c) {
  if (!c.secure.on()) {
    p.fail("mode", "distributed needs secure aggregation (secure.mode \"global\" or \"grouped\"): each silo adds "
                   "only its share of the noise, which protects nothing unless the server sees nothing but the "
                   "masked sum; without secure aggregation use \"central\"");
  }
  if (c.secure.protocol != SecureProtocol::SecAgg) {
    root.child("secure").fail("protocol", "lightsecagg masks in the field of p = 2^32 - 5, not in a ring of 2^bits: "
                                          "the Skellam integers wrap in a power-of-two ring; use secagg");
  }
  if (c.secure.graph) {
    root.child("secure").fail("graph", "SecAgg+'s neighbour graphs reveal sums of as few as a neighbourhood's threshold "
                                       "of survivors, far below half the group: the noise shares sized for that few "
                                       "would sum to many times the planned noise in a full group and overflow the "
                                       "ring that gamma was sized for; use the complete graph (remove secure.graph)");
  }
  const auto ag = root.child("aggregation");
  const auto& a = c.aggregation;
  // A robust rule, nnm or bucketing across secure groups is allowed: the released objects are
  // the group sums, each already carrying the round's noise, and a silo is in one group only, so
  // whatever the server computes from them is post-processing (docs/privacy.md). Secure global
  // mode has one sum and nothing to compare; config_secure.cpp refuses a rule there already.
  if (a.inspects_inputs() && c.secure.mode != SecureMode::Grouped) {
    ag.fail(a.rule.rule != robust::Rule::FedAvg ? "rule" : a.rule.nnm ? "nnm" : "bucket",
            "needs secure.mode \"grouped\" under distributed DP: secure." + std::string(name(c.secure.mode)) +
                " reveals one group sum, nothing to compare");
  }
  if (a.clip_norm > 0) {
    ag.fail("clip_norm", "distributed DP clips every update to privacy.clip_norm; remove aggregation.clip_norm");
  }
  // Adaptive clipping is built (issue 42): every member adds its share of the Skellam noise to its
  // count word too, and each round is accounted with it. Two combinations are not built (nor
  // tested), so they stay refused rather than run with a guarantee nobody checked:
  if (a.adaptive_clip.on() && a.inspects_inputs()) {
    ag.fail("adaptive_clip", "with a robust rule (or nnm, bucket) across the groups is not built under distributed DP: "
                             "the count is calibrated and tested for FedAvg's groups' sums over the fixed denominator "
                             "W only; use fedavg or set privacy.clip_norm");
  }
  if (a.adaptive_clip.on() && protocol::compressed(c.compression)) {
    ag.fail("adaptive_clip", "with compression is not built under distributed DP: a member's count word would count "
                             "its kept coordinates' norm, which no test covers; remove compression or set "
                             "privacy.clip_norm");
  }
  // Secure aggregation takes random_k only (server/config.cpp); its kept set is drawn from the
  // round's seed, public and the same at every silo, so the silos encode those coordinates
  // (clipped to C after the selection, so one silo still moves the sum by at most C) and the
  // mechanism's P is the set's, not the model's. Anything else could not be masked, let alone
  // noised.
  if (protocol::compressed(c.compression) && c.compression.scheme() != wire::Compression::RANDOM_K) {
    root.child("compression").fail("scheme", "distributed DP encodes the rotated update in the ring; only random_k, "
                                             "whose coordinate set is public, combines with it");
  }
}

// The key a finalize_distributed_dp refusal is about: the count's noise, or the ring's bits.
std::string distributed_key(const std::invalid_argument& e) {
  return std::string(e.what()).rfind("count_stddev", 0) == 0 ? "count_stddev" : "bits";
}

DistributedDpConfig parse_distributed(const ConfigNode& root, const ConfigNode& p, ServerConfig& c) {
  DistributedDpConfig dp;
  read_budget(root, p, c, dp);
  const auto& adaptive = c.aggregation.adaptive_clip;
  dp.count_stddev = p.number("count_stddev", 0, 1e-6, 1e12);  // 0: the default (finalize_distributed_dp)
  dp.counts_unclipped = adaptive.on();
  if (p.has("count_stddev") && !adaptive.on()) {
    p.fail("count_stddev", "is the noise of adaptive clipping's unclipped count, and aggregation.adaptive_clip is off");
  }
  if (adaptive.on() && p.has("clip_norm")) {
    p.fail("clip_norm", "and aggregation.adaptive_clip.initial both set the first round's clip norm: keep initial");
  }
  if (adaptive.on()) dp.clip_norm = adaptive.initial;
  dp.bits = static_cast<std::uint32_t>(p.integer("bits", 20, 4, 62));
  dp.ring = c.secure.bits;
  dp.max_group = max_group(root, p, c);
  // The model's size is known when the server loads it: a dimension given here lets the check
  // run now (and the config's tests run without a model).
  const auto dim = static_cast<std::size_t>(p.integer("dim", 0, 0, std::int64_t{1} << 40));
  p.finish();
  refuse_voiding_distributed(root, p, c);
  if (dp.bits > c.secure.bits) {
    p.fail("bits", std::to_string(dp.bits) + " does not fit the masking ring of secure.bits = " +
                       std::to_string(c.secure.bits) + ": the noisy integers live mod 2^bits inside it");
  }
  if (c.secure.bits < 16) {
    root.child("secure").fail("bits", "8 leaves no room for distributed DP's integers; use 16, 32 or 64");
  }
  if (dp.delta * dp.denominator >= 1) {
    c.warnings.push_back(p.key_path("delta") + ": is not below 1 / denominator (" + std::to_string(dp.denominator) +
                         "): at silo level delta should be well below one over the number of silos");
  }
  if (dim > 0) {
    try {
      finalize_distributed_dp(dp, dim);
      if (!fits_another_round(dp, {})) p.fail("noise_multiplier", "is too small for even one round within the budget");
    } catch (const std::invalid_argument& e) {
      p.fail(distributed_key(e), e.what());
    }
  }
  return dp;
}

}  // namespace

void check_distributed_dp(DistributedDpConfig& dp, std::size_t d, const std::string& where) {
  try {
    finalize_distributed_dp(dp, d);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(where + ".privacy." + distributed_key(e) + ": " + e.what());
  }
  if (!fits_another_round(dp, {})) {
    throw ConfigError(where + ".privacy.noise_multiplier: " + std::to_string(dp.noise_multiplier) +
                      " is too small for even one round within epsilon " + std::to_string(dp.epsilon));
  }
}

void parse_privacy(const ConfigNode& root, ServerConfig& c) {
  if (!root.has("privacy")) return;
  const auto p = root.child("privacy");
  const auto level = p.one_of("level", "silo", {"silo", "record"});
  if (level == "record") {
    p.fail("level", "record-level budgets belong to each silo: its agent's config sets privacy.max_epsilon, and the "
                    "server neither sets nor relaxes it (docs/privacy.md); the server's block is \"silo\" level");
  }
  const auto mode = p.one_of("mode", "central", {"central", "distributed"});
  if (mode == "distributed") {
    c.distributed_dp = parse_distributed(root, p, c);
    return;
  }
  CentralDpConfig dp;
  read_budget(root, p, c, dp);
  const auto& adaptive = c.aggregation.adaptive_clip;
  const double count_stddev = p.number("count_stddev", 0, 1e-6, 1e12);
  p.finish();
  refuse_voiding_combinations(root, p, c);
  if (p.has("count_stddev") && !adaptive.on()) {
    p.fail("count_stddev", "is the noise of adaptive clipping's unclipped count, and aggregation.adaptive_clip is off");
  }
  if (adaptive.on() && p.has("clip_norm")) {
    p.fail("clip_norm", "and aggregation.adaptive_clip.initial both set the first round's clip norm: keep initial");
  }
  if (adaptive.on()) dp.clip_norm = adaptive.initial;
  if (dp.rounds > 0) {
    try {
      dp.noise_multiplier = noise_multiplier_for_rounds(dp.epsilon, dp.delta, dp.sample_rate, dp.rounds);
    } catch (const std::exception& e) {
      p.fail("rounds", std::string("no noise multiplier lasts them within epsilon and delta: ") + e.what());
    }
  }
  // Adaptive clipping's count is released with the step (server/central_dp.h): with `rounds`, the
  // noise multiplier above is the round's, shared between the count and the update.
  if (adaptive.on()) {
    const double z_round = dp.rounds > 0 ? dp.noise_multiplier : dp.noise_multiplier * std::sqrt(0.9);
    dp.count_stddev = count_stddev > 0 ? count_stddev : default_count_stddev(dp.denominator, z_round);
    if (dp.rounds > 0) {
      try {
        dp.noise_multiplier = update_noise_multiplier(dp.noise_multiplier, dp.count_stddev);
      } catch (const std::invalid_argument& e) {
        p.fail("count_stddev", std::string(e.what()) + " (the noise that lasts " + std::to_string(dp.rounds) +
                                   " rounds); raise count_stddev or leave it out");
      }
    }
  }
  if (!fits_another_round(dp, {})) {
    privacy::Ledger one;
    one.add(round_mechanism(dp), 1);
    char why[160];
    std::snprintf(why, sizeof why, "%g is too small for even one round: it spends epsilon %.4g, the budget is %g",
                  dp.noise_multiplier, epsilon_of(one, dp.delta), dp.epsilon);
    p.fail("noise_multiplier", why);
  }
  if (dp.delta * dp.denominator >= 1) {
    c.warnings.push_back(p.key_path("delta") + ": is not below 1 / denominator (" + std::to_string(dp.denominator) +
                         "): at silo level delta should be well below one over the number of silos");
  }
  if (dp.rounds > 0 && dp.rounds < c.rounds) {
    c.warnings.push_back(p.key_path("rounds") + ": the noise lasts " + std::to_string(dp.rounds) +
                         " rounds of the " + std::to_string(c.rounds) + " configured; the federation ends when the "
                         "budget is spent");
  }
  c.central_dp = std::move(dp);
}

nlohmann::json privacy_json(const DistributedDpConfig& dp) {
  nlohmann::json j = {{"level", "silo"},           {"mode", "distributed"}, {"epsilon", dp.epsilon},
                      {"delta", dp.delta},         {"clip_norm", dp.clip_norm}, {"denominator", dp.denominator},
                      {"bits", dp.bits},           {"max_silos", dp.max_group}};
  if (dp.rounds > 0) j["rounds"] = dp.rounds;
  else j["noise_multiplier"] = dp.noise_multiplier;
  // Adaptive clipping: the first C is aggregation.adaptive_clip.initial, and the count's noise is kept.
  if (dp.counts_unclipped) {
    j.erase("clip_norm");
    if (dp.count_stddev > 0) j["count_stddev"] = dp.count_stddev;
  }
  return j;
}

nlohmann::json privacy_json(const CentralDpConfig& dp) {
  // The chosen noise multiplier, not the rounds it was chosen for: a config read back keeps the
  // noise the federation started with.
  nlohmann::json j = {{"level", "silo"},   {"mode", "central"},   {"epsilon", dp.epsilon},
                      {"delta", dp.delta}, {"noise_multiplier", dp.noise_multiplier}, {"denominator", dp.denominator}};
  // Adaptive clipping: the first C is aggregation.adaptive_clip.initial, and the count's noise is kept.
  if (dp.count_stddev > 0) j["count_stddev"] = dp.count_stddev;
  else j["clip_norm"] = dp.clip_norm;
  return j;
}

}  // namespace xsilo::server
