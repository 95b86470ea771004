// The files of a simulated federation: the data split, a throwaway PKI, the initial model, and
// every process's config written from its struct.
#include "tools/sim.h"

#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/config.h"
#include "common/fs.h"
#include "crypto/sources.h"
#include "edge_aggregator/config.h"
#include "server/config.h"
#include "common/npz.h"
#include "common/safetensors.h"
#include "silo_agent/config.h"
#include "silo_agent/external_trainer.h"
#include "tools/sim_agent.h"
#include "transport/config.h"
#include "transport/pki.h"

namespace xsilo::tools {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

void write_json(const std::filesystem::path& p, const json& j) { atomic_write_file(p, j.dump(2) + "\n"); }

}  // namespace

agent::AgentConfig central_trainer_config(const SimConfig& cfg, const FederationFiles& f,
                                         const std::filesystem::path& state_dir) {
  agent::AgentConfig a;
  a.trainer = agent::TrainerKind::External;
  a.external.command = cfg.trainer->command;
  a.external.cwd = cfg.trainer->cwd;
  a.external.env = cfg.trainer->env;
  a.external.startup = std::chrono::milliseconds(static_cast<long>(cfg.trainer->startup_s * 1000));
  a.external.evaluate = true;
  a.external.max_failures = 1000;
  a.train_data = f.central_train_csv;
  a.test_data = f.central_test_csv;
  a.state_dir = state_dir;
  a.feature_stats_file = f.feature_stats_file;
  a.feature_stats = f.feature_stats;
  return a;
}

crypto::secagg::Floor sim_secure_floor(const SimConfig& cfg) {
  crypto::secagg::Floor floor;
  if (cfg.secure.is_object() && cfg.secure.contains("graph") && cfg.secure["graph"].is_object()) {
    floor.corrupt = cfg.secure["graph"].value("corrupt", floor.corrupt);
  }
  return floor;
}

std::uint64_t sim_seed(const SimConfig& cfg, std::string_view purpose) {
  return crypto::derive_seed(cfg.seed, 0, purpose);
}

std::uint64_t model_init_seed(const SimConfig& cfg) {
  return sim_seed(cfg, "model-init") & ((std::uint64_t{1} << 53) - 1);
}

std::string silo_name(std::size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "hospital-%02zu", i + 1);
  return buf;
}

std::string edge_name(std::size_t e) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "edge-%02zu", e + 1);
  return buf;
}

