#include "tools/sim.h"

#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "common/config.h"
#include "common/dataset.h"
#include "common/fs.h"
#include "common/mlp.h"
#include "common/safetensors.h"
#include "edge_aggregator/config.h"
#include "server/config.h"
#include "server/metrics.h"
#include "silo_agent/config.h"
#include "silo_agent/external_trainer.h"
#include "tools/sim_agent.h"
#include "transport/config.h"
#include "silo_agent/sgd.h"
#include "common/process.h"
#include "transport/pki.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace xsilo::tools {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_interrupt(int) { g_interrupted = 1; }

std::filesystem::path resolve_dataset(const std::string& name) {
  for (const char* ext : {".csv", ".csv.gz"}) {
    const auto p = data_dir() / (name + ext);
    if (std::filesystem::exists(p)) return p;
  }
  return {};
}

std::string silo_name(std::size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "hospital-%02zu", i + 1);
  return buf;
}

void write_json(const std::filesystem::path& p, const json& j) { atomic_write_file(p, j.dump(2) + "\n"); }


}  // namespace


std::filesystem::path data_dir() {
  if (const char* d = std::getenv("XSILO_DATA_DIR")) return d;
  return std::filesystem::path(XSILO_SOURCE_DIR) / "data";
}

SimConfig default_sim_config() {
  SimConfig c;
  c.data_path = resolve_dataset("breast_cancer");
  c.training = {{"local_epochs", 1}, {"batch_size", 16}, {"learning_rate", 0.1}};
  c.optimizer = {{"kind", "fedavg"}};
  return c;
}

