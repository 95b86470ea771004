// The server's side of secure aggregation for one round: the selected silos split into secure
// groups, one secure::Group per group running the protocol its setup names (server/secure/
// group.h), their steps routed unopened, and at the end one decoded sum per group. Sans-I/O
// like the coordinator that drives it: steps in, (silo, envelope) pairs out. The masked sums
// themselves belong to the aggregator (SecureGroups).
//
// A group moves through the stages every protocol shares (Setup, Masking, Confirm, Unmask): the
// settled members may upload once every group is past Setup; after collection the survivors
// confirm their set, then answer the unmask request. Each step waits for the members it
// expects, one who goes away, or its deadline.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "crypto/secagg.h"
#include "proto/xsilo.pb.h"
#include "protocol/masked.h"
#include "server/group_sum.h"
#include "server/round_config.h"
#include "server/secure/group.h"

namespace xsilo::server {

struct GroupResult {
  std::uint32_t group = 0;
  std::vector<std::string> members, survivors;
  std::size_t threshold = 0;
  std::size_t min_survivors = 0;  // the setup's: distributed DP's noise is calibrated for it
  // Unmasked: d weighted coordinates, then the summed weight (and the unclipped count); RANDOM_K's
  // left-out coordinates are zero. Or why the group has no sum.
  Result<GroupSum> sum = Error("the group's sum was not unmasked");
  std::vector<crypto::secagg::Blame> excluded;  // members excluded with proof, this round
};

// A member the coordinator must drop: its group failed, it missed a step, or it was excluded
// with proof (reason Excluded: Byzantine).
struct SecureDrop {
  std::string silo, why;
  secure::DropReason reason = secure::DropReason::GroupFailed;
};

class SecureRound {
 public:
  // `signer` (the server's certificate key) signs the setups and settled lists, `ca` checks the
  // members' signatures; throws std::invalid_argument without either.
  SecureRound(const SecureConfig& cfg, const std::optional<crypto::CertSigner>& signer,
              const std::optional<crypto::CertVerifier>& ca, const std::string& federation, std::uint64_t round,
              std::uint64_t seed, std::vector<std::string> selected, std::size_t d, bool count_unclipped = false,
              std::vector<std::uint64_t> kept = {}, std::optional<wire::SkellamSetup> skellam = std::nullopt);

  std::uint32_t group_of(const std::string& silo) const;
  std::vector<std::uint32_t> groups() const;
  const wire::SecAggSetup& setup(std::uint32_t group) const { return groups_.at(group)->setup(); }
  // Distributed DP: the part every group's setup signed (nullopt without distributed DP).
  const std::optional<wire::SkellamSetup>& skellam() const { return skellam_; }
  // How many groups' sums finish() unmasked (revealed to the server), plausible or not: under
  // distributed DP each is a noisy release the budget is charged for, whatever the round becomes.
  std::size_t revealed() const { return revealed_; }
  const SecureConfig& config() const { return cfg_; }

  // A secure-aggregation step from a member, for its group (never opened here); replies queue
  // in take_out().
  void on_message(const std::string& silo, const wire::SecureAggregation& step);
  // The setup steps are past their deadline: close whatever group still waits.
  void keys_deadline();
  // A silo is gone: its group stops waiting for it.
  void silo_gone(const std::string& silo);
  // A survivor's route is gone while its group unmasks: the confirmation or unmask phase stops
  // waiting for it (a silo known to be gone is not waited for until the deadline). If it comes
  // back before the phase closes (silo_back), it is asked again and counted.
  void silo_away(const std::string& silo);
  void silo_back(const std::string& silo) { away_.erase(silo); }

  // True once every group is settled (or failed): the settled members may upload.
  bool settled() const;
  // `silo` belongs to a settled member list: its masked input may be added to its group's sum.
  bool may_upload(const std::string& silo) const;
  // `silo`'s masked input is in its group's sum.
  void masked_from(const std::string& silo);
  // Collection closed: name each group's survivors and ask them to confirm the set.
  void begin_unmask();
  // The confirmation or unmask phase is past its deadline. Groups still collecting
  // confirmations go on with those they have: true when that sent unmask requests (wait again).
  bool unmask_deadline();
  bool unmask_requested() const;
  bool unmask_complete() const;
  // What a survivor that came back through another route (its edge went away after carrying its
  // masked input) still has to answer: the survivor set or the unmask request.
  std::optional<wire::Envelope> unmask_request(const std::string& silo) const;
  // Worker thread, once no more messages are fed: rebuilds the secrets and removes the masks
  // from each group's sum of masked inputs, which then moves into its result (decoded where
  // it is read, a block at a time).
  std::vector<GroupResult> finish(std::map<std::uint32_t, protocol::MaskedVector>& sums);

  std::vector<std::pair<std::string, wire::Envelope>> take_out() { return std::exchange(out_, {}); }
  std::vector<SecureDrop> take_dropped() { return std::exchange(dropped_, {}); }
  nlohmann::json describe() const;

 private:
  secure::Group* group_for(const std::string& silo);
  // What the group sent and dropped, queued for the coordinator.
  void drain(secure::Group& g);
  wire::Envelope env() const;
  bool only_away(const secure::Group& g) const {
    return std::all_of(g.waiting().begin(), g.waiting().end(), [&](const std::string& s) { return away_.count(s) > 0; });
  }

  SecureConfig cfg_;
  std::optional<wire::SkellamSetup> skellam_;  // distributed DP (server/distributed_dp.h)
  std::size_t revealed_ = 0;                    // sums unmasked by finish()
  std::string federation_;
  std::uint64_t round_;
  std::uint64_t permutation_seed_;
  std::size_t d_;
  // RANDOM_K: the coordinates the masked vectors hold (else null: all d)
  std::shared_ptr<const std::vector<std::uint64_t>> kept_;
  std::map<std::uint32_t, std::unique_ptr<secure::Group>> groups_;
  mutable std::uint32_t open_from_ = 0;  // unmask_complete(): groups before this one were complete
  std::map<std::string, std::uint32_t> group_of_;
  std::set<std::string> away_;  // survivors without a route during the unmasking
  bool unmasking_ = false;      // begin_unmask() was called
  std::vector<std::pair<std::string, wire::Envelope>> out_;
  std::vector<SecureDrop> dropped_;
};

// The seed a round's groups are drawn with, from the federation's seed (purpose "secure-groups").
std::uint64_t group_permutation_seed(std::uint64_t seed, std::uint64_t round);

// Splits n silos into floor(n / group_size(cfg)) groups of near-equal size, at least one
// (global: one group).
std::vector<std::vector<std::string>> make_groups(std::vector<std::string> silos, const SecureConfig& cfg,
                                                  std::uint64_t permutation_seed);

// The threshold and the smallest revealed sum of a group of n: t = max(2, floor(n / 2) + 1,
// ceil(threshold * n)), at most n; min_survivors = max(t, min_group).
std::uint32_t group_threshold(const SecureConfig& cfg, std::size_t n);
std::uint32_t group_min_survivors(const SecureConfig& cfg, std::size_t n);

// The size groups are drawn at: the smallest n >= min_group for which n - min_survivors(n) >=
// group_dropouts, so that that many members of every group may drop out at any phase and its sum
// still be revealed. With min_group 3 and the default threshold: 4 for one dropout, 6 for two.
// (A group of exactly min_group fails with its first dropout.)
std::size_t group_size(const SecureConfig& cfg);

}  // namespace xsilo::server