namespace {

// The data: a stratified test split, the training rows dealt to silos, the pooled rows.
void split_data(const SimConfig& cfg, FederationFiles& f) {
  const auto& out = f.out;
  // Data: a stratified test split, then the training rows dealt to silos.
  f.all = load_csv(cfg.data_path);
  const Dataset& all = f.all;
  auto [train_rows, test_rows] = train_test_split(all, cfg.test_fraction, sim_seed(cfg, "test-rows"));
  if (cfg.standardize) f.standardizer = Standardizer::fit(subset(all, train_rows));
  const auto parts = cfg.split == "iid"
                         ? split_iid(train_rows, cfg.silos, sim_seed(cfg, "silo-rows"))
                         : split_dirichlet(all, train_rows, cfg.silos, cfg.alpha, sim_seed(cfg, "silo-rows"));
  const auto test_parts = split_iid(test_rows, cfg.silos, sim_seed(cfg, "silo-test-rows"));
  f.central_test = subset(all, test_rows);
  f.central_train = subset(all, train_rows);
  if (cfg.standardize) {
    f.standardizer.apply(f.central_test);
    f.standardizer.apply(f.central_train);
  }
  // Each silo's files as researchers have them: CSV with a header (x0..x{d-1},label) and the
  // same rows as .npz (x float32 [rows, features], y int64 [rows]), raw, not standardized.
  for (std::size_t i = 0; i < cfg.silos; ++i) {
    f.silos.push_back(silo_name(i));
    const auto dir = out / "silos" / f.silos.back();
    for (const auto& [name, rows] : {std::pair{"train", &parts[i]}, {"test", &test_parts[i]}}) {
      const Dataset d = subset(all, *rows);
      save_csv(dir / (std::string(name) + ".csv"), d, /*header=*/true);
      save_npz(dir / (std::string(name) + ".npz"), d);
    }
  }
  // The pooled rows as files too (raw, like the silos'): an external trainer's central run.
  f.central_train_csv = out / "central" / "train.csv";
  f.central_test_csv = out / "central" / "test.csv";
  if (cfg.trainer && !cfg.trainer->silo_data.empty()) {
    Dataset train, test;
    for (const auto& [tr, te] : cfg.trainer->silo_data) {
      for (auto [into, from] : {std::pair{&train, tr}, {&test, te}}) {
        if (from.empty()) continue;
        const Dataset d = load_csv(from);
        if (into->rows == 0) *into = d;
        else {
          into->x.insert(into->x.end(), d.x.begin(), d.x.end());
          into->y.insert(into->y.end(), d.y.begin(), d.y.end());
          into->rows += d.rows;
        }
      }
    }
    save_csv(f.central_train_csv, train, true);
    save_csv(f.central_test_csv, test, true);
  } else {
    save_csv(f.central_train_csv, subset(all, train_rows), true);
    save_csv(f.central_test_csv, subset(all, test_rows), true);
  }
}

// The initial model of a user's own network: given; else asked of the script itself through the
// trainer protocol (an "init" task, answered by xc.tasks(model) / xc.run); else written by
// trainer.init, for those who keep such a mode.
void make_initial_model(const SimConfig& cfg, FederationFiles& f) {
  const auto& out = f.out;
  if (cfg.model_kind == "file") {
    f.initial_model = cfg.model_file;
    if ((f.initial_model.empty() || !std::filesystem::exists(f.initial_model)) && cfg.trainer->init.empty()) {
      f.initial_model = out / "init.safetensors";
      agent::AgentConfig a = central_trainer_config(cfg, f, out / "central" / "init-state");
      agent::ExternalTrainer trainer(a);
      trainer.set_one_shot();
      wire::TrainingPlan plan;
      plan.set_seed(cfg.seed);
      plan.set_config_json(cfg.training.dump());
      try {
        save_safetensors(f.initial_model, trainer.initial_model({0, "central", plan}));
      } catch (const agent::TrainerError& e) {
        // A command that could not be started is not the script's fault: the message says so.
        if (e.reason() == wire::TRAINER_DID_NOT_START) {
          throw std::runtime_error(std::string("sim: cannot ask the training script for its initial weights: ") + e.what());
        }
        throw std::runtime_error(std::string("sim: the training script did not give its initial weights (it answers the "
                                             "agent's init task when it calls xc.tasks(model), xc.epochs(model, ...) "
                                             "or xc.run(model, ...); or give trainer.init): ") +
                                 e.what());
      }
    } else if (!std::filesystem::exists(f.initial_model)) {
      f.initial_model = out / "init.safetensors";
      std::vector<std::string> argv;
      for (auto a : cfg.trainer->init) {
        if (auto at = a.find("{path}"); at != std::string::npos) a.replace(at, 6, f.initial_model.string());
        argv.push_back(a);
      }
      std::filesystem::remove(f.initial_model);
      ProcessOptions in_cwd;
      in_cwd.cwd = cfg.trainer->cwd;
      in_cwd.env = cfg.trainer->env;  // what reaches the trainers reaches their init too (PYTHONPATH, say)
      Process init(argv, out / "logs" / "init.log", in_cwd);
      const auto code = init.wait(std::chrono::minutes(5));
      if (code.value_or(-1) != 0 || !std::filesystem::exists(f.initial_model)) {
        throw std::runtime_error("sim: trainer.init did not write " + f.initial_model.string() + " (exit code " +
                                 std::to_string(code.value_or(-1)) + "); its log ends:\n" +
                                 log_tail(out / "logs" / "init.log"));
      }
    }
  }
}

// A throwaway PKI: one CA, one kit per process.
transport::MetricsOptions sim_metrics(const FederationFiles& f, const std::string& process) {
  transport::MetricsOptions m;
  m.listen = Endpoint{"127.0.0.1", 0};
  m.port_file = metrics_port_file(f, process);
  std::filesystem::create_directories(m.port_file.parent_path());
  std::filesystem::remove(m.port_file);
  return m;
}

void make_pki(const SimConfig& cfg, FederationFiles& f) {
  const auto& out = f.out;
  // A throwaway PKI: one CA, one kit per process.
  f.pki = out / "pki";
  std::filesystem::remove_all(f.pki);
  transport::pki_init(f.pki, cfg.federation);
  transport::pki_issue(f.pki, {wire::SERVER, "server"});
  for (const auto& n : f.silos) transport::pki_issue(f.pki, {wire::SILO, n});
  // An operator's kit: `xsilo status --kit pki/kits/operator` watches the running federation.
  transport::pki_issue(f.pki, {wire::ADMIN, "operator"});
  for (std::size_t e = 0; e < cfg.edges; ++e) {
    f.edges.push_back(edge_name(e));
    transport::pki_issue(f.pki, {wire::EDGE, f.edges.back()});
  }
  // Ports are the kernel's choice (port 0) and known once each process listens (pin_port): a
  // port picked here and bound later could be taken by another process in between.
  f.server_port = 0;
  f.edge_ports.assign(f.edges.size(), 0);
  for (const auto& e : f.edges) std::filesystem::remove(out / (e + ".port"));
}

// The server's config.
void write_server_config(const SimConfig& cfg, FederationFiles& f) {
  const auto& out = f.out;
  const Dataset& all = f.all;
  // The server's config.
  f.state = out / "server";
  f.logs = out / "logs";
  f.port_file = out / "server.port";
  std::filesystem::remove_all(f.state);
  std::filesystem::remove(f.port_file);
  json server = {{"federation", cfg.federation},
                 {"listen", "127.0.0.1:" + std::to_string(f.server_port)},
                 {"port_file", f.port_file.string()},
                 {"tls", {{"kit", (f.pki / "kits" / "server").string()}}},
                 {"allow", f.edges.empty() ? json{{"silo", f.silos}, {"admin", {"operator"}}}
                                           : json{{"silo", f.silos}, {"edge", f.edges}, {"admin", {"operator"}}}},
                 {"state_dir", f.state.string()},
                 {"keep_checkpoints", 0},
                 {"rounds", cfg.rounds},
                 {"seed", cfg.seed},
                 {"model",
                  cfg.model_kind == "file"
                      ? json{{"kind", "file"}, {"path", f.initial_model.string()}}
                      : json{{"kind", cfg.model_kind}, {"inputs", all.features}, {"classes", all.classes}, {"init_seed", model_init_seed(cfg)}}},
                 {"training", cfg.training},
                 {"log_format", cfg.log_format},
                 {"optimizer", cfg.optimizer}};
  if (!cfg.hidden.empty()) server["model"]["hidden"] = cfg.hidden;
  if (cfg.metrics) server["metrics"] = transport::to_json(sim_metrics(f, "server"));
  json selection = cfg.selection.is_object() ? cfg.selection : json::object();
  if (!selection.contains("min_silos")) selection["min_silos"] = sim_min_silos(cfg);  // the user's: the loader judges it
  server["selection"] = selection;
  json deadlines = cfg.deadlines.is_object() ? cfg.deadlines : json::object();
  if (!deadlines.contains("join_s")) deadlines["join_s"] = 10;
  if (!deadlines.contains("train_s")) deadlines["train_s"] = 60;
  if (!deadlines.contains("upload_s")) deadlines["upload_s"] = 30;
  server["deadlines"] = deadlines;
  if (cfg.transport.is_object()) server["transport"] = cfg.transport;
  if (cfg.aggregation.is_object()) server["aggregation"] = cfg.aggregation;
  if (cfg.secure.is_object()) server["secure"] = cfg.secure;
  if (cfg.compression.is_object()) server["compression"] = cfg.compression;
  if (cfg.broadcast.is_object()) server["broadcast"] = cfg.broadcast;
  if (cfg.schedule.is_object()) server["schedule"] = cfg.schedule;
  if (cfg.uploads_at_once > 0) server["uploads_at_once"] = cfg.uploads_at_once;
  if (cfg.silo_privacy.is_object()) server["privacy"] = cfg.silo_privacy;
  f.server_config = out / "configs" / "server.json";
  // The sim's blocks are the user's server-config blocks: the server's loader checks them, and
  // the config written is the loaded struct's own JSON.
  write_json(f.server_config, server);
  try {
    const auto loaded = server::load_server_config(f.server_config);
    for (const auto& w : loaded.warnings) {
      spdlog::warn("sim config {}: {}", cfg.file.empty() ? std::string("defaults") : cfg.file.string(), w);
    }
    write_json(f.server_config, server::to_json(loaded));
  } catch (const ConfigError& e) {
    throw ConfigError(std::string(e.what()) + " (generated from sim config " +
                      (cfg.file.empty() ? std::string("defaults") : cfg.file.string()) + ")");
  }
}

// The edges' configs.
void write_edge_configs(const SimConfig& cfg, FederationFiles& f) {
  for (std::size_t e = 0; e < f.edges.size(); ++e) {
    edge::EdgeConfig edge;
    edge.federation = cfg.federation;
    edge.listen = {"127.0.0.1", f.edge_ports[e]};
    edge.port_file = f.out / (f.edges[e] + ".port");
    edge.upstreams = {{"127.0.0.1", f.server_port}};
    edge.tls = transport::TlsFiles::from_kit(f.pki / "kits" / f.edges[e]);
    edge.allow.allow(wire::SILO, {f.silos.begin(), f.silos.end()});  // any silo of the federation may fail over here
    edge.reconnect = {std::chrono::milliseconds(100), std::chrono::milliseconds(1000), 0};
    edge.log_format = cfg.log_format;
    if (cfg.metrics) edge.metrics = sim_metrics(f, f.edges[e]);
    if (cfg.transport.is_object()) {
      edge.channel = transport::parse_channel_options(ConfigNode(cfg.transport, cfg.file.string(), ".transport"));
    }
    write_json(edge_config_path(f, e), edge::to_json(edge));
  }
}

}  // namespace

