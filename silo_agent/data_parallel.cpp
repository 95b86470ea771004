#include "silo_agent/data_parallel.h"

#include "crypto/sources.h"
#include "silo_agent/collective/failure_policy.h"
#include "silo_agent/collective/sparse_all_reduce.h"
#include "silo_agent/quantized_all_reduce.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

namespace xsilo::agent {

int shard_owner(int shard, int shards, const std::vector<int>& members) {
  if (std::find(members.begin(), members.end(), shard) != members.end()) return shard;
  // The i-th orphaned shard goes to the i-th promoted backup (ids >= shards), in id order.
  std::vector<int> backups;
  for (int id : members) {
    if (id >= shards) backups.push_back(id);
  }
  std::sort(backups.begin(), backups.end());
  std::size_t orphan = 0;
  for (int s = 0; s < shard; ++s) {
    orphan += std::find(members.begin(), members.end(), s) == members.end();
  }
  if (orphan < backups.size()) return backups[orphan];
  return members[static_cast<std::size_t>(shard) % members.size()];
}

namespace {

// Runs the all-reduce of each bucket on its own thread, in order, while the caller goes on
// with the backward pass. The first failure is kept; later buckets of that step are skipped.
class BucketReducer {
 public:
  explicit BucketReducer(std::function<void(std::span<float>)> reduce)
      : reduce_(std::move(reduce)), thread_([this] { loop(); }) {}
  ~BucketReducer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void submit(std::span<float> bucket) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(bucket);
    }
    cv_.notify_all();
  }
  // Waits for every submitted bucket; rethrows the step's failure, if any, and clears it.
  void finish() {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    if (error_) {
      auto e = std::move(error_);
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      const auto bucket = queue_.front();
      queue_.pop_front();
      if (!error_) {
        busy_ = true;
        lock.unlock();
        std::exception_ptr failed;
        try {
          reduce_(bucket);
        } catch (...) {
          failed = std::current_exception();
        }
        lock.lock();
        busy_ = false;
        if (failed) error_ = failed;
      }
      if (queue_.empty()) done_cv_.notify_all();
    }
  }

