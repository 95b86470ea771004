// xsilo server | agent: the daemons, each from one JSON config.
#include <malloc.h>

#include <cstdio>

#include "common/config.h"
#include "common/log.h"
#include "common/net.h"
#include "edge_aggregator/edge.h"
#include "server/daemon.h"
#include "common/safetensors.h"
#include "silo_agent/agent.h"
#include "silo_agent/external_trainer.h"
#include "tools/commands.h"
#include "tools/sim_agent.h"
#include "tools/sim_edge.h"
#include "tools/sim_server.h"
#include "transport/tls.h"

namespace xsilo::tools {

namespace {

// This process's own certificate, at start-up: the operator's first reminder to renew it.
void warn_if_own_certificate_expires(const transport::TlsFiles& tls, int warn_days) {
  try {
    if (auto w = transport::expiry_warning(transport::own_identity(tls), warn_days); !w.empty()) spdlog::warn("own {}", w);
  } catch (const std::exception&) {
    // An unreadable certificate is reported, with the file, when the daemon loads its TLS files.
  }
}

// A daemon with several network threads: one heap for all of them. With an arena per thread, a
// frame freed by one thread could not serve the next frame of another, and each arena kept its
// own (xsilo main keeps freed frames in the process): 16 silos on 2 and 4 threads peaked 3-8 MiB
// above the one-thread server (docs/benchmarks.md, "Network threads").
void one_heap_for(std::size_t network_threads) {
  if (network_threads > 1) mallopt(M_ARENA_MAX, 1);
}

}  // namespace

void add_server(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("server", "run the central server (rounds, aggregation, audit log)");
  auto config = std::make_shared<std::string>();
  auto log_file = std::make_shared<std::string>();
  auto listen = std::make_shared<std::string>();
  auto simulate = std::make_shared<std::string>();
  cmd->add_option("--config", *config, "server config (JSON)")->required();
  cmd->add_option("--log-file", *log_file, "log here instead of stderr");
  cmd->add_option("--listen", *listen,
                  "HOST:PORT to listen on instead of the config's listen (the config file, whose hash the "
                  "audit records, stays as it is: e.g. to bind again the port a first start chose with port 0)");
  auto start = std::make_shared<server::StartOptions>();
  cmd->add_option("--resume-from-round", start->resume_from_round,
                  "the operator's decision: go on from this committed round (its checkpoint must be intact); the "
                  "rounds committed after it are superseded, and the audit log records the decision "
                  "(docs/operations.md, \"When the state folder is damaged\")");
  // Simulations only (tests of the trust model): a server that deviates.
  cmd->add_option("--simulate", *simulate, "simulation hooks (JSON, written by xsilo sim)")->group("");
  cmd->callback([config, log_file, listen, start, simulate, &exit_code] {
    auto cfg = server::load_server_config(*config);
    if (!listen->empty()) {
      try {
        cfg.listen = parse_endpoint(*listen);
      } catch (const std::exception& e) {
        throw ConfigError(std::string("server --listen: ") + e.what());
      }
    }
    init_logging("server", cfg.log_level, *log_file, cfg.log_format);
    for (const auto& w : cfg.warnings) spdlog::warn("config {}: {}", cfg.file.string(), w);
    warn_if_own_certificate_expires(cfg.tls, cfg.channel.certificate_warn_days);
    std::unique_ptr<server::ServerHook> hook;
    if (!simulate->empty()) hook = make_sim_server_hook(cfg, load_sim_server_config(*simulate));
    one_heap_for(cfg.network_threads);
    exit_code = server::run_server(cfg, *start, std::move(hook));
  });
}

void add_edge(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("edge", "run a regional edge aggregator (relays rounds, sums its region)");
  auto config = std::make_shared<std::string>();
  auto log_file = std::make_shared<std::string>();
  auto simulate = std::make_shared<std::string>();
  cmd->add_option("--config", *config, "edge config (JSON)")->required();
  cmd->add_option("--log-file", *log_file, "log here instead of stderr");
  // Simulations only (tests of the trust model): a hostile edge.
  cmd->add_option("--simulate", *simulate, "simulation hooks (JSON, written by xsilo sim)")->group("");
  cmd->callback([config, log_file, simulate, &exit_code] {
    auto cfg = edge::load_edge_config(*config);
    init_logging("edge", cfg.log_level, *log_file, cfg.log_format);
    warn_if_own_certificate_expires(cfg.tls, cfg.channel.certificate_warn_days);
    std::unique_ptr<edge::EdgeHook> hook;
    if (!simulate->empty()) hook = make_sim_edge_hook(cfg, load_sim_edge_config(*simulate));
    one_heap_for(cfg.network_threads);
    exit_code = edge::run_edge(cfg, std::move(hook));
  });
}

void add_agent(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("agent", "run a silo agent (dials out, trains locally, uploads)");
  auto config = std::make_shared<std::string>();
  auto log_file = std::make_shared<std::string>();
  auto simulate = std::make_shared<std::string>();
  auto initial = std::make_shared<std::string>();
  cmd->add_option("--config", *config, "agent config (JSON)")->required();
  cmd->add_option("--log-file", *log_file, "log here instead of stderr");
  cmd->add_option("--write-initial-model", *initial,
                  "ask the external trainer for its initial weights (an init task), write them as the server's "
                  "initial model (safetensors) and exit");
  // Simulations only (xsilo sim, benchmarks): attacks, crashes, the synthetic trainer.
  cmd->add_option("--simulate", *simulate, "simulation hooks (JSON, written by xsilo sim)")->group("");
  cmd->callback([config, log_file, simulate, initial, &exit_code] {
    auto cfg = agent::load_agent_config(*config);
    init_logging("agent", cfg.log_level, *log_file, cfg.log_format);
    if (!initial->empty()) {
      if (cfg.trainer != agent::TrainerKind::External) {
        throw ConfigError("--write-initial-model asks an external trainer; " + *config + " has the built-in one (the "
                          "server makes its initial model from its own config)");
      }
      agent::ExternalTrainer trainer(cfg);
      trainer.set_one_shot();
      save_safetensors(*initial, trainer.initial_model({0, "initial-model", {}}));
      std::printf("wrote %s: the server's \"model\": {\"kind\": \"file\", \"path\": ...}\n", initial->c_str());
      exit_code = 0;
      return;
    }
    warn_if_own_certificate_expires(cfg.tls, cfg.channel.certificate_warn_days);
    agent::AgentHooks hooks;
    if (!simulate->empty()) hooks = make_sim_hooks(cfg, load_sim_agent_config(*simulate));
    exit_code = agent::run_agent(cfg, std::move(hooks));
  });
}

}  // namespace xsilo::tools
