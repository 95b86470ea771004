// xsilo collective: one local worker of a silo. Started by the agent (`local.workers`) to
// train a round's job, by `xsilo bench allreduce` to time all-reduce, and by the tests to
// check sums while workers are killed.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>

#include "bench/peer_common.h"
#include "common/config.h"
#include "silo_agent/collective/group.h"
#include "silo_agent/collective/sparse_all_reduce.h"
#include "silo_agent/data_parallel.h"
#include "silo_agent/quantized_all_reduce.h"
#include "silo_agent/workers.h"
#include "tools/commands.h"

namespace xsilo::tools {

namespace {

struct WorkerOptions {
  std::string coordinator, host = "127.0.0.1", backend = "auto", across_hosts = "ring", intra_host = "tcp",
      compression = "none", job;
  int id = 0, shards = 0;
  std::size_t chunk_bytes = 1u << 20, ranks_per_host = 0;
  double topk_fraction = 0.01;
  std::uint64_t step_timeout_ms = 10000, check_steps = 0, elements = 1000, stall_at_step = UINT64_MAX;
  std::vector<std::size_t> bench;
};

// Times all_reduce (or the 8-bit all-reduce) for each size; the first member prints one RESULT
// line per size.
void run_bench(collective::Group& group, const std::vector<std::size_t>& sizes, const std::string& compression,
               double topk_fraction) {
  std::uint64_t calls = 0;
  for (std::size_t bytes : sizes) {
    std::vector<float> v(bytes / sizeof(float), 1.0f);
    agent::QuantizedResidual residual;
    residual.resize(v.size());
    std::vector<float> sparse_residual(compression == "topk" ? v.size() : 0);
    std::uint64_t sent = 0;
    auto reduce = [&] {
      if (compression == "topk") {
        auto* mesh = group.comm().mesh();
        if (!mesh) throw ConfigError("--compression topk needs a TCP backend");
        // Fresh inputs, varied so that the top-k moves around: a gradient, not a constant.
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 2654435761u + calls) % 1000) - 500.0f;
        ++calls;
        sent = collective::sparse_all_reduce(*mesh, v, sparse_residual, topk_fraction);
      } else if (compression == "int8") {
        auto* mesh = group.comm().mesh();
        if (!mesh) throw ConfigError("--compression int8 needs a TCP backend");
        // Fresh inputs each time: sums of sums would grow without bound.
        std::fill(v.begin(), v.end(), 1.0f);
        agent::quantized_all_reduce(*mesh, v, residual.sent, residual.summed, ++calls);
      } else {
        group.comm().all_reduce(v);
      }
    };
    const int iters = xsilo_bench::iterations_for(bytes);
    for (int i = 0; i < 2; ++i) reduce();
    group.comm().barrier();
    const double t0 = xsilo_bench::now();
    for (int i = 0; i < iters; ++i) reduce();
    const double t = (xsilo_bench::now() - t0) / iters;
    if (group.rank() == 0) xsilo_bench::print_result(bytes, t);
    if (group.rank() == 0 && compression == "topk") {
      std::printf("SENT %zu %llu\n", bytes, static_cast<unsigned long long>(sent));
      std::fflush(stdout);
    }
  }
}

// Step s: shard k contributes (s + 1) * (k + 1) + i % 7 at element i, so the sum over all
// shards is known exactly whoever owns which shard. A worker that takes over a dead worker's
// shard adds its contribution too; the sum must not change.
int run_check(collective::Group& group, const WorkerOptions& o) {
  const int shards = o.shards > 0 ? o.shards : group.size();
  std::vector<float> v(o.elements);
  if (group.promoted()) {
    std::printf("BACKUP %d joins at step %llu on %d ranks\n", group.id(), static_cast<unsigned long long>(group.first_op()),
                group.size());
  }
  for (std::uint64_t step = group.first_op(); step < o.check_steps;) {
    std::printf("STEP %llu begin on %d ranks\n", static_cast<unsigned long long>(step), group.size());
    std::fflush(stdout);
    if (step == o.stall_at_step) std::this_thread::sleep_for(std::chrono::hours(1));
    const auto resume = group.attempt(step, [&](collective::Communicator& comm) {
      std::fill(v.begin(), v.end(), 0.0f);
      for (int k = 0; k < shards; ++k) {
        if (agent::shard_owner(k, shards, group.members()) != group.id()) continue;
        for (std::size_t i = 0; i < v.size(); ++i) v[i] += static_cast<float>((step + 1) * static_cast<unsigned>(k + 1) + i % 7);
      }
      comm.all_reduce(v);
    });
    if (resume) {
      std::printf("STEP %llu failed; re-formed on %d ranks, resuming at step %llu\n",
                  static_cast<unsigned long long>(step), group.size(), static_cast<unsigned long long>(*resume));
      std::fflush(stdout);
      step = *resume;
      continue;
    }
    const float all = static_cast<float>(shards * (shards + 1) / 2);
    for (std::size_t i = 0; i < v.size(); ++i) {
      const float want = static_cast<float>(step + 1) * all + static_cast<float>(shards) * static_cast<float>(i % 7);
      if (v[i] != want) {
        std::printf("STEP %llu WRONG at %zu: %g, want %g\n", static_cast<unsigned long long>(step), i, v[i], want);
        return 1;
      }
    }
    std::printf("STEP %llu ok on %d ranks\n", static_cast<unsigned long long>(step), group.size());
    std::fflush(stdout);
    ++step;
  }
  return 0;
}

