// xsilo bench round: seconds per round, bytes through the server, server peak RSS.
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "tools/bench.h"
#include "common/process.h"
#include "tools/sim.h"
#include "transport/pki.h"

namespace xsilo::tools {

namespace {

using json = nlohmann::json;

struct RoundResult {
  std::size_t silos = 0, edges = 0;
  double seconds_per_round = 0;
  std::uint64_t server_bytes_per_round = 0;
  std::uint64_t server_ingress_per_round = 0;
  double throughput_gbps = 0;
  std::uint64_t peak_rss = 0;
  std::uint64_t model_bytes = 0;
};

RoundResult run_one(std::size_t silos, std::size_t params, std::uint64_t rounds, std::size_t edges) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("xsilo-bench-round-" + std::to_string(::getpid()) + "-" + std::to_string(silos) + "-" +
                    std::to_string(edges));
  std::filesystem::remove_all(dir);
  const auto pki = dir / "pki";
  transport::pki_init(pki, "bench");
  transport::pki_issue(pki, {wire::SERVER, "server"});
  std::vector<std::string> names;
  for (std::size_t i = 0; i < silos; ++i) {
    names.push_back("silo-" + std::to_string(i));
    transport::pki_issue(pki, {wire::SILO, names.back()});
  }
  std::vector<std::string> edge_names;
  for (std::size_t e = 0; e < edges; ++e) {
    edge_names.push_back("edge-" + std::to_string(e));
    transport::pki_issue(pki, {wire::EDGE, edge_names.back()});
  }
  const json transport = {{"max_frame_bytes", 4 << 20}, {"idle_timeout_s", 120}, {"max_queued_mib", 4096}};
  const json server = {{"federation", "bench"},
                       {"listen", "127.0.0.1:0"},
                       {"port_file", (dir / "port").string()},
                       {"tls", {{"kit", (pki / "kits/server").string()}}},
                       {"allow", edges ? json{{"silo", names}, {"edge", edge_names}} : json{{"silo", names}}},
                       {"state_dir", (dir / "state").string()},
                       {"keep_checkpoints", 1},
                       {"rounds", rounds},
                       {"model", {{"kind", "synthetic"}, {"parameters", params}}},
                       {"selection", {{"min_silos", silos}}},
                       {"deadlines", {{"join_s", 60}, {"train_s", 600}, {"upload_s", 600}}},
                       {"transport", transport}};
  atomic_write_file(dir / "server.json", server.dump(2));
  Process srv({self_exe(), "server", "--config", (dir / "server.json").string()}, dir / "server.log");
  std::uint16_t port = 0;
  for (int i = 0; i < 1000 && !port; ++i) {
    if (std::filesystem::exists(dir / "port")) port = static_cast<std::uint16_t>(std::stoi(read_file(dir / "port")));
    else std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!port) throw std::runtime_error("bench round: the server did not start:\n" + log_tail(dir / "server.log"));
  std::vector<std::unique_ptr<Process>> agents;
  std::vector<std::uint16_t> edge_ports;
  for (std::size_t e = 0; e < edges; ++e) {
    const auto port_file = dir / (edge_names[e] + ".port");
    const json edge = {{"federation", "bench"},
                       {"listen", "127.0.0.1:0"},
                       {"port_file", port_file.string()},
                       {"upstreams", {"127.0.0.1:" + std::to_string(port)}},
                       {"tls", {{"kit", (pki / "kits" / edge_names[e]).string()}}},
                       {"allow", {{"silo", names}}},
                       {"transport", transport},
                       {"log_level", "warn"}};
    atomic_write_file(dir / (edge_names[e] + ".json"), edge.dump(2));
    agents.push_back(std::make_unique<Process>(
        std::vector<std::string>{self_exe(), "edge", "--config", (dir / (edge_names[e] + ".json")).string()},
        dir / (edge_names[e] + ".log")));
    std::uint16_t ep = 0;
    for (int i = 0; i < 1000 && !ep; ++i) {
      if (std::filesystem::exists(port_file) && !read_file(port_file).empty()) ep = static_cast<std::uint16_t>(std::stoi(read_file(port_file)));
      else std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!ep) throw std::runtime_error("bench round: an edge did not start");
    edge_ports.push_back(ep);
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& n = names[i];
    const std::uint16_t up = edges ? edge_ports[i % edges] : port;
    const json agent = {{"federation", "bench"},
                        {"upstreams", {"127.0.0.1:" + std::to_string(up)}},
                        {"tls", {{"kit", (pki / "kits" / n).string()}}},
                        {"trainer", {{"kind", "external"}, {"command", {"(synthetic)"}}}},
                        {"state_dir", (dir / n).string()},
                        {"transport", transport},
                        {"log_level", std::getenv("XSILO_KEEP_BENCH_DIR") ? "info" : "warn"}};
    atomic_write_file(dir / (n + ".json"), agent.dump(2));
    // The synthetic trainer (no data, a random update) is a simulation hook, not an agent feature.
    atomic_write_file(dir / (n + ".simulate.json"), json{{"synthetic", {{"samples", 100}}}}.dump());
    agents.push_back(std::make_unique<Process>(
        std::vector<std::string>{self_exe(), "agent", "--config", (dir / (n + ".json")).string(), "--simulate",
                                 (dir / (n + ".simulate.json")).string()},
        dir / (n + ".log")));
  }
  auto code = srv.wait(std::chrono::minutes(30));
  if (!code || *code != 0) {
    throw std::runtime_error("bench round: the server failed:\n" + log_tail(dir / "server.log"));
  }
  for (auto& a : agents) a->wait(std::chrono::seconds(10));
  const auto stats = json::parse(read_file(dir / "state/server_stats.json"));
  RoundResult r;
  r.silos = silos;
  r.edges = edges;
  r.peak_rss = stats["peak_rss_bytes"];
  r.model_bytes = stats["model_bytes"];
  // Rounds after the first: connection set-up and page faults of the first allocations are
  // not part of a steady round.
  std::ifstream in(dir / "state/metrics.csv");
  std::string line;
  std::getline(in, line);
  double secs = 0;
  int n = 0;
  for (int k = 0; std::getline(in, line); ++k) {
    std::stringstream ss(line);
    std::vector<std::string> f;
    for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
    if (k == 0 && rounds > 1) continue;
    secs += std::stod(f[8]);
    ++n;
  }
  r.seconds_per_round = secs / std::max(1, n);
  const std::uint64_t total = stats["bytes_in"].get<std::uint64_t>() + stats["bytes_out"].get<std::uint64_t>();
  r.server_bytes_per_round = total / rounds;
  r.server_ingress_per_round = stats["bytes_in"].get<std::uint64_t>() / rounds;
  r.throughput_gbps = static_cast<double>(r.server_bytes_per_round) / r.seconds_per_round / 1e9;
  if (!std::getenv("XSILO_KEEP_BENCH_DIR")) std::filesystem::remove_all(dir);
  return r;
}

}  // namespace

