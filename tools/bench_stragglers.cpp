// xsilo bench stragglers: a data-parallel step's time with one local worker k times slower
// than the others, without (local.stragglers 0) and with fractional repetition
// (local.stragglers s), and what the redundancy costs in compute. The workers are threads of
// this process, each with its own sockets, as in tests/collective_test.cpp; the slow worker
// waits (k - 1) x its own compute time after each step's backward pass (RunHooks::slow_down),
// a wait that fractional repetition cuts short once the step no longer needs it. With --gossip
// the same run by push-sum gossip (local.algorithm "gossip"), whose workers wait for nobody, and
// every row reports the round's model's loss and accuracy on the rows trained on.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/dataset.h"
#include "common/mlp.h"
#include "silo_agent/collective/gossip_links.h"
#include "silo_agent/collective/group.h"
#include "silo_agent/collective/replicated_all_reduce.h"
#include "silo_agent/data_parallel.h"
#include "silo_agent/gossip.h"
#include "tools/bench.h"
#include "tools/sim.h"

namespace xsilo::tools {

namespace {

using Clock = std::chrono::steady_clock;

struct StragglerRun {
  double step_ms = 0;     // wall time per step
  double compute_ms = 0;  // backward passes finished per step, summed over the workers
  EvalResult trained;     // the round's model on the rows it trained on
};

StragglerRun run(const StragglerBenchOptions& o, const Dataset& data, const Model& model, int stragglers, double slow,
             bool gossip) {
  const Network net(model);
  agent::TrainOptions train;
  train.epochs = o.epochs;
  train.batch_size = o.batch;
  train.learning_rate = 0.05f;
  train.seed = 5;
  agent::BucketOptions buckets;
  buckets.stragglers = stragglers;
  collective::Options opts;
  opts.backend = "ring";
  opts.communicator = !gossip;  // gossip forms its own links
  collective::Coordinator coord(o.workers, std::chrono::milliseconds(5000), "127.0.0.1", 0,
                                gossip ? collective::Coordinator::Membership::fixed
                                       : collective::Coordinator::Membership::reform);
  std::mutex mu;
  std::chrono::nanoseconds computed{0};
  std::vector<std::thread> threads;
  Model result = model;
  const auto t0 = Clock::now();
  for (int id = 0; id < o.workers; ++id) {
    threads.emplace_back([&, id] {
      collective::Group g("127.0.0.1", coord.port(), id, "127.0.0.1", opts);
      Model replica = model;
      agent::RunHooks hooks;
      hooks.slow_down = [&, id](std::uint64_t, std::chrono::nanoseconds took) {
        std::lock_guard<std::mutex> lock(mu);
        computed += took;
        return id == o.slow_worker ? std::chrono::duration_cast<std::chrono::nanoseconds>(took * (slow - 1))
                                   : std::chrono::nanoseconds{0};
      };
      if (gossip) {
        collective::GossipLinks links(g.rank(), g.peers(), g.listen_fd(), replica.size(), opts.step_timeout);
        const auto write = [&](std::span<const float> combined, const agent::GossipResult&) {
          std::lock_guard<std::mutex> lock(mu);
          std::copy(combined.begin(), combined.end(), result.flat().begin());
        };
        agent::train_gossip(links, o.workers, net, replica.flat(), data, train, write, hooks);
        return;
      }
      agent::train_data_parallel(g, o.workers, net, replica.flat(), data, train, buckets, hooks);
      std::lock_guard<std::mutex> lock(mu);
      if (id == 0) result = replica;  // every replica is the same
    });
  }
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // The round's global steps: gossip's workers share the same work (epochs x rows) however many
  // steps each of them runs.
  const double steps = static_cast<double>(o.epochs) * static_cast<double>((data.rows + o.batch - 1) / o.batch);
  return {.step_ms = seconds * 1e3 / steps,
          .compute_ms = std::chrono::duration<double>(computed).count() * 1e3 / steps,
          .trained = net.evaluate(result.flat(), data)};
}

}  // namespace

int bench_stragglers(const StragglerBenchOptions& o) {
  if (o.workers < 2 || o.slow_worker < 0 || o.slow_worker >= o.workers || o.stragglers < 0 ||
      o.stragglers + 1 > o.workers || (o.stragglers == 0 && !o.gossip)) {
    std::cerr << "bench stragglers: needs 2+ workers, a slow worker among them and 1 <= stragglers < workers (0 with --gossip)\n";
    return 2;
  }
  auto data = load_csv(data_dir() / "digits.csv.gz");
  for (auto& v : data.x) v /= 16.0f;
  ModelSpec spec;
  spec.kind = "mlp";
  spec.inputs = data.features;
  spec.classes = 10;
  spec.hidden = o.hidden;
  spec.seed = 7;
  const Model model = init_model(spec);
  std::cerr << "bench stragglers: " << o.workers << " workers (threads), digits " << data.rows << " rows, batch " << o.batch
            << ", " << o.epochs << " epochs, worker " << o.slow_worker << " slowed, the median of " << o.repeats
            << " runs" << std::endl;
  std::vector<std::vector<std::string>> rows;
  // The rows: plain data parallelism (ring, stragglers 0), fractional repetition (stragglers s)
  // unless only gossip is asked for, and with --gossip push-sum gossip.
  struct Variant {
    std::string name;
    int stragglers;
    bool gossip;
  };
  std::vector<Variant> variants{{"ring", 0, false}};
  if (o.stragglers > 0) variants.push_back({"ring, stragglers " + std::to_string(o.stragglers), o.stragglers, false});
  if (o.gossip) variants.push_back({"gossip", 0, true});
  for (const auto& v : variants) {
    const int groups = collective::replica_groups(o.workers, v.stragglers);
    const double redundancy = static_cast<double>(o.workers) / groups;
    double base = 0;
    for (double slow : o.slow) {
      std::vector<StragglerRun> runs;
      for (int k = 0; k < std::max(1, o.repeats); ++k) runs.push_back(run(o, data, model, v.stragglers, slow, v.gossip));
      std::sort(runs.begin(), runs.end(), [](const StragglerRun& a, const StragglerRun& b) { return a.step_ms < b.step_ms; });
      const auto m = runs[runs.size() / 2];  // the median run
      if (slow == 1) base = m.step_ms;
      if (o.json) {
        std::cout << nlohmann::json{{"workers", o.workers}, {"algorithm", v.gossip ? "gossip" : "data_parallel"},
                                    {"stragglers", v.stragglers}, {"slow", slow}, {"step_ms", m.step_ms},
                                    {"compute_ms", m.compute_ms}, {"redundancy", redundancy},
                                    {"rows_per_worker", static_cast<double>(o.batch) / groups},
                                    {"loss", m.trained.loss}, {"accuracy", m.trained.accuracy}}
                         .dump()
                  << std::endl;
      }
      rows.push_back({v.name, fmt(slow, 0) + "x", fmt(m.step_ms), base > 0 ? fmt(m.step_ms / base) + "x" : "-",
                      fmt(static_cast<double>(o.batch) / groups, 0), fmt(redundancy), fmt(m.compute_ms),
                      fmt(m.trained.loss, 3), fmt(100 * m.trained.accuracy, 1)});
    }
  }
  if (!o.json) {
    print_table({"algorithm", "slow worker", "step ms", "vs none slow", "rows/worker/step", "redundancy",
                 "compute ms/step (all workers)", "train loss", "train acc %"},
                rows);
  }
  return 0;
}

}  // namespace xsilo::tools
