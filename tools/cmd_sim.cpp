// xsilo sim: the researcher's entry point.
#include <cstdio>

#include "common/config.h"
#include "tools/commands.h"
#include "tools/sim.h"

namespace xsilo::tools {

void add_sim(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "sim", "run a whole federation on this machine (real processes, mutual TLS on loopback)");
  auto config = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto quiet = std::make_shared<bool>(false);
  auto in_process = std::make_shared<bool>(false);
  cmd->add_option("--config", *config, "experiment config (JSON); default: breast cancer, 5 silos");
  cmd->add_option("--out", *out, "output folder")->required();
  cmd->add_flag("--quiet", *quiet, "no progress lines");
  cmd->add_flag("--in-process", *in_process,
                "the same trainers, attacks, aggregator and optimizer in one process, without network "
                "(fast sweeps; secure aggregation as its arithmetic; refuses edges, faults, external trainers)");
  cmd->callback([config, out, quiet, in_process, &exit_code] {
    const SimConfig cfg = config->empty() ? default_sim_config() : load_sim_config(*config);
    if (!*in_process) {
      exit_code = run_sim(cfg, *out, *quiet).exit_code;
      return;
    }
    auto say = [&](std::uint64_t round, bool committed, const Model&, double acc, double loss) {
      if (*quiet) return;
      if (committed) std::printf("round %llu/%llu: accuracy %.4f, loss %.4f\n", static_cast<unsigned long long>(round),
                                 static_cast<unsigned long long>(cfg.rounds), acc, loss);
      else std::printf("round %llu/%llu: not committed (too few usable updates)\n",
                       static_cast<unsigned long long>(round), static_cast<unsigned long long>(cfg.rounds));
    };
    const auto r = run_sim_in_process(cfg, *out, say);
    if (!*quiet) std::printf("in-process: %llu of %llu rounds committed; model in %s\n",
                             static_cast<unsigned long long>(r.rounds_committed),
                             static_cast<unsigned long long>(cfg.rounds), (std::filesystem::path(*out) / "model.safetensors").string().c_str());
    if (!*quiet) {
      for (const auto& l : secure_clipping_lines(r)) std::printf("%s\n", l.c_str());
    }
    if (!*quiet && cfg.train_max_ms > 0) {
      std::printf("simulated clock: %.1f s at the last commit (each round's sim_ms in %s)\n",
                  static_cast<double>(r.sim_ms) / 1000.0, (std::filesystem::path(*out) / "rounds.jsonl").string().c_str());
    }
    if (!*quiet && r.epsilon_spent >= 0 && cfg.privacy) {
      std::printf("record-level privacy: epsilon %.3f of %g spent (delta %g), the largest over silos\n", r.epsilon_spent,
                  cfg.privacy->max_epsilon, cfg.privacy->delta);
    } else if (!*quiet && r.epsilon_spent >= 0) {
      std::printf("silo-level %s DP: epsilon %.3f of %g spent (delta %g)\n",
                  cfg.silo_privacy.value("mode", "central").c_str(), r.epsilon_spent,
                  cfg.silo_privacy.value("epsilon", 0.0), cfg.silo_privacy.value("delta", 1e-5));
    }
    exit_code = r.exit_code;
  });
}

}  // namespace xsilo::tools
