// Data-parallel local training: the workers of one silo each hold a shard of its rows, and
// every SGD step of the single-process trainer (same seed, same global batch) is computed by
// all of them together. Each worker takes the rows of the global batch that lie in the shards
// it owns, computes their gradient, and the gradients are summed by all-reduce in buckets as
// the backward pass produces them, last layer first, so that the reduction of one bucket
// overlaps the backward computation of the layers below it. Every worker then applies the
// same update, so all replicas stay identical.
//
// When a worker dies or stalls, the step fails on every survivor; the group re-forms without
// it, the shards it owned pass to the survivors, and the step is redone from the parameters
// kept before it. The result equals single-process training within float tolerance, unless the
// buckets travel compressed: then every replica still applies the same (decoded) gradient, and
// each worker's error feedback is rolled back with the parameters when a step is redone.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/dataset.h"
#include "common/mlp.h"
#include "silo_agent/collective/group.h"
#include "silo_agent/sgd.h"

namespace xsilo::agent {

struct BucketOptions {
  std::size_t first_bytes = std::size_t{1} << 20;   // small first bucket: communication starts early
  std::size_t bytes = std::size_t{25} << 20;        // then large buckets: fewer, cheaper collectives
  // "none": float32 all-reduce; "int8": 8-bit codes with error feedback (quantized_all_reduce.h);
  // "topk": the largest topk_fraction of each bucket's coordinates with error feedback
  // (collective/sparse_all_reduce.h). Both on the TCP backends; the loss of each step travels
  // as a float beside them.
  std::string compression = "none";
  double topk_fraction = 0.01;
  // Stragglers: with s > 0 the workers form groups of at least s + 1 that compute the same rows
  // (fractional repetition, collective/replicated_all_reduce.h), and each step takes the first
  // finisher of each group: any s slow workers are not waited for, at s + 1 (N / floor(N / (s +
  // 1))) times the compute. The step's gradient then travels as one message, not in buckets;
  // float32 only (no compression).
  int stragglers = 0;
};
inline const std::vector<std::string>& bucket_compressions() {
  static const std::vector<std::string> names{"none", "int8", "topk"};
  return names;
}

// Shard s of `shards` is rows [s*rows/shards, (s+1)*rows/shards). Its owner is worker s while
// s is a member; else the i-th promoted backup (a member whose id is >= shards, in id order)
// when s is the i-th shard without its worker; else members[s % members.size()].
int shard_owner(int shard, int shards, const std::vector<int>& members);

// The single-process trainer's batches, which every local algorithm walks: each epoch reshuffles
// the previous epoch's row order (as train_sgd does), and step op takes the next batch_size rows
// of its epoch's order (an epoch's last batch may be shorter).
class BatchSchedule {
 public:
  BatchSchedule(const Dataset& data, const TrainOptions& opts);
  std::uint64_t steps() const { return steps_per_epoch_ * orders_.size(); }  // the round's
  std::uint64_t steps_per_epoch() const { return steps_per_epoch_; }
  // The rows of step op, in order; past steps() the epochs start over (never empty when
  // steps() > 0).
  std::span<const std::size_t> rows(std::uint64_t op) const;
  // Which of `shards` equal runs of the data's rows `row` lies in (shard_owner's shards).
  int shard_of(std::size_t row, int shards) const {
    return static_cast<int>(row * static_cast<std::size_t>(shards) / rows_);
  }

 private:
  std::size_t rows_, bs_, steps_per_epoch_;
  std::vector<std::vector<std::size_t>> orders_;
};

// Where a run begins: step 0, or the step a checkpoint of the same job was saved at (`params`
// then hold that step's parameters) with the losses of the steps before it.
struct StartAt {
  std::uint64_t op = 0;
  std::vector<float> step_loss;
};

// What a run reports as it goes: one line per re-formation, each finished epoch, and after each
// completed step (the next op, the parameters and every step's loss so far) for checkpoints.
struct RunHooks {
  std::function<void(const std::string&)> log = {};
  std::function<void(std::uint32_t)> on_epoch = {};
  std::function<void(std::uint64_t, std::span<const float>, const std::vector<float>&)> on_step = {};
  // Stragglers: which worker's (group rank's) gradient stood for this worker's group in step op.
  std::function<void(std::uint64_t op, int rank)> on_supplier = {};
  // Tests and benchmarks model a slow worker with this: how long it waits after computing step op
  // in `took` (e.g. 4 x took: a worker 5x slower). With stragglers the wait ends as soon as the
  // step no longer needs this worker's gradient.
  std::function<std::chrono::nanoseconds(std::uint64_t op, std::chrono::nanoseconds took)> slow_down = {};
};

// Trains `params` in place with every member of `group`; `shards` is the number of workers the
// group started with. Error feedback (int8, topk) starts at zero, also when resuming.
TrainStats train_data_parallel(collective::Group& group, int shards, const Network& net, std::span<float> params,
                               const Dataset& data, const TrainOptions& opts, const BucketOptions& buckets,
                               const RunHooks& hooks = {}, const StartAt& start = {});

}  // namespace xsilo::agent
