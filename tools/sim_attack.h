// Simulated attacks, so that researchers can test defences (`xsilo sim`'s per-silo "attack").
// They live with the simulation tools, never in the agent: the sim starts a Byzantine silo as
// `xsilo agent --simulate FILE`, which wraps the agent's update with the attack. Attackers that need the honest updates (ALIE, IPM) collude: they are given
// the honest silos' data and names and recompute those silos' exact updates each round.
#pragma once

#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/dataset.h"
#include "common/config.h"
#include "common/mlp.h"
#include "proto/xsilo.pb.h"

namespace xsilo::tools {

struct AttackConfig {
  std::string kind;  // "" (none), sign_flip, gaussian, scaling, alie, ipm, label_flip, nan, mimic,
                     // model_replacement (docs/robust.md defines each); under secure aggregation,
                     // skip_clipping (factor x delta, encoded without the silo's clipping) and
                     // unclipped_lie (an unclipped count of 7 where a member may add 0 or 1)
  double scale = 1.0;    // sign_flip: delta -> -scale * delta
  double sigma = 1.0;    // gaussian: delta -> N(0, sigma^2) per coordinate
  double factor = 10.0;  // scaling: delta -> factor * delta (model replacement)
  double z = 1.0;        // alie: mean - z * std of the honest deltas, per coordinate
  double epsilon = 0.5;  // ipm: -epsilon * mean of the honest deltas
  double boost = 1.0;    // model_replacement: the upload's norm, in largest honest norms
  struct Honest {
    std::string silo;
    std::filesystem::path train;
  };
  std::vector<Honest> honest;  // the attacks that collude (needs_honest)
  bool active() const { return !kind.empty(); }
  // The attacks computed from the honest silos' deltas: the sim gives the attackers their data.
  bool needs_honest() const { return kind == "alie" || kind == "ipm" || kind == "mimic" || kind == "model_replacement"; }
};

// need_honest: the colluding attacks (needs_honest()) must name the honest silos' data (the sim adds them later).
AttackConfig parse_attack(const ConfigNode& node, bool need_honest = true);


// Replaces `delta` (this silo's honest, unweighted delta) with the attack's. `honest_deltas`
// computes the colluders' view of the honest silos' deltas when the attack needs them.
void apply_attack(const AttackConfig& a, std::span<float> delta, std::uint64_t seed,
                  const std::function<std::vector<std::vector<float>>()>& honest_deltas);

}  // namespace xsilo::tools
