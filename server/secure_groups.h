// Secure aggregation as an aggregator: one masked sum per secure group (mod 2^bits), the
// groups' protocol state (SecureRound), and at the end the unmasked group sums, checked, then
// their mean (or the robust rule across the group means).
#pragma once

#include <memory>
#include <map>

#include "protocol/masked.h"
#include "server/aggregator.h"
#include "server/secure_round.h"

namespace xsilo::server {

// Whether a group's unmasked sum (d coordinates, the summed weight, then the unclipped count when
// `counts_unclipped`) can come from `survivors` honest members under `sc`; the error says why not: a weight
// outside (0, survivors x max_weight], a norm above weight x clip_norm (a member skipped
// clipping), a count that is not a whole number in [0, survivors]. Each with rounding slack.
Status check_plausible_sum(const GroupSum& sum, std::size_t survivors, const SecureConfig& sc,
                          bool counts_unclipped);

// Whether a secure round's masked sums end with the count of the members whose delta was within
// the round's clip norm (one more word; the codec's unclipped bit): under adaptive clipping
// (`adaptive_clip_norm` set), which steers by it, and in a round without silo-level DP, so that
// the server can say how many updates secure.clip_norm scaled down (a group's count, like its
// sum, is all it learns; under DP it would be released without noise, so it is not made). Never
// where the bit would need more of the ring than the updates (max_weight x clip_norm below 1).
bool counts_unclipped(const RoundConfig& cfg, std::optional<double> adaptive_clip_norm);

// How a round's sums were clipped, for combine_groups.
struct GroupClipping {
  bool counted = false;                // the sums end with the count of members within the clip norm
  std::optional<double> adaptive;      // adaptive clipping: the round's C, every member clipped to it
  double ceiling = 0;                  // secure.clip_norm: the codec's bound, and the next C's
  bool warn = true;                    // log a warning when secure.clip_norm scaled updates down
};

// The unmasked group sums (results without a sum are left out) through the rule across group
// means, or their total for FedAvg, with each group's outcome. With counted sums the record says
// how many updates were scaled down (secure.clipped; a warning when secure.clip_norm did it) and,
// under adaptive clipping, the next clip norm, at most the ceiling. SecureGroups::combine, and
// `xsilo sim --in-process`'s grouped rounds.
CombineResult combine_groups(const AggregationConfig& aggregation, const std::vector<GroupResult>& results,
                             std::size_t d, const GroupClipping& clipping, const CombineContext& ctx,
                             std::span<float> out);

// Distributed DP (server/distributed_dp.h): the setup part every member encodes with, for a round
// (at adaptive clipping's `clip_norm` for it: at_clip_norm); nullopt without distributed DP.
// Throws std::logic_error when the config was not finalized.
std::optional<wire::SkellamSetup> skellam_setup(const RoundConfig& cfg, std::uint64_t round,
                                                std::optional<double> clip_norm = std::nullopt);
// Whether a decoded distributed-DP group sum can come from its survivors; the error says why not
// (the count word is not their number, or the norm passes what clipped members, rounding and 3
// times the noise's norm can make).
Status check_plausible_skellam_sum(const GroupSum& sum, std::size_t survivors, std::size_t min_survivors,
                                   const DistributedDpConfig& dp);
// Distributed DP: the revealed groups' noisy sums added and divided by the fixed denominator W
// (FedAvg), or the configured rule across the groups' noisy means, each sum over its member count
// (grouped mode): post-processing of the released sums, which spends nothing more. With a count
// word (dp.count_scale > 0, adaptive clipping at the round's dp.clip_norm) the next clip norm
// from the groups' noisy counts, as central mode: b = clamp(sum of the centred counts / W + 1/2),
// at most `ceiling` (0: none).
CombineResult combine_distributed_groups(const AggregationConfig& aggregation, const std::vector<GroupResult>& results,
                                         std::size_t d, const DistributedDpConfig& dp, const CombineContext& ctx,
                                         std::span<float> out, double ceiling = 0);

class SecureGroups final : public Aggregator {
 public:
  // `clip_norm`: this round's (adaptive clipping), which every member clips to; the masked sums
  // then also count the members that were within it.
  SecureGroups(const RoundConfig& cfg, const std::vector<TensorInfo>& layout, std::uint64_t round,
               const std::vector<std::string>& selected, std::optional<double> clip_norm = std::nullopt);

  SecureRound* secure() override { return &round_; }

 private:
  protocol::UploadBuffer lane_buffer(std::size_t lane) override;
  FoldResult do_fold(const Contribution& c, protocol::UploadCheck& check, std::size_t lane) override;
  std::vector<Rejection> do_prepare() override;
  CombineResult do_combine(std::span<float> out, const CombineContext& ctx) override;

  AggregationConfig aggregation_;
  std::size_t d_;
  std::optional<double> clip_norm_;  // adaptive: this round's (else secure.clip_norm, fixed)
  bool counts_ = false;              // the sums end with the unclipped count (counts_unclipped)
  double ceiling_ = 0;               // secure.clip_norm: the codec's overflow check is made for it
  std::vector<std::uint64_t> kept_;  // RANDOM_K: the coordinates every member masks (else all)
  std::size_t words_;                // d (or the kept ones), the weight, and the unclipped count when counted
  std::optional<DistributedDpConfig> dp_;  // distributed DP at the round's C: words_ = the rotated length + 1 (+ 1)
  SecureRound round_;
  std::vector<std::unique_ptr<protocol::MaskedVector>> current_;            // each upload lane's upload being received
  std::map<std::uint32_t, protocol::MaskedVector> sums_;  // per group
  std::vector<GroupResult> results_;                      // after prepare()
};

}  // namespace xsilo::server
