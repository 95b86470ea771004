// The server's side of secure aggregation for one round: the selected silos split into secure
// groups, one crypto::secagg::Server per group, their messages, and at the end one decoded sum
// per group. Sans-I/O like the coordinator that drives it: messages in, (silo, envelope)
// pairs out. The masked sums themselves belong to the aggregator (SecureGroups).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "crypto/secagg.h"
#include "proto/xsilo.pb.h"
#include "protocol/masked.h"
#include "server/round_config.h"

namespace xsilo::server {

struct GroupResult {
  std::uint32_t group = 0;
  std::vector<std::string> members, survivors;
  std::size_t threshold = 0;
  bool ok = false;
  std::string why;            // when not ok
  std::vector<double> sum;    // decoded: d weighted coordinates, then the summed weight
};

class SecureRound {
 public:
  SecureRound(const SecureConfig& cfg, const std::string& federation, std::uint64_t round,
              std::uint64_t seed, std::vector<std::string> selected, std::size_t d);

  std::uint32_t group_of(const std::string& silo) const;
  std::vector<std::uint32_t> groups() const;
  const wire::SecAggSetup& setup(std::uint32_t group) const { return groups_.at(group).setup; }
  const SecureConfig& config() const { return cfg_; }
  std::size_t length() const { return d_ + 1; }  // words of a masked input: d, then the weight

  // SecAggKeys, SecAggShares or SecAggUnmaskShares from a member; replies queue in take_out().
  void on_message(const std::string& silo, const wire::Envelope& e);
  // Key phases past their deadline: close whatever group is still waiting.
  void keys_deadline();
  // A silo is gone: its group stops waiting for it in the key phases.
  void silo_gone(const std::string& silo);

  // True once every group has its share deliveries out (or failed): inputs can be masked.
  bool shared() const;
  // `silo`'s masked input is in its group's sum.
  void masked_from(const std::string& silo);
  // Collection closed: ask every group's survivors for their shares.
  void begin_unmask();
  bool unmask_requested() const;
  bool unmask_complete() const;
  // The unmask request again, for a survivor that has not answered and came back through
  // another route (its edge went away after carrying its masked input).
  std::optional<wire::Envelope> unmask_request(const std::string& silo) const;
  // Worker thread, once no more messages are fed: rebuilds the secrets, removes the masks from
  // each group's sum of masked inputs and decodes it.
  std::vector<GroupResult> finish(std::map<std::uint32_t, protocol::MaskedVector>& sums);

  std::vector<std::pair<std::string, wire::Envelope>> take_out() { return std::exchange(out_, {}); }
  // Silos whose group failed before masking (below the threshold), with why.
  std::vector<std::pair<std::string, std::string>> take_failed() { return std::exchange(failed_, {}); }
  nlohmann::json describe() const;

 private:
  struct Group {
    wire::SecAggSetup setup;
    std::unique_ptr<crypto::secagg::Server> server;
    std::map<std::string, bool> keys_from, shares_from;  // who we still wait for
    std::string failed;
    bool keys_closed = false, shares_closed = false, unmask_requested = false;
    wire::Envelope unmask_request;
    std::set<std::string> unmask_answered;
  };
  Group* group_for(const std::string& silo);
  void on_keys(Group& g, const std::string& silo, const wire::SecAggKeys& keys);
  void on_shares(Group& g, const std::string& silo, const wire::SecAggShares& shares);
  void on_unmask(Group& g, const std::string& silo, const wire::SecAggUnmaskShares& shares);
  void try_close_keys(Group& g, bool force);
  void try_close_shares(Group& g, bool force);
  void fail(Group& g, const std::string& why);
  wire::Envelope env() const;

  SecureConfig cfg_;
  std::string federation_;
  std::uint64_t round_;
  std::uint64_t permutation_seed_;
  std::size_t d_;
  std::map<std::uint32_t, Group> groups_;
  std::map<std::string, std::uint32_t> group_of_;
  std::vector<std::pair<std::string, wire::Envelope>> out_;
  std::vector<std::pair<std::string, std::string>> failed_;
};

// Splits n silos into floor(n / min_group) groups of near-equal size (global: one group).
std::vector<std::vector<std::string>> make_groups(std::vector<std::string> silos, const SecureConfig& cfg,
                                                  std::uint64_t permutation_seed);

}  // namespace xsilo::server
