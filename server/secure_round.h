// The server's side of secure aggregation for one round: the selected silos split into
// secure groups, one crypto::secagg::Server per group, the groups' sums of masked inputs
// (mod 2^bits), and at the end one decoded sum per group. Sans-I/O like the coordinator that
// owns it: messages in, (silo, envelope) pairs out.
#pragma once

#include <chrono>
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
#include "server/config.h"

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
  const wire::SecAggSetup& setup(std::uint32_t group) const { return groups_.at(group).setup; }
  std::size_t groups() const { return groups_.size(); }

  // Messages from silos; replies and broadcasts queue in `out`.
  void on_keys(const std::string& silo, const wire::SecAggKeys& keys);
  void on_shares(const std::string& silo, const wire::SecAggShares& shares);
  void on_unmask(const std::string& silo, const wire::SecAggUnmaskShares& shares);
  // Key phases past their deadline: close whatever group is still waiting.
  void keys_deadline();
  // A silo is gone: its group stops waiting for it in the key phases.
  void silo_gone(const std::string& silo);

  // True once every group has its share deliveries out (or failed): inputs can be masked.
  bool shared() const;
  // Masked inputs: the group's running sum of words and the silos it holds.
  std::size_t word_bytes() const { return cfg_.bits / 8; }
  void fold(std::uint32_t group, const std::uint8_t* words);  // worker thread
  void masked_from(const std::string& silo);
  // Collection closed: ask every group's survivors for their shares.
  void begin_unmask();
  bool unmask_complete() const;
  // The unmask request again, for a survivor that has not answered and came back through
  // another route (its edge went away after carrying its masked input).
  std::optional<wire::Envelope> unmask_request(const std::string& silo) const;
  // Worker thread: rebuild the secrets, remove the masks, decode every group's sum.
  std::vector<GroupResult> finish();

  std::vector<std::pair<std::string, wire::Envelope>> take_out() { return std::exchange(out_, {}); }
  // Silos whose group failed before masking (below the threshold), with why.
  std::vector<std::pair<std::string, std::string>> take_failed() { return std::exchange(failed_, {}); }
  nlohmann::json describe() const;

 private:
  struct Group {
    wire::SecAggSetup setup;
    std::unique_ptr<crypto::secagg::Server> server;
    std::map<std::string, bool> keys_from, shares_from;  // who we still wait for
    std::vector<std::uint32_t> sum32;
    std::vector<std::uint64_t> sum64;
    std::string failed;
    bool keys_closed = false, shares_closed = false, unmask_requested = false;
    wire::Envelope unmask_request;
    std::set<std::string> unmask_answered;
  };
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
