// How a round turns the uploads it accepts into one mean delta. The coordinator runs the
// protocol (who uploads when, who dropped out); an aggregator owns the buffers and the
// arithmetic. Its fold(), prepare(), combine() and output() run on the worker thread, one at a
// time and in order (checked: common/thread_check.h), and return values: the coordinator never
// reads what they write anywhere else.
//
//   PlainSum      fedavg: a running sum of weight * delta (silos' uploads or edges' partial sums)
//   RowCollector  a robust rule or clipping: every silo's own delta, one row each
//   SecureGroups  secure aggregation: masked sums per secure group, unmasked at the end, then
//                 the mean (or the robust rule) across the group means
//
// A new aggregation mode is a new Aggregator and a line in make_aggregator().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/model.h"
#include "common/result.h"
#include "common/thread_check.h"
#include "protocol/upload_slot.h"
#include "server/round_config.h"

namespace xsilo::server {

class SecureRound;

// Who one upload speaks for.
struct Contribution {
  std::vector<std::string> silos;  // one silo, or the contributors of an edge's partial sum
  double weight = 0;               // plain uploads: the summed weight of `silos`
  std::uint32_t group = 0;         // secure uploads: the secure group of the (partial) sum
  std::string declared_sha256;     // as the uploader declared it ("" when it declared none)
  bool partial_sum = false;        // an edge's sum of its region (not one silo's update)
  // Buffered rounds: s(staleness) (server/schedule.h), the factor the upload is added scaled by
  // (its weight is not). A plain sum only: every other aggregator refuses a scale other than 1.
  double scale = 1;
};

// An upload in the sum.
struct Folded {
  std::string sha256;  // of the upload's bytes as received
};
// An upload refused by its checks: the cause its drop records, and the sentence for people.
struct FoldFailure {
  enum class Cause { NonFinite, HashMismatch };
  Cause cause;
  std::string why;
};
using FoldResult = Result<Folded, FoldFailure>;

// Silos that prepare() found unusable (a secure group that could not be unmasked, or whose sum
// proves a member skipped clipping), with the reason.
struct Rejection {
  std::vector<std::string> silos;
  std::string why;
};

struct CombineContext {
  std::uint64_t round = 0;
  std::uint64_t seed = 0;     // the federation's seed: bucketing draws its permutation from it and the round
  std::size_t nonfinite = 0;  // silos caught sending NaN/inf this round: they used up part of f
  std::span<const float> centre;  // the last committed aggregate step (centered clipping's start), or empty
};

// The round's aggregate step (written into combine()'s `out`), or why the round must abort.
// Either way `record` holds the parts of the audit record that say how it came about
// ("robust", "secure.groups_outcome", ...).
struct Combined {
  nlohmann::json record;
  std::optional<double> next_clip_norm;  // adaptive clipping: the clip norm of the next round
};
struct CombineFailure {
  std::string reason;
  nlohmann::json record;
};
using CombineResult = Result<Combined, CombineFailure>;

// The audit record's parts from either side of a CombineResult.
inline nlohmann::json& record_of(CombineResult& c) { return c ? c->record : c.error().record; }

// An upload lane's buffer: a model's floats, not zeroed when made. Every element is written by
// the upload's chunks before anything reads it: a lane is checked and folded only once its
// upload is whole (protocol::UploadLane::end), and the same buffer already took one upload after
// another within a round without being cleared. Zeroing it cost a pass over a model per lane a
// round, and its pages are faulted in by the chunks as they land instead.
class LaneBuffer {
 public:
  explicit LaneBuffer(std::vector<TensorInfo> layout)
      : tensors_(std::move(layout)), size_(elements(tensors_)), data_(std::make_unique_for_overwrite<float[]>(size_)) {}
  std::span<float> flat() { return {data_.get(), size_}; }
  std::span<const float> flat() const { return {data_.get(), size_}; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

 private:
  std::vector<TensorInfo> tensors_;
  std::size_t size_ = 0;
  std::unique_ptr<float[]> data_;
};

class Aggregator {
 public:
  virtual ~Aggregator() = default;
  // Where the upload of upload lane `lane` goes and what it must look like: each lane has a
  // buffer of its own (made when the lane is first used), so that uploads may arrive at the
  // same time (the server's uploads_at_once); the edge and the simulation use lane 0.
  protocol::UploadBuffer buffer(std::size_t lane = 0) { return lane_buffer(lane); }
  // Worker: validates the upload now in buffer(lane) (the slot's checks have run) and folds it in.
  FoldResult fold(const Contribution& c, protocol::UploadCheck& check, std::size_t lane = 0) {
    worker_.check("Aggregator::fold");
    if (c.scale != 1 && !folds_scaled()) throw std::logic_error("a scaled upload for an aggregator that sums plainly only");
    return do_fold(c, check, lane);
  }
  // Worker, after collection closed: readies the inputs; returns those that failed.
  [[nodiscard]] std::vector<Rejection> prepare() {
    worker_.check("Aggregator::prepare");
    return do_prepare();
  }
  // Worker: the mean delta of the round into `out` (d floats), or why the round must abort.
  CombineResult combine(std::span<float> out, const CombineContext& ctx) {
    worker_.check("Aggregator::combine");
    return do_combine(out, ctx);
  }
  // Worker, after the last fold: the buffer combine() writes into, which then becomes the next
  // global model (a model of the layout; an aggregator may hand over a buffer of its own that it
  // no longer needs, so a round holds one model less).
  std::shared_ptr<Model> output(const Model& layout) {
    worker_.check("Aggregator::output");
    return do_output(layout);
  }
  // The secure protocol state of this round, if the mode has one.
  virtual SecureRound* secure() { return nullptr; }

