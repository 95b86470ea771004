#include "server/secure_groups.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "crypto/skellam.h"
#include "protocol/compression.h"

namespace xsilo::server {

namespace {

SecureConfig with_clip_norm(SecureConfig s, std::optional<double> clip_norm) {
  if (clip_norm) s.clip_norm = std::min(*clip_norm, s.clip_norm);
  return s;
}

// The round's C under adaptive clipping (capped by secure.clip_norm, as the setup states it).
std::optional<double> round_clip_norm(const RoundConfig& cfg, std::optional<double> clip_norm) {
  if (!clip_norm) return std::nullopt;
  return with_clip_norm(cfg.secure, clip_norm).clip_norm;
}

// Distributed DP at the round's C (server/distributed_dp.h at_clip_norm).
std::optional<DistributedDpConfig> round_dp(const RoundConfig& cfg, std::optional<double> clip_norm) {
  if (!cfg.distributed_dp) return std::nullopt;
  const auto c = round_clip_norm(cfg, clip_norm);
  return c ? at_clip_norm(*cfg.distributed_dp, *c) : *cfg.distributed_dp;
}

// RANDOM_K: the round's shared coordinate set (protocol/compression.h); empty otherwise.
std::vector<std::uint64_t> shared_set(const RoundConfig& cfg, const std::vector<TensorInfo>& layout,
                                      std::uint64_t round) {
  const auto c = round_compression(cfg, round);
  if (c.scheme() != wire::Compression::RANDOM_K) return {};
  return protocol::shared_kept_set(c, layout);
}

}  // namespace

// Distributed DP's setup part: the parameters every member encodes with (server/distributed_dp.h).
std::optional<wire::SkellamSetup> skellam_setup(const RoundConfig& cfg, std::uint64_t round,
                                                std::optional<double> clip_norm) {
  if (!cfg.distributed_dp) return std::nullopt;
  if (!cfg.distributed_dp->ready()) throw std::logic_error("distributed DP was not finalized for the model's size");
  const auto dp = clip_norm ? at_clip_norm(*cfg.distributed_dp, *clip_norm) : *cfg.distributed_dp;
  // The rotation seed is public, labelled with its purpose: every silo and the server rotate alike.
  return signed_part(dp, crypto::derive_seed(cfg.seed, round, "skellam-rotation"));
}

// Why a distributed-DP group sum cannot come from its survivors: the count word is not their
// number (every member adds exactly 1), or the norm is beyond what clipped members, rounding and
// the noise can make (a member skipped clipping or scaled wrong). The noise's norm is about
// sqrt(P V) / gamma; three times that is never reached by honest members in practice.
Status check_plausible_skellam_sum(const GroupSum& sum, std::size_t survivors, std::size_t min_survivors,
                                   const DistributedDpConfig& dp) {
  const double n = static_cast<double>(survivors);
  if (sum.weight() != n) {
    return Error("member count " + std::to_string(sum.weight()) + " is not the " + std::to_string(survivors) +
                 " survivors: a member sent a count word other than 1");
  }
  double sq = 0;
  sum.for_each_block([&](std::size_t, std::span<const double> block) {
    for (const double v : block) sq += v * v;
  });
  const double P = static_cast<double>(dp.padded);
  const double v = n * dp.variance / static_cast<double>(std::max<std::size_t>(1, min_survivors));
  const double bound = n * dp.clip_norm + (n * std::sqrt(P) + 3 * std::sqrt(P * v) + 10) / dp.gamma;
  if (std::sqrt(sq) > bound) {
    return Error("group sum norm " + std::to_string(std::sqrt(sq)) + " exceeds what " + std::to_string(survivors) +
                 " clipped members and the noise can make (" + std::to_string(bound) + "): a member skipped clipping");
  }
  if (dp.count_scale > 0 && sum.size() > sum.d() + 1) {
    // Adaptive clipping: n members' +-h and the noise, read as u - n / 2 + noise / (2 h); six
    // times the noise's deviation is never passed by honest members in practice.
    const double centred = sum.at(sum.d() + 1);
    const double slack = 6 * std::sqrt(v) / (2 * static_cast<double>(dp.count_scale)) + 1;
    if (std::abs(centred) > n / 2 + slack) {
      return Error("unclipped count word " + std::to_string(centred) + " is beyond what " +
                   std::to_string(survivors) + " members' +-" + std::to_string(dp.count_scale) +
                   " and the noise can make: a member sent another word");
    }
  }
  return {};
}

Status check_plausible_sum(const GroupSum& sum, std::size_t survivors, const SecureConfig& sc,
                          bool counts_unclipped) {
  const std::size_t d = sum.d();
  const double w = sum.weight(), n = static_cast<double>(survivors);
  double sq = 0;
  sum.for_each_block([&](std::size_t, std::span<const double> block) {
    for (const double v : block) sq += v * v;
  });
  // Each member adds w x with ||x|| <= clip_norm and w <= max_weight; rounding adds at most one
  // step per coordinate and member.
  const double step = std::ldexp(1.0, -static_cast<int>(sc.fraction_bits)) * n;
  const double bound = w * sc.clip_norm * 1.001 + step * std::sqrt(static_cast<double>(d));
  if (!(w > 0) || w > n * sc.max_weight * 1.001 + step) {
    return Error("summed weight " + std::to_string(w) + " is impossible for " + std::to_string(survivors) +
                 " silos of max_weight " + std::to_string(sc.max_weight));
  }
  if (std::sqrt(sq) > bound) {
    return Error("group sum norm " + std::to_string(std::sqrt(sq)) + " exceeds summed weight x clip_norm = " +
                 std::to_string(w * sc.clip_norm) + ": a member skipped clipping");
  }
  if (counts_unclipped) {
    // Honest bits are 0 or 1 and encode exactly: any other sum means a member (or the edge that
    // carried its region) sent something else.
    const double c = sum.at(d + 1);
    if (c != std::floor(c) || c < 0 || c > n) {
      return Error("unclipped count " + std::to_string(c) + " is impossible for " + std::to_string(survivors) +
                   " members: a member sent a bit other than 0 or 1");
    }
  }
  return {};
}

SecureGroups::SecureGroups(const RoundConfig& cfg, const std::vector<TensorInfo>& layout, std::uint64_t round,
                           const std::vector<std::string>& selected, std::optional<double> clip_norm)
    : aggregation_(cfg.aggregation),
      d_(elements(layout)),
      clip_norm_(clip_norm),
      counts_(counts_unclipped(cfg, clip_norm)),
      ceiling_(cfg.secure.clip_norm),
      kept_(shared_set(cfg, layout, round)),
      words_(cfg.distributed_dp ? crypto::padded_length(kept_.empty() ? d_ : kept_.size()) + 1 +
                                      (cfg.distributed_dp->count_scale > 0 ? 1 : 0)
                                : (kept_.empty() ? d_ : kept_.size()) + 1 + (counts_ ? 1 : 0)),
      dp_(round_dp(cfg, clip_norm)),
      round_(with_clip_norm(cfg.secure, clip_norm), cfg.signer, cfg.ca, cfg.federation, round, cfg.seed, selected, d_,
             counts_, kept_, skellam_setup(cfg, round, round_clip_norm(cfg, clip_norm))),
      current_(std::max<std::size_t>(1, cfg.uploads_at_once)) {
  // Every lane's slot exists from the start and never moves (the worker may be folding one lane
  // while the network thread fills another's on its first grant); a lane's words are made then.
  for (auto g : round_.groups()) sums_.emplace(g, protocol::MaskedVector::for_setup(round_.setup(g)));
}

protocol::UploadBuffer SecureGroups::lane_buffer(std::size_t lane) {
  // Every group's words have the same width (one setup for the round's ring): the first group's.
  check_lane(lane, current_.size());
  if (!current_[lane]) {
    current_[lane] = std::make_unique<protocol::MaskedVector>(protocol::MaskedVector::for_setup(round_.setup(round_.groups().front())));
  }
  auto& cur = *current_[lane];
  return {.bytes = cur.bytes(),
          .dtype = cur.dtype(),
          .layout = {{"masked", {words_}, 0}},
          .hash = true,
          .keep = nullptr,
          .scheme = {},
          .sink = nullptr,
          .packed_bits = cur.wire_bits()};
}

FoldResult SecureGroups::do_fold(const Contribution& c, protocol::UploadCheck& check, std::size_t lane) {
  auto r = check_upload(check, c, c.partial_sum ? "partial sum" : "update");
  if (!r) return r;
  sums_.at(c.group).add(*current_.at(lane));  // masked words: nothing to check, add mod 2^bits
  return r;
}

std::vector<Rejection> SecureGroups::do_prepare() {
  // Every upload is folded: the lanes' buffers go before the output model is made beside the sums.
  for (auto& lane : current_) lane.reset();
  results_ = round_.finish(sums_);
  const auto& sc = round_.config();
  std::vector<Rejection> rejected;
  for (auto& r : results_) {
    if (r.sum) {
      auto plausible = dp_ ? check_plausible_skellam_sum(*r.sum, r.survivors.size(), r.min_survivors, *dp_)
                           : check_plausible_sum(*r.sum, r.survivors.size(), sc, counts_);
      if (!plausible) r.sum = plausible.error();
    }
    if (!r.sum) {
      const std::string& why = r.sum.error().message();
      spdlog::warn("secure group {} rejected: {}", r.group, why);
      rejected.push_back({r.members, "secure group " + std::to_string(r.group) + ": " + why});
    }
  }
  return rejected;
}

CombineResult SecureGroups::do_combine(std::span<float> out, const CombineContext& ctx) {
  if (dp_) return combine_distributed_groups(aggregation_, results_, d_, *dp_, ctx, out, ceiling_);
  const GroupClipping clipping{.counted = counts_,
                                .adaptive = clip_norm_ ? std::optional<double>(round_.config().clip_norm) : std::nullopt,
                                .ceiling = ceiling_};
  return combine_groups(aggregation_, results_, d_, clipping, ctx, out);
}

namespace {

// Each group's mean (its sum over its weight: the codec's summed weight, or under distributed DP
// its member count, every silo weighing 1), one row per group, through the rule across groups.
CombineResult rule_across_group_means(const AggregationConfig& aggregation, const std::vector<const GroupSum*>& sums,
                                      const std::vector<std::string>& labels, std::size_t d,
                                      const CombineContext& ctx, std::span<float> out) {
  std::vector<float> rows(sums.size() * d);
  std::vector<double> weights, norms;
  for (std::size_t g = 0; g < sums.size(); ++g) {
    const double inv = 1.0 / sums[g]->weight();
    float* row = rows.data() + g * d;
    sums[g]->for_each_block([&](std::size_t from, std::span<const double> block) {
      for (std::size_t k = 0; k < block.size(); ++k) row[from + k] = static_cast<float>(block[k] * inv);
    });
    weights.push_back(sums[g]->weight());
    norms.push_back(robust::l2_norm(std::span<const float>(row, d)));
  }
  return combine_rows(aggregation, rows, d, labels, "group", weights, norms, ctx, out);
}

// The groups' sums added in order, a block of GroupSum::kBlock at a time, over `denominator`,
// into `out`: no copy of the whole sum in doubles beside the ring words (issue 43 item 4).
void mean_of_group_sums(const std::vector<const GroupSum*>& sums, std::size_t d, double denominator,
                        std::span<float> out) {
  std::vector<double> total(std::min(GroupSum::kBlock, d)), part(total.size());
  for (std::size_t from = 0; from < d; from += GroupSum::kBlock) {
    const std::size_t n = std::min(GroupSum::kBlock, d - from);
    std::fill_n(total.begin(), n, 0.0);
    for (const auto* s : sums) {
      s->decode(from, {part.data(), n});
      for (std::size_t k = 0; k < n; ++k) total[k] += part[k];
    }
    for (std::size_t k = 0; k < n; ++k) out[from + k] = static_cast<float>(total[k] / denominator);
  }
}

}  // namespace

CombineResult combine_distributed_groups(const AggregationConfig& aggregation, const std::vector<GroupResult>& results,
                                         std::size_t d, const DistributedDpConfig& dp, const CombineContext& ctx,
                                         std::span<float> out, double ceiling) {
  // FedAvg: the groups' noisy sums over the fixed denominator W, as central mode
  // (server/distributed_dp.h). A robust rule (or nnm, bucketing): across the groups' noisy means.
  // Either is post-processing of the released sums, each of which already carries the round's
  // noise: the spend is the round's SkellamSum whatever is computed from them (docs/privacy.md).
  nlohmann::json outcome = nlohmann::json::array();
  std::vector<const GroupSum*> sums;
  std::vector<std::string> labels;
  double members = 0, centred_count = 0;
  const bool counts = dp.count_scale > 0 && aggregation.adaptive_clip.on();
  for (const auto& r : results) {
    nlohmann::json o = {{"group", r.group}, {"survivors", r.survivors}, {"ok", r.sum.has_value()},
                        {"min_survivors", r.min_survivors}};
    if (!r.sum) o["reason"] = r.sum.error().message();
    outcome.push_back(o);
    if (!r.sum) continue;
    members += r.sum->weight();
    // The group's noisy centred count (never recorded: only the fraction below leaves, as central).
    if (counts) centred_count += r.sum->at(d + 1);
    sums.push_back(&*r.sum);
    labels.push_back(std::to_string(r.group));
  }
  CombineResult c = Combined{};
  nlohmann::json part = {{"updates", members}};
  if (members == 0) {
    c = CombineFailure{.reason = "no secure group's sum was revealed", .record = {}};
  } else if (aggregation.inspects_inputs()) {
    c = rule_across_group_means(aggregation, sums, labels, d, ctx, out);
    part["step"] = "the rule across the groups' noisy means (each sum over its members)";
  } else {
    mean_of_group_sums(sums, d, dp.denominator, out);
    part["denominator"] = dp.denominator;
  }
  record_of(c)["secure"]["groups_outcome"] = outcome;
  record_of(c)["distributed_dp"] = part;
  if (counts && c) {
    // Central mode's estimate from the noised count (server/central_dp_sum.cpp), here the sum of
    // the revealed groups' centred counts, each noised inside the ring: held to [0, 1]
    // (post-processing), so C moves by at most exp(lr max(q, 1 - q)) a round.
    const double fraction = std::clamp(centred_count / dp.denominator + 0.5, 0.0, 1.0);
    auto [next, adapt] = adapt_clip_norm_to(aggregation.adaptive_clip, dp.clip_norm, fraction, ceiling);
    adapt["count_scale"] = dp.count_scale;
    adapt["count_stddev"] = count_noise_stddev(dp);
    adapt["counted_in"] = "the masked group sums' noised count words";
    c->record["robust"]["adaptive_clip"] = std::move(adapt);
    c->next_clip_norm = next;
  }
  return c;
}

bool counts_unclipped(const RoundConfig& cfg, std::optional<double> adaptive_clip_norm) {
  if (!cfg.secure.on()) return false;
  if (adaptive_clip_norm) return true;
  return !cfg.central_dp && !cfg.distributed_dp &&
         cfg.secure.max_weight * std::max(cfg.secure.clip_norm, 1.0) >= 1.0;
}

CombineResult combine_groups(const AggregationConfig& aggregation, const std::vector<GroupResult>& results,
                             std::size_t d, const GroupClipping& clipping, const CombineContext& ctx,
                             std::span<float> out) {
  nlohmann::json outcome = nlohmann::json::array();
  std::vector<const GroupSum*> sums;  // the groups counted, in order
  std::vector<std::string> labels;
  double unclipped = 0, total_weight = 0;
  std::size_t counted = 0;
  for (const auto& r : results) {
    nlohmann::json o = {{"group", r.group}, {"survivors", r.survivors}, {"ok", r.sum.has_value()}};
    if (!r.sum) o["reason"] = r.sum.error().message();
    else o["weight"] = r.sum->weight();
    if (r.sum && clipping.counted) {
      // The group's count of members within the clip norm: a sum, like everything else here
      // (prepare() checked it is a whole number of at most the survivors).
      o["unclipped"] = r.sum->at(d + 1);
      unclipped += r.sum->at(d + 1);
      counted += r.survivors.size();
    }
    outcome.push_back(o);
    if (!r.sum) continue;
    sums.push_back(&*r.sum);
    total_weight += r.sum->weight();
    labels.push_back(std::to_string(r.group));
  }
  CombineResult c = Combined{};
  if (aggregation.inspects_inputs()) {
    c = rule_across_group_means(aggregation, sums, labels, d, ctx, out);
  } else {
    mean_of_group_sums(sums, d, total_weight, out);  // the weighted mean
  }
  record_of(c)["secure"]["groups_outcome"] = outcome;
  if (clipping.counted && counted > 0) {
    const double norm = clipping.adaptive.value_or(clipping.ceiling);
    const auto scaled = static_cast<std::size_t>(std::llround(static_cast<double>(counted) - unclipped));
    record_of(c)["secure"]["clipped"] = {{"updates", scaled}, {"of", counted}, {"clip_norm", norm}};
    if (scaled > 0 && !clipping.adaptive && clipping.warn && c) {
      // Nothing else would say it: the silos' deltas were larger than the codec's bound, and the
      // round's step is damped and biased against plain mode (docs/configs.md, secure.clip_norm).
      spdlog::warn("round {}: secure.clip_norm {:g} scaled down {} of {} updates (their norm was above it), which "
                   "damps and biases the round's step against plain mode; raise it (the config check says when "
                   "the ring needs more room for it) or let aggregation.adaptive_clip follow the norms "
                   "(docs/configs.md, secure.clip_norm)",
                   ctx.round, norm, scaled, counted);
    }
  }
  if (clipping.adaptive && counted > 0 && c) {
    // Every member clipped to the round's norm (capped by secure.clip_norm, the codec's bound);
    // the next one follows the unclipped fraction, and stays under that bound.
    auto [next, part] = adapt_clip_norm(aggregation.adaptive_clip, *clipping.adaptive, unclipped, counted,
                                        clipping.ceiling);
    part["counted_in"] = "the masked group sums";
    c->record["robust"]["adaptive_clip"] = std::move(part);
    c->next_clip_norm = next;
  }
  return c;
}

}  // namespace xsilo::server
