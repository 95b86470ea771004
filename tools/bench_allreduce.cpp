// xsilo bench allreduce: our TCP all-reduce (ring, halving-doubling, tree, butterfly, auto, and
// int8: the 8-bit all-reduce with error feedback; hierarchical, with --ranks-per-host; topk: the
// sparse all-reduce, with the bytes it moves and the error a merging ring would add) across N worker processes on loopback, beside
// OpenMPI's MPI_Allreduce over TCP and Gloo's ring-chunked all-reduce measured in the same run,
// against the loopback bound measured in the same run. With tree or butterfly among the
// backends, OpenMPI's own algorithm of that shape runs too (openmpi-tree: a segmented binary-tree
// reduce then a segmented binary-tree broadcast; openmpi-butterfly: recursive doubling); Gloo has
// neither. Bus bandwidth follows nccl-tests: busbw = algbw x
// 2(N-1)/N, the rate each link must carry, counted in float32 bytes for every system (int8's
// links carry about a quarter of that).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/process.h"
#include "common/result.h"
#include "silo_agent/collective/gpu_info.h"
#include "silo_agent/collective/group.h"
#include "silo_agent/collective/sparse_all_reduce.h"
#include "silo_agent/workers.h"
#include "tools/bench.h"

namespace xsilo::tools {

namespace {

using json = nlohmann::json;
using Results = std::map<std::size_t, double>;  // bytes -> seconds per all-reduce

// Plain TCP over loopback, one stream between two threads: what one link carries here.
double loopback_once() {
  auto [lfd, port] = collective::listen_any("127.0.0.1");
  constexpr std::size_t total = std::size_t{512} << 20, block = std::size_t{1} << 20;
  std::thread receiver([lfd = lfd] {
    const int fd = ::accept(lfd, nullptr, nullptr);
    std::vector<char> buf(block);
    std::size_t got = 0;
    while (got < total) {
      const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    ::close(fd);
  });
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  double rate = 0;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    std::vector<char> buf(block, 1);
    const auto t0 = std::chrono::steady_clock::now();
    std::size_t sent = 0;
    while (sent < total) {
      const ssize_t n = ::send(fd, buf.data(), buf.size(), MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<std::size_t>(n);
    }
    ::shutdown(fd, SHUT_WR);
    receiver.join();
    rate = static_cast<double>(sent) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } else {
    receiver.detach();
  }
  ::close(fd);
  ::close(lfd);
  return rate;
}

// The best of a few runs: the machine's capacity, not its worst moment.
double loopback_rate() {
  double best = 0;
  for (int i = 0; i < 5; ++i) best = std::max(best, loopback_once());
  return best;
}

// The "WORD bytes value" lines of a rank's log, by size: RESULT lines carry the seconds per
// all-reduce, SENT lines (topk) the bytes rank 0 sent per call.
std::map<std::size_t, double> parse_lines(const std::filesystem::path& log, const std::string& tag) {
  std::map<std::size_t, double> r;
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string word;
    std::size_t bytes;
    double value;
    if (s >> word >> bytes >> value && word == tag) r[bytes] = value;
  }
  return r;
}

Results parse_results(const std::filesystem::path& log) { return parse_lines(log, "RESULT"); }

std::vector<std::string> size_args(const std::vector<std::size_t>& sizes) {
  std::vector<std::string> out;
  for (auto s : sizes) out.push_back(std::to_string(s));
  return out;
}

bool wait_all(std::vector<std::unique_ptr<Process>>& procs, std::chrono::seconds limit) {
  bool ok = true;
  for (auto& p : procs) {
    const auto code = p->wait(std::chrono::duration_cast<std::chrono::milliseconds>(limit));
    if (!code) p->stop();
    ok = ok && code && *code == 0;
  }
  return ok;
}

Results run_ours(const std::string& backend, int ranks, const AllreduceBenchOptions& opts,
                 const std::filesystem::path& dir) {
  const auto& sizes = opts.bytes;
  const bool compressed = backend == "int8" || backend == "topk";
  // hierarchical+ALG: the hierarchical all-reduce with ALG among the hosts' leaders.
  const auto plus = backend.find('+');
  const std::string base = plus == std::string::npos ? backend : backend.substr(0, plus);
  const std::string across = plus == std::string::npos ? "ring" : backend.substr(plus + 1);
  std::cerr << "bench allreduce: " << backend << ", " << ranks << " ranks..." << std::endl;
  collective::Coordinator coord(ranks, std::chrono::milliseconds(5000), opts.listen_host);
  std::vector<std::unique_ptr<Process>> procs;
  for (int k = 0; k < ranks; ++k) {
    // With hosts given, hierarchical groups the ranks by their --host address.
    const std::string host = opts.hosts.empty() ? "127.0.0.1" : opts.hosts[static_cast<std::size_t>(k) % opts.hosts.size()];
    const bool by_rank = base == "hierarchical" && opts.hosts.empty();
    std::vector<std::string> argv{self_exe(), "collective", "--coordinator",
                                  opts.listen_host + ":" + std::to_string(coord.port()), "--id", std::to_string(k),
                                  "--host", host, "--backend", compressed ? "ring" : base, "--across-hosts", across, "--intra-host", opts.intra_host,
                                  "--compression", compressed ? backend : "none", "--step-timeout-ms", "60000",
                                  "--chunk-bytes", std::to_string(opts.chunk_bytes), "--ranks-per-host",
                                  by_rank ? std::to_string(opts.ranks_per_host) : "0",
                                  "--topk-fraction", std::to_string(opts.topk_fraction), "--bench"};
    for (auto& s : size_args(sizes)) argv.push_back(s);
    if (!opts.hosts.empty() && !opts.launcher.empty()) {
      const auto prefix = agent::launch_prefix(opts.launcher, host);
      argv.insert(argv.begin(), prefix.begin(), prefix.end());
    }
    procs.push_back(std::make_unique<Process>(argv, dir / (backend + "-" + std::to_string(k) + ".log")));
  }
  if (!wait_all(procs, std::chrono::seconds(900))) {
    std::cerr << "bench allreduce: a " << backend << " worker failed; see " << dir.string() << "\n";
  }
  return parse_results(dir / (backend + "-0.log"));
}

std::filesystem::path peer_binary(const std::string& name) {
  return std::filesystem::path(XSILO_BENCH_BIN_DIR) / name;
}

// The mpirun arguments that force OpenMPI's coll/tuned all-reduce of the same shape as our
// `ours` (tree, butterfly), pieces of our chunk size; none (its own choice) for anything else.
std::vector<std::string> mpi_algorithm(const std::string& ours, std::size_t chunk_bytes) {
  const std::string segment = std::to_string(chunk_bytes);
  std::vector<std::string> mca{"--mca", "coll_tuned_use_dynamic_rules", "1"};
  auto add = [&](const char* key, const std::string& value) {
    mca.insert(mca.end(), {"--mca", key, value});
  };
  if (ours == "tree") {
    add("coll_tuned_allreduce_algorithm", "2");  // nonoverlapping: reduce, then bcast
    add("coll_tuned_reduce_algorithm", "4");     // binary tree
    add("coll_tuned_reduce_algorithm_segmentsize", segment);
    add("coll_tuned_bcast_algorithm", "5");      // binary tree
    add("coll_tuned_bcast_algorithm_segmentsize", segment);
  } else if (ours == "butterfly") {
    add("coll_tuned_allreduce_algorithm", "3");  // recursive doubling
  } else {
    return {};
  }
  return mca;
}

Results run_mpi(int ranks, const std::vector<std::size_t>& sizes, const std::filesystem::path& dir,
                const std::string& variant = "", std::size_t chunk_bytes = 1u << 20) {
  const auto bin = peer_binary("xsilo_mpi_allreduce");
  const std::string name = variant.empty() ? "openmpi" : "openmpi-" + variant;
  std::cerr << "bench allreduce: " << name << ", " << ranks << " ranks..." << std::endl;
  if (!std::filesystem::exists(bin)) {
    std::cout << "OpenMPI peer: skipped (" << bin.string() << " was not built: OpenMPI not found)\n";
    return {};
  }
  // TCP only (no shared memory), so that every system here moves its bytes through loopback.
  std::vector<std::string> argv{"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(ranks),
                                "--mca", "btl", "tcp,self", "--mca", "pml", "ob1", "--mca", "btl_tcp_if_include",
                                "lo"};
  for (auto& a : mpi_algorithm(variant, chunk_bytes)) argv.push_back(a);
  argv.push_back(bin.string());
  for (auto& s : size_args(sizes)) argv.push_back(s);
  const auto log = dir / (name + ".log");
  std::vector<std::unique_ptr<Process>> procs;
  procs.push_back(std::make_unique<Process>(argv, log));
  if (!wait_all(procs, std::chrono::seconds(900))) std::cerr << "bench allreduce: mpirun failed; see " << log.string() << "\n";
  return parse_results(log);
}

Results run_gloo(int ranks, const std::vector<std::size_t>& sizes, const std::filesystem::path& dir) {
  const auto bin = peer_binary("xsilo_gloo_allreduce");
  std::cerr << "bench allreduce: Gloo, " << ranks << " ranks..." << std::endl;
  if (!std::filesystem::exists(bin)) {
    std::cout << "Gloo peer: skipped (" << bin.string() << " was not built: Gloo not found)\n";
    return {};
  }
  const auto store = dir / "gloo-store";
  std::filesystem::remove_all(store);
  std::filesystem::create_directories(store);
  std::vector<std::unique_ptr<Process>> procs;
  for (int k = 0; k < ranks; ++k) {
    std::vector<std::string> argv{bin.string(), std::to_string(k), std::to_string(ranks), store.string()};
    for (auto& s : size_args(sizes)) argv.push_back(s);
    procs.push_back(std::make_unique<Process>(argv, dir / ("gloo-" + std::to_string(k) + ".log")));
  }
  if (!wait_all(procs, std::chrono::seconds(900))) std::cerr << "bench allreduce: a Gloo rank failed; see " << dir.string() << "\n";
  return parse_results(dir / "gloo-0.log");
}

std::string human(std::size_t bytes) {
  if (bytes >= (1u << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

// Success when NCCL can run `ranks` ranks here, else why not.
Status nccl_available(int ranks) {
  const auto gpu = collective::gpu_info();
  if (!gpu.built) return Error("this xsilo was built without CUDA and NCCL");
  if (gpu.devices == 0) return Error("no GPU: " + gpu.cuda_error);
  if (gpu.devices < ranks) return Error("NCCL takes one GPU per rank; " + std::to_string(gpu.devices) + " visible");
  return {};
}

using Measured = std::map<std::string, Results>;

// Bus bandwidth is algorithm bandwidth times 2(N - 1) / N (NCCL's convention).
double bus_factor(int ranks) { return ranks > 1 ? 2.0 * (ranks - 1) / ranks : 1.0; }

// Every system's times at `ranks`: ours (the backends asked for), then OpenMPI and Gloo. `systems`
// lists those that ran, in the table's order.
void measure(int ranks, const AllreduceBenchOptions& opts, const std::filesystem::path& dir, Measured& measured,
             std::vector<std::string>& systems) {
  for (const auto& backend : opts.backends) {
    if (backend == "nccl") {
      if (const auto nccl = nccl_available(ranks); !nccl) {
        std::cout << "nccl, " << ranks << " ranks: skipped (" << nccl.error().message() << ")\n";
        continue;
      }
    }
    measured[backend] = run_ours(backend, ranks, opts, dir);
    systems.push_back(backend);
  }
  if (opts.peers) {
    measured["openmpi"] = run_mpi(ranks, opts.bytes, dir);
    measured["gloo"] = run_gloo(ranks, opts.bytes, dir);
    for (const char* p : {"openmpi", "gloo"}) {
      if (!measured[p].empty()) systems.push_back(p);
    }
    // The peers' algorithms of the same shape as ours. Gloo has no tree or butterfly all-reduce
    // (ring, ring-chunked, halving-doubling, bcube), so only OpenMPI's run.
    for (const char* variant : {"tree", "butterfly"}) {
      if (std::find(opts.backends.begin(), opts.backends.end(), variant) == opts.backends.end()) continue;
      const std::string name = std::string("openmpi-") + variant;
      measured[name] = run_mpi(ranks, opts.bytes, dir, variant, opts.chunk_bytes);
      if (!measured[name].empty()) systems.push_back(name);
    }
  }
}

// A row per size: each system's time and bus bandwidth beside the bound (a JSON line each with --json).
void report_sizes(int ranks, double link, const AllreduceBenchOptions& opts, Measured& measured,
                  const std::vector<std::string>& systems) {
  const double factor = bus_factor(ranks);
  const double bound = link / ranks;
  std::vector<std::vector<std::string>> rows;
  for (std::size_t bytes : opts.bytes) {
    std::vector<std::string> row{human(bytes)};
    for (const auto& s : systems) {
      const auto it = measured[s].find(bytes);
      if (it == measured[s].end()) {
        row.push_back("-");
        row.push_back("-");
        continue;
      }
      const double algbw = static_cast<double>(bytes) / it->second;
      row.push_back(fmt(it->second * 1e6, 0));
      row.push_back(fmt(algbw * factor / 1e9, 3));
      if (opts.json) {
        std::cout << json{{"bench", "allreduce"}, {"system", s}, {"ranks", ranks}, {"bytes", bytes},
                          {"seconds", it->second}, {"algbw_gbps", algbw / 1e9}, {"busbw_gbps", algbw * factor / 1e9},
                          {"bound_busbw_gbps", bound / 1e9}}
                         .dump()
                  << "\n";
      }
    }
    row.push_back(fmt(bound / 1e9, 3));
    rows.push_back(row);
  }
  if (!opts.json) {
    std::printf("\n%d ranks: time per all-reduce (us) and bus bandwidth (GB/s)\n", ranks);
    std::vector<std::string> header{"size"};
    for (const auto& s : systems) {
      header.push_back(s + " us");
      header.push_back(s + " busbw");
    }
    header.push_back("bound busbw");
    print_table(header, rows);
  }
}

// The targets of the issue at 64 MiB (bandwidth) and 4 KiB (latency).
void report_targets(int ranks, double link, const AllreduceBenchOptions& opts, Measured& measured) {
  const double factor = bus_factor(ranks);
  const double bound = link / ranks;
  auto at = [&](const std::string& s, std::size_t bytes) {
    const auto it = measured[s].find(bytes);
    return it == measured[s].end() ? 0.0 : it->second;
  };
  const std::size_t big = std::size_t{64} << 20, small = 4096;
  for (const auto& ours : opts.backends) {
    if (ours == "nccl" || !measured.count(ours)) continue;
    if (at(ours, big) > 0 && at("gloo", big) > 0 && at("openmpi", big) > 0 && !opts.json) {
      const double o = at(ours, big), g = at("gloo", big), m = at("openmpi", big);
      std::printf("64 MiB, %s: busbw %.3f GB/s = %.2fx Gloo (target >= 1), %.2fx OpenMPI (target >= 1.25), %.0f%% of the bound\n",
                  ours.c_str(), big * factor / o / 1e9, g / o, m / o, 100.0 * big * factor / o / bound);
    }
    // Tree and butterfly against OpenMPI's algorithm of the same shape, on their home ground.
    const std::string same = "openmpi-" + ours;
    for (std::size_t bytes : {small, std::size_t{64} << 10}) {
      if ((ours == "tree" || ours == "butterfly") && at(ours, bytes) > 0 && at(same, bytes) > 0 && !opts.json) {
        std::printf("%s, %s: %.0f us vs %s %.0f us = %.2fx (target >= 1)\n", human(bytes).c_str(), ours.c_str(),
                    at(ours, bytes) * 1e6, same.c_str(), at(same, bytes) * 1e6, at(same, bytes) / at(ours, bytes));
      }
    }
    if (at(ours, small) > 0 && at("openmpi", small) > 0 && !opts.json) {
      std::printf("4 KiB, %s: %.0f us vs OpenMPI %.0f us (target: no slower)\n", ours.c_str(), at(ours, small) * 1e6,
                  at("openmpi", small) * 1e6);
    }
  }
}

// topk: the bytes a rank sent against the float32 ring's 2(N - 1)/N of the vector, and the loss
// along hops of a ring that would merge the sets and cut them back to k at every hop (computed
// here, no sockets), beside the all-gather's (none) and the top-k choice's own (what error
// feedback carries over).
void report_topk(int ranks, const AllreduceBenchOptions& opts, const std::filesystem::path& dir) {
  if (std::find(opts.backends.begin(), opts.backends.end(), "topk") == opts.backends.end() || opts.json) return;
  const auto sent = parse_lines(dir / "topk-0.log", "SENT");
  for (const auto& [bytes, s] : sent) {
    const double dense = bus_factor(ranks) * static_cast<double>(bytes);
    std::printf("topk %.4g, %s, %d ranks: a rank sends %.0f bytes = %.2f%% of the float32 ring's %.0f\n",
                opts.topk_fraction, human(bytes).c_str(), ranks, s, 100.0 * s / dense, dense);
  }
  // The hops: a table for 2, 4, 8 and 16 ranks, whatever --ranks says (no sockets here).
  static bool hops_done = false;
  if (hops_done) return;
  hops_done = true;
  const std::size_t n = std::size_t{1} << 20;
  const std::size_t k = collective::topk_count(n, opts.topk_fraction);
  std::printf("\ntopk %.4g of 2^20 normal coordinates per rank: relative L2 error of the result\n", opts.topk_fraction);
  std::vector<std::vector<std::string>> rows;
  for (int ranks_here : {2, 4, 8, 16}) {
    std::vector<std::vector<collective::SparseEntry>> sets;
    std::vector<double> dense(n, 0.0), exact(n, 0.0);
    for (int r = 0; r < ranks_here; ++r) {
      std::mt19937_64 rng(static_cast<std::uint64_t>(r) + 1);
      std::normal_distribution<float> d(0.0f, 1.0f);
      std::vector<float> g(n), residual(n, 0.0f);
      for (std::size_t i = 0; i < n; ++i) dense[i] += g[i] = d(rng);
      sets.push_back(collective::select_topk(g, residual, k));
      for (const auto& e : sets.back()) exact[e.index] += e.value;
    }
    auto gap = [&](const std::vector<float>& got, const std::vector<double>& want) {
      double num = 0, den = 0;
      for (std::size_t i = 0; i < n; ++i) {
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
      }
      return std::sqrt(num / den);
    };
    std::vector<float> gathered(n, 0.0f);
    for (const auto& set : sets) {
      for (const auto& e : set) gathered[e.index] += e.value;
    }
    const auto merged = collective::merge_ring_sum(sets, n, k);
    rows.push_back({std::to_string(ranks_here), std::to_string(ranks_here - 1), fmt(gap(gathered, exact), 4),
                    fmt(gap(merged, exact), 4), fmt(gap(gathered, dense), 4), fmt(gap(merged, dense), 4)});
  }
  print_table({"ranks", "hops", "all-gather vs sets", "merging ring vs sets", "all-gather vs dense",
               "merging ring vs dense"},
              rows);
}

}  // namespace

int bench_allreduce(const AllreduceBenchOptions& opts) {
  if (!opts.hosts.empty() && opts.peers) {
    throw ConfigError("bench allreduce: --hosts places our ranks only, and OpenMPI and Gloo would run here; add --no-peers");
  }
  const auto dir = std::filesystem::temp_directory_path() / ("xsilo-bench-allreduce-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const double link = loopback_rate();
  if (!opts.json) {
    std::printf("loopback: one TCP stream carries %.2f GB/s here; the all-reduce bus bandwidth bound is that / N\n",
                link / 1e9);
  }
  int status = 0;
  for (int ranks : opts.ranks) {
    Measured measured;
    std::vector<std::string> systems;
    measure(ranks, opts, dir, measured, systems);
    report_sizes(ranks, link, opts, measured, systems);
    report_targets(ranks, link, opts, measured);
    report_topk(ranks, opts, dir);
    for (const auto& s : systems) {
      if (measured[s].size() != opts.bytes.size()) status = 1;
    }
  }
  if (status == 0) std::filesystem::remove_all(dir);
  else std::cerr << "bench allreduce: some sizes are missing; the logs are in " << dir.string() << "\n";
  return status;
}

}  // namespace xsilo::tools
