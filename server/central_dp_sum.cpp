// The aggregator of silo-level central DP (server/central_dp.h): every silo's own delta clipped
// to C and added with weight 1; the step is the sum over the fixed denominator W plus Gaussian
// noise of standard deviation z C / W. A running sum, like PlainSum: no rows are kept. With
// adaptive clipping, C is the round's and the count of unclipped deltas is released with its own
// noise (N(0, sigma_b^2), centred bits: server/central_dp.h) to move C for the next round.
#include "server/aggregator.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace xsilo::server {

namespace {

class CentralDpSum final : public Aggregator {
 public:
  CentralDpSum(const Model& layout, CentralDpConfig dp, AggregationConfig::AdaptiveClip adaptive, std::size_t lanes,
               std::optional<crypto::NoiseSource::Key> key)
      : dp_(std::move(dp)), adaptive_(adaptive), key_(key), sum_(std::make_shared<Model>(layout.zeros_like())) {
    current_.resize(lanes);  // never grows: see PlainSum
    current_.front() = std::make_unique<LaneBuffer>(layout.tensors());
  }

 private:
  protocol::UploadBuffer lane_buffer(std::size_t lane) override {
    return lane_upload(current_, lane);
  }

  FoldResult do_fold(const Contribution& c, protocol::UploadCheck& check, std::size_t lane) override {
    auto r = check_upload(check, c, "update");
    if (!r) return r;
    // The upload is weight * delta: the delta, clipped, counts once whatever weight it claims.
    // One factor, in double: min(1 / w, C / ||w delta||). Scaling by 1 / w in float first would
    // overflow for a tiny claimed weight, and a non-finite norm would then escape the clipping.
    const auto cur = current_.at(lane)->flat();
    double sq = 0;
    for (const float x : cur) sq += static_cast<double>(x) * static_cast<double>(x);
    const double norm = std::sqrt(sq);
    // The delta's norm is norm / w; a weight so small that it overflows counts as clipped.
    if (norm <= dp_.clip_norm * c.weight) ++unclipped_;
    if (norm > 0) {
      // Just below C / norm when clipping, so that float rounding cannot leave it above C.
      const double f = std::min(1.0 / c.weight, dp_.clip_norm * (1 - 1e-6) / norm);
      const auto acc = sum_->flat();
      for (std::size_t i = 0; i < cur.size(); ++i) acc[i] += static_cast<float>(static_cast<double>(cur[i]) * f);
    }
    ++updates_;
    return r;
  }

  // `out` may be the sum itself (output()): each element is read before it is written.
  CombineResult do_combine(std::span<float> out, const CombineContext&) override {
    const auto acc = sum_->flat();
    const double inv = 1.0 / dp_.denominator;
    for (std::size_t i = 0; i < acc.size(); ++i) out[i] = static_cast<float>(static_cast<double>(acc[i]) * inv);
    crypto::NoiseSource noise(key_);  // the round's key (make_central_dp_sum)
    add_gaussian_noise(out, noise_stddev(dp_), noise);
    Combined c;
    if (adaptive_.on() && dp_.count_stddev > 0) {
      // The paper's estimate of the unclipped fraction from the centred, noised count over W: only
      // it leaves (in the record and as the next C), never the count itself. Held to [0, 1]
      // (post-processing), so that C moves by at most exp(lr max(q, 1 - q)) a round, as without DP.
      const double n = static_cast<double>(updates_);
      const double noisy = static_cast<double>(unclipped_) - n / 2 + dp_.count_stddev * noise.gaussian();
      const double fraction = std::clamp(noisy / dp_.denominator + 0.5, 0.0, 1.0);
      auto [next, part] = adapt_clip_norm_to(adaptive_, dp_.clip_norm, fraction);
      part["count_stddev"] = dp_.count_stddev;
      c.record["robust"]["adaptive_clip"] = std::move(part);
      c.next_clip_norm = next;
    }
    // Neither the norms nor which update was clipped: only what the mechanism's parameters and
    // the participant list already say (the norms are the silos' data, and the log is no secret).
    c.record["central_dp"] = {{"updates", updates_}, {"denominator", dp_.denominator},
                              {"noise_stddev", noise_stddev(dp_)}};
    return c;
  }

  std::shared_ptr<Model> do_output(const Model&) override { return sum_; }

  CentralDpConfig dp_;  // clip_norm: the round's
  AggregationConfig::AdaptiveClip adaptive_;
  std::optional<crypto::NoiseSource::Key> key_;
  std::vector<std::unique_ptr<LaneBuffer>> current_;  // each lane's upload buffer
  std::shared_ptr<Model> sum_;
  std::size_t updates_ = 0;
  std::size_t unclipped_ = 0;  // deltas within C (adaptive clipping), never recorded
};

}  // namespace

std::unique_ptr<Aggregator> make_central_dp_sum(const RoundConfig& cfg, const Model& layout,
                                                std::optional<crypto::NoiseSource::Key> key,
                                                std::optional<double> clip_norm) {
  if (!cfg.central_dp) throw std::logic_error("make_central_dp_sum without a central_dp config");
  if (!key) {  // the round's noise key: fresh, from the sources the core is given (crypto/sources.h)
    crypto::NoiseSource::Key fresh;
    cfg.sources.random_bytes(fresh);
    key = fresh;
  }
  auto dp = *cfg.central_dp;
  if (clip_norm) dp.clip_norm = *clip_norm;  // adaptive clipping's C for this round
  return std::make_unique<CentralDpSum>(layout, std::move(dp), cfg.aggregation.adaptive_clip,
                                        std::max<std::size_t>(1, cfg.uploads_at_once), key);
}

}  // namespace xsilo::server
