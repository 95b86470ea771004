// The session's secure-aggregation client (docs/protocol.md, "A securely aggregated round"),
// sans-I/O like the rest of the session core: it checks a round's signed setup against the
// silo's own trust (the federation CA, the pinned servers, the floor), makes the member the
// setup's protocol calls for (silo_agent/secure/member.h), hands it every step of the round's
// group, fills the masking job (masking_job.h) once the update and the share deliveries are
// here, and keeps the masked words for the upload. It sends nothing and logs nothing: each call
// returns what goes upstream or why the silo refuses, and the session sends, answers and logs.
//
//   start(setup) -> keys | refusal;  receive(step) -> answer [settled] | refusal;
//   masking_job(update) -> job (once);  masked(result) -> the masked words' hash | why not
//
// Network thread only; the masking job holds its own reference to the member while it runs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "common/result.h"
#include "crypto/certs.h"
#include "crypto/secagg.h"
#include "crypto/sources.h"
#include "proto/status.h"
#include "proto/xsilo.pb.h"
#include "protocol/masked.h"
#include "silo_agent/masking_job.h"
#include "silo_agent/secure/member.h"
#include "silo_agent/session_types.h"
#include "silo_agent/update.h"

namespace xsilo::agent {

// The parts of the session's configuration (session.h) that secure aggregation needs.
struct SecureClientConfig {
  std::string federation;
  std::optional<crypto::CertSigner> signer;  // the silo's key: without it, no secure round
  std::optional<crypto::CertVerifier> ca;    // the federation CA
  std::set<std::string> servers;             // pinned server names; empty: any the CA certifies
  crypto::secagg::Floor floor;               // the weakest setup the silo joins
  crypto::Sources sources = crypto::Sources::system();  // the member's keys and masks, the encoding's seed
  std::size_t max_message_bytes = std::size_t{4} << 20;  // the transport's frame limit
};

// A step of the group the member answered: what goes upstream, and whether the member has just
// settled into its group's sum (the masking may start once the update is here).
struct SecureReply {
  secure::Answer answer;
  bool settled = false;
};

class SecureClient {
 public:
  explicit SecureClient(SecureClientConfig cfg) : cfg_(std::move(cfg)) {}

  // A round starts: whatever group the last one had is dropped, masked words included.
  void reset();
  // The connection is gone: a member whose masking is in flight is dropped (its result never
  // reaches the sum); any other stays, to answer the server through its next route.
  void disconnected();

  // The round's signed setup: this silo's keys to send upstream at once, or why it refuses the
  // group (a wire error code and its sentence; then it takes no part in the round).
  proto::Result<wire::SecureAggregation> start(const wire::SecAggSetup& setup, std::uint64_t round,
                                               const std::string& me);
  // A step of the round's group (an Envelope whose body is `secure`): the answer, or the refusal
  // after which the silo takes no further part. A step that overtakes the masking is refused
  // here rather than handled beside the worker, which holds the member meanwhile.
  Result<SecureReply, secure::Refusal> receive(const wire::Envelope& e);

  // The masking job, when the member has settled, the update is here and nothing masks it yet;
  // the encoding's seed is drawn here. Nothing otherwise.
  std::optional<MaskingJob> masking_job(const std::optional<RoundOutput>& pending, FaultHook& hook);
  // The masking job's result: the masked words are kept for the upload; their SHA-256, or why
  // the update could not be masked.
  Result<std::string> masked(MaskDone r);

  // In a secure group this round (start() succeeded, not dropped since).
  bool active() const { return member_ != nullptr; }
  bool masking() const { return masking_; }
  // The masked update, once masked() succeeded (null before).
  const std::shared_ptr<protocol::MaskedVector>& words() const { return words_; }
  // The group's session string (protocol/secagg_wire.h) for the fault hook; "" when not active.
  // Distributed DP: the SHA-256 of the Skellam part of the setup this silo accepted
  // (protocol::skellam_sha256), what the server's round record must name; "" without one.
  std::string skellam_sha256() const;
  std::string session_string() const;
  // One line for the silo's log about the group it joined.
  std::string describe() const { return member_ ? member_->describe() : std::string(); }

 private:
  // The server that signed a secure setup, checked, or why it may not run this silo's groups.
  Result<std::string> setup_signer(const wire::SecAggSetup& setup, std::uint64_t round) const;

  SecureClientConfig cfg_;
  std::uint64_t round_ = 0;
  std::shared_ptr<secure::Member> member_;
  std::optional<wire::SecAggSetup> setup_;
  std::string session_;  // the setup's (protocol::secure_session), made once when it is taken
  std::shared_ptr<protocol::MaskedVector> words_;
  bool settled_ = false, masking_ = false;
};

}  // namespace xsilo::agent
