#include "server/aggregator.h"

#include "proto/frame.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <stdexcept>
#include <cmath>
#include <numeric>

#include "crypto/hash.h"
#include "crypto/sources.h"
#include "server/secure_groups.h"
#include "server/upload_stage.h"

namespace xsilo::server {

namespace {

std::size_t lanes(const RoundConfig& cfg) { return std::max<std::size_t>(1, cfg.uploads_at_once); }

}  // namespace

FoldResult check_upload(protocol::UploadCheck& check, const Contribution& c, const std::string& what) {
  auto v = protocol::verify_upload(check, c.declared_sha256, what);
  switch (v.problem) {
    case protocol::UploadVerdict::Problem::None: return Folded{.sha256 = std::move(v.sha256)};
    case protocol::UploadVerdict::Problem::NonFinite:
      return FoldFailure{.cause = FoldFailure::Cause::NonFinite, .why = std::move(v.why)};
    case protocol::UploadVerdict::Problem::HashMismatch:
      return FoldFailure{.cause = FoldFailure::Cause::HashMismatch, .why = std::move(v.why)};
  }
  throw std::logic_error("check_upload: an unknown verdict");
}

protocol::UploadBuffer Aggregator::lane_upload(std::vector<std::unique_ptr<LaneBuffer>>& lanes, std::size_t lane) {
  check_lane(lane, lanes.size());
  if (!lanes[lane]) lanes[lane] = std::make_unique<LaneBuffer>(lanes.front()->tensors());
  const auto values = lanes[lane]->flat();
  return {.bytes = {reinterpret_cast<std::uint8_t*>(values.data()), values.size_bytes()},
          .dtype = wire::F32,
          .layout = lanes[lane]->tensors(),
          .hash = true,
          .keep = nullptr,
          .scheme = {},
          .sink = nullptr};
}

void Aggregator::check_lane(std::size_t lane, std::size_t lanes) {
  if (lane >= lanes) {
    throw std::logic_error("upload lane " + std::to_string(lane) + " of " + std::to_string(lanes));
  }
}

namespace {

std::string what_of(const Contribution& c) { return c.partial_sum ? "partial sum" : "update"; }

// fedavg: a running sum of weight * delta; the mean is the sum over the summed weight, written
// over the sum itself (the round's output buffer: the server holds the global model, an upload
// buffer per upload lane and the sum, 2 + lanes models). A model over the staging threshold
// keeps no upload buffer: each lane's upload is staged in a file of its own
// (server/upload_stage.h) and added from there, once checked, so the server holds two models.
class PlainSum final : public Aggregator {
 public:
  // `stage_dir`: where uploads are staged, if they are (stages_uploads()).
  // `lanes`: uploads at once. Each lane's slot exists from the start and is filled on its first
  // grant (on the network thread) while a fold of another lane may be reading its own slot on
  // the worker: the vectors never grow, so no slot moves under the worker.
  PlainSum(const Model& layout, const std::optional<std::filesystem::path>& stage_dir, std::size_t lanes)
      : layout_(layout.tensors()),
        bytes_(layout.bytes()),
        stage_dir_(stage_dir),
        sum_(std::make_shared<Model>(layout.zeros_like())) {
    current_.resize(lanes);
    stage_.resize(lanes);
    if (!stage_dir_) current_.front() = std::make_unique<LaneBuffer>(layout.tensors());
  }

 private:
  // A lane's buffer or staged file beyond the first is made on its first use: a round with
  // fewer uploads than lanes holds no more than it uses.
  protocol::UploadBuffer lane_buffer(std::size_t lane) override {
    check_lane(lane, stage_dir_ ? stage_.size() : current_.size());
    if (stage_dir_) {
      if (!stage_[lane]) stage_[lane] = std::make_shared<StagedUpload>(*stage_dir_, bytes_);
      const auto& s = stage_[lane];
      return {.bytes = s->window(), .dtype = wire::F32, .layout = layout_, .hash = true, .keep = s, .scheme = {}, .sink = s};
    }
    return lane_upload(current_, lane);
  }

  FoldResult do_fold(const Contribution& c, protocol::UploadCheck& check, std::size_t lane) override {
    if (!check.sink_status) return lose(check.sink_status.error().message(), c);
    auto r = check_upload(check, c, what_of(c));
    if (!r) return r;
    if (stage_dir_) {
      // The upload passed its checks; only the server's own storage can fail from here.
      if (!lost_.empty()) return r;
      if (auto added = stage_.at(lane)->add_to(sum_->flat(), c.scale); !added) return lose(added.error().message(), c);
    } else {
      const auto cur = current_.at(lane)->flat();
      auto acc = sum_->flat();
      if (c.scale == 1) {
        for (std::size_t i = 0; i < cur.size(); ++i) acc[i] += cur[i];
      } else {
        for (std::size_t i = 0; i < cur.size(); ++i) acc[i] += static_cast<float>(cur[i] * c.scale);
      }
    }
    weight_ += c.weight;
    return r;
  }

