#include "silo_agent/data_parallel.h"

#include "crypto/sources.h"
#include "silo_agent/collective/failure_policy.h"
#include "silo_agent/collective/replicated_all_reduce.h"
#include "silo_agent/collective/sparse_all_reduce.h"
#include "silo_agent/quantized_all_reduce.h"

#include <algorithm>
#include <atomic>
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

BatchSchedule::BatchSchedule(const Dataset& data, const TrainOptions& opts)
    : rows_(data.rows), bs_(std::max<std::uint32_t>(1, opts.batch_size)), steps_per_epoch_((data.rows + bs_ - 1) / bs_),
      orders_(opts.epochs, std::vector<std::size_t>(data.rows)) {
  std::mt19937_64 rng(opts.seed);
  std::vector<std::size_t> order(data.rows);
  std::iota(order.begin(), order.end(), 0);
  for (auto& epoch_order : orders_) {
    std::shuffle(order.begin(), order.end(), rng);
    epoch_order = order;
  }
}

std::span<const std::size_t> BatchSchedule::rows(std::uint64_t op) const {
  const auto& order = orders_[(op / steps_per_epoch_) % orders_.size()];
  const std::size_t start = (op % steps_per_epoch_) * bs_;
  return std::span<const std::size_t>(order).subspan(start, std::min(bs_, rows_ - start));
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

// One worker's data-parallel training: the single-process trainer's batches, each worker
// taking the rows of the shards it owns; each step's gradient summed over the group bucket by
// bucket while the backward pass goes on (BucketReducer); a step redone from the parameters kept
// before it when the group re-forms.
class DataParallelRun {
 public:
  DataParallelRun(collective::Group& group, int shards, const Network& net, std::span<float> params,
                  const Dataset& data, const TrainOptions& opts, const BucketOptions& buckets)
      : group_(group), shards_(shards), net_(net), params_(params), data_(data), opts_(opts), buckets_(buckets),
        schedule_(data, opts), steps_per_epoch_(schedule_.steps_per_epoch()), total_(schedule_.steps()),
        int8_(compression(buckets) == "int8"),
        topk_(buckets.compression == "topk"), replicas_(buckets.stragglers > 0), grad_(params.size() + 1),
        g_(grad_.data() + 1, params.size()), step_loss_(total_) {
    if (int8_) residual_.resize(grad_.size());
    if (topk_) sparse_residual_.resize(grad_.size());
    if (replicas_ && (int8_ || topk_)) {
      throw std::invalid_argument("stragglers take the float32 gradient, not " + buckets.compression + " buckets");
    }
    if (replicas_) sum_.resize(grad_.size());
  }

  TrainStats run(const RunHooks& hooks, const StartAt& start) {
    if (start.op >= total_ || start.step_loss.size() != start.op) {
      throw std::invalid_argument("a resumed run starts at step " + std::to_string(start.op) + " of " +
                                  std::to_string(total_) + " with " + std::to_string(start.step_loss.size()) +
                                  " losses before it");
    }
    std::copy(start.step_loss.begin(), start.step_loss.end(), step_loss_.begin());
    hooks_ = &hooks;
    // After every re-formation the first step begins with the parameters broadcast from rank 0
    // (a worker that was in the group before): a backup promoted into the group holds only the
    // round's starting model, and every member of a new table has come through the same
    // re-formation, so all of them agree to broadcast. A backup starts at the step it joins in,
    // and always in a re-formed table (epoch > 0), even one that redoes step 0: deciding by its
    // first step left a backup promoted in step 0 out of the survivors' broadcast, and every
    // collective after it out of line.
    bool sync = group_.promoted();
    for (std::uint64_t op = std::max(start.op, group_.first_op()); op < total_;) {
      kept_.keep(op).assign(params_.begin(), params_.end());
      if (int8_) kept_residual_.keep(op) = residual_;
      if (topk_) kept_sparse_.keep(op) = sparse_residual_;
      const auto resume = group_.attempt(op, [&](collective::Communicator& comm) {
        if (sync) {
          comm.broadcast(params_, 0);
          comm.broadcast(step_loss_, 0);  // a backup's mean loss counts the steps run before it came
        }
        if (replicas_) step_replicated(op);
        else step(op);
      });
      if (!resume) {
        sync = false;
        ++op;
        if (hooks.on_epoch && op % steps_per_epoch_ == 0) hooks.on_epoch(static_cast<std::uint32_t>(op / steps_per_epoch_));
        if (hooks.on_step && op < total_) hooks.on_step(op, params_, step_loss_);
        continue;
      }
      go_back(*resume);
      if (hooks.log) hooks.log(reformed(op, *resume));
      op = *resume;
      sync = true;
    }
    TrainStats stats;
    stats.steps = total_;
    stats.mean_loss = std::accumulate(step_loss_.begin(), step_loss_.end(), 0.0) / static_cast<double>(total_);
    return stats;
  }

 private:
  // The buckets' compression, once checked.
  static const std::string& compression(const BucketOptions& buckets) {
    const auto& names = bucket_compressions();
    if (std::find(names.begin(), names.end(), buckets.compression) == names.end()) {
      throw std::invalid_argument("bucket compression is none, int8 or topk, not " + buckets.compression);
    }
    return buckets.compression;
  }

  // One bucket of the step's gradient summed over the group (on the reducer's thread).
  void reduce(std::span<float> bucket) {
    auto& comm = group_.comm();
    if (replicas_) return reduce_replicated(comm);
    if (!int8_ && !topk_) return comm.all_reduce(bucket);
    auto* mesh = comm.mesh();
    if (!mesh) {
      throw std::runtime_error("the " + buckets_.compression + " all-reduce runs on the TCP backends, not " +
                               comm.backend());
    }
    auto at = static_cast<std::size_t>(bucket.data() - grad_.data());
    if (at == 0) {  // the loss, as it is
      comm.all_reduce(bucket.first(1));
      bucket = bucket.subspan(1);
      at = 1;
    }
    if (topk_) {
      collective::sparse_all_reduce(*mesh, bucket, std::span(sparse_residual_).subspan(at, bucket.size()),
                                    buckets_.topk_fraction);
      return;
    }
    // The rounding of this bucket in this step: its own purpose, never the row order's numbers.
    const std::uint64_t seed = crypto::derive_seed(opts_.seed, op_now_, "int8-bucket-rounding", std::to_string(at));
    quantized_all_reduce(*mesh, bucket, std::span(residual_.sent).subspan(at, bucket.size()),
                         std::span(residual_.summed).subspan(at, bucket.size()), seed);
  }

  // Stragglers: the whole step's gradient summed by fractional repetition, the first finisher
  // of each group standing for it; when this worker's copy is no longer needed, stop_ tells the
  // computing thread to stop.
  void reduce_replicated(collective::Communicator& comm) {
    auto* mesh = comm.mesh();
    if (!mesh) throw std::runtime_error("stragglers run on the TCP backends, not " + comm.backend());
    const auto ready = [this] {
      // This worker's own computation failed: no copy of its group's gradient may be coming, so
      // the wait for one gives up rather than poll for ever (step_replicated rethrows the cause).
      if (compute_failed_.load(std::memory_order_acquire)) throw std::runtime_error("this worker's computation failed");
      return own_ready_.load(std::memory_order_acquire);
    };
    const auto stop = [this] { stop_.store(true, std::memory_order_release); };
    try {
      const auto got = collective::replicated_all_reduce(*mesh, buckets_.stragglers, grad_, ready, sum_,
                                                         collective::Options{}.chunk_bytes, leaders_algorithm(comm),
                                                         stop);
      supplier_ = got.supplier;
    } catch (...) {
      stop();
      throw;
    }
  }

  // The leaders' all-reduce: the backend's own algorithm ("auto": hd for a small vector, the ring).
  collective::FlatAllReduce leaders_algorithm(collective::Communicator& comm) const {
    const auto& names = collective::across_host_algorithms();
    const auto b = comm.backend();
    if (std::find(names.begin(), names.end(), b) != names.end()) return collective::across_host_algorithm(b);
    if (b == "auto" && grad_.size() * sizeof(float) < collective::Options{}.hd_threshold_bytes) {
      return collective::across_host_algorithm("hd");
    }
    return collective::ring_all_reduce;
  }

  // This worker's rows of the batch into xb_ and yb_: those of the shards it owns, or with
  // stragglers those of its group (of `groups`): the batch's positions cut in `groups` equal
  // runs, so every group has the same share of every step.
  void gather(std::span<const std::size_t> batch_rows, int groups = 0) {
    xb_.clear();
    yb_.clear();
    const std::size_t batch = batch_rows.size();
    for (std::size_t i = 0; i < batch; ++i) {
      const std::size_t r = batch_rows[i];
      if (groups > 0) {
        const auto g = static_cast<int>(i * static_cast<std::size_t>(groups) / batch);
        if (g != group_.rank() % groups) continue;
      } else if (shard_owner(schedule_.shard_of(r, shards_), shards_, group_.members()) != group_.id()) {
        continue;
      }
      xb_.insert(xb_.end(), data_.row(r), data_.row(r) + data_.features);
      yb_.push_back(data_.y[r]);
    }
  }

  // Step `op`: backward on this worker's rows, buckets submitted as the gradient fills from the
  // end, the summed gradient applied once every bucket is back.
  void step(std::uint64_t op) {
    op_now_ = op;
    const auto batch_rows = schedule_.rows(op);
    const std::size_t batch = batch_rows.size();
    gather(batch_rows);
    const std::size_t mine = yb_.size();
    // loss_and_grad averages over this worker's rows; scaling by mine/batch makes the sum over
    // workers the mean over the global batch.
    const float scale = static_cast<float>(mine) / static_cast<float>(batch);
    std::size_t lo = grad_.size();  // [lo, end) is submitted; [ready_lo, lo) ready but pending
    std::size_t ready_lo = lo;
    bool first = true;
    auto flush = [&](std::size_t down_to) {
      std::span<float> bucket(grad_.data() + down_to, lo - down_to);
      if (mine == 0) std::fill(bucket.begin(), bucket.end(), 0.0f);  // not 0 x value: a NaN stays NaN
      else for (auto& v : bucket) v *= scale;
      reducer_.submit(bucket);
      lo = down_to;
      first = false;
    };
    // A worker with none of the batch's rows contributes zeros, but in the same buckets as the
    // others (every collective must match its peers'): it runs backward on one row of the batch
    // for the bucket boundaries and sends zeros.
    const float* rows = mine ? xb_.data() : data_.row(batch_rows[0]);
    const int* labels = mine ? yb_.data() : &data_.y[batch_rows[0]];
    const auto began = std::chrono::steady_clock::now();
    const double loss = net_.loss_and_grad(params_, rows, labels, std::max<std::size_t>(mine, 1), g_,
                                           [&](std::size_t offset, std::size_t) {
                                             ready_lo = offset + 1;
                                             const std::size_t limit = first ? buckets_.first_bytes : buckets_.bytes;
                                             if ((lo - ready_lo) * sizeof(float) >= limit) flush(ready_lo);
                                           });
    grad_[0] = static_cast<float>(loss);
    slow_down(op, began, false);
    flush(0);
    reducer_.finish();
    step_loss_[op] = grad_[0];
    for (std::size_t k = 0; k < params_.size(); ++k) {
      params_[k] -= opts_.learning_rate * (g_[k] + opts_.weight_decay * params_[k]);
    }
  }

  // What the slow_down hook asks for after computing step op since `began` (tests and
  // benchmarks); `stoppable`: cut short once stop_ is set.
  void slow_down(std::uint64_t op, std::chrono::steady_clock::time_point began, bool stoppable) {
    if (!hooks_ || !hooks_->slow_down) return;
    const auto now = std::chrono::steady_clock::now();
    const auto until = now + hooks_->slow_down(op, now - began);
    while (std::chrono::steady_clock::now() < until) {
      if (stoppable && stop_.load(std::memory_order_acquire)) return;
      std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(std::chrono::microseconds(100),
                                                                     until - std::chrono::steady_clock::now()));
    }
  }

  struct Stopped {};  // this worker's gradient is no longer needed in this step

  // Step `op` with stragglers: the reducer thread runs the replicated all-reduce from the start
  // while this thread computes the group's gradient; whichever copy of it is ready first in each
  // group is summed, and a worker whose copy was not needed stops computing (between layers, or
  // in the slow_down wait). Every worker applies the same sum.
  void step_replicated(std::uint64_t op) {
    op_now_ = op;
    const auto batch_rows = schedule_.rows(op);
    const std::size_t batch = batch_rows.size();
    const int groups = collective::replica_groups(group_.size(), buckets_.stragglers);
    gather(batch_rows, groups);
    const std::size_t mine = yb_.size();
    own_ready_.store(false, std::memory_order_relaxed);
    stop_.store(false, std::memory_order_relaxed);
    compute_failed_.store(false, std::memory_order_relaxed);
    reducer_.submit(grad_);
    try {
      const float* rows = mine ? xb_.data() : data_.row(batch_rows[0]);
      const int* labels = mine ? yb_.data() : &data_.y[batch_rows[0]];
      const auto began = std::chrono::steady_clock::now();
      const double loss = net_.loss_and_grad(params_, rows, labels, std::max<std::size_t>(mine, 1), g_,
                                             [&](std::size_t, std::size_t) {
                                               if (stop_.load(std::memory_order_acquire)) throw Stopped{};
                                             });
      grad_[0] = static_cast<float>(loss);
      const float scale = static_cast<float>(mine) / static_cast<float>(batch);
      if (mine == 0) std::fill(grad_.begin(), grad_.end(), 0.0f);
      else for (auto& v : grad_) v *= scale;
      slow_down(op, began, true);
      own_ready_.store(true, std::memory_order_release);
    } catch (const Stopped&) {
    } catch (...) {
      // Not a stop: the computation itself failed. The reducer may be waiting for this
      // worker's copy (or for every copy of its group, all failing alike): it is told to give
      // up, then the failure ends the step, and this worker, as any other failure of its own.
      const auto cause = std::current_exception();
      compute_failed_.store(true, std::memory_order_release);
      try {
        reducer_.finish();
      } catch (...) {  // its giving up, or a mate's copy arrived first: the cause is what is reported
      }
      std::rethrow_exception(cause);
    }
    reducer_.finish();
    if (hooks_ && hooks_->on_supplier) hooks_->on_supplier(op, supplier_);
    step_loss_[op] = sum_[0];
    for (std::size_t k = 0; k < params_.size(); ++k) {
      params_[k] -= opts_.learning_rate * (sum_[k + 1] + opts_.weight_decay * params_[k]);
    }
  }

  // The group re-formed: go back to the parameters kept before the step to redo (a worker that
  // finished step op - 1 may be one step ahead of one that failed in it).
  void go_back(std::uint64_t resume) {
    const auto& back = kept_.before(resume);
    std::copy(back.begin(), back.end(), params_.begin());
    if (int8_) {
      residual_ = kept_residual_.before(resume);
      residual_.handover();  // the segments have new owners
    }
    if (topk_) sparse_residual_ = kept_sparse_.before(resume);
  }

  std::string reformed(std::uint64_t op, std::uint64_t resume) const {
    std::string ids;
    for (int id : group_.members()) {
      if (!ids.empty()) ids += ',';
      ids += std::to_string(id);
    }
    return "step " + std::to_string(op) + " failed; the workers re-formed as [" + ids + "] (epoch " +
           std::to_string(group_.epoch()) + ") and redo step " + std::to_string(resume);
  }

  collective::Group& group_;
  const int shards_;
  const Network& net_;
  std::span<float> params_;
  const Dataset& data_;
  const TrainOptions& opts_;
  const BucketOptions& buckets_;
  const BatchSchedule schedule_;
  const std::uint64_t steps_per_epoch_, total_;
  const bool int8_, topk_, replicas_;
  // grad_[0] carries this worker's share of the batch loss; grad_[1..] (g_) the gradient.
  std::vector<float> grad_;
  std::span<float> g_;
  std::vector<float> xb_;
  std::vector<int> yb_;
  collective::StepSnapshots<std::vector<float>> kept_;  // parameters before steps op and op - 1
  QuantizedResidual residual_;  // int8: error feedback, kept as the parameters are
  collective::StepSnapshots<QuantizedResidual> kept_residual_;
  // topk: what this worker has not sent yet, kept (and rolled back) as the parameters are. It
  // is the worker's own: a re-formation hands nothing over, and a dead worker's is lost.
  std::vector<float> sparse_residual_;
  collective::StepSnapshots<std::vector<float>> kept_sparse_;
  std::uint64_t op_now_ = 0;  // the step whose buckets the reducer is summing
  // Stragglers: the step's sum (grad_ is this worker's copy of its group's gradient, which the
  // reducer reads once own_ready_ says so), and the flag that stops a copy no longer needed.
  std::vector<float> sum_;
  std::atomic<bool> own_ready_{false}, stop_{false}, compute_failed_{false};
  int supplier_ = -1;
  const RunHooks* hooks_ = nullptr;
  std::vector<float> step_loss_;  // each step's loss over the global batch
  BucketReducer reducer_{[this](std::span<float> bucket) { reduce(bucket); }};  // last: its thread uses the above
};

}  // namespace

TrainStats train_data_parallel(collective::Group& group, int shards, const Network& net, std::span<float> params,
                               const Dataset& data, const TrainOptions& opts, const BucketOptions& buckets,
                               const RunHooks& hooks, const StartAt& start) {
  if (data.rows == 0) return TrainStats{};
  return DataParallelRun(group, shards, net, params, data, opts, buckets).run(hooks, start);
}

}  // namespace xsilo::agent
