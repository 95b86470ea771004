// The server's side of one secure group in one round, whatever protocol the group runs: the
// seam a secure-aggregation protocol plugs into (docs/architecture.md, "Secure aggregation
// protocols"). SecureRound (server/secure_round.h) draws the groups, routes each member's
// wire::SecureAggregation steps to its group and forwards what the group sends; it never opens a
// step. A protocol is a subclass (server/secure/secagg_group.cpp: SecAgg and SecAgg+) and a
// line in make_group() (server/secure/group.cpp).
//
// Every protocol moves through the same stages, which is all the coordinator sees:
//
//   Setup    the members' keys, shares and receipts (the protocol's own steps), each step
//            waiting for the members it expects, a member that goes away, or the deadline;
//   Masking  the admitted members upload masked inputs, which the aggregator sums;
//   Confirm  collection closed: the survivors confirm the set they are in;
//   Unmask   the survivors answer the unmask request; then finish() removes the masks.
//   Done     finished, or failed (failed() says why: every member drops).
//
// The base class holds what every protocol shares: the members a step waits for, the failure,
// the messages out and the members dropped (each with a typed reason and the sentence the audit
// record gives). Sans-I/O like the coordinator: steps in, (silo, step) pairs out.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "crypto/certs.h"
#include "crypto/keys.h"
#include "crypto/secagg.h"
#include "proto/xsilo.pb.h"
#include "protocol/masked.h"
#include "server/round_config.h"

namespace xsilo::server::secure {

enum class Stage { Setup, Masking, Confirm, Unmask, Done };

// Why a member leaves its group this round.
enum class DropReason {
  GroupFailed,  // the whole group failed (too few left, a parameter refused, ...)
  NoKeys,       // no valid signed keys from it in time
  NoShares,     // no valid signed shares from it in time
  NoReceipt,    // shared, but sent no receipt for what it was dealt
  Excluded,     // Byzantine, with proof (an accusation judged, a share its dealer refutes)
};
const char* name(DropReason r);

struct Drop {
  std::string silo;
  DropReason reason = DropReason::GroupFailed;
  std::string why;  // the sentence for logs and the audit record
};

// What a group needs from the server to run: its certificate key (signs setups, survivor sets),
// the CA (checks the members'), and where the round stands.
struct GroupContext {
  crypto::CertSigner signer;
  crypto::CertVerifier ca;
  std::string federation;
  std::uint64_t round = 0;
};

class Group {
 public:
  virtual ~Group() = default;

  const wire::SecAggSetup& setup() const { return setup_; }
  std::uint32_t id() const { return setup_.group(); }
  Stage stage() const { return stage_; }
  const std::string& failed() const { return failed_; }
  const std::set<std::string>& waiting() const { return waiting_; }

  // A member's step. Handled only when the current step expects it from that member (late,
  // early, twice or in the wrong direction: ignored); one that does not check (unsigned,
  // malformed: perhaps altered on the way) is logged, and the member may still answer properly.
  // Then the step closes if every member it waits for has answered or is in `away`.
  void receive(const std::string& silo, const wire::SecureAggregation& step, const std::set<std::string>& away);
  // The current step closes with whatever it has (its deadline), and so do the steps after it
  // while everyone they wait for is in `away`.
  void close_step(const std::set<std::string>& away) { advance(true, away); }
  // A member the step waits for went away: the step closes if only such members are left.
  void proceed(const std::set<std::string>& away) { advance(false, away); }
  // `silo` is gone: the step stops waiting for it (not in Masking: the uploads decide there).
  void gone(const std::string& silo, const std::set<std::string>& away);
  // `silo`'s masked input may be added to the group's sum.
  bool may_upload(const std::string& silo) const {
    return failed_.empty() && stage_ == Stage::Masking && admitted(silo);
  }
  // `silo`'s masked input is in the group's sum.
  virtual void masked_from(const std::string& silo) = 0;
  // Collection closed: Masking -> Confirm (the survivors are asked to confirm their set).
  void begin_unmask();
  // What a survivor still has to answer (its set to confirm, or the unmask request): for one
  // that came back through another route.
  std::optional<wire::SecureAggregation> pending(const std::string& silo) const;
  // Worker thread, once no more steps are fed: removes the masks from the sum of the survivors'
  // masked inputs in place; success or why not (the group's sum is then not revealed).
  virtual Status finish(protocol::MaskedVector& sum) = 0;
  // The members whose masked inputs are in the sum (U3).
  virtual std::vector<std::string> survivors() const = 0;
  virtual std::vector<crypto::secagg::Blame> excluded() const = 0;
  // The group's state for `xsilo status` and the audit record.
  virtual nlohmann::json describe() const = 0;

  // What the group sent and dropped since the last call.
  std::vector<std::pair<std::string, wire::SecureAggregation>> take_out() { return std::exchange(out_, {}); }
  std::vector<Drop> take_dropped() { return std::exchange(dropped_, {}); }
  void fail(const std::string& why);

 protected:
  Group(wire::SecAggSetup setup, GroupContext ctx);

  // The protocol's part. handles(): whether the current step takes this step from a member.
  // handle(): success when it counts (the member is no longer waited for), or why it does not.
  // close(): the current step ends with what it has; false when nothing changed (a stage that
  // ends by the coordinator's decision: Masking, Unmask).
  virtual bool handles(const wire::SecureAggregation& step) const = 0;
  virtual Status handle(const std::string& silo, const wire::SecureAggregation& step) = 0;
  virtual bool close() = 0;
  // Masking -> Confirm: name the survivors and ask them; false (after fail()) when it cannot.
  virtual void ask_survivors() = 0;
  virtual bool admitted(const std::string& silo) const = 0;
  // Members the protocol excluded with proof since the last call (the base drops them).
  virtual std::vector<crypto::secagg::Blame> new_blames() = 0;

  void send(const std::string& silo, wire::SecureAggregation step) { out_.emplace_back(silo, std::move(step)); }
  void drop(const std::string& silo, DropReason reason, const std::string& why);
  // The group's own prefix for drop sentences: "secure group 3".
  std::string label() const { return "secure group " + std::to_string(id()); }
  void report_blame();

  wire::SecAggSetup setup_;
  GroupContext ctx_;
  Stage stage_ = Stage::Setup;
  std::set<std::string> waiting_;  // members the current step still waits for
  // Confirm and Unmask: the request the waiting survivors are to answer.
  std::optional<wire::SecureAggregation> request_;

 private:
  void advance(bool force, const std::set<std::string>& away);

  std::string failed_;
  std::vector<std::pair<std::string, wire::SecureAggregation>> out_;
  std::vector<Drop> dropped_;
};

// The group a setup describes, running the protocol it names; the setup's protocol-specific
// fields are planned and signed here. `box` is the key pair the members seal their unmask
// answers to. A group whose parameters are unusable comes back failed, with the reason.
std::unique_ptr<Group> make_group(const SecureConfig& cfg, wire::SecAggSetup setup, GroupContext ctx);

}  // namespace xsilo::server::secure
