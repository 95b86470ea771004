// The coordinator's silo-level DP (central or distributed): the round's mechanism and privacy
// record, its charge on an abort, the budget check before a round, and distributed DP's
// unmask_begun record that the unmask steps carry (docs/privacy.md).
#include "server/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "server/coordinator_round.h"
#include "server/secure_round.h"

namespace xsilo::server {

// Distributed DP: the part this round's setups signed and the rotated length they state (before
// any setup exists, the config's own).
std::pair<wire::SkellamSetup, std::size_t> Coordinator::signed_skellam() const {
  const auto& budget = *cfg_.distributed_dp;
  if (r_ && r_->secure && r_->secure->skellam()) {
    return {*r_->secure->skellam(), protocol::skellam_padded(r_->secure->setup(r_->secure->groups().front()))};
  }
  return {signed_part(budget, 0), budget.padded};
}

privacy::Mechanism Coordinator::round_dp_mechanism() const {
  if (cfg_.central_dp) return round_mechanism(*cfg_.central_dp);
  const auto [k, padded] = signed_skellam();
  return round_mechanism(as_signed(*cfg_.distributed_dp, k, padded));
}

nlohmann::json Coordinator::privacy_record(const privacy::Ledger& spent) const {
  if (cfg_.central_dp) {
    auto c = *cfg_.central_dp;
    if (clip_norm_) c.clip_norm = *clip_norm_;  // adaptive clipping: the round's C, as its aggregator clips
    return round_privacy_record(c, spent);
  }
  const auto [k, padded] = signed_skellam();
  auto j = round_privacy_record(*cfg_.distributed_dp, k, padded, spent);
  j["sums_revealed"] = r_ && r_->secure ? r_->secure->revealed() : std::size_t{0};
  return j;
}

bool Coordinator::charged_on_abort() const {
  return cfg_.distributed_dp && r_ && r_->secure && (r_->unmask_begun || r_->secure->revealed() > 0);
}

bool Coordinator::central_budget_spent(std::int64_t now_ms) {
  // Either silo-level mode: its budget, and whether one more round's mechanism fits the spend.
  double epsilon = 0, delta = 0;
  const char* noise = nullptr;
  if (cfg_.distributed_dp) {
    // The next round's mechanism as its setups will sign it: at adaptive clipping's C (capped as
    // SecureGroups caps it), gamma' C is gamma C up to a rounding, which the check must not miss.
    const auto& dp = *cfg_.distributed_dp;
    const auto next = clip_norm_ ? at_clip_norm(dp, std::min(*clip_norm_, cfg_.secure.clip_norm)) : dp;
    if (fits_another_round(next, central_spent_)) return false;
    epsilon = cfg_.distributed_dp->epsilon, delta = cfg_.distributed_dp->delta, noise = "distributed Skellam";
  } else if (cfg_.central_dp) {
    if (fits_another_round(*cfg_.central_dp, central_spent_)) return false;
    epsilon = cfg_.central_dp->epsilon, delta = cfg_.central_dp->delta, noise = "central Gaussian";
  } else {
    return false;
  }
  char why[256];
  std::snprintf(why, sizeof why,
                "privacy budget spent: epsilon %.6g of %.6g (delta %g) after %llu rounds with %s noise; another round "
                "would exceed it",
                epsilon_of(central_spent_, delta), epsilon, delta, static_cast<unsigned long long>(central_spent_.count()),
                noise);
  spdlog::warn("{}", why);
  end_federation(why, now_ms);
  return true;
}

nlohmann::json Coordinator::unmask_begun_record(std::int64_t now_ms) const {
  auto after = central_spent_;
  after.add(round_dp_mechanism(), 1);
  auto privacy = privacy_record(after);
  privacy.erase("sums_revealed");  // none yet (no share was asked for); the round's own record counts them
  auto keys = nlohmann::json::array();
  for (const auto& [silo, sha] : r_->run_keys) keys.push_back({{"silo", silo}, {"keys_sha256", sha}});
  return {{"event", kUnmaskBegun}, {"round", round_}, {"time", iso_time(now_ms)}, {"privacy", std::move(privacy)},
          {"keys", std::move(keys)}};
}

// Distributed DP: a step of the unmasking carries the record that charges it (its signed head and
// its line), which each silo checks before it releases its shares.
void Coordinator::with_unmask_begun(wire::Envelope& e) const {
  if (!r_->unmask_begun_head || !e.has_secure()) return;
  *e.mutable_secure()->mutable_unmask_begun() = *r_->unmask_begun_head;
  e.mutable_secure()->set_unmask_begun_record(r_->unmask_begun_line);
}

}  // namespace xsilo::server
