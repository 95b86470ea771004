// The server config's "privacy" block: silo-level differential privacy, central mode
// (server/central_dp.h), and the combinations that would void its guarantee.
#include "server/config_privacy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/config.h"
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

// What central DP cannot be combined with, each with its reason.
void refuse_voiding_combinations(const ConfigNode& root, const ConfigNode& p, const ServerConfig& c) {
  if (c.secure.on()) {
    p.fail("mode", "central needs the server to clip each silo's update, but with secure." +
                       std::string(name(c.secure.mode)) +
                       " the server never sees one (only masked sums); the mode for secure aggregation is "
                       "\"distributed\" (noise added by the silos inside the masked ring), not built yet");
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
  if (a.adaptive_clip.on()) {
    ag.fail("adaptive_clip", "adapts the clip norm to the quantile of the updates' norms, a release of the updates "
                             "that central DP's accountant does not count; set privacy.clip_norm");
  }
  if (c.allow.allows_role(wire::EDGE)) {
    root.child("allow").fail("edge", "edges send one partial sum per region, so the server cannot clip each silo's "
                                     "update as central DP needs; remove allow.edge");
  }
}

}  // namespace

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
    p.fail("mode", "distributed (each silo's share of discrete Gaussian or Skellam noise inside secure aggregation) "
                   "is not built yet; \"central\" has the server add the noise (a trusted server)");
  }
  CentralDpConfig dp;
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
  p.finish();
  refuse_voiding_combinations(root, p, c);
  if (dp.rounds > 0) {
    try {
      dp.noise_multiplier = noise_multiplier_for_rounds(dp.epsilon, dp.delta, dp.sample_rate, dp.rounds);
    } catch (const std::exception& e) {
      p.fail("rounds", std::string("no noise multiplier lasts them within epsilon and delta: ") + e.what());
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

nlohmann::json privacy_json(const CentralDpConfig& dp) {
  // The chosen noise multiplier, not the rounds it was chosen for: a config read back keeps the
  // noise the federation started with.
  return {{"level", "silo"},           {"mode", "central"},        {"epsilon", dp.epsilon},
          {"delta", dp.delta},         {"clip_norm", dp.clip_norm}, {"noise_multiplier", dp.noise_multiplier},
          {"denominator", dp.denominator}};
}

}  // namespace xsilo::server