Status check_split(const SimConfig& cfg) {
  try {
    const Dataset all = load_csv(cfg.data_path);
    const auto rows = train_test_split(all, cfg.test_fraction, sim_seed(cfg, "test-rows")).first;
    if (cfg.split == "iid") split_iid(rows, cfg.silos, sim_seed(cfg, "silo-rows"));
    else split_dirichlet(all, rows, cfg.silos, cfg.alpha, sim_seed(cfg, "silo-rows"));
    return {};
  } catch (const std::exception& e) {
    return Error(e.what());
  }
}

std::size_t sim_min_silos(const SimConfig& cfg) {
  const json selection = cfg.selection.is_object() ? cfg.selection : json::object();
  // A count as JSON holds it: parsed (unsigned) or built in C++ (signed).
  auto count = [](const json& v) -> std::optional<std::size_t> {
    if (v.is_number_unsigned()) return v.get<std::size_t>();
    if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return static_cast<std::size_t>(v.get<std::int64_t>());
    return std::nullopt;
  };
  if (const auto n = selection.contains("min_silos") ? count(selection["min_silos"]) : std::nullopt) return *n;
  // A majority, and at least the min_updates asked for (a round starts with no fewer); without
  // one, under secure aggregation at least a group (secure.min_group, 3 by default), which a
  // secure sum never goes below, where the federation has that many silos.
  std::size_t least = std::max<std::size_t>(1, cfg.silos / 2 + 1);
  const std::string mode = cfg.secure.is_object() ? cfg.secure.value("mode", "off") : "off";
  if (const auto u = selection.contains("min_updates") ? count(selection["min_updates"]) : std::nullopt) {
    least = std::max(least, *u);
  } else if (mode != "off") {
    const auto g = count(cfg.secure.contains("min_group") ? cfg.secure["min_group"] : json(3));
    if (g && *g <= cfg.silos) least = std::max(least, *g);
  }
  return least;
}

