// xsilo sim: the researcher's entry point.
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
  cmd->add_option("--config", *config, "experiment config (JSON); default: breast cancer, 5 silos");
  cmd->add_option("--out", *out, "output folder")->required();
  cmd->add_flag("--quiet", *quiet, "no progress lines");
  cmd->callback([config, out, quiet, &exit_code] {
    const SimConfig cfg = config->empty() ? default_sim_config() : load_sim_config(*config);
    exit_code = run_sim(cfg, *out, *quiet).exit_code;
  });
}

}  // namespace xsilo::tools