int bench_round(const RoundBenchOptions& opts) {
  std::vector<std::vector<std::string>> rows;
  bool ok = true;
  for (auto k : opts.silos) {
   for (auto e : opts.edges) {
    if (!opts.json) std::cerr << "running: " << k << " silos, " << e << " edges, " << opts.params << " parameters, "
                              << opts.rounds << " rounds..." << std::endl;
    const auto r = run_one(k, opts.params, opts.rounds, e);
    const double mib = 1024.0 * 1024.0;
    const double rss_bound = 3.0 * static_cast<double>(r.model_bytes) + 64 * mib;
    const bool rss_ok = static_cast<double>(r.peak_rss) < rss_bound;
    const bool tput_ok = r.throughput_gbps >= kTlsLoopbackGBps / 2;
    ok = ok && rss_ok && tput_ok;
    if (opts.json) {
      std::cout << json{{"bench", "round"},
                        {"silos", k},
                        {"edges", e},
                        {"params", opts.params},
                        {"seconds_per_round", r.seconds_per_round},
                        {"server_bytes_per_round", r.server_bytes_per_round},
                        {"server_ingress_bytes_per_round", r.server_ingress_per_round},
                        {"throughput_GBps", r.throughput_gbps},
                        {"tls_loopback_limit_GBps", kTlsLoopbackGBps},
                        {"peak_rss_bytes", r.peak_rss},
                        {"peak_rss_bound_bytes", rss_bound},
                        {"model_bytes", r.model_bytes}}
                       .dump()
                << std::endl;
    }
    rows.push_back({std::to_string(k), std::to_string(e), std::to_string(opts.params), fmt(r.seconds_per_round, 3),
                    fmt(static_cast<double>(r.server_bytes_per_round) / mib, 1),
                    fmt(static_cast<double>(r.server_ingress_per_round) / mib, 1),
                    fmt(r.throughput_gbps, 3) + (tput_ok ? "" : " (<0.6)"),
                    fmt(100 * r.throughput_gbps / kTlsLoopbackGBps, 0) + "%",
                    fmt(static_cast<double>(r.peak_rss) / mib, 1) + (rss_ok ? "" : " (over)"),
                    fmt(rss_bound / mib, 1)});
   }
  }
  if (!opts.json) {
    print_table({"silos", "edges", "params", "s/round", "server MiB/round", "ingress MiB/round", "GB/s",
                 "of TLS limit", "server peak RSS MiB", "bound 3x+64 MiB"},
                rows);
    std::cout << "TLS 1.3 loopback limit between two processes: " << kTlsLoopbackGBps
              << " GB/s (DESIGN §11); target: at least half of it, and peak RSS under the bound\n";
  }
  return ok ? 0 : 1;
}

}  // namespace xsilo::tools