FederationFiles prepare_federation(const SimConfig& cfg, const std::filesystem::path& out_arg) {
  // Every path written into a config is absolute: a config resolves relative paths against its
  // own folder, so a path relative to the current folder would mean something else there.
  const auto out = std::filesystem::absolute(out_arg).lexically_normal();
  if (cfg.data_path.empty() || !std::filesystem::exists(cfg.data_path)) {
    throw ConfigError("sim: data set not found in " + data_dir().string() +
                      " (set XSILO_DATA_DIR to the folder holding breast_cancer.csv)");
  }
  FederationFiles f;
  f.out = out;
  std::filesystem::create_directories(out);
  std::filesystem::remove_all(out / "logs");
  std::filesystem::remove_all(out / "silos");  // an earlier run's silo state (momentum, witnessed audit heads)
  f.logs = out / "logs";
  std::filesystem::create_directories(f.logs);

  split_data(cfg, f);
  make_pki(cfg, f);
  if (cfg.standardize) {
    std::vector<std::filesystem::path> train_files;
    for (std::size_t i = 0; i < cfg.silos; ++i) {
      const bool own = cfg.trainer && !cfg.trainer->silo_data.empty();
      train_files.push_back(own ? cfg.trainer->silo_data[i].first : f.out / "silos" / f.silos[i] / "train.csv");
    }
    // A plain federation shows the server every update anyway: the silos' sums are added up
    // here. A secure one computes them under its own secure aggregation.
    f.feature_stats = federation_feature_stats(train_files);
    if (cfg.secure.is_object() && cfg.secure.value("mode", "off") != "off") {
      f.feature_stats = secure_feature_stats(cfg, f, train_files, f.feature_stats);
    }
    f.feature_stats_file = f.out / "feature_stats.json";
    save_feature_stats(f.feature_stats_file, f.feature_stats);
  }
  make_initial_model(cfg, f);
  write_server_config(cfg, f);
  write_edge_configs(cfg, f);
  return f;
}

