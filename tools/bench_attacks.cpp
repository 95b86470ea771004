// xsilo bench attacks: the robust rules against the simulated attacks, as a table of final
// test accuracies (digits, MLP, 10 silos, Dirichlet alpha 0.5).
#include <iostream>

#include <nlohmann/json.hpp>

#include "tools/bench.h"
#include "tools/sim.h"

namespace xsilo::tools {

namespace {
using json = nlohmann::json;

SimConfig base(std::uint64_t rounds) {
  SimConfig c = default_sim_config();
  c.name = "attacks";
  c.silos = 10;
  c.rounds = rounds;
  c.seed = 11;
  c.data_path = data_dir() / "digits.csv.gz";
  c.split = "dirichlet";
  c.alpha = 0.5;
  c.model_kind = "mlp";
  c.hidden = {64};
  c.training = {{"local_epochs", 2}, {"batch_size", 32}, {"learning_rate", 0.05}};
  c.optimizer = {{"kind", "fedavg"}};
  c.selection = {{"min_silos", 10}, {"min_updates", 10}};
  c.baseline = false;
  return c;
}
}  // namespace

int bench_attacks(const AttackBenchOptions& opts) {
  const std::vector<std::pair<std::string, json>> attacks = {
      {"none", json()},
      {"sign_flip", {{"kind", "sign_flip"}, {"scale", 4.0}}},
      {"gaussian", {{"kind", "gaussian"}, {"sigma", 0.1}}},
      {"scaling", {{"kind", "scaling"}, {"factor", 10.0}}},
      {"alie", {{"kind", "alie"}, {"z", 1.0}}},
      {"ipm", {{"kind", "ipm"}, {"epsilon", 0.5}}},
      {"label_flip", {{"kind", "label_flip"}}},
      {"nan", {{"kind", "nan"}}}};
  const auto tmp = std::filesystem::temp_directory_path() / ("xsilo-bench-attacks-" + std::to_string(::getpid()));
  int failures = 0;
  for (std::size_t f : opts.attackers) {
    std::vector<std::pair<std::string, json>> rules = {
        {"fedavg", {{"rule", "fedavg"}}},
        {"krum", {{"rule", "krum"}, {"f", f}}},
        {"multi_krum", {{"rule", "multi_krum"}, {"f", f}}},
        {"median", {{"rule", "median"}}},
        {"trimmed_mean", {{"rule", "trimmed_mean"}, {"f", f}}},
        {"centered_clip", {{"rule", "centered_clip"}, {"tau", opts.tau}, {"iterations", 3}}}};
    if (10 >= 4 * f + 3) rules.insert(rules.begin() + 5, {"bulyan", {{"rule", "bulyan"}, {"f", f}}});
    std::vector<std::vector<std::string>> rows;
    for (const auto& [rule, agg] : rules) {
      std::vector<std::string> row{rule};
      for (const auto& [attack, a] : attacks) {
        SimConfig c = base(opts.rounds);
        c.aggregation = agg;
        // NaN updates are rejected at validation (and use up f): the round commits on the rest.
        if (attack == "nan") c.selection["min_updates"] = 10 - f;
        if (!a.is_null()) {
          c.attackers = f;
          c.attack = a;
        }
        if (!opts.json) std::cerr << f << " attackers, " << rule << ", " << attack << "..." << std::flush;
        double acc = -1;
        try {
          const auto r = run_sim(c, tmp, /*quiet=*/true);
          acc = r.rounds_committed ? r.final_accuracy : -1;
        } catch (const std::exception& e) {
          ++failures;
          std::cerr << " failed: " << e.what();
        }
        if (!opts.json) std::cerr << " " << fmt(100 * acc, 1) << "%\n";
        if (opts.json) {
          std::cout << json{{"bench", "attacks"}, {"attackers", f}, {"rule", rule}, {"attack", attack},
                            {"final_accuracy", acc}}
                           .dump()
                    << std::endl;
        }
        row.push_back(acc < 0 ? "failed" : fmt(100 * acc, 1));
      }
      rows.push_back(row);
    }
    if (!opts.json) {
      std::cout << "\n" << f << " of 10 silos attack (digits, MLP 64, Dirichlet 0.5, " << opts.rounds
                << " rounds; final test accuracy %)\n";
      std::vector<std::string> header{"rule"};
      for (const auto& [attack, a] : attacks) header.push_back(attack);
      print_table(header, rows);
    }
  }
  std::filesystem::remove_all(tmp);
  return failures ? 1 : 0;
}

}  // namespace xsilo::tools
