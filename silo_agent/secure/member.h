// A silo's side of one secure group in one round, whatever protocol the group runs: the seam a
// secure-aggregation protocol plugs into on the agent (docs/architecture.md, "Secure
// aggregation protocols"). The session checks the signed setup against the trusted servers,
// hands the member every wire::SecureAggregation step of its round and sends what it answers;
// it never opens a step. A protocol is a subclass (silo_agent/secure/secagg_member.cpp: SecAgg
// and SecAgg+) and a line in make_member() (silo_agent/secure/member.cpp).
//
// Network thread, except mask(), which the worker runs while the session holds every step back.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "common/result.h"
#include "crypto/certs.h"
#include "crypto/secagg.h"
#include "crypto/sources.h"
#include "proto/status.h"
#include "proto/xsilo.pb.h"
#include "protocol/masked.h"

namespace xsilo::agent::secure {

// What an answer releases: steps after which a fault hook may kill the process (tests, `xsilo sim`
// faults), and UnmaskShares, the shares that let the server remove this silo's masks from its
// group's sum (under distributed DP the session logs their release durably before they leave).
enum class Sent { Nothing, Keys, Shares, UnmaskShares, Other };

struct Answer {
  std::optional<wire::SecureAggregation> step;  // what goes back upstream, if anything
  Sent sent = Sent::Nothing;
};

// A step the member cannot take: which step, and why (said upstream and in the silo's log).
struct Refusal {
  std::string step;  // "key list", "share delivery", ...
  std::string why;
};

struct MemberContext {
  std::string federation;
  std::uint64_t round = 0;
  std::string me;
  crypto::CertSigner signer;
  crypto::CertVerifier ca;
  std::string server_name;  // the setup's signer, already checked
  crypto::secagg::Floor floor;
  crypto::Sources sources;  // the member's randomness (masks, keys), from the session's
  std::size_t max_message_bytes = std::size_t{4} << 20;  // the transport's frame limit
};

// The name of a step ("secagg_keys"), for refusals.
std::string step_name(const wire::SecureAggregation& step);

class Member {
 public:
  virtual ~Member() = default;
  // The first step (the member's keys), or why this silo refuses the group (a setup below its
  // floor, parameters that are unusable).
  virtual proto::Result<wire::SecureAggregation> start() = 0;
  // A step from the server: the answer (perhaps none), or the refusal after which this silo
  // takes no further part in the group.
  virtual std::variant<Answer, Refusal> receive(const wire::SecureAggregation& step) = 0;
  // Settled into its group's sum: mask() may run.
  virtual bool ready() const = 0;
  // Worker: adds the masks to the encoded input in place; success or why not.
  virtual Status mask(protocol::MaskedVector& words) = 0;
  // One line for the silo's log about the group it joined.
  virtual std::string describe() const = 0;
};

// The member the setup's protocol calls for; null for a protocol this agent does not speak.
std::unique_ptr<Member> make_member(const wire::SecAggSetup& setup, MemberContext ctx);

}  // namespace xsilo::agent::secure