SimConfig load_sim_config(const std::filesystem::path& file) {
  const auto j = ConfigNode::load_file(file);
  ConfigNode root(j, file.string());
  SimConfig c = default_sim_config();
  c.file = file;
  c.name = root.str("name", file.stem().string());
  c.federation = root.str("federation", c.federation);
  c.silos = static_cast<std::size_t>(root.integer("silos", 5, 1, 1000));
  c.rounds = static_cast<std::uint64_t>(root.integer("rounds", 20, 1, 100000));
  c.seed = static_cast<std::uint64_t>(root.integer("seed", 7, 0));
  c.baseline = root.boolean("baseline", true);

  const auto data = root.child("data");
  if (data.has("path")) {
    c.data_path = data.path("path", "");
    if (!std::filesystem::exists(c.data_path)) data.fail("path", "file " + c.data_path.string() + " does not exist");
    data.str("dataset", "");
  } else {
    const auto name = data.one_of("dataset", "breast_cancer", {"breast_cancer", "digits"});
    c.data_path = resolve_dataset(name);
    if (c.data_path.empty()) {
      data.fail("dataset", "no " + name + ".csv(.gz) in " + data_dir().string() +
                               " (set XSILO_DATA_DIR to the folder holding the data)");
    }
  }
  c.test_fraction = data.number("test_fraction", 0.2, 0.01, 0.9);
  c.standardize = data.boolean("standardize", true);
  c.split = data.one_of("split", "dirichlet", {"dirichlet", "iid"});
  c.alpha = data.number("alpha", 0.5, 1e-3, 1e6);
  data.finish();

  const auto model = root.child("model");
  c.model_kind = model.one_of("kind", "logistic", {"logistic", "mlp", "file"});
  for (auto h : model.int_list("hidden", 1, 1 << 16)) c.hidden.push_back(static_cast<std::size_t>(h));
  if (c.model_kind == "logistic" && !c.hidden.empty()) model.fail("hidden", "a logistic model has no hidden layers");
  if (c.model_kind == "file") {
    c.model_file = model.path("path", "");
    if (c.model_file.empty()) model.fail("path", "is required: the initial model as a safetensors file");
  }
  model.finish();

  if (root.has("trainer")) {
    const auto t = root.child("trainer");
    SimConfig::Trainer tr;
    tr.command = t.str_list("command");
    if (tr.command.empty()) t.fail("command", "is required: the training script's command line");
    tr.init = t.str_list("init");
    tr.cwd = t.path("cwd", "");
    if (tr.cwd.empty()) tr.cwd = std::filesystem::absolute(file).parent_path();
    const auto& env = t.raw("env");
    if (!env.is_null()) {
      if (!env.is_object()) t.fail("env", "must be an object of NAME: \"value\"");
      for (auto it = env.begin(); it != env.end(); ++it) {
        if (!it->is_string()) t.fail("env", "value of " + it.key() + " must be a string");
        tr.env.emplace_back(it.key(), it->get<std::string>());
      }
    }
    tr.startup_s = t.number("startup_s", 120, 0.1, 86400);
    tr.task_timeout_s = t.number("task_timeout_s", 0, 0, 7 * 86400);
    tr.max_failures = static_cast<int>(t.integer("max_failures", 3, 1, 1000));
    tr.evaluate = t.boolean("evaluate", true);
    for (const auto& d : t.child_list("silo_data")) {
      tr.silo_data.emplace_back(d.path("train", ""), d.path("test", ""));
      if (tr.silo_data.back().first.empty()) d.fail("train", "is required");
      d.finish();
    }
    t.finish();
    if (!tr.silo_data.empty() && tr.silo_data.size() != c.silos) {
      t.fail("silo_data", "names " + std::to_string(tr.silo_data.size()) + " silos' data, but silos is " +
                              std::to_string(c.silos));
    }
    if (c.model_kind != "file") {
      model.fail("kind", "an external trainer trains its own model: give \"kind\": \"file\" and the initial model's "
                         "\"path\" (trainer.init can write it)");
    }
    if (!std::filesystem::exists(c.model_file) && tr.init.empty()) {
      model.fail("path", "file " + c.model_file.string() + " does not exist (trainer.init can write it)");
    }
    c.trainer = std::move(tr);
  } else if (c.model_kind == "file" && !std::filesystem::exists(c.model_file)) {
    model.fail("path", "file " + c.model_file.string() + " does not exist");
  }

  auto pass = [&](const char* key, json& into) {
    const auto& v = root.raw(key);
    if (v.is_null()) return;
    if (!v.is_object()) root.fail(key, "must be an object");
    into = v;
  };
  pass("training", c.training);
  pass("optimizer", c.optimizer);
  pass("selection", c.selection);
  pass("deadlines", c.deadlines);
  pass("transport", c.transport);
  pass("aggregation", c.aggregation);
  pass("secure", c.secure);
  pass("local", c.local);
  c.edges = static_cast<std::size_t>(root.integer("edges", 0, 0, 64));
  for (const auto& fn : root.child_list("faults")) {
    SimConfig::Fault fault;
    fault.process = fn.str_required("process");
    fault.action = fn.one_of("action", "kill", {"kill", "restart"});
    fault.round = static_cast<std::uint64_t>(fn.integer("round", 1, 1, static_cast<std::int64_t>(c.rounds)));
    fault.phase = fn.one_of("phase", "train", {"train", "upload", "after_keys", "after_shares"});
    if (fault.phase.rfind("after_", 0) == 0 && fault.process.rfind("hospital-", 0) != 0) {
      fn.fail("phase", fault.phase + " applies to silos (hospital-NN) only");
    }
    if (c.trainer && fault.phase.rfind("after_", 0) == 0) {
      fn.fail("phase", fault.phase + " needs the built-in trainer (it is a hook inside the silo's simulated agent)");
    }
    fn.finish();
    c.faults.push_back(fault);
  }
  const auto att = root.child("attack");
  if (root.has("attack")) {
    c.attackers = static_cast<std::size_t>(att.integer("silos", 1, 0, static_cast<std::int64_t>(c.silos) - 1));
    c.attack = nlohmann::json::object();
    for (const char* key : {"kind", "scale", "sigma", "factor", "z", "epsilon"}) {
      if (!att.raw(key).is_null()) c.attack[key] = att.raw(key);
    }
    att.finish();
    if (!c.attack.contains("kind")) att.fail("kind", "is required");
  }
  root.finish();
  return c;
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

  // Data: a stratified test split, then the training rows dealt to silos.
  f.all = load_csv(cfg.data_path);
  const Dataset& all = f.all;
  auto [train_rows, test_rows] = train_test_split(all, cfg.test_fraction, cfg.seed);
  if (cfg.standardize) f.standardizer = Standardizer::fit(subset(all, train_rows));
  const auto parts = cfg.split == "iid"
                         ? split_iid(train_rows, cfg.silos, cfg.seed + 1)
                         : split_dirichlet(all, train_rows, cfg.silos, cfg.alpha, cfg.seed + 1);
  const auto test_parts = split_iid(test_rows, cfg.silos, cfg.seed + 2);
  f.central_test = subset(all, test_rows);
  f.central_train = subset(all, train_rows);
  if (cfg.standardize) {
    f.standardizer.apply(f.central_test);
    f.standardizer.apply(f.central_train);
  }
  for (std::size_t i = 0; i < cfg.silos; ++i) {
    f.silos.push_back(silo_name(i));
    const auto dir = out / "silos" / f.silos.back();
    save_csv(dir / "train.csv", subset(all, parts[i]));
    save_csv(dir / "test.csv", subset(all, test_parts[i]));
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
    save_csv(f.central_train_csv, train);
    save_csv(f.central_test_csv, test);
  } else {
    save_csv(f.central_train_csv, subset(all, train_rows));
    save_csv(f.central_test_csv, subset(all, test_rows));
  }

  // The initial model of a user's own network: given, or written by the trainer's init command.
  if (cfg.model_kind == "file") {
    f.initial_model = cfg.model_file;
    if (!std::filesystem::exists(f.initial_model)) {
      f.initial_model = out / "init.safetensors";
      std::vector<std::string> argv;
      for (auto a : cfg.trainer->init) {
        if (auto at = a.find("{path}"); at != std::string::npos) a.replace(at, 6, f.initial_model.string());
        argv.push_back(a);
      }
      std::filesystem::remove(f.initial_model);
      ProcessOptions in_cwd;
      in_cwd.cwd = cfg.trainer->cwd;
      Process init(argv, out / "logs" / "init.log", in_cwd);
      const auto code = init.wait(std::chrono::minutes(5));
      if (code.value_or(-1) != 0 || !std::filesystem::exists(f.initial_model)) {
        throw std::runtime_error("sim: trainer.init did not write " + f.initial_model.string() + " (exit code " +
                                 std::to_string(code.value_or(-1)) + "); its log ends:\n" +
                                 log_tail(out / "logs" / "init.log"));
      }
    }
  }

  // A throwaway PKI: one CA, one kit per process.
  f.pki = out / "pki";
  std::filesystem::remove_all(f.pki);
  transport::pki_init(f.pki, cfg.federation);
  transport::pki_issue(f.pki, {wire::SERVER, "server"});
  for (const auto& n : f.silos) transport::pki_issue(f.pki, {wire::SILO, n});
  for (std::size_t e = 0; e < cfg.edges; ++e) {
    char name[32];
    std::snprintf(name, sizeof name, "edge-%02zu", e + 1);
    f.edges.push_back(name);
    transport::pki_issue(f.pki, {wire::EDGE, name});
    f.edge_ports.push_back(free_loopback_port());
  }
  f.server_port = free_loopback_port();
  for (const auto& e : f.edges) std::filesystem::remove(out / (e + ".port"));

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
                 {"allow", f.edges.empty() ? json{{"silo", f.silos}} : json{{"silo", f.silos}, {"edge", f.edges}}},
                 {"state_dir", f.state.string()},
                 {"keep_checkpoints", 0},
                 {"rounds", cfg.rounds},
                 {"seed", cfg.seed},
                 {"model",
                  cfg.model_kind == "file"
                      ? json{{"kind", "file"}, {"path", f.initial_model.string()}}
                      : json{{"kind", cfg.model_kind}, {"inputs", all.features}, {"classes", all.classes}, {"init_seed", cfg.seed}}},
                 {"training", cfg.training},
                 {"optimizer", cfg.optimizer}};
  if (!cfg.hidden.empty()) server["model"]["hidden"] = cfg.hidden;
  json selection = cfg.selection.is_object() ? cfg.selection : json::object();
  if (!selection.contains("min_silos")) selection["min_silos"] = std::max<std::size_t>(1, cfg.silos / 2 + 1);
  server["selection"] = selection;
  json deadlines = cfg.deadlines.is_object() ? cfg.deadlines : json::object();
  if (!deadlines.contains("join_s")) deadlines["join_s"] = 10;
  if (!deadlines.contains("train_s")) deadlines["train_s"] = 60;
  if (!deadlines.contains("upload_s")) deadlines["upload_s"] = 30;
  server["deadlines"] = deadlines;
  if (cfg.transport.is_object()) server["transport"] = cfg.transport;
  if (cfg.aggregation.is_object()) server["aggregation"] = cfg.aggregation;
  if (cfg.secure.is_object()) server["secure"] = cfg.secure;
  f.server_config = out / "configs" / "server.json";
  // The sim's blocks are the user's server-config blocks: the server's loader checks them, and
  // the config written is the loaded struct's own JSON.
  write_json(f.server_config, server);
  try {
    write_json(f.server_config, server::to_json(server::load_server_config(f.server_config)));
  } catch (const ConfigError& e) {
    throw ConfigError(std::string(e.what()) + " (generated from sim config " +
                      (cfg.file.empty() ? std::string("defaults") : cfg.file.string()) + ")");
  }
  for (std::size_t e = 0; e < f.edges.size(); ++e) {
    edge::EdgeConfig edge;
    edge.federation = cfg.federation;
    edge.listen = {"127.0.0.1", f.edge_ports[e]};
    edge.port_file = f.out / (f.edges[e] + ".port");
    edge.upstreams = {{"127.0.0.1", f.server_port}};
    edge.tls = transport::TlsFiles::from_kit(f.pki / "kits" / f.edges[e]);
    edge.allow.allow(wire::SILO, {f.silos.begin(), f.silos.end()});  // any silo of the federation may fail over here
    edge.reconnect = {std::chrono::milliseconds(100), std::chrono::milliseconds(1000), 0};
    if (cfg.transport.is_object()) {
      edge.channel = transport::parse_channel_options(ConfigNode(cfg.transport, cfg.file.string(), ".transport"));
    }
    write_json(edge_config_path(f, e), edge::to_json(edge));
  }
  return f;
}