  // `out` may be the sum itself (output()): each element is read before it is written.
  CombineResult do_combine(std::span<float> out, const CombineContext&) override {
    if (!lost_.empty()) return CombineFailure{.reason = "the server lost the round's sum: " + lost_, .record = {}};
    const auto acc = sum_->flat();
    const float inv = static_cast<float>(1.0 / weight_);
    for (std::size_t i = 0; i < acc.size(); ++i) out[i] = acc[i] * inv;
    return Combined{};
  }

  std::shared_ptr<Model> do_output(const Model&) override { return sum_; }
  bool folds_scaled() const override { return true; }

  // The server's own storage failed while staging or adding an upload: the sum may be partly
  // updated, so the round cannot commit (combine() says why). The upload is not the uploader's
  // fault: it counts as received.
  FoldResult lose(const std::string& why, const Contribution& c) {
    if (lost_.empty()) {
      lost_ = why;
      spdlog::error("the round's sum is lost: {}", lost_);
    }
    return Folded{.sha256 = c.declared_sha256};
  }

  std::vector<TensorInfo> layout_;
  std::uint64_t bytes_ = 0;
  std::optional<std::filesystem::path> stage_dir_;
  std::vector<std::unique_ptr<LaneBuffer>> current_;    // each lane's upload buffer, when uploads are not staged
  std::vector<std::shared_ptr<StagedUpload>> stage_;    // else each lane's staged upload
  std::shared_ptr<Model> sum_;
  double weight_ = 0;
  std::string lost_;  // why the sum can no longer be trusted ("" while it can)
};

// Robust rules and clipping need every silo's own delta: one row each (n x d floats).
class RowCollector final : public Aggregator {
 public:
  // Room for a row per selected silo up front (address space only: pages are touched as rows
  // arrive), so that the rows are never copied to a larger buffer, holding n x d twice. Where
  // the system will not promise that much, the rows grow as they arrive.
  RowCollector(const Model& layout, AggregationConfig a, std::size_t selected, std::size_t lanes)
      : d_(layout.size()), a_(std::move(a)) {
    current_.resize(lanes);  // never grows: see PlainSum
    current_.front() = std::make_unique<LaneBuffer>(layout.tensors());
    try {
      rows_.reserve(selected * d_);
    } catch (const std::bad_alloc&) {
    }
  }

 private:
  protocol::UploadBuffer lane_buffer(std::size_t lane) override {
    return lane_upload(current_, lane);
  }

  FoldResult do_fold(const Contribution& c, protocol::UploadCheck& check, std::size_t lane) override {
    auto r = check_upload(check, c, what_of(c));
    if (!r) return r;
    // The upload is weight * delta: keep the delta, clipped if configured.
    const auto cur = current_.at(lane)->flat();
    const std::size_t d = cur.size(), at = rows_.size();
    rows_.resize(at + d);
    const float inv = static_cast<float>(1.0 / c.weight);
    for (std::size_t i = 0; i < d; ++i) rows_[at + i] = cur[i] * inv;
    // Its norm goes into the audit record whether or not it is clipped.
    const auto row = std::span<float>(rows_).subspan(at, d);
    const double norm = a_.clip_norm > 0 ? robust::clip_l2(row, 1, d, a_.clip_norm)[0].score : robust::l2_norm(row);
    labels_.push_back(c.silos.front());
    weights_.push_back(c.weight);
    norms_.push_back(norm);
    return r;
  }

  CombineResult do_combine(std::span<float> out, const CombineContext& ctx) override {
    in_silo_order();
    return combine_rows(a_, rows_, d_, labels_, "silo", weights_, norms_, ctx, out);
  }

  // The rows in the order of the silos' names, not of their arrival: the seeded buckets (and
  // every tie the rules break by position) then depend on the seed and who took part only, so
  // a round can be recomputed from its record and the updates.
  void in_silo_order() {
    const std::size_t n = labels_.size(), d = d_;
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(), [&](auto a, auto b) { return labels_[a] < labels_[b]; });
    std::vector<float> row(d);
    std::vector<bool> placed(n, false);
    for (std::size_t start = 0; start < n; ++start) {  // row `order[i]` moves to position i, cycle by cycle
      if (placed[start] || order[start] == start) continue;
      std::copy_n(rows_.begin() + start * d, d, row.begin());
      std::size_t i = start;
      while (order[i] != start) {
        std::copy_n(rows_.begin() + order[i] * d, d, rows_.begin() + i * d);
        placed[i] = true;
        i = order[i];
      }
      std::copy(row.begin(), row.end(), rows_.begin() + i * d);
      placed[i] = true;
    }
    auto permute = [&](auto& v) {
      auto copy = v;
      for (std::size_t i = 0; i < n; ++i) v[i] = copy[order[i]];
    };
    permute(labels_);
    permute(weights_);
    permute(norms_);
  }

