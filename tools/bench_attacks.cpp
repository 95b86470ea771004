// xsilo bench attacks: robust rules and pre-aggregation steps against the simulated attacks,
// as tables of final test accuracies (mean and spread over seeds), per data set, label skew
// and number of attackers. Every run is a whole federation: in process by default (the
// agents' trainers and attacks, the server's aggregator; tests hold it to the real processes'
// models), or as real processes over mutual TLS with --processes.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "tools/bench.h"
#include "tools/sim.h"

namespace xsilo::tools {

namespace {
using json = nlohmann::json;

struct Setting {
  std::string dataset;
  double alpha = 0.5;
  std::size_t attackers = 2;
  std::size_t f = 2;  // what the rules assume
  std::size_t silos = 10;
};

// The model and training of each task: the digits MLP of the quick start, breast cancer's
// logistic regression, and digits under a logistic regression (a second small logistic task,
// with updates of another scale than breast cancer's).
SimConfig base(const Setting& s, std::uint64_t seed, std::uint64_t rounds) {
  SimConfig c = default_sim_config();
  c.name = "attacks";
  c.silos = s.silos;
  c.rounds = rounds;
  c.seed = seed;
  c.data_path = data_dir() / (s.dataset == "breast_cancer" ? "breast_cancer.csv" : "digits.csv.gz");
  c.split = "dirichlet";
  c.alpha = s.alpha;
  if (s.dataset == "digits") {
    c.model_kind = "mlp";
    c.hidden = {64};
    c.training = {{"local_epochs", 2}, {"batch_size", 32}, {"learning_rate", 0.05}};
  } else if (s.dataset == "digits_logistic") {
    c.model_kind = "logistic";
    c.training = {{"local_epochs", 1}, {"batch_size", 32}, {"learning_rate", 0.05}};
  } else {
    c.model_kind = "logistic";
    c.training = {{"local_epochs", 1}, {"batch_size", 16}, {"learning_rate", 0.1}};
  }
  c.optimizer = {{"kind", "fedavg"}};
  c.selection = {{"min_silos", s.silos}, {"min_updates", s.silos}};
  c.baseline = false;
  return c;
}

const std::vector<std::pair<std::string, json>>& attacks() {
  static const std::vector<std::pair<std::string, json>> a = {
      {"none", json()},
      {"sign_flip", {{"kind", "sign_flip"}, {"scale", 4.0}}},
      {"sign_flip20", {{"kind", "sign_flip"}, {"scale", 20.0}}},
      {"gaussian", {{"kind", "gaussian"}, {"sigma", 0.1}}},
      {"scaling", {{"kind", "scaling"}, {"factor", 10.0}}},
      {"alie", {{"kind", "alie"}, {"z", 1.0}}},
      {"ipm", {{"kind", "ipm"}, {"epsilon", 0.5}}},
      {"ipm10", {{"kind", "ipm"}, {"epsilon", 10.0}}},
      {"label_flip", {{"kind", "label_flip"}}},
      {"nan", {{"kind", "nan"}}},
      {"mimic", {{"kind", "mimic"}}},
      {"model_repl", {{"kind", "model_replacement"}, {"boost", 1.0}}}};
  return a;
}

}  // namespace

std::vector<Defence> attack_bench_defences(std::size_t f, double tau, std::size_t iterations, std::size_t silos,
                                           double oppose, double one_sided, double lag) {
  const json cclip = {{"rule", "centered_clip"},
                      {"tau", tau > 0 ? json(tau) : json("auto")},
                      {"iterations", iterations},
                      {"oppose", oppose},
                      {"one_sided", one_sided},
                      {"lag", lag}};
  const json adaptive = {{"quantile", 0.5}, {"lr", 0.2}, {"initial", 1.0}};
  std::vector<Defence> d = {
      {"fedavg", {{"rule", "fedavg"}}, {}, {}},
      {"krum", {{"rule", "krum"}, {"f", f}}, {}, {}},
      {"multi_krum", {{"rule", "multi_krum"}, {"f", f}}, {}, {}},
      {"median", {{"rule", "median"}}, {}, {}},
      {"trimmed_mean", {{"rule", "trimmed_mean"}, {"f", f}}, {}, {}},
      {"centered_clip", cclip, {}, {}},
  };
  json unrejecting = cclip;  // the paper's rule: every input pulls by up to the radius
  unrejecting["reject"] = 0;
  d.push_back({"cclip_noreject", unrejecting, {}, {}});
  json unopposing = cclip;  // the rule of 2026-12-05: distances only, no alignment with the last step
  unopposing["oppose"] = 0;
  d.push_back({"cclip_nooppose", unopposing, {}, {}});
  json two_sided = cclip;  // without the one-sided test (before 2026-12-05's third run)
  two_sided["one_sided"] = 0;
  d.push_back({"cclip_noonesided", two_sided, {}, {}});
  json unlagging = cclip;  // without the lag test (before 2026-12-06)
  unlagging["lag"] = 0;
  d.push_back({"cclip_nolag", unlagging, {}, {}});
  if (silos >= 4 * f + 3) d.push_back({"bulyan", {{"rule", "bulyan"}, {"f", f}}, {}, {}});
  // The steps of docs/robust.md, in the combinations their papers recommend.
  d.push_back({"nnm+trimmed_mean", {{"rule", "trimmed_mean"}, {"f", f}, {"nnm", true}}, {}, {}});
  d.push_back({"nnm+multi_krum", {{"rule", "multi_krum"}, {"f", f}, {"nnm", true}}, {}, {}});
  json mixed = cclip;
  mixed["nnm"] = true;
  mixed["f"] = f;
  d.push_back({"nnm+cclip", mixed, {}, {}});
  json bucketed = cclip;
  bucketed["bucket"] = 2;
  d.push_back({"bucket2+cclip", bucketed, {}, {}});
  d.push_back({"momentum+cclip", cclip, {{"silo_momentum", 0.9}}, {}});
  d.push_back({"momentum+nnm+tm", {{"rule", "trimmed_mean"}, {"f", f}, {"nnm", true}}, {{"silo_momentum", 0.9}}, {}});
  d.push_back({"adaptclip+fedavg", {{"rule", "fedavg"}, {"adaptive_clip", adaptive}}, {}, {}});
  d.push_back({"adaptclip+nnm+tm", {{"rule", "trimmed_mean"}, {"f", f}, {"nnm", true}, {"adaptive_clip", adaptive}}, {}, {}});
  json clipped_mixed = mixed;
  clipped_mixed["adaptive_clip"] = adaptive;
  d.push_back({"adaptclip+nnm+cclip", clipped_mixed, {}, {}});
  // Secure rounds in groups of 3 (a silo's default floor: no sum of fewer than 3 is revealed),
  // silos / 3 group means: a Byzantine silo spoils its group's mean, so f counts groups (10
  // silos make 3 means, which withstand one spoiled mean; 30 make 10). With adaptive clipping every member clips its own delta to the
  // round's C before it is masked: an attacker's share of its group's mean is at most C / 3.
  const json groups = {{"mode", "grouped"}, {"min_group", 3},      {"group_dropouts", 0}, {"modulus_bits", 64},
                       {"fraction_bits", 24}, {"clip_norm", 100}, {"max_weight", 1000}};
  d.push_back({"groups+fedavg", {{"rule", "fedavg"}}, {}, groups});
  d.push_back({"groups+median", {{"rule", "median"}}, {}, groups});
  d.push_back({"groups+cclip", cclip, {}, groups});
  json clipped = cclip;
  clipped["adaptive_clip"] = adaptive;
  d.push_back({"groups+adaptclip+cclip", clipped, {}, groups});
  d.push_back({"groups+adaptclip+fedavg", {{"rule", "fedavg"}, {"adaptive_clip", adaptive}}, {}, groups});
  return d;
}

namespace {

struct Cell {
  std::vector<double> acc;  // per seed, in [0, 1]
  std::string refused;      // why the config was refused ("" when it ran)
  double mean() const {
    double s = 0;
    for (double a : acc) s += a;
    return acc.empty() ? NAN : s / double(acc.size());
  }
  double sd() const {
    if (acc.size() < 2) return 0;
    const double m = mean();
    double s = 0;
    for (double a : acc) s += (a - m) * (a - m);
    return std::sqrt(s / double(acc.size() - 1));
  }
  std::string text() const {
    if (!refused.empty()) return "refused";
    if (acc.empty()) return "failed";
    return fmt(100 * mean(), 1) + (acc.size() > 1 ? " ±" + fmt(100 * sd(), 1) : "");
  }
};

// The seeds a setting runs on: the ones asked for, except those whose Dirichlet split cannot
// give every silo enough rows (tiny silos at alpha 0.1 on breast cancer's 455 training rows),
// each replaced by the next seed that can; `note` says which.
std::vector<std::uint64_t> usable_seeds(const Setting& s, const std::vector<std::uint64_t>& asked, std::uint64_t rounds,
                                        std::string& note) {
  std::vector<std::uint64_t> out;
  std::string skipped, why;
  std::uint64_t next = asked.empty() ? 1 : *std::max_element(asked.begin(), asked.end()) + 1;
  for (auto seed : asked) {
    for (int tries = 0; tries < 100; ++tries) {
      const auto split = check_split(base(s, seed, rounds));
      if (split) {
        out.push_back(seed);
        break;
      }
      skipped += (skipped.empty() ? "" : ", ") + std::to_string(seed);
      why = split.error().message();
      seed = next++;
    }
  }
  if (!skipped.empty()) {
    std::string used;
    for (auto seed : out) used += (used.empty() ? "" : ", ") + std::to_string(seed);
    note = "seeds " + used + ": seeds " + skipped + " cannot split the data (" + why + ")";
  }
  return out;
}

std::string setting_name(const Setting& s) {
  return s.dataset + ", Dirichlet " + fmt(s.alpha, 1) + ", " + std::to_string(s.attackers) + " of " + std::to_string(s.silos) + " attack" +
         (s.f != s.attackers ? " (rules assume f = " + std::to_string(s.f) + ")" : "");
}

// Every setting asked for: each dataset x alpha x number of attackers.
std::vector<Setting> settings_of(const AttackBenchOptions& opts) {
  std::vector<Setting> settings;
  for (const auto& ds : opts.datasets) {
    if (ds != "digits" && ds != "breast_cancer" && ds != "digits_logistic") {
      throw ConfigError("bench attacks: unknown task " + ds + " (digits, breast_cancer, digits_logistic)");
    }
    for (double alpha : opts.alpha) {
      for (std::size_t n : opts.attackers) settings.push_back({ds, alpha, n, opts.f ? opts.f : n, opts.silos});
    }
  }
  return settings;
}

// --defences and --attacks: empty asks for all.
bool wanted(const std::vector<std::string>& only, const std::string& name) {
  return only.empty() || std::find(only.begin(), only.end(), name) != only.end();
}

// One cell of a setting's table: the defence against the attack, a federation per seed. A refusal
// of the configuration ends the cell; a failed run counts in `failures`.
void run_cell(const Setting& s, const Defence& def, const std::string& attack, const json& a,
              const std::vector<std::uint64_t>& seeds, const AttackBenchOptions& opts, const std::filesystem::path& tmp,
              Cell& cell, int& failures) {
  for (auto seed : seeds) {
    SimConfig c = base(s, seed, opts.rounds);
    c.aggregation = def.aggregation;
    if (!def.secure.is_null()) c.secure = def.secure;
    for (const auto& [k, v] : def.training.items()) c.training[k] = v;
    // NaN updates are rejected at validation (and use up f): the round commits on the rest.
    if (attack == "nan") c.selection["min_updates"] = s.silos - s.attackers;
    if (!a.is_null()) {
      c.attackers = s.attackers;
      c.attack = a;
    }
    double acc = -1;
    try {
      const auto r = opts.processes ? run_sim(c, tmp, /*quiet=*/true) : run_sim_in_process(c, tmp);
      if (r.rounds_committed) cell.acc.push_back(acc = r.final_accuracy);
      else ++failures;
    } catch (const ConfigError& e) {
      cell.refused = e.what();
      break;
    } catch (const std::exception& e) {
      ++failures;
      std::cerr << "  " << setting_name(s) << ", " << def.name << ", " << attack << ", seed " << seed
                << ": failed: " << e.what() << "\n";
    }
    if (opts.json) {
      std::cout << json{{"bench", "attacks"}, {"dataset", s.dataset},     {"alpha", s.alpha},
                        {"attackers", s.attackers}, {"defence", def.name}, {"attack", attack},
                        {"seed", seed},           {"final_accuracy", acc}}
                       .dump()
                << std::endl;
    }
  }
}

// A setting's table (a row per defence, a column per attack, and the worst drop), then the refusals.
void print_setting(const Setting& s, const AttackBenchOptions& opts, const std::vector<std::uint64_t>& seeds,
                   const std::string& seed_note, std::vector<std::vector<std::string>>& rows,
                   std::map<std::string, std::map<std::string, Cell>>& cells) {
  std::cout << "\n" << setting_name(s) << " (" << opts.rounds << " rounds; final test accuracy %, mean ± sd over "
            << seeds.size() << " seeds)\n";
  if (!seed_note.empty()) std::cout << "  " << seed_note << "\n";
  std::vector<std::string> header{"defence"};
  for (const auto& [attack, a] : attacks()) {
    if (wanted(opts.attacks, attack)) header.push_back(attack);
  }
  header.push_back("worst drop");
  // The last column: how far the worst attack takes each defence below its own clean run.
  for (auto& row : rows) {
    const auto& byattack = cells[row[0]];
    const auto clean = byattack.find("none");
    double worst = 0;
    std::string which;
    for (const auto& [attack, cell] : byattack) {
      if (attack == "none" || clean == byattack.end() || !cell.refused.empty() || cell.acc.empty()) continue;
      const double drop = 100 * (clean->second.mean() - cell.mean());
      if (drop > worst || which.empty()) worst = drop, which = attack;
    }
    row.push_back(which.empty() ? "-" : fmt(worst, 1) + " (" + which + ")");
  }
  print_table(header, rows);
  for (const auto& [def, byattack] : cells) {
    for (const auto& [attack, cell] : byattack) {
      if (!cell.refused.empty()) {
        std::cout << "  " << def << " / " << attack << " refused: " << cell.refused << "\n";
        break;
      }
    }
  }
}

}  // namespace

int bench_attacks(const AttackBenchOptions& opts) {
  const auto tmp = std::filesystem::temp_directory_path() / ("xsilo-bench-attacks-" + std::to_string(::getpid()));
  int failures = 0;
  const std::vector<Setting> settings = settings_of(opts);
  std::cerr << "bench attacks: " << settings.size() << " settings x " << opts.seeds.size() << " seeds, "
            << (opts.processes ? "real processes over mutual TLS" : "in process (xsilo sim --in-process)") << "\n";
  for (const auto& s : settings) {
    const auto defences = attack_bench_defences(s.f, opts.tau, opts.iterations, s.silos, opts.oppose, opts.one_sided, opts.lag);
    std::string seed_note;
    const auto seeds = usable_seeds(s, opts.seeds, opts.rounds, seed_note);
    std::vector<std::vector<std::string>> rows;
    std::map<std::string, std::map<std::string, Cell>> cells;
    for (const auto& def : defences) {
      if (!wanted(opts.defences, def.name)) continue;
      std::vector<std::string> row{def.name};
      for (const auto& [attack, a] : attacks()) {
        if (!wanted(opts.attacks, attack)) continue;
        Cell& cell = cells[def.name][attack];
        run_cell(s, def, attack, a, seeds, opts, tmp, cell, failures);
        std::cerr << "  " << setting_name(s) << " | " << def.name << " | " << attack << ": " << cell.text() << "\n";
        row.push_back(cell.text());
      }
      rows.push_back(row);
    }
    if (opts.json) continue;
    print_setting(s, opts, seeds, seed_note, rows, cells);
  }
  std::filesystem::remove_all(tmp);
  return failures ? 1 : 0;
}

}  // namespace xsilo::tools
