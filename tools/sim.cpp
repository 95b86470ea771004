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
#include "server/config.h"
#include "silo_agent/trainer.h"
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

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  for (std::string f; std::getline(ss, f, ',');) out.push_back(f);
  return out;
}

}  // namespace

std::string log_tail(const std::filesystem::path& log, std::size_t lines) {
  std::ifstream in(log);
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);) all.push_back(l);
  std::string out;
  for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    out += "    " + all[i] + "\n";
  }
  return out;
}

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
  c.model_kind = model.one_of("kind", "logistic", {"logistic", "mlp"});
  for (auto h : model.int_list("hidden", 1, 1 << 16)) c.hidden.push_back(static_cast<std::size_t>(h));
  if (c.model_kind == "logistic" && !c.hidden.empty()) model.fail("hidden", "a logistic model has no hidden layers");
  model.finish();

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
  std::filesystem::remove_all(f.logs);
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
                  {{"kind", cfg.model_kind},
                   {"inputs", all.features},
                   {"classes", all.classes},
                   {"init_seed", cfg.seed}}},
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
  write_json(f.server_config, server);
  try {
    server::load_server_config(f.server_config);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string(e.what()) + " (generated from sim config " +
                      (cfg.file.empty() ? std::string("defaults") : cfg.file.string()) + ")");
  }
  for (std::size_t e = 0; e < f.edges.size(); ++e) {
    json edge = {{"federation", cfg.federation},
                 {"listen", "127.0.0.1:" + std::to_string(f.edge_ports[e])},
                 {"port_file", (f.out / (f.edges[e] + ".port")).string()},
                 {"upstreams", {"127.0.0.1:" + std::to_string(f.server_port)}},
                 {"tls", {{"kit", (f.pki / "kits" / f.edges[e]).string()}}},
                 {"allow", {{"silo", f.silos}}},  // any silo of the federation may fail over here
                 {"reconnect", {{"initial_backoff_s", 0.1}, {"max_backoff_s", 1}}}};
    if (cfg.transport.is_object()) edge["transport"] = cfg.transport;
    write_json(edge_config_path(f, e), edge);
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

std::filesystem::path write_agent_config(const SimConfig& cfg, const FederationFiles& f,
                                         std::size_t i, const std::vector<std::string>& upstreams) {
  const auto dir = f.out / "silos" / f.silos[i];
  json agent = {{"federation", cfg.federation},
                {"upstreams", upstreams},
                {"tls", {{"kit", (f.pki / "kits" / f.silos[i]).string()}}},
                {"data", {{"train", (dir / "train.csv").string()}, {"test", (dir / "test.csv").string()}}},
                {"state_dir", (dir / "state").string()},
                {"reconnect", {{"initial_backoff_s", 0.1}, {"max_backoff_s", 1}}}};
  if (cfg.standardize) {
    agent["data"]["standardize"] = {{"mean", f.standardizer.mean}, {"std", f.standardizer.stddev}};
  }
  if (cfg.transport.is_object()) agent["transport"] = cfg.transport;
  if (cfg.local.is_object()) agent["local"] = cfg.local;
  if (!f.edges.empty()) agent["failover"] = {{"probe_s", 1}};
  for (const auto& fault : cfg.faults) {
    if (fault.process == f.silos[i] && fault.phase.rfind("after_", 0) == 0) {
      agent["crash"] = {{"after", fault.phase.substr(6)}, {"round", fault.round}};
    }
  }
  if (i >= cfg.silos - cfg.attackers) {
    json attack = cfg.attack;
    const std::string kind = attack.value("kind", "");
    if (kind == "alie" || kind == "ipm") {
      json honest = json::array();
      for (std::size_t h = 0; h < cfg.silos - cfg.attackers; ++h) {
        honest.push_back({{"silo", f.silos[h]}, {"train", (f.out / "silos" / f.silos[h] / "train.csv").string()}});
      }
      attack["honest"] = honest;
    }
    agent["attack"] = attack;
  }
  const auto path = f.out / "configs" / (f.silos[i] + ".json");
  write_json(path, agent);
  return path;
}

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
  say("xsilo sim: " + cfg.name + " | " + std::to_string(cfg.silos) + " silos, " +
      std::to_string(cfg.rounds) + " rounds | " + cfg.data_path.filename().string() + " (" +
      std::to_string(all.rows) + " rows, " + std::to_string(all.features) + " features, " +
      std::to_string(all.classes) + " classes) | split " + cfg.split +
      (cfg.split == "dirichlet" ? " alpha=" + std::to_string(cfg.alpha).substr(0, 4) : ""));
  {
    std::string sizes;
    for (std::size_t i = 0; i < cfg.silos; ++i) {
      sizes += (i ? ", " : "") + std::to_string(load_csv(out / "silos" / names[i] / "train.csv").rows);
    }
    say("  training rows per silo: " + sizes + "; " + std::to_string(f.central_test.rows) + " test rows");
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
    const auto path = write_agent_config(cfg, f, i, agent_upstreams(cfg, f, i));
    argv[names[i]] = {self_exe(), "agent", "--config", path.string()};
    launch(names[i]);
  }
  say("  server on 127.0.0.1:" + std::to_string(port) + " (mutual TLS 1.3), " +
      (f.edges.empty() ? std::string() : std::to_string(f.edges.size()) + " edges, ") +
      std::to_string(cfg.silos) + " agents started; logs in " + logs.string());
  for (const auto& fault : cfg.faults) {
    if (!argv.count(fault.process)) {
      throw ConfigError("sim: fault names process \"" + fault.process + "\", which this federation does not have");
    }
  }
  const Dataset& central_test = f.central_test;
  const Dataset& central_train = f.central_train;

  // 4. Follow the rounds through the server's metrics; evaluate each committed model on the
  //    held-out test set.
  auto prev_handler = std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  std::ofstream metrics(out / "metrics.csv");
  metrics << "round,committed,accuracy,loss,fed_eval_accuracy,fed_eval_loss,train_loss,"
             "silos_reporting,dropped,seconds\n";
  std::vector<double> xs, accs, losses;
  std::size_t rows_seen = 0;
  const auto server_metrics = state / "metrics.csv";
  std::optional<int> server_exit;
  // Faults fire when the server's log shows their round reaching their phase.
  std::vector<bool> fired(cfg.faults.size(), false);
  std::string log;  // the server's log so far, read incrementally
  auto poll_faults = [&] {
    if (cfg.faults.empty()) return;
    {
      std::ifstream in(logs / "server.log", std::ios::binary);
      in.seekg(static_cast<std::streamoff>(log.size()));
      std::ostringstream fresh;
      fresh << in.rdbuf();
      log += fresh.str();
    }
    for (std::size_t k = 0; k < cfg.faults.size(); ++k) {
      const auto& fault = cfg.faults[k];
      if (fired[k] || fault.phase.rfind("after_", 0) == 0) continue;  // silos crash themselves
      const std::string r = std::to_string(fault.round);
      const std::string mark = fault.phase == "train" ? "round " + r + "/" : "round " + r + ": upload slot";
      if (log.find(mark) == std::string::npos) continue;
      fired[k] = true;
      say("  fault: " + fault.action + " " + fault.process + " in round " + r + " (" + fault.phase + ")");
      procs[fault.process]->signal(SIGKILL);
      procs[fault.process]->wait(std::chrono::milliseconds(5000));
      if (fault.action == "restart") {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        launch(fault.process);
      }
    }
  };
  auto poll_rows = [&] {
    if (!std::filesystem::exists(server_metrics)) return;
    std::ifstream in(server_metrics);
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    for (std::size_t i = rows_seen + 1; i < lines.size(); ++i) {
      const auto f = split_csv_line(lines[i]);
      if (f.size() < 11) break;  // a row still being written
      rows_seen = i;
      const std::uint64_t round = std::stoull(f[0]);
      const bool committed = f[1] == "1";
      double acc = NAN, loss = NAN;
      if (committed) {
        char name[64];
        std::snprintf(name, sizeof name, "round_%06llu.safetensors", static_cast<unsigned long long>(round));
        const Model m = load_safetensors(state / "checkpoints" / name);
        const auto ev = Network(m).evaluate(m.flat(), central_test);
        acc = ev.accuracy;
        loss = ev.loss;
        ++result.rounds_committed;
        xs.push_back(static_cast<double>(round));
        accs.push_back(acc);
        losses.push_back(loss);
        result.final_accuracy = acc;
        result.final_loss = loss;
      }
      metrics << round << "," << (committed ? 1 : 0) << "," << acc << "," << loss << "," << f[7]
              << "," << f[6] << "," << f[5] << "," << f[3] << "," << f[4] << "," << f[8] << "\n";
      metrics.flush();
      char line[256];
      const std::string edges = cfg.edges ? " | edges " + f[10] + "/" + std::to_string(cfg.edges) : "";
      if (committed) {
        std::snprintf(line, sizeof line,
                      "round %3llu/%llu | silos %s/%s%s | dropped %s | loss %.4f | acc %6.2f%% | %5.2f s",
                      static_cast<unsigned long long>(round), static_cast<unsigned long long>(cfg.rounds),
                      f[3].c_str(), f[2].c_str(), edges.c_str(), f[4].c_str(), loss, 100 * acc, std::stod(f[8]));
      } else {
        std::snprintf(line, sizeof line, "round %3llu/%llu | ABORTED | silos %s/%s | dropped %s | %5.2f s",
                      static_cast<unsigned long long>(round), static_cast<unsigned long long>(cfg.rounds),
                      f[3].c_str(), f[2].c_str(), f[4].c_str(), std::stod(f[8]));
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
    p->wait(std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                       grace_end - Clock::now())));
  }
  for (auto& [name, p] : procs) {
    if (p->running()) p->signal(SIGTERM);
  }
  for (auto& [name, p] : procs) {
    if (!p->wait(std::chrono::milliseconds(2000))) p->stop(std::chrono::milliseconds(0));
  }
  std::signal(SIGINT, prev_handler);
  std::signal(SIGTERM, SIG_DFL);

  // 5. Outputs.
  std::uint64_t last = 0;
  for (double x : xs) last = static_cast<std::uint64_t>(x);
  if (last) {
    char name[64];
    std::snprintf(name, sizeof name, "round_%06llu.safetensors", static_cast<unsigned long long>(last));
    std::filesystem::copy_file(state / "checkpoints" / name, out / "model.safetensors",
                               std::filesystem::copy_options::overwrite_existing);
  }
  for (const char* f : {"audit.jsonl", "audit.pub"}) {
    if (std::filesystem::exists(state / f)) {
      std::filesystem::copy_file(state / f, out / f, std::filesystem::copy_options::overwrite_existing);
    }
  }
  if (cfg.baseline && !g_interrupted) {
    // The same model trained centrally on the pooled training rows, for as many epochs as a
    // silo saw in total.
    const auto tr = cfg.training;
    ModelSpec spec{cfg.model_kind, all.features, static_cast<std::size_t>(all.classes), cfg.hidden, cfg.seed};
    Model m = init_model(spec);
    agent::TrainOptions opts;
    opts.epochs = static_cast<std::uint32_t>(cfg.rounds * tr.value("local_epochs", 1u));
    opts.batch_size = tr.value("batch_size", 32u);
    opts.learning_rate = tr.value("learning_rate", 0.1f);
    opts.weight_decay = tr.value("weight_decay", 0.0f);
    opts.seed = cfg.seed;
    const Network net(m);
    agent::train_sgd(net, m.flat(), central_train, opts);
    result.baseline_accuracy = net.evaluate(m.flat(), central_test).accuracy;
  }
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
