// The session's secure-aggregation client (docs/protocol.md, "A securely aggregated round"): the
// signed setup checked against the silo's own floor, the SecAgg client's messages in and out, and
// the masking job (masking_job.h) queued once the update and the share deliveries are here.
#include "silo_agent/session.h"

#include <spdlog/spdlog.h>

#include "proto/frame.h"
#include "protocol/failure.h"
#include "protocol/secagg_wire.h"
#include "silo_agent/masking_job.h"
#include "silo_agent/secure/member.h"

namespace xsilo::agent {

Result<std::string> Session::setup_signer(const wire::SecAggSetup& setup) const {
  if (!cfg_.signer || !cfg_.ca) return Error("this agent has no certificate key to take part in secure aggregation");
  auto server = cfg_.ca->certified(setup.server_certificate(), "server");
  if (!server) return Error("the secure setup carries no valid server certificate: " + server.error().message());
  if (!cfg_.servers.empty() && !cfg_.servers.count(server->name)) {
    return Error("the secure setup is signed by server " + server->name + ", which is not one this agent trusts");
  }
  auto verdict = cfg_.ca->verify(setup.server_certificate(), server->name, "server",
                                 protocol::setup_statement(setup, cfg_.federation, round_), setup.server_signature());
  if (!verdict) return Error("the secure setup is not signed by the server (" + verdict.error().message() + ")");
  return server->name;
}

// Secure aggregation: the setup is checked, then keys go out at once, overlapping with training.
void Session::start_secure(const wire::SecAggSetup& setup) {
  const auto signer = setup_signer(setup);
  std::string why = signer ? "" : signer.error().message();
  if (!signer || signer->empty()) {  // a certificate that names no one signs nothing
    spdlog::error("round {}: refusing the secure group: {}", round_, why);
    reply_error(wire::NOT_ALLOWED, why);
    return;
  }
  std::shared_ptr<secure::Member> member = secure::make_member(
      setup, secure::MemberContext{.federation = cfg_.federation,
                                   .round = round_,
                                   .me = name_,
                                   .signer = *cfg_.signer,
                                   .ca = *cfg_.ca,
                                   .server_name = *signer,
                                   .floor = cfg_.floor,
                                   .sources = cfg_.sources,
                                   .max_message_bytes = cfg_.max_message_bytes});
  if (!member) {
    why = "the secure setup names protocol " + std::to_string(setup.protocol()) + ", which this agent does not speak";
    spdlog::error("round {}: refusing the secure group: {}", round_, why);
    reply_error(wire::NOT_ALLOWED, why);
    return;
  }
  auto keys = member->start();
  if (!keys) {
    // A setup below this silo's floor, or unusable: said to the server (and so recorded), and
    // in the silo's own log.
    spdlog::error("round {}: refusing the secure group: {}", round_, keys.error().message);
    reply_error(keys.error().code, keys.error().message);
    return;
  }
  setup_ = setup;
  secure_ = std::move(member);
  auto out = env();
  *out.mutable_secure() = std::move(*keys);
  send(std::move(out));
  spdlog::info("round {}: {}; keys advertised", round_, secure_->describe());
  silent_ = hook_.after_sent(SecureStep::KeysSent, round_);
}

// A secure-aggregation step failed here: say why upstream, and take no further part.
void Session::secure_failed(const std::string& step, const std::string& why) {
  spdlog::error("round {}: secure aggregation ({}): {}", round_, step, why);
  reply_error(wire::UNEXPECTED, why);
}

// A step of this round's secure group, for the member. While the masking job runs, the worker
// holds the member: a step that overtakes the masking (only a faulty or malicious upstream sends
// one; the server asks for nothing before the update is announced) is refused here rather than
// handled beside the worker.
void Session::on_secure(const wire::Envelope& e) {
  if (!secure_ || e.round() != round_) return;
  const std::string step = proto::body_name(e);
  if (masking_) return secure_failed(step, "the " + step + " arrived while this silo masks its update");
  auto r = secure_->receive(e.secure());
  if (auto* no = std::get_if<secure::Refusal>(&r)) return secure_failed(no->step, no->why);
  auto& answer = std::get<secure::Answer>(r);
  if (answer.step) {
    auto out = env();
    *out.mutable_secure() = std::move(*answer.step);
    send(std::move(out));
  }
  if (answer.sent == secure::Sent::Shares) silent_ = hook_.after_sent(SecureStep::SharesSent, round_);
  if (secure_->ready() && !settled_) {
    settled_ = true;
    mask_when_ready();
  }
}

// Masks the encoded update once both it and the share deliveries are here (on the worker: one
// PRG expansion per group member), then announces it.
void Session::mask_when_ready() {
  if (!secure_ || !settled_ || !pending_ || !pending_->update || masked_ || masking_) return;
  masking_ = true;
  MaskingJob m{.member = secure_,
               .setup = *setup_,
               .update = pending_->update,
               .weight = pending_->weight,
               .kept = pending_->kept,
               .hook = &hook_,
               .seed = draw_seed()};
  if (setup_->has_skellam()) cfg_.sources.random_bytes(m.noise_key);  // distributed DP's noise
  job([j = std::move(m)]() -> SessionJobResult { return j(); });
}

void Session::masked(MaskDone r) {
  masking_ = false;
  if (!r.error.empty()) {
    spdlog::error("round {}: masking failed: {}", round_, r.error);
    reply_failure(wire::UPDATE_NOT_ENCODABLE);
    return;
  }
  masked_ = std::move(r.words);
  pending_->sha256 = r.sha256;
  announce_ready();
  spdlog::info("round {}: update encoded and masked", round_);
}

}  // namespace xsilo::agent
