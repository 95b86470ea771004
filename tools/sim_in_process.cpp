// `xsilo sim --in-process`: the federation's arithmetic without its processes. Every silo's
// trainer, momentum and simulated attack are the agent's own code (make_sim_hooks, run_round,
// apply_momentum, the FaultHook's tamper); every update goes through the server's own
// aggregator (make_aggregator: the upload checks, clipping, the pre-aggregation steps, the
// rule and its fallback, adaptive clipping) and the server optimizer. What is left out is the
// network and the protocol around it: no TLS, no deadlines, no dropouts, no audit log, so the
// modes that live in the protocol (secure aggregation, edges, faults, hostile processes, an
// external trainer) are refused with the reason. It is what large sweeps (xsilo bench
// attacks) run on; a test checks that it commits the same models as the real processes.
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>

#include <spdlog/spdlog.h>

#include "common/config.h"
#include "common/fs.h"
#include "common/mlp.h"
#include "common/safetensors.h"
#include "crypto/hash.h"
#include "server/aggregator.h"
#include "server/config.h"
#include "server/optimizer.h"
#include "silo_agent/config.h"
#include "silo_agent/update.h"
#include "tools/sim.h"
#include "tools/sim_agent.h"

namespace xsilo::tools {

namespace {

// The modes whose behaviour lives in the protocol, not in the arithmetic: refused before any
// file is written or command run.
void refuse_protocol_modes(const SimConfig& cfg) {
  auto refuse = [&](const std::string& what) {
    throw ConfigError("sim --in-process: " + what + " needs the real processes (run xsilo sim without --in-process)");
  };
  if (cfg.secure.is_object() && cfg.secure.value("mode", std::string("off")) != "off") refuse("secure aggregation");
  if (cfg.edges) refuse("edges");
  if (!cfg.faults.empty()) refuse("faults");
  if (!cfg.hostile.empty()) refuse("hostile processes");
  if (cfg.trainer) refuse("an external trainer");
  // The codecs and their error feedback live in the agents' and the server's sessions.
  auto set = [](const nlohmann::json& block) {
    return block.is_object() && block.value("scheme", std::string("none")) != "none";
  };
  if (set(cfg.compression)) refuse("compressed uploads (compression)");
  if (set(cfg.broadcast)) refuse("a compressed broadcast (broadcast)");
  if (cfg.selection.is_object() && cfg.selection.value("silos_per_round", std::size_t{0}) != 0 &&
      cfg.selection.value("silos_per_round", std::size_t{0}) < cfg.silos) {
    refuse("sampling silos per round (selection.silos_per_round)");
  }
}

struct Silo {
  std::string name;
  std::unique_ptr<agent::Trainer> trainer;
  std::unique_ptr<agent::FaultHook> hook;  // the simulated attack, if any
  Model momentum;
};

}  // namespace

SimResult run_sim_in_process(const SimConfig& cfg, const std::filesystem::path& out, const RoundCallback& on_round) {
  // The agents' start-up lines would be noise here: warnings and errors still show.
  struct Quieter {
    spdlog::level::level_enum was = spdlog::get_level();
    Quieter() { spdlog::set_level(std::max(was, spdlog::level::warn)); }
    ~Quieter() { spdlog::set_level(was); }
  } quieter;
  refuse_protocol_modes(cfg);
  FederationFiles f = prepare_federation(cfg, out);
  const auto scfg = server::load_server_config(f.server_config);

  std::vector<Silo> silos;
  for (std::size_t i = 0; i < cfg.silos; ++i) {
    const auto files = write_agent_config(cfg, f, i, {"127.0.0.1:1"});
    auto a = agent::load_agent_config(files.config);
    a.local.workers = 1;  // local workers' all-reduce gives the same sum, up to float rounding
    const SimAgentConfig sim = files.simulate.empty() ? SimAgentConfig{} : load_sim_agent_config(files.simulate);
    auto hooks = make_sim_hooks(a, sim);
    Silo s;
    s.name = f.silos[i];
    s.trainer = hooks.trainer ? std::move(hooks.trainer) : agent::make_trainer(a);
    s.hook = std::move(hooks.faults);
    silos.push_back(std::move(s));
  }

  Model global = init_model(scfg.model);
  server::ServerOptimizer optimizer(scfg.optimizer, global);
  std::optional<double> clip_norm;
  if (scfg.aggregation.adaptive_clip.on()) clip_norm = scfg.aggregation.adaptive_clip.initial;
  std::vector<std::string> names;
  for (const auto& s : silos) names.push_back(s.name);
  const std::size_t need = scfg.selection.min_updates ? scfg.selection.min_updates : scfg.selection.min_silos;

  SimResult result;
  result.exit_code = 0;
  for (std::uint64_t round = 1; round <= scfg.rounds; ++round) {
    auto agg = server::make_aggregator(scfg, global, round, names, clip_norm);
    server::CombineContext ctx{round, scfg.seed, 0};
    std::size_t folded = 0;
    for (auto& s : silos) {
      agent::TrainTask task{round, s.name, scfg.plan};
      agent::RoundOutput o;
      try {
        o = agent::run_round(*s.trainer, global, task);
      } catch (const agent::TrainerError& e) {
        // As an agent does: the silo reports the failure and the round goes on without it.
        spdlog::warn("round {}: {}: training failed: {}", round, s.name, e.what());
        continue;
      }
      if (!o.update || !(o.weight > 0) || !std::isfinite(o.weight)) continue;  // the server refuses such a weight
      if (scfg.plan.silo_momentum() > 0) {
        if (!s.momentum.same_layout(*o.update)) s.momentum = o.update->zeros_like();
        agent::apply_momentum(*o.update, o.weight, s.momentum, scfg.plan.silo_momentum());
      }
      s.hook->tamper(task, global, o.update->flat(), o.weight);
      // The upload, as the server's slot receives it: into the aggregator's buffer, checked.
      auto buf = agg->buffer();
      const auto bytes = std::as_bytes(o.update->flat());
      std::memcpy(buf.bytes.data(), bytes.data(), bytes.size());
      auto check = std::make_shared<protocol::UploadCheck>();
      protocol::check_work(check, buf.bytes.data(), o.update->size(), wire::F32, /*hash=*/true)();
      const server::Contribution c{{s.name}, o.weight, 0, crypto::sha256_hex(o.update->flat()), false};
      const auto r = agg->fold(c, *check);
      if (r.ok()) ++folded;
      else if (r.error == server::FoldError::NonFinite) ++ctx.nonfinite;
    }
    (void)agg->prepare();
    bool committed = folded >= need;
    if (committed) {
      Model next = global.zeros_like();
      const auto c = agg->combine(next.flat(), ctx);
      committed = c.ok;
      if (committed) {
        optimizer.step_into(global.flat(), next.flat());
        global = std::move(next);
        if (c.next_clip_norm) clip_norm = c.next_clip_norm;
        ++result.rounds_committed;
      }
    }
    const auto ev = Network(global).evaluate(global.flat(), f.central_test);
    result.final_accuracy = ev.accuracy;
    result.final_loss = ev.loss;
    if (on_round) on_round(round, committed, global, ev.accuracy, ev.loss);
  }
  save_safetensors(f.out / "model.safetensors", global);
  result.exit_code = result.rounds_committed == scfg.rounds ? 0 : 1;  // as xsilo sim: every round committed
  return result;
}

}  // namespace xsilo::tools