 protected:
  // A lane the coordinator's UploadLanes hands out is below uploads_at_once, always; an
  // aggregator's lane_buffer checks it against the lanes it made.
  static void check_lane(std::size_t lane, std::size_t lanes);
  // Lane `lane`'s upload, received straight into its buffer (f32, the layout of lanes[0], made
  // on first use), hashed as it arrives; the lane checked against lanes.size() first.
  static protocol::UploadBuffer lane_upload(std::vector<std::unique_ptr<LaneBuffer>>& lanes, std::size_t lane);

 private:
  virtual protocol::UploadBuffer lane_buffer(std::size_t lane) = 0;
  virtual FoldResult do_fold(const Contribution& c, protocol::UploadCheck& check, std::size_t lane) = 0;
  virtual std::vector<Rejection> do_prepare() { return {}; }
  // Whether do_fold honours Contribution::scale (the plain sum, which buffered rounds use).
  virtual bool folds_scaled() const { return false; }
  virtual CombineResult do_combine(std::span<float> out, const CombineContext& ctx) = 0;
  virtual std::shared_ptr<Model> do_output(const Model& layout) { return std::make_shared<Model>(layout.zeros_like()); }
  ThreadCheck worker_;
};

// The checks every upload passes before it is folded: the finiteness the slot's check work
// found, then the declared SHA-256 (finishes check.hash). `what`: "update", "partial sum".
FoldResult check_upload(protocol::UploadCheck& check, const Contribution& c, const std::string& what);

// Adaptive clipping's step after a round in which `unclipped` of `inputs` were within
// `clip_norm`: C exp(-lr (b - quantile)), b = unclipped / inputs, at most `ceiling` when it is
// > 0 and at least ac.min; and the audit record's "adaptive_clip" part.
std::pair<double, nlohmann::json> adapt_clip_norm(const AggregationConfig::AdaptiveClip& ac, double clip_norm,
                                                  double unclipped, std::size_t inputs, double ceiling = 0);
// The same step from the unclipped fraction b itself (central DP's noisy estimate).
std::pair<double, nlohmann::json> adapt_clip_norm_to(const AggregationConfig::AdaptiveClip& ac, double clip_norm,
                                                     double fraction, double ceiling = 0);

// Whether make_aggregator() stages uploads of a model this size in a file (plain FedAvg over
// the staging threshold): the server then holds two models, not three.
bool stages_uploads(const RoundConfig& cfg, std::uint64_t model_bytes);

// The aggregator the round's config calls for. `selected`: the round's silos (secure groups
// are drawn from them). `clip_norm`: this round's, when adaptive clipping sets it.
std::unique_ptr<Aggregator> make_aggregator(const RoundConfig& cfg, const Model& layout, std::uint64_t round,
                                            const std::vector<std::string>& selected,
                                            std::optional<double> clip_norm = std::nullopt);

// Silo-level central DP (server/central_dp.h; cfg.central_dp set): each silo's delta clipped to
// C with weight 1, the step their sum over W plus Gaussian noise of z C / W. `key`: the noise's
// ChaCha20 key, for tests; none: a fresh one each round from cfg.sources (the daemon's: the system's
// random source). `clip_norm`: this round's C under adaptive clipping (else the config's).
std::unique_ptr<Aggregator> make_central_dp_sum(const RoundConfig& cfg, const Model& layout,
                                                std::optional<crypto::NoiseSource::Key> key = std::nullopt,
                                                std::optional<double> clip_norm = std::nullopt);

// Rows (deltas or group means) through the configured rule, with its fallback when too few
// inputs remain; the decisions go into the record. Shared by RowCollector and SecureGroups.
CombineResult combine_rows(const AggregationConfig& a, std::vector<float>& rows, std::size_t d,
                           const std::vector<std::string>& labels, const char* label_key,
                           const std::vector<double>& weights, const std::vector<double>& norms,
                           const CombineContext& ctx, std::span<float> out);

}  // namespace xsilo::server