  std::size_t d_;
  std::vector<std::unique_ptr<LaneBuffer>> current_;  // each lane's upload buffer
  AggregationConfig a_;
  std::vector<float> rows_;
  std::vector<std::string> labels_;
  std::vector<double> weights_, norms_;
};

}  // namespace

namespace {

// The rule as it runs this round: the Byzantine budget less the silos already caught, its own
// seed, the centre of the last committed step.
robust::RuleSpec round_spec(const AggregationConfig& a, std::size_t d, const CombineContext& ctx) {
  // Silos caught sending NaN or infinite values were Byzantine: they used up part of the
  // budget f, so the rule guards against the f - caught that may remain among the inputs.
  robust::RuleSpec spec = a.rule;
  spec.f = a.rule.f - std::min(a.rule.f, ctx.nonfinite);
  // Its own derivation: the round's selection draws from the same federation seed and round.
  spec.seed = crypto::derive_seed(ctx.seed, ctx.round, "robust-rule");
  if (ctx.centre.size() == d) spec.centre = ctx.centre;
  return spec;
}

// What an auditor needs to recompute a centred clipping: the radius, whether it was measured,
// the centre, and the rejection (all of the last iteration, like the decisions).
void record_centered_clip(nlohmann::json& info, const robust::RuleSpec& spec, const robust::Result& r) {
  info["tau"] = r.radius;
  if (spec.tau <= 0) info["tau_from"] = "half the median distance";
  info["centre"] = spec.centre.empty() ? "zero" : "last committed step";
  if (spec.reject > 0) {
    info["reject"] = spec.reject;
    info["rejected_beyond"] = r.rejected_beyond;
  }
  if (spec.oppose > 0) info["oppose"] = spec.oppose;
  if (spec.oppose > 0 || spec.lag > 0) {
    const bool measured = std::any_of(r.decisions.begin(), r.decisions.end(),
                                      [](const robust::Decision& d) { return d.alignment.has_value(); });
    if (measured) {
      info["median_alignment"] = r.median_alignment;
      if (!r.opposition_off.empty()) {
        info["opposition_off"] = r.opposition_off;
      } else if (spec.oppose > 0) {
        info["opposed_below"] = r.opposed_below;
      }
    }
  }
  if (spec.lag > 0) {
    info["lag"] = spec.lag;
    if (r.lagging_beyond > 0) info["lagging_beyond"] = r.lagging_beyond;
  }
  if (!r.screens_stood_down.empty()) info["screens_stood_down"] = r.screens_stood_down;
  if (spec.one_sided > 0) {
    info["one_sided"] = spec.one_sided;
    if (r.one_sided_off.empty()) {
      info["median_balance"] = r.median_balance;
      info["one_sided_beyond"] = r.one_sided_beyond;
    } else {
      info["one_sided_off"] = r.one_sided_off;
    }
  }
}

// Each input's decision, under its label, with its norm and whether clipping touched it.
nlohmann::json record_decisions(const AggregationConfig& a, const robust::Result& r,
                                const std::vector<std::string>& labels, const char* label_key,
                                const std::vector<double>& norms) {
  nlohmann::json inputs = nlohmann::json::array();
  for (std::size_t i = 0; i < labels.size(); ++i) {
    nlohmann::json e = {{label_key, labels[i]}, {"kept", r.decisions[i].kept}, {"score", r.decisions[i].score}};
    if (!r.decisions[i].reason.empty()) e["reason"] = r.decisions[i].reason;
    e["norm"] = norms[i];
    if (r.decisions[i].alignment) e["alignment"] = *r.decisions[i].alignment;
    if (r.decisions[i].balance) e["balance"] = *r.decisions[i].balance;
    if (a.clip_norm > 0 && norms[i] > a.clip_norm) e["clipped"] = true;
    inputs.push_back(e);
  }
  return inputs;
}

// The seeded buckets, by their members' labels.
nlohmann::json record_buckets(const robust::Result& r, const std::vector<std::string>& labels) {
  nlohmann::json buckets = nlohmann::json::array();
  for (const auto& b : r.buckets) {
    nlohmann::json names = nlohmann::json::array();
    for (auto i : b) names.push_back(labels[i]);
    buckets.push_back(names);
  }
  return buckets;
}

}  // namespace