int run_worker(const WorkerOptions& o) {
  const auto colon = o.coordinator.rfind(':');
  if (colon == std::string::npos) throw ConfigError("--coordinator must be HOST:PORT, got " + o.coordinator);
  collective::Options opts;
  opts.backend = o.backend;
  opts.chunk_bytes = o.chunk_bytes;
  opts.ranks_per_host = o.ranks_per_host;
  opts.across_hosts = o.across_hosts;
  opts.intra_host = o.intra_host;
  opts.step_timeout = std::chrono::milliseconds(o.step_timeout_ms);
  std::optional<agent::WorkerJob> job;
  if (!o.job.empty()) job = agent::load_job(o.job);
  // Gossip forms links of its own (gossip_links.h): the group gives it the table only.
  opts.communicator = !(job && job->algorithm == agent::LocalAlgorithm::gossip);
  if (!opts.communicator && (!o.bench.empty() || o.check_steps)) {
    throw ConfigError("--bench and --check-steps run the all-reduce, which a gossip job (" + o.job + ") does not form");
  }
  try {
    collective::Group group(o.coordinator.substr(0, colon),
                            static_cast<std::uint16_t>(std::stoi(o.coordinator.substr(colon + 1))), o.id, o.host, opts);
    spdlog::info("worker {}: rank {} of {} ({} backend)", o.id, group.rank(), group.size(), o.backend);
    if (!o.bench.empty()) {
      run_bench(group, o.bench, o.compression, o.topk_fraction);
      return 0;
    }
    if (o.check_steps) return run_check(group, o);
    if (!job) throw ConfigError("give --job FILE, --bench SIZES or --check-steps N");
    agent::run_worker_job(group, *job);
    return 0;
  } catch (const collective::StandbyReleased& e) {
    spdlog::info("worker {}: {}", o.id, e.what());
    return 0;
  } catch (const collective::CollectiveError& e) {
    spdlog::error("worker {}: {}", o.id, e.what());
    return 3;
  }
}

}  // namespace

void add_collective(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<WorkerOptions>();
  auto* c = app.add_subcommand("collective", "one local worker of a silo (started by the agent and the benchmarks)");
  c->add_option("--coordinator", o->coordinator, "the workers' coordinator, HOST:PORT")->required();
  c->add_option("--id", o->id, "this worker's id, 0..N-1")->required();
  c->add_option("--host", o->host, "address this worker listens on for its peers")->capture_default_str();
  c->add_option("--backend", o->backend, "ring, hd, tree, butterfly, hierarchical, auto or nccl")->capture_default_str();
  c->add_option("--ranks-per-host", o->ranks_per_host,
                "hierarchical: ranks r / N share a host (0: ranks with the same --host address do)")
      ->capture_default_str();
  c->add_option("--across-hosts", o->across_hosts, "hierarchical: the leaders' algorithm across hosts (ring, hd, tree, butterfly)")
      ->check(CLI::IsMember(collective::across_host_algorithms()))
      ->capture_default_str();
  c->add_option("--intra-host", o->intra_host,
                "hierarchical: inside each host tcp, nccl (one GPU per worker: each worker must see as many GPUs as its host has workers) or auto (nccl where they do, else tcp)")
      ->check(CLI::IsMember(collective::intra_host_transports()))
      ->capture_default_str();
  c->add_option("--compression", o->compression, "--bench: none, int8 (the 8-bit all-reduce) or topk (the sparse one)")
      ->check(CLI::IsMember({"none", "int8", "topk"}))
      ->capture_default_str();
  c->add_option("--topk-fraction", o->topk_fraction, "--bench with topk: the share of coordinates each rank sends")
      ->capture_default_str();
  c->add_option("--chunk-bytes", o->chunk_bytes, "pipelining unit of the ring")->capture_default_str();
  c->add_option("--step-timeout-ms", o->step_timeout_ms, "a peer silent this long has failed")->capture_default_str();
  c->add_option("--job", o->job, "train the job in this file (written by the agent)");
  c->add_option("--bench", o->bench, "time all-reduce of these sizes in bytes");
  c->add_option("--check-steps", o->check_steps, "all-reduce known data this many steps and check every sum");
  c->add_option("--elements", o->elements, "floats per check step")->capture_default_str();
  c->add_option("--shards", o->shards, "shards in the check (default: the group's size)");
  c->add_option("--stall-at-step", o->stall_at_step, "tests: hang before this check step, as a stuck worker would");
  c->callback([o, &exit_code] { exit_code = run_worker(*o); });
}

}  // namespace xsilo::tools
