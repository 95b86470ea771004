// xsilo bench round: seconds per round, bytes through the server and uploaded, server peak RSS.
#include <algorithm>
#include <iostream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/fs.h"
#include "common/process.h"
#include "protocol/compression.h"
#include "server/aggregator.h"
#include "server/audit.h"
#include "server/config.h"
#include "server/metrics.h"
#include "server/round_record.h"
#include "server/secure_round.h"
#include "tools/bench.h"
#include "transport/pki.h"

namespace xsilo::tools {

namespace {

using json = nlohmann::json;

struct RoundResult {
  std::size_t silos = 0, edges = 0;
  std::string scheme;  // "none", "quantize-8/256+ef", ...
  double seconds_per_round = 0;  // median of the rounds after the first
  std::uint64_t server_bytes_per_round = 0;
  std::uint64_t server_ingress_per_round = 0;
  std::uint64_t upload_bytes_per_sender = 0;  // encoded bytes a silo (an edge, with edges) uploads a round
  std::uint64_t download_bytes_per_receiver = 0;  // model bytes the server sends a silo (an edge) a round, after the first
  double throughput_gbps = 0;
  std::uint64_t peak_rss = 0;
  std::size_t peak_descriptors = 0;  // the server's open descriptors, the most seen as a round closed
  std::uint64_t model_bytes = 0;
  // The TLS loopback bound is what a dense, plain round on loopback can reach; across shaped
  // links, with fewer bytes to move or with masking, the link or the CPU sets the pace instead.
  bool loopback_bound = false;
  // Uploads staged in a file (server/upload_stage.h): the server holds two models, not three,
  // and its bound is 2.2x the model instead of (2 + lanes) x + 64 MiB.
  bool staged = false;
  // Upload buffers the server may hold at once: its uploads_at_once, at most one per sender.
  std::size_t lanes = 1;
  // Sums the server holds: one, or one per secure group (each group's is unmasked on its own),
  // of `word_bytes` a coordinate (the ring's words under secure aggregation, else floats); the
  // upload buffers are of the same words.
  std::size_t sums = 1;
  std::size_t word_bytes = sizeof(float);
  // Each silo's idle seconds a timed round (the record timelines: waiting for its upload slot,
  // then for the round to close), the mean over the timed rounds it uploaded in.
  std::map<std::string, double> idle_seconds;
  // The server process's CPU seconds (user and system, every thread, its whole run) and the bytes
  // it received and sent over the run: its CPU cost per GB moved.
  double cpu_seconds = 0;
  std::uint64_t bytes_in = 0, bytes_out = 0;
};

// What the server's bytes cost in crypto alone, in CPU seconds per GB moved, at one core's
// `openssl speed` rates measured in the same run: TLS 1.3's AES-256-GCM over every byte in and
// out, and SHA-256 over every byte in (each upload's hash is checked). 0 when a rate is missing.
double crypto_alone_seconds_per_gb(const RoundResult& r, double gcm_rate, double sha_rate) {
  const double moved = static_cast<double>(r.bytes_in + r.bytes_out);
  if (gcm_rate <= 0 || sha_rate <= 0 || moved <= 0) return 0;
  return (moved / gcm_rate + static_cast<double>(r.bytes_in) / sha_rate) / (moved / 1e9);
}

// The bound's terms, for the table: "6x+64+conns/2" (in models), "1+7x2+64+conns/2" (the
// model, then sums and lanes of 64-bit words), "2.2x" (staged).
std::string bound_terms(const RoundResult& r) {
  if (r.staged) return "2.2x";
  const std::string n = std::to_string(r.sums + r.lanes);
  const std::string models = r.word_bytes == sizeof(float) ? std::to_string(1 + r.sums + r.lanes) + "x"
                                                           : "1+" + n + "x" + fmt(static_cast<double>(r.word_bytes) / sizeof(float), r.word_bytes < 4 ? 2 : 0);
  return models + "+64+conns/2";
}

// The silos' idle seconds a round: "0.120, 0.310 (silo-07)", or "-" without timelines.
std::string idle_text(const RoundResult& r) {
  if (r.idle_seconds.empty()) return "-";
  double sum = 0;
  auto most = r.idle_seconds.begin();
  for (auto it = r.idle_seconds.begin(); it != r.idle_seconds.end(); ++it) {
    sum += it->second;
    if (it->second > most->second) most = it;
  }
  return fmt(sum / static_cast<double>(r.idle_seconds.size()), 3) + ", " + fmt(most->second, 3) + " (" + most->first + ")";
}

std::uint16_t wait_for_port(const std::filesystem::path& port_file, const std::filesystem::path& log,
                            const std::string& who) {
  for (int i = 0; i < 1000; ++i) {
    if (std::filesystem::exists(port_file) && !read_file(port_file).empty()) {
      return static_cast<std::uint16_t>(std::stoi(read_file(port_file)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  throw std::runtime_error("bench round: " + who + " did not start:\n" + log_tail(log));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// The daemons of one run, and the folder of their certificates, configs, logs and state.
struct Federation {
  std::filesystem::path dir;
  std::vector<std::string> silo_names, edge_names;
  std::unique_ptr<Process> server;
  std::uint16_t port = 0;
  std::vector<std::pair<std::string, std::unique_ptr<Process>>> daemons;  // edges and agents
};

// Every daemon's "transport" block.
json transport_settings() {
  return json{{"max_frame_bytes", 4 << 20}, {"idle_timeout_s", 120}, {"max_queued_mib", 4096}};
}

// A daemon named `name` (server, silo-I, edge-E), inside its network namespace if the
// benchmark runs across namespaces (`ip netns exec` execs the daemon in place).
std::unique_ptr<Process> start_daemon(const RoundBenchOptions& opts, const std::filesystem::path& dir,
                                      const std::string& name, const std::string& role,
                                      const std::vector<std::string>& args) {
  std::vector<std::string> argv;
  if (!opts.netns_prefix.empty()) argv = {"ip", "netns", "exec", opts.netns_prefix + "-" + name};
  argv.push_back(self_exe());
  argv.push_back(role);
  argv.insert(argv.end(), args.begin(), args.end());
  return std::make_unique<Process>(argv, dir / (name + ".log"));
}

// The run's own CA, and a certificate for the server and for each silo and edge.
void issue_certificates(Federation& f, std::size_t silos, std::size_t edges) {
  const auto pki = f.dir / "pki";
  transport::pki_init(pki, "bench");
  transport::pki_issue(pki, {wire::SERVER, "server"});
  for (std::size_t i = 0; i < silos; ++i) {
    f.silo_names.push_back("silo-" + std::to_string(i));
    transport::pki_issue(pki, {wire::SILO, f.silo_names.back()});
  }
  for (std::size_t e = 0; e < edges; ++e) {
    f.edge_names.push_back("edge-" + std::to_string(e));
    transport::pki_issue(pki, {wire::EDGE, f.edge_names.back()});
  }
}

// Writes the server's config and loads it as the server will.
server::ServerConfig write_server_config(const RoundBenchOptions& opts, const Federation& f) {
  const auto& dir = f.dir;
  const auto pki = dir / "pki";
  const auto& names = f.silo_names;
  const auto& edge_names = f.edge_names;
  const std::string host = opts.server_address;
  json server = {{"federation", "bench"},
                 {"listen", host + ":0"},
                 {"port_file", (dir / "port").string()},
                 {"tls", {{"kit", (pki / "kits/server").string()}}},
                 {"allow", !edge_names.empty() ? json{{"silo", names}, {"edge", edge_names}} : json{{"silo", names}}},
                 {"state_dir", (dir / "state").string()},
                 {"keep_checkpoints", 1},
                 {"rounds", opts.rounds},
                 {"model", {{"kind", "synthetic"}, {"parameters", opts.params}}},
                 {"selection", {{"min_silos", names.size()}}},
                 {"deadlines", {{"join_s", 60}, {"train_s", 600}, {"upload_s", 600}}},
                 {"secure", {{"mode", opts.secure}}},
                 {"transport", transport_settings()}};
  if (!opts.compression.is_null()) server["compression"] = opts.compression;
  if (!opts.broadcast.is_null()) server["broadcast"] = opts.broadcast;
  if (opts.uploads_at_once >= 0) server["uploads_at_once"] = opts.uploads_at_once;
  if (opts.broadcasts_at_once >= 0) server["broadcasts_at_once"] = opts.broadcasts_at_once;
  if (opts.network_threads >= 0) server["network_threads"] = opts.network_threads;
  atomic_write_file(dir / "server.json", server.dump(2));
  // A compression block the server would refuse is a usage error here, not a failed run.
  try {
    return server::load_server_config(dir / "server.json");
  } catch (const ConfigError&) {
    std::filesystem::remove_all(dir);
    throw;
  }
}

// Starts each edge under the server; returns the port each one listens on for its silos.
std::vector<std::uint16_t> start_edges(const RoundBenchOptions& opts, Federation& f) {
  const auto& dir = f.dir;
  const auto pki = dir / "pki";
  const auto& edge_names = f.edge_names;
  const std::string host = opts.server_address;
  std::vector<std::uint16_t> edge_ports;
  for (std::size_t e = 0; e < edge_names.size(); ++e) {
    const auto port_file = dir / (edge_names[e] + ".port");
    const json edge = {{"federation", "bench"},
                       {"listen", "127.0.0.1:0"},
                       {"port_file", port_file.string()},
                       {"upstreams", {host + ":" + std::to_string(f.port)}},
                       {"tls", {{"kit", (pki / "kits" / edge_names[e]).string()}}},
                       {"allow", {{"silo", f.silo_names}}},
                       {"transport", transport_settings()},
                       {"log_level", "warn"}};
    atomic_write_file(dir / (edge_names[e] + ".json"), edge.dump(2));
    f.daemons.emplace_back(edge_names[e], start_daemon(opts, dir, edge_names[e], "edge",
                                                       {"--config", (dir / (edge_names[e] + ".json")).string()}));
    edge_ports.push_back(wait_for_port(port_file, dir / (edge_names[e] + ".log"), "an edge"));
  }
  return edge_ports;
}

// Starts each silo's agent with the synthetic trainer, under its edge (silo i under edge
// i mod edges) or straight under the server.
void start_agents(const RoundBenchOptions& opts, Federation& f, const std::vector<std::uint16_t>& edge_ports) {
  const auto& dir = f.dir;
  const auto pki = dir / "pki";
  const auto& names = f.silo_names;
  const std::size_t edges = edge_ports.size();
  const std::string host = opts.server_address;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& n = names[i];
    const std::string up =
        edges ? "127.0.0.1:" + std::to_string(edge_ports[i % edges]) : host + ":" + std::to_string(f.port);
    const json agent = {{"federation", "bench"},
                        {"upstreams", {up}},
                        {"tls", {{"kit", (pki / "kits" / n).string()}}},
                        {"trainer", {{"kind", "external"}, {"command", {"(synthetic)"}}}},
                        {"state_dir", (dir / n).string()},
                        {"transport", transport_settings()},
                        {"log_level", std::getenv("XSILO_KEEP_BENCH_DIR") ? "info" : "warn"}};
    atomic_write_file(dir / (n + ".json"), agent.dump(2));
    // The synthetic trainer (no data, a random update) is a simulation hook, not an agent feature.
    atomic_write_file(dir / (n + ".simulate.json"), json{{"synthetic", {{"samples", 100}}}}.dump());
    f.daemons.emplace_back(n, start_daemon(opts, dir, n, "agent",
                                           {"--config", (dir / (n + ".json")).string(), "--simulate",
                                            (dir / (n + ".simulate.json")).string()}));
  }
}

// Every round must commit: a round that aborted measured a dropout, not a round. Throws for a
// round that did not, and, once the run has ended (`why`), for rounds that never came.
std::vector<server::MetricsRow> check_rounds(const std::filesystem::path& dir, std::uint64_t rounds,
                                             const std::string& why) {
  const auto rows = server::read_metrics(dir / "state/metrics.csv");
  for (const auto& row : rows) {
    if (!row.committed) {
      throw std::runtime_error("bench round: round " + std::to_string(row.round) + " did not commit (" +
                               std::to_string(row.reported) + " of " + std::to_string(row.selected) +
                               " silos reported):\n" + log_tail(dir / "server.log"));
    }
  }
  if (!why.empty() && rows.size() < rounds) {
    throw std::runtime_error("bench round: " + why + " after " + std::to_string(rows.size()) + " of " +
                             std::to_string(rounds) + " rounds:\n" + log_tail(dir / "server.log"));
  }
  return rows;
}

// Waits for the server's last round. The server would wait for a lost silo until its
// deadlines, so the run fails as soon as a round aborts or a daemon exits before the last round.
std::vector<server::MetricsRow> run_rounds(Federation& f, std::uint64_t rounds) {
  std::optional<int> code;
  for (int half_seconds = 0; !code && half_seconds < 30 * 60 * 2; ++half_seconds) {
    code = f.server->wait(std::chrono::milliseconds(500));
    check_rounds(f.dir, rounds, "");
    for (auto& [name, p] : f.daemons) {
      if (!code && !p->running()) {
        check_rounds(f.dir, rounds, name + " exited with code " + std::to_string(*p->exit_code()));
      }
    }
  }
  if (!code || *code != 0) {
    throw std::runtime_error("bench round: the server failed:\n" + log_tail(f.dir / "server.log"));
  }
  for (auto& d : f.daemons) d.second->wait(std::chrono::seconds(10));
  return check_rounds(f.dir, rounds, "the server ended");
}

// A round record's participants' idle seconds, added to `idle` (and counted): the wait between
// UpdateReady and the upload's grant, and from the upload received to the round's close.
void add_idle(const json& rec, std::map<std::string, double>& idle, std::map<std::string, std::size_t>& counted) {
  const double closed = rec.value("phases", json::object()).value("commit", -1.0);
  if (closed < 0) return;
  for (const auto& p : rec.value("participants", json::array())) {
    const auto t = p.value("timeline", json::object());
    if (!t.contains("ready") || !t.contains("granted") || !t.contains("received")) continue;
    idle[p.value("silo", "")] +=
        server::idle_seconds(t["ready"].get<double>(), t["granted"].get<double>(), t["received"].get<double>(), closed);
    ++counted[p.value("silo", "")];
  }
}

// The run's numbers, from the server's metrics rows, its stats and its audit log.
RoundResult measure(const RoundBenchOptions& opts, const server::ServerConfig& server_cfg, const Federation& f,
                    const std::vector<server::MetricsRow>& rows) {
  const auto& dir = f.dir;
  const std::uint64_t rounds = opts.rounds;
  const std::size_t silos = f.silo_names.size(), edges = f.edge_names.size();
  const auto stats = json::parse(read_file(dir / "state/server_stats.json"));
  RoundResult r;
  r.silos = silos;
  r.edges = edges;
  r.scheme = protocol::describe(server_cfg.compression);
  if (protocol::compressed(server_cfg.broadcast)) r.scheme += ", broadcast " + protocol::describe(server_cfg.broadcast);
  r.loopback_bound = opts.netns_prefix.empty() && !protocol::compressed(server_cfg.compression) &&
                     !protocol::compressed(server_cfg.broadcast) && !server_cfg.secure.on();
  r.peak_rss = stats["peak_rss_bytes"];
  r.peak_descriptors = stats.value("peak_open_descriptors", std::size_t{0});
  r.model_bytes = stats["model_bytes"];
  r.staged = server::stages_uploads(server_cfg, r.model_bytes);
  r.lanes = std::max<std::size_t>(1, std::min(server_cfg.uploads_at_once, edges ? edges : silos));
  if (server_cfg.secure.on()) {
    r.word_bytes = server_cfg.secure.bits / 8;
    if (server_cfg.secure.mode == server::SecureMode::Grouped) {
      r.sums = std::max<std::size_t>(1, silos / server::group_size(server_cfg.secure));
    }
  }
  // Rounds after the first: connection set-up and page faults of the first allocations are
  // not part of a steady round.
  std::vector<double> secs;
  std::uint64_t uploaded = 0;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    uploaded += rows[k].upload_bytes;
    if (k > 0 || rounds == 1) secs.push_back(rows[k].seconds);
  }
  r.seconds_per_round = median(secs);
  r.upload_bytes_per_sender = uploaded / rounds / (edges ? edges : silos);
  // The model's broadcast, from the audit records, over the same rounds as the timing (a
  // compressed broadcast sends the whole model in the first).
  std::uint64_t sent = 0, timed = 0;
  std::map<std::string, double> idle;
  std::map<std::string, std::size_t> counted;
  for (const auto& rec : server::read_audit_log(dir / "state/audit.jsonl")) {
    if (rec.value("event", "") != "round" || (rec.value("round", 0) == 1 && rounds > 1)) continue;
    sent += rec.value("broadcast_bytes", std::uint64_t{0});
    ++timed;
    add_idle(rec, idle, counted);
  }
  for (const auto& [silo, seconds] : idle) r.idle_seconds[silo] = seconds / static_cast<double>(counted[silo]);
  r.download_bytes_per_receiver = timed ? sent / timed / (edges ? edges : silos) : 0;
  const std::uint64_t total = stats["bytes_in"].get<std::uint64_t>() + stats["bytes_out"].get<std::uint64_t>();
  r.server_bytes_per_round = total / rounds;
  r.cpu_seconds = stats.value("cpu_seconds", 0.0);
  r.bytes_in = stats["bytes_in"].get<std::uint64_t>();
  r.bytes_out = stats["bytes_out"].get<std::uint64_t>();
  r.server_ingress_per_round = stats["bytes_in"].get<std::uint64_t>() / rounds;
  r.throughput_gbps = static_cast<double>(r.server_bytes_per_round) / r.seconds_per_round / 1e9;
  return r;
}

RoundResult run_one(const RoundBenchOptions& opts, std::size_t silos, std::size_t edges) {
  Federation f;
  f.dir = std::filesystem::temp_directory_path() /
          ("xsilo-bench-round-" + std::to_string(::getpid()) + "-" + std::to_string(silos) + "-" +
           std::to_string(edges));
  std::filesystem::remove_all(f.dir);
  issue_certificates(f, silos, edges);
  const auto server_cfg = write_server_config(opts, f);
  f.server = start_daemon(opts, f.dir, "server", "server", {"--config", (f.dir / "server.json").string()});
  f.port = wait_for_port(f.dir / "port", f.dir / "server.log", "the server");
  start_agents(opts, f, start_edges(opts, f));
  const auto rows = run_rounds(f, opts.rounds);
  RoundResult r = measure(opts, server_cfg, f, rows);
  if (!std::getenv("XSILO_KEEP_BENCH_DIR")) std::filesystem::remove_all(f.dir);
  return r;
}

// The runs' table and what its bounds are.
void print_round_table(const std::vector<std::vector<std::string>>& rows, double gcm_rate, double sha_rate) {
  print_table({"upload", "silos", "edges", "params", "s/round", "upload MiB/sender", "model MiB/receiver",
               "server MiB/round", "ingress MiB/round", "GB/s", "of TLS limit", "server CPU s/GB (x crypto alone)",
               "server peak RSS MiB", "RSS bound MiB", "server fds", "silo idle s/round: mean, most"},
              rows);
  if (gcm_rate > 0 && sha_rate > 0) {
    std::cout << "Crypto alone, one core (openssl speed, this run): AES-256-GCM " << fmt(gcm_rate / 1e9, 2)
              << " GB/s, SHA-256 " << fmt(sha_rate / 1e9, 2)
              << " GB/s; the server's bytes need GCM on every byte in and out and SHA-256 on every byte in; "
                 "target: server CPU within 1.5x of that (its whole run, start-up and every thread included)\n";
  } else {
    std::cout << "Crypto alone: `openssl speed` gave no rate here, so the CPU column has no bound\n";
  }
  std::cout << "TLS 1.3 loopback limit between two processes: " << kTlsLoopbackGBps
            << " GB/s (DESIGN §11); target for dense plain rounds on loopback: at least half of it; for every "
               "run: peak RSS under the bound ((2 + uploads at once) x the model + 64 MiB + 0.5 MiB a connection, the uploads at once "
               "being the server's uploads_at_once or the senders, if fewer; under secure aggregation the sum and "
               "the upload buffers are the ring's words, and each secure group has a sum of its own: the model + "
               "(groups + uploads at once) x the words; 2.2x when uploads are staged in a file, models over the "
               "server's stage_uploads_over_mib)\n";
}

}  // namespace

int bench_round(const RoundBenchOptions& opts) {
  if (!opts.netns_prefix.empty() && std::any_of(opts.edges.begin(), opts.edges.end(), [](auto e) { return e > 0; })) {
    throw ConfigError("bench round: --netns-prefix runs silos straight to the server; leave out --edges");
  }
  std::vector<std::vector<std::string>> rows;
  bool ok = true;
  // The crypto-alone bound's rates, one core, measured now beside the runs (DESIGN §11).
  const double gcm_rate = openssl_speed("aes-256-gcm", "AES-256-GCM");
  const double sha_rate = openssl_speed("sha256", "sha256");
  for (auto k : opts.silos) {
   for (auto e : opts.edges) {
    if (!opts.json) std::cerr << "running: " << k << " silos, " << e << " edges, " << opts.params << " parameters, "
                              << opts.rounds << " rounds..." << std::endl;
    const auto r = run_one(opts, k, e);
    const double mib = 1024.0 * 1024.0;
    // The global model, the sum (a secure group's each) and a buffer per lane, a fixed base, and
    // the TLS and stream buffers of each connection (half a MiB; tests/scale_test.cpp holds the
    // same). Plain: (2 + lanes) x the model.
    const double connections = static_cast<double>(k + e);
    const double words = static_cast<double>(r.model_bytes) / sizeof(float) * static_cast<double>(r.word_bytes);
    const double rss_bound = r.staged ? 2.2 * static_cast<double>(r.model_bytes)
                                      : static_cast<double>(r.model_bytes) +
                                            static_cast<double>(r.sums + r.lanes) * words + 64 * mib +
                                            0.5 * mib * connections;
    const bool rss_ok = static_cast<double>(r.peak_rss) < rss_bound;
    const bool tput_ok = !r.loopback_bound || r.throughput_gbps >= kTlsLoopbackGBps / 2;
    const double moved_gb = static_cast<double>(r.bytes_in + r.bytes_out) / 1e9;
    const double cpu_per_gb = moved_gb > 0 ? r.cpu_seconds / moved_gb : 0;
    const double alone_per_gb = crypto_alone_seconds_per_gb(r, gcm_rate, sha_rate);
    ok = ok && rss_ok && tput_ok;
    if (opts.json) {
      std::cout << json{{"bench", "round"},
                        {"silos", k},
                        {"edges", e},
                        {"params", opts.params},
                        {"scheme", r.scheme},
                        {"secure", opts.secure},
                        {"seconds_per_round", r.seconds_per_round},
                        {"upload_bytes_per_sender_per_round", r.upload_bytes_per_sender},
                        {"download_bytes_per_receiver_per_round", r.download_bytes_per_receiver},
                        {"silo_idle_seconds_per_round", r.idle_seconds},
                        {"server_bytes_per_round", r.server_bytes_per_round},
                        {"server_ingress_bytes_per_round", r.server_ingress_per_round},
                        {"throughput_GBps", r.throughput_gbps},
                        {"tls_loopback_limit_GBps", r.loopback_bound ? json(kTlsLoopbackGBps) : json()},
                        {"server_cpu_seconds", r.cpu_seconds},
                        {"server_cpu_seconds_per_GB", cpu_per_gb},
                        {"crypto_alone_seconds_per_GB", alone_per_gb},
                        {"peak_rss_bytes", r.peak_rss},
                        {"server_open_descriptors", r.peak_descriptors},
                        {"peak_rss_bound_bytes", rss_bound},
                        {"uploads_staged", r.staged},
                        {"model_bytes", r.model_bytes}}
                       .dump()
                << std::endl;
    }
    rows.push_back({r.scheme + (opts.secure == "off" ? "" : ", secure " + opts.secure), std::to_string(k),
                    std::to_string(e), std::to_string(opts.params), fmt(r.seconds_per_round, 3),
                    fmt(static_cast<double>(r.upload_bytes_per_sender) / mib, 2),
                    fmt(static_cast<double>(r.download_bytes_per_receiver) / mib, 2),
                    fmt(static_cast<double>(r.server_bytes_per_round) / mib, 1),
                    fmt(static_cast<double>(r.server_ingress_per_round) / mib, 1),
                    fmt(r.throughput_gbps, 3) + (tput_ok ? "" : " (<0.6)"),
                    r.loopback_bound ? fmt(100 * r.throughput_gbps / kTlsLoopbackGBps, 0) + "%" : "-",
                    fmt(cpu_per_gb, 2) + (alone_per_gb > 0 ? " (" + fmt(cpu_per_gb / alone_per_gb, 2) + "x)" : ""),
                    fmt(static_cast<double>(r.peak_rss) / mib, 1) + (rss_ok ? "" : " (over)"),
                    fmt(rss_bound / mib, 1) + " (" + bound_terms(r) + ")", std::to_string(r.peak_descriptors),
                    idle_text(r)});
   }
  }
  if (!opts.json) print_round_table(rows, gcm_rate, sha_rate);
  return ok ? 0 : 1;
}

}  // namespace xsilo::tools