std::filesystem::path edge_config_path(const FederationFiles& f, std::size_t e) {
  return f.out / "configs" / (f.edges[e] + ".json");
}

std::vector<std::string> agent_upstreams(const SimConfig& cfg, const FederationFiles& f, std::size_t i) {
  std::vector<std::string> up;
  if (!f.edges.empty()) {
    up.push_back("127.0.0.1:" + std::to_string(f.edge_ports[i % f.edges.size()]));
    if (f.edges.size() > 1) up.push_back("127.0.0.1:" + std::to_string(f.edge_ports[(i + 1) % f.edges.size()]));
  }
  up.push_back("127.0.0.1:" + std::to_string(f.server_port));
  (void)cfg;
  return up;
}

namespace {

// The port a process wrote to its port file (a number and a newline), or nothing yet.
std::optional<std::uint16_t> read_port_file(const std::filesystem::path& p) {
  if (!std::filesystem::exists(p)) return std::nullopt;
  const std::string text = read_file(p);
  if (text.empty() || text.back() != '\n') return std::nullopt;
  return static_cast<std::uint16_t>(std::stoi(text));
}

// Waits for `p` to name a port; throws with the log's tail if the process dies first.
std::uint16_t wait_for_port_file(Process& proc, const std::string& who, const std::filesystem::path& p,
                                 const std::filesystem::path& log, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (auto port = read_port_file(p)) return *port;
    if (!proc.running()) throw std::runtime_error(who + " exited during start-up:\n" + log_tail(log));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  throw std::runtime_error(who + " did not start in time:\n" + log_tail(log));
}

// Sets `key` of the JSON config at `p` to `value`, leaving the rest as it is.
void set_config_key(const std::filesystem::path& p, const std::string& key, const json& value) {
  auto j = json::parse(read_file(p));
  j[key] = value;
  write_json(p, j);
}

std::string loopback(std::uint16_t port) { return "127.0.0.1:" + std::to_string(port); }

}  // namespace

std::uint16_t wait_for_port(Process& server, FederationFiles& f, std::chrono::milliseconds timeout) {
  const auto port = wait_for_port_file(server, "the server", f.port_file, f.logs / "server.log", timeout);
  if (port != f.server_port) {
    // Pinned: a restarted server binds the same port (server_argv) and the edges dial it. The
    // server's config file stays byte for byte what the server read: its hash is in the audit
    // record of every round.
    f.server_port = port;
    for (std::size_t e = 0; e < f.edges.size(); ++e) {
      set_config_key(edge_config_path(f, e), "upstreams", json::array({loopback(port)}));
    }
  }
  return port;
}

void wait_for_edge(Process& edge, FederationFiles& f, std::size_t e, std::chrono::milliseconds timeout) {
  const auto port = wait_for_port_file(edge, f.edges[e], f.out / (f.edges[e] + ".port"),
                                       f.logs / (f.edges[e] + ".log"), timeout);
  if (port != f.edge_ports[e]) {
    f.edge_ports[e] = port;  // pinned: a restarted edge binds the same port its silos dial
    set_config_key(edge_config_path(f, e), "listen", loopback(port));
  }
}

std::vector<std::string> server_argv(const FederationFiles& f, const std::string& xsilo) {
  std::vector<std::string> a{xsilo, "server", "--config", f.server_config.string()};
  if (f.server_port) a.insert(a.end(), {"--listen", loopback(f.server_port)});
  if (!f.server_simulate.empty()) a.insert(a.end(), {"--simulate", f.server_simulate.string()});
  return a;
}