  std::function<void(std::span<float>)> reduce_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::span<float>> queue_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace

TrainStats train_data_parallel(collective::Group& group, int shards, const Network& net, std::span<float> params,
                               const Dataset& data, const TrainOptions& opts, const BucketOptions& buckets,
                               const std::function<void(const std::string&)>& log,
                               const std::function<void(std::uint32_t)>& on_epoch) {
  TrainStats stats;
  if (data.rows == 0) return stats;
  const std::size_t bs = std::max<std::uint32_t>(1, opts.batch_size);
  const std::size_t steps_per_epoch = (data.rows + bs - 1) / bs;
  const std::uint64_t total = steps_per_epoch * opts.epochs;
  // The single-process trainer's row orders, epoch by epoch.
  std::vector<std::vector<std::size_t>> orders(opts.epochs, std::vector<std::size_t>(data.rows));
  std::mt19937_64 rng(opts.seed);
  std::vector<std::size_t> order(data.rows);
  std::iota(order.begin(), order.end(), 0);
  for (auto& epoch_order : orders) {  // each epoch reshuffles the previous order, as train_sgd does
    std::shuffle(order.begin(), order.end(), rng);
    epoch_order = order;
  }
  auto shard_of = [&](std::size_t row) {
    return static_cast<int>(row * static_cast<std::size_t>(shards) / data.rows);
  };
  // grad[0] carries this worker's share of the batch loss; grad[1..] the gradient.
  std::vector<float> grad(params.size() + 1);
  std::span<float> g(grad.data() + 1, params.size());
  std::vector<float> xb;
  std::vector<int> yb;
  collective::StepSnapshots<std::vector<float>> kept;  // parameters before steps op and op - 1
  const bool int8 = buckets.compression == "int8", topk = buckets.compression == "topk";
  if (!int8 && !topk && buckets.compression != "none") {
    throw std::invalid_argument("bucket compression is none, int8 or topk, not " + buckets.compression);
  }
  // topk: what each worker has not sent yet, kept (and rolled back) as the parameters are. It
  // is the worker's own: a re-formation hands nothing over, and a dead worker's is lost.
  std::vector<float> sparse_residual(topk ? grad.size() : 0);
  collective::StepSnapshots<std::vector<float>> kept_sparse;
  QuantizedResidual residual;  // int8: error feedback, kept as the parameters are
  collective::StepSnapshots<QuantizedResidual> kept_residual;
  if (int8) residual.resize(grad.size());
  std::uint64_t op_now = 0;  // the step whose buckets the reducer is summing
  BucketReducer reducer([&](std::span<float> bucket) {
    auto& comm = group.comm();
    if (!int8 && !topk) return comm.all_reduce(bucket);
    auto* mesh = comm.mesh();
    if (!mesh) {
      throw std::runtime_error("the " + buckets.compression + " all-reduce runs on the TCP backends, not " + comm.backend());
    }
    auto at = static_cast<std::size_t>(bucket.data() - grad.data());
    if (at == 0) {  // the loss, as it is
      comm.all_reduce(bucket.first(1));
      bucket = bucket.subspan(1);
      at = 1;
    }
    if (topk) {
      collective::sparse_all_reduce(*mesh, bucket, std::span(sparse_residual).subspan(at, bucket.size()),
                                    buckets.topk_fraction);
      return;
    }
    // The rounding of this bucket in this step: its own purpose, never the row order's numbers.
    const std::uint64_t seed = crypto::derive_seed(opts.seed, op_now, "int8-bucket-rounding", std::to_string(at));
    quantized_all_reduce(*mesh, bucket, std::span(residual.sent).subspan(at, bucket.size()),
                         std::span(residual.summed).subspan(at, bucket.size()), seed);
  });
  std::vector<double> step_loss(total);

  auto step = [&](std::uint64_t op) {
    op_now = op;
    const auto& order = orders[op / steps_per_epoch];
    const std::size_t start = (op % steps_per_epoch) * bs;
    const std::size_t batch = std::min(bs, data.rows - start);
    xb.clear();
    yb.clear();
    for (std::size_t i = 0; i < batch; ++i) {
      const std::size_t r = order[start + i];
      if (shard_owner(shard_of(r), shards, group.members()) != group.id()) continue;
      xb.insert(xb.end(), data.row(r), data.row(r) + data.features);
      yb.push_back(data.y[r]);
    }
    const std::size_t mine = yb.size();
    // loss_and_grad averages over this worker's rows; scaling by mine/batch makes the sum over
    // workers the mean over the global batch.
    const float scale = static_cast<float>(mine) / static_cast<float>(batch);
    std::size_t lo = grad.size();  // [lo, end) is submitted; [ready_lo, lo) ready but pending
    std::size_t ready_lo = lo;
    bool first = true;
    auto flush = [&](std::size_t down_to) {
      std::span<float> bucket(grad.data() + down_to, lo - down_to);
      if (mine == 0) std::fill(bucket.begin(), bucket.end(), 0.0f);  // not 0 x value: a NaN stays NaN
      else for (auto& v : bucket) v *= scale;
      reducer.submit(bucket);
      lo = down_to;
      first = false;
    };
    // A worker with none of the batch's rows contributes zeros, but in the same buckets as the
    // others (every collective must match its peers'): it runs backward on one row of the batch
    // for the bucket boundaries and sends zeros.
    const float* rows = mine ? xb.data() : data.row(order[start]);
    const int* labels = mine ? yb.data() : &data.y[order[start]];
    const double loss = net.loss_and_grad(params, rows, labels, std::max<std::size_t>(mine, 1), g,
                                          [&](std::size_t offset, std::size_t) {
                                            ready_lo = offset + 1;
                                            const std::size_t limit = first ? buckets.first_bytes : buckets.bytes;
                                            if ((lo - ready_lo) * sizeof(float) >= limit) flush(ready_lo);
                                          });
    grad[0] = static_cast<float>(loss);
    flush(0);
    reducer.finish();
    step_loss[op] = grad[0];
    for (std::size_t k = 0; k < params.size(); ++k) {
      params[k] -= opts.learning_rate * (g[k] + opts.weight_decay * params[k]);
    }
  };

  // After every re-formation the first step begins with the parameters broadcast from rank 0
  // (a worker that was in the group before): a backup promoted into the group holds only the
  // round's starting model, and every member of a new table has come through the same
  // re-formation, so all of them agree to broadcast. A backup starts at the step it joins in.
  bool sync = group.first_op() > 0;
  for (std::uint64_t op = group.first_op(); op < total;) {
    kept.keep(op).assign(params.begin(), params.end());
    if (int8) kept_residual.keep(op) = residual;
    if (topk) kept_sparse.keep(op) = sparse_residual;
    const auto resume = group.attempt(op, [&](collective::Communicator& comm) {
      if (sync) comm.broadcast(params, 0);
      step(op);
    });
    if (!resume) {
      sync = false;
      ++op;
      if (on_epoch && op % steps_per_epoch == 0) on_epoch(static_cast<std::uint32_t>(op / steps_per_epoch));
      continue;
    }
    // The group re-formed: go back to the parameters kept before the step to redo (a worker
    // that finished step op - 1 may be one step ahead of one that failed in it).
    const auto& back = kept.before(*resume);
    std::copy(back.begin(), back.end(), params.begin());
    if (int8) {
      residual = kept_residual.before(*resume);
      residual.handover();  // the segments have new owners
    }
    if (topk) sparse_residual = kept_sparse.before(*resume);
    if (log) {
      std::string ids;
      for (int id : group.members()) {
        if (!ids.empty()) ids += ',';
        ids += std::to_string(id);
      }
      log("step " + std::to_string(op) + " failed; the workers re-formed as [" + ids + "] (epoch " +
          std::to_string(group.epoch()) + ") and redo step " + std::to_string(*resume));
    }
    op = *resume;
    sync = true;
  }
  stats.steps = total;
  stats.mean_loss = std::accumulate(step_loss.begin(), step_loss.end(), 0.0) / static_cast<double>(total);
  return stats;
}

}  // namespace xsilo::agent
