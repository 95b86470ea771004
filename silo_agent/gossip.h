// Gossip inside a silo (`local.algorithm: "gossip"`): decentralized SGD by push-sum (Kempe,
// Dobra, Gehrke 2003; Stochastic Gradient Push, Assran et al. 2019). No step waits for any
// other worker, so a slow or dead worker holds nobody back.
//
// Each worker holds x (a model's worth of floats) and a weight w, starting at (model, 1); its
// model is z = x / w. A step:
//   1. adds every push that has arrived to (x, w), and every push of its own that could not be
//      delivered (the mass comes back to the sender: gossip_links.h);
//   2. computes the gradient g at z on its rows of the step's global batch (the rows of the
//      shards it owns, as data parallelism takes them) and moves z by one SGD step:
//      x -= lr * w * (g + weight_decay * z), so z moves by exactly lr * (g + wd z) whatever w is.
//      SGP subtracts lr * g from x, which moves z by lr * g / w: a worker that has given mass
//      away and received none (w small: a burst of steps while its peers are descheduled, a
//      peer slow to start) takes steps 1/w times too large, and on this repository's shared
//      two-core machine that left four worker processes with an untrained model (loss 2.2-2.3
//      of an untrained 2.31, 20 epochs of the digits case). The price of the choice: a step
//      moves the network's sum x by w times a step, and the mass in flight makes the w of a
//      worker at its step about 0.6 on average, so gossip's steps count for less than data
//      parallelism's (docs/collectives.md, "Gossip", measures it);
//   3. halves (x, w) (exact in floating point), keeps one half and pushes the other to one live
//      peer drawn at random (a generator seeded from the round's seed and the rank); a worker
//      holding less than half its starting mass pushes only if a push came in since its last
//      (in a burst its mass would otherwise halve at every step and its steps count for
//      nothing). It waits for nobody either way.
// Sum x over the workers and the messages in flight is, at every instant, the sum of the
// starting models minus the steps taken: the mass is conserved. The push-sum ratio of the
// network, sum x / sum w, is therefore a weighted average of the models, and each worker's z
// converges to it at a rate set by the mixing (for random peers, a constant factor per step).
//
// Failures, with no re-formation and no agreement: a push that cannot be written to the end
// (the peer's link closed, or it took nothing for the step timeout) comes back to its sender,
// who also stops choosing that peer. A push fully written to a worker that then dies (or that
// stalls: the socket's buffers take it until they fill) is lost,
// and so is that worker's own mass: the survivors' average is reweighted, not wrong (sum w of
// the result says how much mass it holds: the number of workers when nothing was lost).
//
// The end of the round: the round's work is epochs x rows, summed over the workers (what data
// parallelism does: each of its steps trains on one global batch). Each push carries how many
// rows its sender has trained on; a worker stops once its own count and the last it heard from
// every other worker (a dead one's included) reach the round's work, or at once when a peer has
// stopped. So a slow worker does fewer steps and the fast ones more, instead of everyone waiting
// for it; with equal speeds each worker runs about the round's steps (steps past them walk the
// epochs' row orders again). A worker never runs more than 2 x workers x the round's steps. Stopping, it sends `done` to every live peer and, from then on, no push;
// it then absorbs until every live peer's `done` is in (a peer's pushes precede its `done` on
// the link, so its mass is all here) or the peer is given up after the step timeout. Its (x, w)
// is then final. The combination: the collector is the lowest live rank as each worker sees
// it; every other worker sends it its final (x, w) and waits for `written`; the collector
// sums x and w over its own and every live peer's final (given up after the step timeout),
// writes sum x / sum w through `write`, then sends `written`. A worker whose collector dies
// before `written` sends its kept final to the next lowest live rank, which then collects: the
// model is written while any worker lives. Combining to one collector costs one model message per
// worker (the gather of a reduce); the alternative, a few last gossip steps and the leader's own
// z, is not exact.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/dataset.h"
#include "common/mlp.h"
#include "silo_agent/collective/gossip_links.h"
#include "silo_agent/data_parallel.h"
#include "silo_agent/sgd.h"

namespace xsilo::agent {

struct GossipResult {
  TrainStats stats;            // the collector: over every combined worker's steps; else its own
  bool collected = false;      // this worker combined the finals and called `write`
  std::vector<float> own;      // this worker's z = x / w when it stopped, before any combination
  double own_weight = 0;       // its w then
  std::uint64_t own_steps = 0;  // the steps it ran
  double weight = 0;           // collector: sum w of the result (the workers' count if no mass was lost)
  int combined = 0;            // collector: how many workers' finals the result holds, its own included
  std::vector<std::string> events;  // peers given up and why, collectors that died
};

// The collector's output: the combined model and its stats (written before `written` goes out).
using GossipWrite = std::function<void(std::span<const float> model, const GossipResult& result)>;

// Trains `params` (this worker's starting model) by push-sum gossip with the peers of `links`;
// `shards`: the number of workers the round started with (rows of shard s go to its owner among
// the live workers, as shard_owner() decides for data parallelism). On return `params` holds the
// combined model on the collector, this worker's own z elsewhere. hooks: log, on_epoch and
// slow_down are used.
GossipResult train_gossip(collective::GossipLinks& links, int shards, const Network& net, std::span<float> params,
                          const Dataset& data, const TrainOptions& opts, const GossipWrite& write,
                          const RunHooks& hooks = {});

}  // namespace xsilo::agent
