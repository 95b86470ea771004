// A federation on loopback whose processes a test starts and kills itself: the real xsilo
// binary, the files `xsilo sim` would write. Processes die with the Fed.
#pragma once

#include <fstream>
#include <functional>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "server/audit.h"
#include "tests/testlib.h"
#include "common/process.h"
#include "tools/sim.h"

namespace xsilo::tools {

using namespace std::chrono_literals;

inline std::size_t metrics_rows(const std::filesystem::path& state) {
  std::ifstream in(state / "metrics.csv");
  std::size_t n = 0;
  for (std::string l; std::getline(in, l);) ++n;
  return n ? n - 1 : 0;
}

// Whether the server's events.jsonl says round `round` started with `selected` silos (0: any):
// the moment to fault a round "under way", which metrics.csv's rows show only after the round
// before has ended (the next one may or may not have started by then: a timing race, issue 47).
inline bool round_started(const std::filesystem::path& state, std::uint64_t round, std::size_t selected = 0) {
  std::ifstream in(state / "events.jsonl");
  for (std::string l; std::getline(in, l);) {
    try {
      const auto e = nlohmann::json::parse(l);
      if (e.value("event", "") == "round_started" && e.value("round", std::uint64_t{0}) == round &&
          (selected == 0 || e.value("detail", "") == std::to_string(selected) + " selected")) {
        return true;
      }
    } catch (const nlohmann::json::exception&) {
      // a line still being written
    }
  }
  return false;
}

inline bool wait_until(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return cond();
}


// A federation whose processes the test starts and kills itself.
struct Fed {
  explicit Fed(SimConfig cfg) : cfg(std::move(cfg)) { files = prepare_federation(this->cfg, dir.path()); }
  void start_server() {
    std::filesystem::remove(files.port_file);
    server = std::make_unique<Process>(server_argv(files, test::xsilo_bin()), files.logs / "server.log");
    port = wait_for_port(*server, files);
  }
  void start_edges() {
    for (std::size_t e = 0; e < files.edges.size(); ++e) edges.push_back(edge_process(e, files.edges[e] + ".log"));
    for (std::size_t e = 0; e < files.edges.size(); ++e) wait_for_edge(*edges[e], files, e);
  }
  // Edge e again, after the test killed it: its config and port, a log of its own.
  void restart_edge(std::size_t e) {
    edges[e] = edge_process(e, files.edges[e] + "-restarted.log");
    wait_for_edge(*edges[e], files, e);
  }
  std::unique_ptr<Process> edge_process(std::size_t e, const std::string& log) {
    std::filesystem::remove(files.out / (files.edges[e] + ".port"));  // the port it binds now, not an old one
    return std::make_unique<Process>(
        std::vector<std::string>{test::xsilo_bin(), "edge", "--config", edge_config_path(files, e).string()},
        files.logs / log);
  }
  void start_agents() {
    for (std::size_t i = 0; i < cfg.silos; ++i) {
      const auto agent = write_agent_config(cfg, files, i, agent_upstreams(cfg, files, i));
      agent_configs.push_back(agent.config);
      agents.push_back(std::make_unique<Process>(agent.argv(test::xsilo_bin()), files.logs / (files.silos[i] + ".log")));
    }
  }
  std::string logs() const {
    std::string s = "server:\n" + log_tail(files.logs / "server.log", 30);
    for (const auto& n : files.edges) s += n + ":\n" + log_tail(files.logs / (n + ".log"), 12);
    for (const auto& n : files.silos) s += n + ":\n" + log_tail(files.logs / (n + ".log"), 8);
    return s;
  }
  std::vector<nlohmann::json> rounds() const {
    std::vector<nlohmann::json> out;
    for (auto& r : server::read_audit_log(files.state / "audit.jsonl")) {
      if (r["event"] == "round") out.push_back(r);
    }
    return out;
  }

  test::TempDir dir;
  SimConfig cfg;
  FederationFiles files;
  std::unique_ptr<Process> server;
  std::vector<std::unique_ptr<Process>> edges;
  std::vector<std::unique_ptr<Process>> agents;
  std::vector<std::filesystem::path> agent_configs;
  std::uint16_t port = 0;
};


// Sets one top-level key of a daemon's JSON config file that a test has prepared.
inline void set_config_key(const std::filesystem::path& config, const std::string& key, const nlohmann::json& value) {
  auto j = nlohmann::json::parse(read_file(config));
  j[key] = value;
  atomic_write_file(config, j.dump(2));
}

inline SimConfig small_config(std::size_t silos, std::uint64_t rounds) {
  SimConfig c = default_sim_config();
  c.silos = silos;
  c.rounds = rounds;
  c.baseline = false;
  c.selection = {{"min_silos", silos}, {"min_updates", 2}};
  return c;
}

// Digits with a wide MLP: a round takes long enough to stop a silo in the middle of it.
inline SimConfig slow_config(std::size_t silos, std::uint64_t rounds) {
  SimConfig c = small_config(silos, rounds);
  c.data_path = data_dir() / "digits.csv.gz";
  c.model_kind = "mlp";
  c.hidden = {512, 512};
  c.training = {{"local_epochs", 4}, {"batch_size", 32}, {"learning_rate", 0.05}};
  c.deadlines = {{"join_s", 20}, {"train_s", 120}, {"upload_s", 60}};
  return c;
}

}  // namespace xsilo::tools
