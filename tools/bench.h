// `xsilo bench ...`: programs that measure, print a table, and compare with the physical limits
// of DESIGN §11 (docs/benchmarks.md records the figures and the commands).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "robust/robust.h"

namespace xsilo::tools {

// Wall seconds since t0, for the timings every bench prints.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The bounds measured on the reference machine (2 cores), DESIGN §11.
inline constexpr double kTlsLoopbackGBps = 1.2;
inline constexpr double kMemcpyGBps = 25.0;

// `openssl speed -evp EVP -bytes 16384` on one core, in bytes per second: the rate of the line
// whose algorithm name contains LABEL (0 if openssl is missing or prints no such line).
double openssl_speed(const std::string& evp, const std::string& label);

struct RoundBenchOptions {
  std::vector<std::size_t> silos{8};
  std::size_t params = 10'000'000;
  std::uint64_t rounds = 3;
  bool json = false;
  std::vector<std::size_t> edges{0};  // 0: silos connect straight to the server
  // The server config's "compression" block and secure.mode of every run (null, "off": neither).
  nlohmann::json compression;
  nlohmann::json broadcast;  // the server config's "broadcast" block (null: the whole model every round)
  std::string secure = "off";
  // For scripts/wan-bench.sh: each process in a network namespace the script made and shaped,
  // PREFIX-server and PREFIX-silo-I, the server listening on `server_address` (no edges).
  std::string netns_prefix;
  std::string server_address = "127.0.0.1";
  // The server's uploads_at_once and broadcasts_at_once (negative: the server's default).
  std::int64_t uploads_at_once = -1;
  std::int64_t broadcasts_at_once = -1;
  std::int64_t network_threads = -1;  // the server's network_threads (negative: its default)
};

// Server and K agents (real processes, mutual TLS on loopback) with a synthetic model: no
// training, only the protocol, the transport and the aggregation.
int bench_round(const RoundBenchOptions& opts);

// One TLS channel streaming a model of `mib` MiB in chunks to another thread.
int bench_transport(std::size_t mib, std::size_t chunk_bytes, bool json);

struct AttackBenchOptions {
  std::vector<std::string> datasets{"digits", "breast_cancer"};
  std::vector<double> alpha{0.5, 0.1};           // Dirichlet label skew
  std::vector<std::size_t> attackers{2, 3};
  std::vector<std::uint64_t> seeds{11, 12, 13};  // each cell: mean and spread over these
  std::uint64_t rounds = 30;
  double tau = 0;     // centered clipping radius; 0: "auto" (from the round's own inputs)
  std::size_t f = 0;  // the rules' tolerance; 0: the number of attackers
  std::size_t iterations = 10;  // centered clipping's
  double oppose = robust::kDefaultOppose;  // centered clipping's opposition (0: none)
  double one_sided = robust::kDefaultOneSided;  // centered clipping's one-sided test (0: none)
  double lag = robust::kDefaultLag;              // centered clipping's lag test (0: none)
  std::size_t silos = 10;
  std::vector<std::string> defences, attacks;    // only these (empty: all)
  bool processes = false;                        // real processes instead of in process
  bool json = false;
};
int bench_attacks(const AttackBenchOptions& opts);

// One row of the attack tables: a rule with its pre-aggregation steps (the server's
// "aggregation" block) and silo-side settings (keys of "training", e.g. silo_momentum).
// A row may also be a secure round ("secure": the server's secure section; the rule then sees
// one mean per group, and its f counts groups).
struct Defence {
  std::string name;
  nlohmann::json aggregation, training, secure;
};
std::vector<Defence> attack_bench_defences(std::size_t f, double tau, std::size_t iterations = 10,
                                           std::size_t silos = 10, double oppose = robust::kDefaultOppose,
                                           double one_sided = robust::kDefaultOneSided,
                                           double lag = robust::kDefaultLag);

struct RobustBenchOptions {
  std::vector<std::size_t> n{10, 32, 100};
  std::vector<std::size_t> d{1'000'000, 10'000'000};
  std::string numpy_rules = "median,trimmed_mean,krum,multi_krum";
  bool json = false;
};
int bench_robust(const RobustBenchOptions& opts);

struct SecAggBenchOptions {
  std::vector<std::size_t> n{10, 50, 100};
  std::vector<std::size_t> d{1'000'000, 10'000'000};
  std::vector<double> dropouts{0.0, 0.1, 0.3};
  std::string graph = "complete";  // complete (SecAgg), plus (SecAgg+ neighbour graphs) or both
  double plan_dropout = 0.3;       // the dropout rate SecAgg+'s graph is chosen for
  double corrupt = 0.05;           // the fraction of corrupt silos it is chosen for
  bool lightsecagg = false;        // add LightSecAgg rows (crypto/lightsecagg.h) to each cell
  double lsa_privacy = 0.5;        // LightSecAgg's T as a fraction of n (U from plan_dropout)
  bool json = false;
};
int bench_secagg(const SecAggBenchOptions& opts);

struct AllreduceBenchOptions {
  std::vector<std::string> backends{"ring", "hd", "auto"};
  std::vector<int> ranks{4};
  std::vector<std::size_t> bytes{4096, 16384, 65536, 262144, 1u << 20, 4u << 20, 16u << 20, 64u << 20, 256u << 20};
  std::size_t chunk_bytes = 1u << 20;  // pipelining unit of our ring
  std::size_t ranks_per_host = 2;      // hierarchical: ranks r / this share a host
  std::string intra_host = "tcp";      // hierarchical: inside each host tcp, nccl or auto
  double topk_fraction = 0.01;         // topk: the share of coordinates each rank sends
  // Ranks on several hosts, as an agent's local.hosts: rank k on hosts[k % size], started
  // through `launcher` (local.launcher's words, "{host}" replaced); the coordinator listens on
  // listen_host. Empty: every rank on this host.
  std::vector<std::string> hosts, launcher;
  std::string listen_host = "127.0.0.1";
  bool peers = true;  // OpenMPI and Gloo in the same run
  bool json = false;
};
// Our all-reduce across N worker processes on loopback, beside OpenMPI and Gloo.
int bench_allreduce(const AllreduceBenchOptions& opts);

struct TrainerBenchOptions {
  std::vector<std::size_t> params{10'000'000, 100'000'000};
  std::size_t repeats = 3;
  std::uint64_t rounds = 20;   // the default experiment, built-in vs external (0: skip)
  std::string python = "/usr/bin/python3";
  bool json = false;
};
// The hand-off to an external trainer and back, against /dev/shm once; per-round overhead.
int bench_trainer(const TrainerBenchOptions& opts);

struct StragglerBenchOptions {
  int workers = 6, stragglers = 1, slow_worker = 1, repeats = 3;
  std::vector<double> slow{1, 5, 10};  // how many times slower the slow worker computes
  std::uint32_t epochs = 2, batch = 240;
  std::vector<std::size_t> hidden{256, 256};
  bool gossip = false;  // also push-sum gossip (local.algorithm "gossip")
  bool json = false;
};
// A data-parallel step with one slow local worker, without and with fractional repetition, and
// with --gossip by push-sum gossip.
int bench_stragglers(const StragglerBenchOptions& opts);

struct CompressionBenchOptions {
  std::vector<std::size_t> d{1'000'000, 10'000'000};  // codec speed
  std::uint64_t rounds = 30;                          // learning quality (0: skip)
  std::vector<std::uint64_t> seeds{11};
  std::vector<std::string> only;                      // only these rows (default: all)
  std::filesystem::path sim;                          // a sim config's model, trainer and data (default: digits MLP)
  bool skip_codecs = false;
  bool json = false;
};
// Upload compressors: accuracy and bytes of whole federations, and the codecs' speed.
int bench_compression(const CompressionBenchOptions& opts);

// A fixed-width table: header row, then rows.
void print_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);
std::string fmt(double v, int decimals = 2);

}  // namespace xsilo::tools