void wait_for_edge(Process& edge, const FederationFiles& f, std::size_t e, std::chrono::milliseconds timeout) {
  const auto port_file = f.out / (f.edges[e] + ".port");
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (std::filesystem::exists(port_file) && !read_file(port_file).empty()) return;
    if (!edge.running()) {
      throw std::runtime_error(f.edges[e] + " exited during start-up:\n" + log_tail(f.logs / (f.edges[e] + ".log")));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  throw std::runtime_error(f.edges[e] + " did not start in time");
}

std::filesystem::path edge_config_path(const FederationFiles& f, std::size_t e) {
  return f.out / "configs" / (f.edges[e] + ".json");
}

std::uint16_t free_loopback_port() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
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

std::uint16_t wait_for_port(Process& server, const FederationFiles& f,
                            std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (std::filesystem::exists(f.port_file)) {
      const std::string text = read_file(f.port_file);
      if (!text.empty() && text.back() == '\n') return static_cast<std::uint16_t>(std::stoi(text));
    }
    if (!server.running()) {
      throw std::runtime_error("the server exited during start-up:\n" + log_tail(f.logs / "server.log"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  throw std::runtime_error("the server did not start in time:\n" + log_tail(f.logs / "server.log"));
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
  if (!f.edges.empty()) a.failover_probe = std::chrono::milliseconds(1000);
  if (cfg.transport.is_object()) {
    a.channel = transport::parse_channel_options(ConfigNode(cfg.transport, cfg.file.string(), ".transport"));
  }
  a.train_data = dir / "train.csv";
  a.test_data = dir / "test.csv";
  a.state_dir = dir / "state";
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
    a.standardize = "given";
    a.given = f.standardizer;
  }
  if (cfg.local.is_object()) a.local = agent::parse_local(ConfigNode(cfg.local, cfg.file.string(), ".local"), a.trainer);
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
  if (i >= cfg.silos - cfg.attackers) {
    sim.attack = parse_attack(ConfigNode(cfg.attack, cfg.file.string(), ".attack"), /*need_honest=*/false);
    if (sim.attack.kind == "alie" || sim.attack.kind == "ipm") {
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

namespace {

// The training plan the sim's training block makes (what the server sends each silo).
wire::TrainingPlan sim_plan(const SimConfig& cfg, std::uint64_t epochs_factor = 1) {
  json tr = cfg.training;
  const auto epochs = tr.value("local_epochs", 1u) * epochs_factor;
  tr["local_epochs"] = epochs;
  wire::TrainingPlan plan;
  plan.set_train(true);
  plan.set_local_epochs(static_cast<std::uint32_t>(epochs));
  plan.set_batch_size(tr.value("batch_size", 32u));
  plan.set_learning_rate(tr.value("learning_rate", 0.1f));
  plan.set_weight_decay(tr.value("weight_decay", 0.0f));
  plan.set_seed(cfg.seed);
  plan.set_config_json(tr.dump());
  return plan;
}

// Evaluates models on the pooled test rows: the built-in networks in this process, a user's own
// model through its own training script (one more copy of it, run here on the pooled data).
class CentralEvaluator {
 public:
  CentralEvaluator(const SimConfig& cfg, const FederationFiles& f) : cfg_(cfg), f_(f) {
    if (!cfg.trainer) return;
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
    a.state_dir = f.out / "central" / "state";
    external_ = std::make_unique<agent::ExternalTrainer>(a);
  }
  // Accuracy and loss of `m` on the pooled test rows (NaN when it cannot be evaluated).
  std::pair<double, double> evaluate(const Model& m, std::uint64_t round) {
    if (!external_) {
      const auto ev = Network(m).evaluate(m.flat(), f_.central_test);
      return {ev.accuracy, ev.loss};
    }
    try {
      agent::TrainTask task{round, "central", sim_plan(cfg_)};
      const auto ev = external_->evaluate(m, task);
      return {ev.eval_accuracy(), ev.eval_loss()};
    } catch (const std::exception& e) {
      std::cerr << "sim: evaluating round " << round << " failed: " << e.what() << "\n";
      return {NAN, NAN};
    }
  }
  // The same model trained centrally on the pooled training rows, for as many epochs as a silo
  // saw in total; its test accuracy.
  double baseline() {
    if (!external_) {
      ModelSpec spec;
      spec.kind = cfg_.model_kind;
      spec.inputs = f_.all.features;
      spec.classes = static_cast<std::size_t>(f_.all.classes);
      spec.hidden = cfg_.hidden;
      spec.seed = cfg_.seed;
      Model m = init_model(spec);
      const auto plan = sim_plan(cfg_, cfg_.rounds);
      agent::TrainOptions opts;
      opts.epochs = plan.local_epochs();
      opts.batch_size = plan.batch_size();
      opts.learning_rate = plan.learning_rate();
      opts.weight_decay = plan.weight_decay();
      opts.seed = cfg_.seed;
      const Network net(m);
      agent::train_sgd(net, m.flat(), f_.central_train, opts);
      return net.evaluate(m.flat(), f_.central_test).accuracy;
    }
    try {
      const Model init = load_safetensors(f_.initial_model);
      Model trained = init.zeros_like();
      agent::TrainTask task{1, "central", sim_plan(cfg_, cfg_.rounds)};
      external_->train(init, task, trained);
      return external_->evaluate(trained, task).eval_accuracy();
    } catch (const std::exception& e) {
      std::cerr << "sim: central training failed: " << e.what() << "\n";
      return -1;
    }
  }

 private:
  const SimConfig& cfg_;
  const FederationFiles& f_;
  std::unique_ptr<agent::ExternalTrainer> external_;
};

}  // namespace

SimResult run_sim(const SimConfig& cfg, const std::filesystem::path& out, bool quiet) {
  SimResult result;
  auto say = [&](const std::string& s) {
    if (!quiet) std::cout << s << std::endl;
  };
  const auto t_start = Clock::now();
  const FederationFiles f = prepare_federation(cfg, out);
  const Dataset& all = f.all;
  const auto& names = f.silos;
  const auto& state = f.state;
  const auto& logs = f.logs;
  say("xsilo sim: " + cfg.name + " | " + std::to_string(cfg.silos) + " silos, " + std::to_string(cfg.rounds) +
      " rounds | " + cfg.data_path.filename().string() + " (" + std::to_string(all.rows) + " rows, " +
      std::to_string(all.features) + " features, " + std::to_string(all.classes) + " classes) | split " + cfg.split +
      (cfg.split == "dirichlet" ? " alpha=" + std::to_string(cfg.alpha).substr(0, 4) : "") +
      (cfg.trainer ? " | trainer: " + cfg.trainer->command.back() : ""));
  {
    std::string sizes;
    for (std::size_t i = 0; i < cfg.silos; ++i) {
      sizes += (i ? ", " : "") + std::to_string(load_csv(out / "silos" / names[i] / "train.csv").rows);
    }
    say("  training rows per silo: " + sizes + "; " + std::to_string(f.central_test.rows) + " test rows");
  }
  for (const auto& fault : cfg.faults) {
    const bool known = fault.process == "server" || std::count(f.edges.begin(), f.edges.end(), fault.process) ||
                       std::count(names.begin(), names.end(), fault.process);
    if (!known) throw ConfigError("sim: fault names process \"" + fault.process + "\", which this federation does not have");
  }
  // Every process by name, so that faults can find them.
  std::map<std::string, std::vector<std::string>> argv;
  std::map<std::string, std::unique_ptr<Process>> procs;
  auto launch = [&](const std::string& name) {
    procs[name] = std::make_unique<Process>(argv[name], logs / (name + ".log"));
  };
  argv["server"] = {self_exe(), "server", "--config", f.server_config.string()};
  launch("server");
  const std::uint16_t port = wait_for_port(*procs["server"], f);
  for (std::size_t e = 0; e < f.edges.size(); ++e) {
    argv[f.edges[e]] = {self_exe(), "edge", "--config", edge_config_path(f, e).string()};
    launch(f.edges[e]);
  }
  // Silos dial their preferred edge first; let the edges listen before the silos start.
  for (std::size_t e = 0; e < f.edges.size(); ++e) wait_for_edge(*procs[f.edges[e]], f, e);
  for (std::size_t i = 0; i < cfg.silos; ++i) {
    argv[names[i]] = write_agent_config(cfg, f, i, agent_upstreams(cfg, f, i)).argv(self_exe());
    launch(names[i]);
  }
  say("  server on 127.0.0.1:" + std::to_string(port) + " (mutual TLS 1.3), " +
      (f.edges.empty() ? std::string() : std::to_string(f.edges.size()) + " edges, ") + std::to_string(cfg.silos) +
      " agents started; logs in " + logs.string());
  CentralEvaluator central(cfg, f);

  // Follow the rounds through the server's metrics; evaluate each committed model on the
  // held-out test set.
  auto prev_handler = std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  std::ofstream metrics(out / "metrics.csv");
  metrics << "round,committed,accuracy,loss,fed_eval_accuracy,fed_eval_loss,train_loss,"
             "silos_reporting,dropped,seconds\n";
  std::vector<double> xs, accs, losses;
  std::size_t rows_seen = 0;
  std::optional<int> server_exit;
  // Faults fire on the server's progress events (events.jsonl): a round starting ("train"),
  // its first upload grant ("upload").
  std::vector<bool> fired(cfg.faults.size(), false);
  std::size_t events_read = 0;
  auto poll_faults = [&] {
    if (cfg.faults.empty()) return;
    std::ifstream in(state / "events.jsonl", std::ios::binary);
    in.seekg(static_cast<std::streamoff>(events_read));
    for (std::string line; std::getline(in, line);) {
      if (in.eof()) break;  // a line still being written
      events_read += line.size() + 1;
      json ev;
      try {
        ev = json::parse(line);
      } catch (const json::exception&) {
        continue;
      }
      const std::string name = ev.value("event", "");
      const auto round = ev.value("round", std::uint64_t{0});
      for (std::size_t k = 0; k < cfg.faults.size(); ++k) {
        const auto& fault = cfg.faults[k];
        if (fired[k] || fault.phase.rfind("after_", 0) == 0 || fault.round != round) continue;  // silos crash themselves
        if (name != (fault.phase == "train" ? "round_started" : "upload_granted")) continue;
        fired[k] = true;
        say("  fault: " + fault.action + " " + fault.process + " in round " + std::to_string(round) + " (" + fault.phase + ")");
        procs[fault.process]->signal(SIGKILL);
        procs[fault.process]->wait(std::chrono::milliseconds(5000));
        if (fault.action == "restart") {
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          launch(fault.process);
        }
      }
    }
  };
  auto poll_rows = [&] {
    std::vector<server::MetricsRow> rows;
    try {
      rows = server::read_metrics(state / "metrics.csv");
    } catch (const std::exception& e) {
      say(std::string("  cannot read the server's metrics: ") + e.what());
      return;
    }
    for (; rows_seen < rows.size(); ++rows_seen) {
      const auto& r = rows[rows_seen];
      double acc = NAN, loss = NAN;
      if (r.committed) {
        char name[64];
        std::snprintf(name, sizeof name, "round_%06llu.safetensors", static_cast<unsigned long long>(r.round));
        std::tie(acc, loss) = central.evaluate(load_safetensors(state / "checkpoints" / name), r.round);
        ++result.rounds_committed;
        xs.push_back(static_cast<double>(r.round));
        accs.push_back(acc);
        losses.push_back(loss);
        result.final_accuracy = acc;
        result.final_loss = loss;
      }
      metrics << r.round << "," << (r.committed ? 1 : 0) << "," << acc << "," << loss << "," << r.fed_eval_accuracy << ","
              << r.fed_eval_loss << "," << r.train_loss << "," << r.reported << "," << r.dropped << "," << r.seconds
              << "\n";
      metrics.flush();
      char line[256];
      const std::string edges = cfg.edges ? " | edges " + std::to_string(r.edges) + "/" + std::to_string(cfg.edges) : "";
      if (r.committed) {
        std::snprintf(line, sizeof line, "round %3llu/%llu | silos %zu/%zu%s | dropped %zu | loss %.4f | acc %6.2f%% | %5.2f s",
                      static_cast<unsigned long long>(r.round), static_cast<unsigned long long>(cfg.rounds), r.reported,
                      r.selected, edges.c_str(), r.dropped, loss, 100 * acc, r.seconds);
      } else {
        std::snprintf(line, sizeof line, "round %3llu/%llu | ABORTED | silos %zu/%zu | dropped %zu | %5.2f s",
                      static_cast<unsigned long long>(r.round), static_cast<unsigned long long>(cfg.rounds), r.reported,
                      r.selected, r.dropped, r.seconds);
      }
      say(line);
    }
  };
  while (!server_exit) {
    poll_rows();
    poll_faults();
    if (g_interrupted) {
      say("interrupted: stopping the federation");
      procs["server"]->stop();
      break;
    }
    server_exit = procs["server"]->wait(std::chrono::milliseconds(cfg.faults.empty() ? 50 : 5));
    // A server killed by a "restart" fault comes back; its exit is not the end.
    if (server_exit && *server_exit == 128 + SIGKILL && !g_interrupted) {
      const bool restarting = std::any_of(cfg.faults.begin(), cfg.faults.end(), [](const auto& fl) {
        return fl.process == "server" && fl.action == "restart";
      });
      if (restarting) {
        std::this_thread::sleep_for(std::chrono::milliseconds(600));
        if (procs["server"]->running()) server_exit.reset();
      }
    }
  }
  poll_rows();
  const int server_code = server_exit.value_or(-1);
  // The others got Finished from the server (or its edge): one grace period for all of them,
  // then whatever is left (an edge restarted after the end, its silos) is stopped together.
  const auto grace_end = Clock::now() + std::chrono::milliseconds(5000);
  for (auto& [name, p] : procs) {
    if (name == "server") continue;
    p->wait(std::max(std::chrono::milliseconds(0),
                     std::chrono::duration_cast<std::chrono::milliseconds>(grace_end - Clock::now())));
  }
  for (auto& [name, p] : procs) {
    if (p->running()) p->signal(SIGTERM);
  }
  for (auto& [name, p] : procs) {
    if (!p->wait(std::chrono::milliseconds(2000))) p->stop(std::chrono::milliseconds(0));
  }
  std::signal(SIGINT, prev_handler);
  std::signal(SIGTERM, SIG_DFL);

  // Outputs.
  std::uint64_t last = 0;
  for (double x : xs) last = static_cast<std::uint64_t>(x);
  if (last) {
    char name[64];
    std::snprintf(name, sizeof name, "round_%06llu.safetensors", static_cast<unsigned long long>(last));
    std::filesystem::copy_file(state / "checkpoints" / name, out / "model.safetensors",
                               std::filesystem::copy_options::overwrite_existing);
  }
  for (const char* name : {"audit.jsonl", "audit.pub"}) {
    if (std::filesystem::exists(state / name)) {
      std::filesystem::copy_file(state / name, out / name, std::filesystem::copy_options::overwrite_existing);
    }
  }
  if (cfg.baseline && !g_interrupted) result.baseline_accuracy = central.baseline();
  write_report(out, cfg.name, xs, accs, losses, result.baseline_accuracy);
  const double secs = std::chrono::duration<double>(Clock::now() - t_start).count();
  json summary = {{"name", cfg.name},
                  {"rounds", cfg.rounds},
                  {"rounds_committed", result.rounds_committed},
                  {"server_exit_code", server_code},
                  {"final_accuracy", result.final_accuracy},
                  {"final_loss", result.final_loss},
                  {"seconds", secs}};
  if (result.baseline_accuracy >= 0) summary["centralized_accuracy"] = result.baseline_accuracy;
  write_json(out / "summary.json", summary);

  const bool ok = server_code == 0 && result.rounds_committed == cfg.rounds;
  char line[256];
  std::snprintf(line, sizeof line, "%s: %llu/%llu rounds committed in %.1f s; final test accuracy %.2f%%",
                ok ? "done" : "FAILED", static_cast<unsigned long long>(result.rounds_committed),
                static_cast<unsigned long long>(cfg.rounds), secs, 100 * result.final_accuracy);
  say(line);
  if (result.baseline_accuracy >= 0) {
    std::snprintf(line, sizeof line, "  centralized training on the pooled data: %.2f%% (difference %+.2f points)",
                  100 * result.baseline_accuracy, 100 * (result.final_accuracy - result.baseline_accuracy));
    say(line);
  }
  say("  outputs: " + (out / "metrics.csv").string() + ", model.safetensors, audit.jsonl + audit.pub, report.html");
  say("  verify the audit log: xsilo audit verify " + (out / "audit.jsonl").string() + " --key " +
      (out / "audit.pub").string());
  if (!ok && server_code != 0) {
    say("  the server exited with code " + std::to_string(server_code) + "; its log ends:\n" +
        log_tail(logs / "server.log"));
  }
  result.exit_code = ok ? 0 : 1;
  return result;
}

}  // namespace xsilo::tools