std::vector<std::string> AgentFiles::argv(const std::string& xsilo) const {
  std::vector<std::string> a{xsilo, "agent", "--config", config.string()};
  if (!simulate.empty()) a.insert(a.end(), {"--simulate", simulate.string()});
  return a;
}

AgentFiles write_agent_config(const SimConfig& cfg, const FederationFiles& f, std::size_t i,
                              const std::vector<std::string>& upstreams) {
  const auto dir = f.out / "silos" / f.silos[i];
  agent::AgentConfig a;
  a.federation = cfg.federation;
  for (const auto& u : upstreams) a.upstreams.push_back(parse_endpoint(u));
  a.tls = transport::TlsFiles::from_kit(f.pki / "kits" / f.silos[i]);
  a.reconnect = {std::chrono::milliseconds(100), std::chrono::milliseconds(1000), 0};
  a.log_format = cfg.log_format;
  if (cfg.metrics) a.metrics = sim_metrics(f, f.silos[i]);
  if (!f.edges.empty()) a.failover_probe = std::chrono::milliseconds(1000);
  if (cfg.transport.is_object()) {
    a.channel = transport::parse_channel_options(ConfigNode(cfg.transport, cfg.file.string(), ".transport"));
  }
  a.train_data = dir / "train.csv";
  a.test_data = dir / "test.csv";
  a.state_dir = dir / "state";
  a.secure_floor = sim_secure_floor(cfg);
  if (cfg.trainer) {
    const auto& t = *cfg.trainer;
    a.trainer = agent::TrainerKind::External;
    a.external.command = t.command;
    a.external.cwd = t.cwd;
    a.external.env = t.env;
    a.external.startup = std::chrono::milliseconds(static_cast<long>(t.startup_s * 1000));
    a.external.task_timeout = std::chrono::milliseconds(static_cast<long>(t.task_timeout_s * 1000));
    a.external.max_failures = t.max_failures;
    a.external.evaluate = t.evaluate;
    if (!t.silo_data.empty()) std::tie(a.train_data, a.test_data) = t.silo_data[i];
  } else if (cfg.standardize) {
    a.standardize = "federated";
  }
  if (!f.feature_stats.empty()) {
    a.feature_stats_file = f.feature_stats_file;
    a.feature_stats = f.feature_stats;
  }
  if (cfg.local.is_object()) a.local = agent::parse_local(ConfigNode(cfg.local, cfg.file.string(), ".local"), a.trainer);
  if (cfg.privacy) a.privacy = *cfg.privacy;
  AgentFiles files;
  files.config = f.out / "configs" / (f.silos[i] + ".json");
  write_json(files.config, agent::to_json(a));

  // What makes this silo a simulated one: its crash, its attack.
  SimAgentConfig sim;
  for (const auto& fault : cfg.faults) {
    if (fault.process == f.silos[i] && fault.phase.rfind("after_", 0) == 0) {
      sim.crash_after = fault.phase.substr(6);
      sim.crash_round = fault.round;
    }
  }
  if (auto h = cfg.hostile.find(f.silos[i]); h != cfg.hostile.end()) sim.hostile = h->second;
  // The last straggler_silos silos are the slow ones (stragglers.factor times train_ms).
  const std::uint64_t slow = i + cfg.straggler_silos >= cfg.silos ? cfg.straggler_factor : 1;
  sim.train_min_ms = cfg.train_min_ms * slow;
  sim.train_max_ms = cfg.train_max_ms * slow;
  if (i >= cfg.silos - cfg.attackers) {
    sim.attack = parse_attack(ConfigNode(cfg.attack, cfg.file.string(), ".attack"), /*need_honest=*/false);
    if (sim.attack.needs_honest()) {
      for (std::size_t h = 0; h < cfg.silos - cfg.attackers; ++h) {
        sim.attack.honest.push_back({f.silos[h], f.out / "silos" / f.silos[h] / "train.csv"});
      }
    }
  }
  if (sim.active()) {
    files.simulate = f.out / "configs" / (f.silos[i] + ".simulate.json");
    write_json(files.simulate, to_json(sim));
  }
  return files;
}

}  // namespace xsilo::tools