CombineResult combine_rows(const AggregationConfig& a, std::vector<float>& rows, std::size_t d,
                           const std::vector<std::string>& labels, const char* label_key,
                           const std::vector<double>& weights, const std::vector<double>& norms,
                           const CombineContext& ctx, std::span<float> out) {
  const std::size_t n = labels.size();
  robust::RuleSpec spec = round_spec(a, d, ctx);
  nlohmann::json info = {{"rule", robust::name(a.rule.rule)}, {"f", a.rule.f}, {"inputs", n}};
  if (ctx.nonfinite) {
    info["nonfinite_rejected"] = ctx.nonfinite;
    info["f_applied"] = spec.f;
  }
  Combined c;
  if (const auto st = robust::check(spec, n); !st) {
    const std::string& why = st.error().message();
    info["fallback"] = robust::name(a.fallback);
    info["fallback_reason"] = why;
    spdlog::warn("round {}: {}; falling back to {}", ctx.round, why, robust::name(a.fallback));
    if (a.fallback == robust::Fallback::Abort) {
      info["applied"] = "abort";
      return CombineFailure{.reason = why + "; the configured fallback is abort", .record = {{"robust", info}}};
    }
    spec.rule = a.fallback == robust::Fallback::Median ? robust::Rule::Median : robust::Rule::FedAvg;
    spec.nnm = false;  // the fallback runs on the inputs as they are
    spec.bucket = 0;
  }
  info["applied"] = robust::name(spec.rule);
  if (spec.nnm) info["nnm"] = true;
  if (spec.bucket > 1) {
    info["bucket"] = spec.bucket;
    info["bucket_seed"] = spec.seed;
  }
  if (a.clip_norm > 0) info["clip_norm"] = a.clip_norm;
  const robust::MatrixView x{rows.data(), n, d};
  const auto r = robust::apply(spec, x, weights);
  std::copy(r.aggregate.begin(), r.aggregate.end(), out.begin());
  if (spec.rule == robust::Rule::CenteredClip) record_centered_clip(info, spec, r);
  info["decisions"] = record_decisions(a, r, labels, label_key, norms);
  if (a.adaptive_clip.on() && a.clip_norm > 0 && n > 0) {
    const auto unclipped = std::count_if(norms.begin(), norms.end(), [&](double v) { return v <= a.clip_norm; });
    auto [next, part] = adapt_clip_norm(a.adaptive_clip, a.clip_norm, static_cast<double>(unclipped), n);
    info["adaptive_clip"] = std::move(part);
    c.next_clip_norm = next;
  }
  if (!r.buckets.empty()) info["buckets"] = record_buckets(r, labels);
  c.record["robust"] = info;
  return c;
}

std::pair<double, nlohmann::json> adapt_clip_norm(const AggregationConfig::AdaptiveClip& ac, double clip_norm,
                                                  double unclipped, std::size_t inputs, double ceiling) {
  return adapt_clip_norm_to(ac, clip_norm, unclipped / static_cast<double>(inputs), ceiling);
}

std::pair<double, nlohmann::json> adapt_clip_norm_to(const AggregationConfig::AdaptiveClip& ac, double clip_norm,
                                                     double b, double ceiling) {
  // The fraction left unclipped moves the norm toward the configured quantile of the norms.
  double next = clip_norm * std::exp(-ac.lr * (b - ac.quantile));
  nlohmann::json part = {{"clip_norm", clip_norm}, {"unclipped_fraction", b}, {"quantile", ac.quantile}};
  if (ceiling > 0 && next > ceiling) {
    next = ceiling;
    part["capped_at"] = ceiling;
  }
  if (next < ac.min) {
    next = ac.min;
    part["floored_at"] = ac.min;
  }
  part["next"] = next;
  return {next, part};
}

std::unique_ptr<Aggregator> make_aggregator(const RoundConfig& cfg, const Model& layout, std::uint64_t round,
                                            const std::vector<std::string>& selected, std::optional<double> clip_norm) {
  if (cfg.central_dp) return make_central_dp_sum(cfg, layout, std::nullopt, clip_norm);
  if (cfg.secure.on()) return std::make_unique<SecureGroups>(cfg, layout.tensors(), round, selected, clip_norm);
  if (cfg.aggregation.needs_all_updates()) {
    AggregationConfig a = cfg.aggregation;
    if (clip_norm) a.clip_norm = *clip_norm;
    return std::make_unique<RowCollector>(layout, std::move(a), selected.size(), lanes(cfg));
  }
  return std::make_unique<PlainSum>(layout,
                                    stages_uploads(cfg, layout.bytes())
                                        ? std::optional<std::filesystem::path>(cfg.staging.dir)
                                        : std::nullopt,
                                    lanes(cfg));
}

bool stages_uploads(const RoundConfig& cfg, std::uint64_t model_bytes) {
  return !cfg.secure.on() && !cfg.central_dp && !cfg.aggregation.needs_all_updates() &&
         cfg.staging.stages(model_bytes);
}

}  // namespace xsilo::server
