#include "silo_agent/session.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <ctime>
#include <set>

#include "common/safetensors.h"
#include "crypto/fixed_point.h"
#include "crypto/hash.h"
#include "proto/frame.h"
#include "protocol/audit_key.h"
#include "protocol/compression.h"
#include "protocol/failure.h"
#include "protocol/join.h"
#include "protocol/packed.h"
#include "protocol/privacy.h"
#include "protocol/round_start.h"
#include "protocol/secagg_wire.h"
#include "protocol/signed_update.h"
#include "silo_agent/silo_state.h"
#include "silo_agent/training_job.h"
#include "silo_agent/upload_source.h"

namespace xsilo::agent {

namespace {

// The time of a line in the silo's own logs, from the session's clock (crypto/sources.h).
std::string iso_time(std::int64_t unix_ms) {
  const auto t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

SecureClientConfig secure_config(const SessionConfig& cfg) {
  return SecureClientConfig{.federation = cfg.federation,
                            .signer = cfg.signer,
                            .ca = cfg.ca,
                            .servers = cfg.servers,
                            .floor = cfg.floor,
                            .sources = cfg.sources,
                            .max_message_bytes = cfg.max_message_bytes};
}

}  // namespace

Session::Session(SessionConfig cfg, Trainer& trainer, FaultHook& hook)
    : cfg_(std::move(cfg)), trainer_(trainer), hook_(hook), secure_(secure_config(cfg_)) {
  if (cfg_.witnessed) witnessed_key_ = cfg_.witnessed->public_key();
}

std::uint64_t Session::draw_seed() const {
  std::uint64_t seed = 0;
  cfg_.sources.random_bytes({reinterpret_cast<std::uint8_t*>(&seed), sizeof seed});
  return seed;
}

wire::Envelope Session::env() const {
  wire::Envelope e;
  e.set_federation(cfg_.federation);
  e.set_round(round_);
  return e;
}

void Session::reply_error(wire::ErrorCode code, const std::string& msg) {
  auto e = env();
  e.mutable_error()->set_code(code);
  e.mutable_error()->set_message(msg);
  send(std::move(e));
}

void Session::reply_failure(wire::FailureReason reason) {
  auto e = env();
  e.mutable_error()->set_code(wire::TRAINING_FAILED);
  e.mutable_error()->set_failure(reason);
  e.mutable_error()->set_message(std::string(protocol::failure_text(reason)));
  send(std::move(e));
}

void Session::send(wire::Envelope e) {
  hook_.outgoing(e, secure_.session_string());
  actions_.push_back(action::Send{std::move(e)});
}

void Session::job(std::function<SessionJobResult()> work) {
  const std::uint64_t id = ++job_id_;
  job_generation_[id] = generation_;
  actions_.push_back(action::Job{id, [worker = worker_, work = std::move(work)] {
                                   worker->check("the silo's worker job");
                                   return work();
                                 }});
}

void Session::on_connected(const std::string& identity, const std::string& upstream, const std::string& upstream_name,
                           const std::string& upstream_identity) {
  name_ = identity;
  upstream_ = upstream;
  upstream_name_ = upstream_name;
  upstream_identity_ = upstream_identity;
  connected_ = true;
  leave_requested_ = leave_granted_ = false;
  // The last head this silo witnessed: a server whose log does not hold it stops (docs/audit.md).
  if (cfg_.witnessed) {
    auto e = env();
    *e.mutable_witness() = *cfg_.witnessed;
    send(std::move(e));
  }
}

void Session::on_disconnected() {
  connected_ = false;
  leave_requested_ = leave_granted_ = false;
  ++generation_;  // whatever was in flight belongs to a connection that is gone
  *live_generation_ = generation_;
  pending_.reset();
  // A masking in flight is dropped with its member; otherwise the secure state stays: a member
  // whose masked input is in the sum still holds shares, and the server reaches it through its
  // new route to confirm and unmask.
  secure_.disconnected();
  in_round_ = training_ = false;
}

void Session::on_message(const wire::Envelope& e) {
  using B = wire::Envelope::BodyCase;
  if (silent_) return;
  switch (e.body_case()) {
    case B::kJoinChallenge: on_join_challenge(e); break;
    case B::kRoundStart: on_round_start(e); break;
    case B::kSecure: on_secure(e); break;
    case B::kTensorChunk: on_model_chunk(e); break;
    case B::kModelRequest: on_model_request(e); break;
    case B::kUploadGrant:
      if (!pending_ || (!pending_->update && !pending_->stream) || uploaded_ || e.round() != round_ || !in_round_) {
        reply_error(wire::UNEXPECTED, "UploadGrant but no update is ready for round " + std::to_string(e.round()));
        break;
      }
      upload();
      break;
    case B::kRoundEnd:
    {
      const std::string status = e.round_end().committed() ? "committed" : "not committed";
      const std::string& reason = e.round_end().reason();
      spdlog::info("round {} ended for this silo: {}{}", e.round(), status,
                   reason.empty() || reason == status ? "" : " (" + reason + ")");
    }
      if (e.round_end().has_audit_head() && e.round_end().audit_head().seq() > 0) witness(e);
      if (e.round() == round_) {
        ++generation_;
        *live_generation_ = generation_;
        in_round_ = false;
        if (pending_) spare_ = std::move(pending_->update);
        pending_.reset();
      }
      break;
    case B::kFinished:
      spdlog::info("the federation finished after {} rounds: {}", e.finished().rounds(), e.finished().reason());
      finished_ = true;
      actions_.push_back(action::Finished{});
      break;
    case B::kLeaving:
      if (!leave_requested_) {
        reply_error(wire::UNEXPECTED, "Leaving, but this silo did not ask to leave");
        break;
      }
      leave_granted_ = true;
      spdlog::info("{} selects this silo for no more rounds; leaving {}", upstream_identity_,
                   in_round_ ? "when round " + std::to_string(round_) + " ends" : "now");
      break;
    case B::kError: spdlog::warn("{} reports: {}", upstream_identity_, e.error().message()); break;
    default: reply_error(wire::UNEXPECTED, "a silo does not expect " + proto::body_name(e));
  }
}

void Session::request_leave() {
  if (!connected_ || leave_requested_ || finished_) return;
  leave_requested_ = true;
  auto e = env();
  e.mutable_leaving();
  send(std::move(e));
}

// An edge asks this silo to sign its join (protocol/join.h), for the edge named in the
// certificate of the connection it came on: a proof for one edge is worthless through another.
void Session::on_join_challenge(const wire::Envelope& e) {
  if (!cfg_.signer) {
    reply_error(wire::NOT_ALLOWED, "this silo has no certificate key to sign its join with");
    return;
  }
  if (e.join_challenge().nonce().size() < 16) {
    reply_error(wire::NOT_ALLOWED, "a join challenge needs a nonce of at least 16 bytes");
    return;
  }
  auto proof = env();
  *proof.mutable_join_proof() = protocol::sign_join(*cfg_.signer, cfg_.federation, upstream_name_, e.join_challenge().nonce());
  send(std::move(proof));
}


void Session::on_model_request(const wire::Envelope& e) {
  const std::string& want = e.model_request().model_sha256();
  // The receipt's held_sha() names a model the training job checked against its round's hash,
  // still held: the model the server itself sent, nothing of the silo's own. (Behind an edge, the silo may
  // still think a round runs when the server is gone; the edge relays the request only when no
  // upload of this silo is under way, so nothing of one follows the request up.)
  const auto& model = receipt_.model();
  const bool held = model && !want.empty() && receipt_.held_sha() == want;
  if (held) {
    actions_.push_back(action::SendStream{std::make_shared<protocol::ChunkSource>(
        model, model->flat(), model->tensors(), cfg_.federation, e.round(), cfg_.chunk_bytes), false});
  }
  auto offer = env();
  offer.set_round(e.round());
  offer.mutable_model_offer()->set_model_sha256(want);
  offer.mutable_model_offer()->set_held(held);
  send(std::move(offer));
  spdlog::warn("{} asks for the model of committed round {} ({}): {}", upstream_identity_, e.model_request().round(),
               proto::printable(want.substr(0, 12)), held ? "sending the copy this silo holds" : "this silo holds none");
}

// The server's signed audit head after a round: kept as a witness, so an auditor can hold the
// server's log against it (xsilo audit verify --witness), with the key it was checked under.
// A head the round's audit key did not sign (altered or made up on the way) is not kept.
void Session::witness(const wire::Envelope& e) {
  const auto& h = e.round_end().audit_head();
  const std::string key = e.round() == round_ && !round_audit_key_.empty() ? round_audit_key_ : witnessed_key_;
  nlohmann::json entry = {{"federation", cfg_.federation}, {"round", e.round()}, {"seq", h.seq()},
                          {"head", h.sha256()},           {"sig", h.signature()}, {"time", iso_time(cfg_.sources.unix_ms())}};
  if (!key.empty()) {
    if (!protocol::head_signed_by(h, key)) {
      spdlog::warn("round {}: the audit head {} is not signed by the server's audit key; not kept", e.round(), h.seq());
      return;
    }
    entry["key"] = crypto::to_hex(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(key.data()), key.size()));
    witnessed_key_ = key;
    wire::Witness w;
    *w.mutable_head() = h;
    w.set_public_key(key);
    cfg_.witnessed = std::move(w);
  }
  actions_.push_back(action::Record{.entry = std::move(entry), .log = "audit_heads.jsonl"});
}

// The checks a round start passes before this silo acts on it: a model layout it can hold, a
// server it trusts, no earlier round than the last, not the start it acted on already, and an
// audit key it can reach (then taken for the round). False: refused (answered, except a start
// seen before, which is ignored).
bool Session::accept_round_start(const wire::RoundStart& rs) {
  if (const auto st = protocol::check_layout(rs, cfg_.max_model_elements); !st) {
    const std::string& why = st.error().message();
    spdlog::error("round {}: refusing the round's model layout: {}", rs.round(), why);
    reply_error(wire::BAD_UPDATE, "model layout: " + why);
    return false;
  }
  if (cfg_.ca) {
    // The model, layout and plan come through whoever relays them: only a server of this
    // federation (one this agent pins, when it pins any) may start a round here.
    const auto server = protocol::round_start_signer(rs, *cfg_.ca, cfg_.federation);
    if (!server || server->empty() || (!cfg_.servers.empty() && !cfg_.servers.count(*server))) {
      const std::string why = server ? "the round start is signed by server " + *server + ", which is not one this agent trusts"
                                     : server.error().message();
      spdlog::error("round {}: refusing the round: {}", rs.round(), why);
      reply_error(wire::NOT_ALLOWED, why);
      return false;
    }
  }
  if (rs.round() < round_) {
    // A signed start of an earlier round, replayed: rounds only move forward (a restarted
    // server starts the same round again, never an older one).
    reply_error(wire::WRONG_ROUND, "round " + std::to_string(rs.round()) + " starts after round " +
                                       std::to_string(round_) + " did: refused");
    return false;
  }
  if (!rs.nonce().empty() && rs.nonce() == start_nonce_) {
    // The start this silo acted on, again (relayed twice): a server starts each round afresh.
    // Ignored without an answer, which the server would count against this silo.
    spdlog::warn("round {}: the same signed RoundStart again; ignored (each is acted on once)", rs.round());
    return false;
  }
  if (rs.has_audit_key()) {
    // The audit key this silo takes part under: the one it witnessed, or one its rotations lead to.
    std::string why;
    const std::string key = protocol::reach_audit_key(witnessed_key_, rs.audit_key(), why);
    if (key.empty()) {
      spdlog::error("round {}: refusing the round: {}", rs.round(), why);
      reply_error(wire::NOT_ALLOWED, "audit key: " + why);
      return false;
    }
    round_audit_key_ = key;
  }
  return true;
}

void Session::on_round_start(const wire::Envelope& e) {
  const auto& rs = e.round_start();
  if (!accept_round_start(rs)) return;
  start_nonce_ = rs.nonce();
  run_keys_.clear();
  own_keys_.clear();
  ++generation_;
  *live_generation_ = generation_;
  pending_.reset();
  uploaded_ = false;
  in_round_ = true;
  training_ = false;
  round_ = rs.round();
  if (leave_granted_) {
    // Selected after the upstream agreed to select this silo no more: the server that agreed
    // has restarted since and forgotten. Ask the one there now, and go when it answers.
    spdlog::info("round {}: selected after leave was granted (the server restarted?); asking again", round_);
    leave_granted_ = leave_requested_ = false;
    request_leave();
  }
  plan_ = rs.plan();
  compression_ = rs.compression();
  model_sha_ = rs.model_sha256();
  // Nothing of the model is kept when the trainer streams and the round needs nothing of it
  // after training.
  receipt_.prepare(rs, trainer_.streams() && !hook_.tampers() && !rs.has_secagg() &&
                           !protocol::compressed(compression_) && plan_.silo_momentum() <= 0);
  secure_.reset();
  if (rs.has_secagg()) {
    start_secure(rs.secagg());
    if (!secure_.active()) {
      // A secure round this silo cannot take part in securely: it takes no part at all (an
      // update trained here must never leave in the clear).
      in_round_ = false;
      return;
    }
  }
  if (!silent_ && receipt_.complete()) on_model();
}

void Session::on_model_chunk(const wire::Envelope& e) {
  if (!receipt_.open() || e.round() != round_ || !in_round_) {
    // The rest of a model already refused goes unanswered; any other chunk is out of place.
    if (e.round() != round_ || round_failed_ != round_) {
      reply_error(wire::WRONG_ROUND, "model chunk for a round that has not started here");
    }
    return;
  }
  if (receipt_.complete()) {
    // The model is here (and maybe training): a chunk past its end changes nothing of it.
    reply_error(wire::BAD_UPDATE, "model chunk after the whole model arrived");
    return;
  }
  if (auto st = receipt_.add(e.tensor_chunk()); !st) {
    spdlog::error("round {}: bad model chunk: {}", round_, st.error().message());
    reply_error(wire::BAD_UPDATE, st.error().message());
    receipt_.drop();
    in_round_ = false;  // the rest of this model is dropped without a word: one error says why
    round_failed_ = round_;
    return;
  }
  if (receipt_.complete()) on_model();
}

// The whole model has arrived: check it, evaluate and train on the worker.
void Session::on_model() {
  training_ = true;
  if (receipt_.streaming()) return on_streamed_model();
  spdlog::info("round {}: model received ({} parameters); training", round_, receipt_.model()->size());
  const TrainTask task{round_, name_, plan_};
  job([j = TrainingJob{.trainer = &trainer_,
                       .hook = &hook_,
                       .model = receipt_.model(),
                       .task = task,
                       .sha = model_sha_,
                       .spare = std::move(spare_),
                       .live = live_generation_,
                       .generation = generation_,
                       .momentum = momentum_,
                       .momentum_file = cfg_.momentum_file,
                       .compression = compression_,
                       .secure = secure_.active(),
                       .residual = residual_,
                       .residual_file = cfg_.residual_file,
                       .chunk_bytes = cfg_.chunk_bytes,
                       .seed = draw_seed()}]() mutable -> SessionJobResult { return j(); });
}

// A streamed round: the model was hashed as it came; the trainer makes its delta, and the
// upload's SHA-256 is taken as the delta is made (it is made again when it is sent).
void Session::on_streamed_model() {
  const std::string got = receipt_.finish_sha256();
  spdlog::info("round {}: model received and hashed, not kept ({} parameters); training", round_, receipt_.received());
  const TrainTask task{round_, name_, plan_};
  job([j = StreamedTrainingJob{.trainer = &trainer_,
                               .task = task,
                               .sha = model_sha_,
                               .received_sha = got,
                               .layout = receipt_.layout(),
                               .live = live_generation_,
                               .generation = generation_,
                               .chunk_elems = cfg_.chunk_bytes / sizeof(float)}]() mutable -> SessionJobResult {
    return j();
  });
}

void Session::trained(TrainDone r) {
  training_ = false;
  if (!r.error.empty()) {
    spdlog::error("round {}: {}", round_, r.error);  // the silo's own log: the whole story
    reply_failure(r.failure);  // the server: a code; it lets the round go on without this silo
    if (r.fatal) actions_.push_back(action::Fatal{r.error});
    return;
  }
  // The training job checked the model against the round's SHA-256 before it trained.
  receipt_.hold(model_sha_);
  pending_ = std::move(r.out);
  if (!plan_.train()) return;  // an evaluation-only round: the metrics went nowhere to upload
  if (secure_.active()) return mask_when_ready();
  announce_ready();
}

void Session::announce_ready() {
  auto e = env();
  auto* r = e.mutable_update_ready();
  r->set_num_samples(secure_.active() ? 1 : pending_->num_samples);  // secure: the real count is inside the masked sum
  *r->mutable_metrics() = pending_->metrics;
  r->set_model_sha256(receipt_.held_sha());
  if (!pending_->privacy.mechanism().empty()) *r->mutable_privacy() = pending_->privacy;
  send(std::move(e));
  spdlog::info("round {}: trained on {} samples (loss {:.4f}); update ready", round_, pending_->num_samples,
               pending_->metrics.train_loss());
}

void Session::upload() {
  const bool secure = secure_.active();
  if (secure && !secure_.words()) {
    reply_error(wire::UNEXPECTED, "the masked update is not ready");
    return;
  }
  auto src = upload_source(*pending_, secure ? secure_.words() : nullptr, cfg_.federation, round_, cfg_.chunk_bytes);
  // The silo's own record of what left the building (hashes, never data), durable before the
  // first byte leaves: every update the server counts is in it. With error feedback the residual
  // moves on with this line (silo_state.h), whether or not the upload arrives.
  action::Record sent{.entry = {{"time", iso_time(cfg_.sources.unix_ms())},
                                {"federation", cfg_.federation},
                                {"round", round_},
                                {"upstream", upstream_},
                                {"upstream_identity", upstream_identity_},
                                {"model_sha256", model_sha_},
                                {"update_sha256", pending_->sha256},
                                {"weight", pending_->weight},
                                {"num_samples", pending_->num_samples}}};
  // Distributed DP: the noise this silo was asked to add, as the hash the server's round record
  // must name (docs/privacy.md): the silo's side of the comparison.
  if (secure) {
    if (auto k = secure_.skellam_sha256(); !k.empty()) sent.entry["skellam_setup_sha256"] = std::move(k);
  }
  // Record-level privacy: what this upload spent, in the line that says it left. The silo's
  // budget is the sum of these lines (silo_agent/privacy_budget.h).
  if (!pending_->privacy.mechanism().empty()) {
    sent.entry["privacy"] = protocol::privacy_json(pending_->privacy);
    sent.required = true;
  }
  if (pending_->residual_next) {
    *residual_ = std::move(*pending_->residual_next);
    pending_->residual_next.reset();
    sent.entry["error_feedback_sha256"] = pending_->residual_sha256;
    if (!cfg_.residual_file.empty()) {
      sent.staged = staged_path(cfg_.residual_file);
      sent.onto = cfg_.residual_file;
    }
  }
  actions_.push_back(std::move(sent));
  actions_.push_back(action::SendStream{std::move(src)});
  uploaded_ = true;  // once per round, however many grants arrive
  auto e = env();
  auto* end = e.mutable_update_end();
  end->set_weight(secure ? 0.0 : pending_->weight);  // secure: inside the masked sum
  end->set_num_samples(secure ? 0 : pending_->num_samples);
  end->set_update_sha256(pending_->sha256);
  *end->mutable_metrics() = pending_->metrics;
  // Signed, so that an edge forwards the silo's own word on what it sent (signed_update.h).
  if (cfg_.signer) protocol::sign_update(*end, *cfg_.signer, cfg_.federation, round_);
  send(std::move(e));
  if (pending_->encoded) {
    spdlog::info("round {}: uploading {} bytes ({} of {} uncompressed)", round_, pending_->encoded_bytes,
                 protocol::describe(compression_), pending_->bytes());
  } else if (secure && secure_.words() && secure_.words()->wire_bits()) {
    const auto& w = *secure_.words();
    spdlog::info("round {}: uploading {} bytes ({} words packed {} bits each, {} bytes whole)", round_,
                 protocol::packed_bytes(w.words(), w.wire_bits()), w.words(), w.wire_bits(), w.bytes().size());
  } else {
    spdlog::info("round {}: uploading {} bytes{}", round_,
                 secure && secure_.words() ? secure_.words()->bytes().size() : pending_->bytes(),
                 pending_->stream ? ", made as they are sent" : "");
  }
}

// Secure aggregation: the setup is checked, then keys go out at once, overlapping with training.
void Session::start_secure(const wire::SecAggSetup& setup) {
  auto keys = secure_.start(setup, round_, name_);
  if (!keys) {
    // Not this silo's server, a setup below its floor, or unusable: said to the server (and so
    // recorded), and in the silo's own log.
    spdlog::error("round {}: refusing the secure group: {}", round_, keys.error().message());
    reply_error(keys.error().code(), keys.error().message());
    return;
  }
  own_keys_ = protocol::advertised_own_keys(*keys);
  auto out = env();
  *out.mutable_secure() = std::move(*keys);
  send(std::move(out));
  spdlog::info("round {}: {}; keys advertised", round_, secure_.describe());
  silent_ = hook_.after_sent(SecureStep::KeysSent, round_);
}

// A step of this round's secure group: the answer goes upstream; a refusal says why, and the
// silo takes no further part.
void Session::on_secure(const wire::Envelope& e) {
  if (!secure_.active() || e.round() != round_) return;
  // Distributed DP: the shares go only against the record that charges this run, checked before
  // the member sees the request (a request it answered is spent).
  const bool asks_shares = !secure_.skellam_sha256().empty() && protocol::asks_unmask_shares(e.secure());
  if (asks_shares) {
    if (const auto st = check_unmask_begun(e.secure()); !st) {
      spdlog::error("round {}: not releasing the unmask shares: {}", round_, st.error().message());
      reply_error(wire::NOT_ALLOWED, st.error().message());
      return;
    }
  }
  auto r = secure_.receive(e);
  if (!r) {
    spdlog::error("round {}: secure aggregation ({}): {}", round_, r.error().step, r.error().why);
    reply_error(wire::UNEXPECTED, r.error().why);
    return;
  }
  if (const auto st = take_run_keys(e.secure()); !st) {
    spdlog::error("round {}: secure aggregation: {}", round_, st.error().message());
    reply_error(wire::UNEXPECTED, st.error().message());
    secure_.reset();  // no further part in this run
    return;
  }
  if (asks_shares && r->answer.step && r->answer.sent == secure::Sent::UnmaskShares) record_unmask_release(e.secure());
  if (r->answer.step) {
    auto out = env();
    *out.mutable_secure() = std::move(*r->answer.step);
    send(std::move(out));
  }
  if (r->answer.sent == secure::Sent::Shares) silent_ = hook_.after_sent(SecureStep::SharesSent, round_);
  if (r->settled) mask_when_ready();
}

// Distributed DP: the shares about to leave let the server unmask this round's noisy group sum,
// so the run must be charged whatever the server says it unmasked ("sums_revealed" is its own
// count). The server shows the record that charges it: the signed audit head of the round's
// unmask_begun record and its line, which must name this run (check_unmask_begun), at a seq this
// silo never released at before (a second run of the round under one record would be a second
// noisy sum under one charge). The silo's word for it: a line of sent.jsonl naming that record,
// durable before the shares leave (a line that cannot be written stops the agent first), that
// `xsilo audit verify --sent` holds the log to (docs/privacy.md). Not an upload: no update_sha256,
// no spend of the silo's records.
namespace {

// The unmask_begun record `line` must be the one of `round` under `setup` and name this run:
// each member of `known` (the members' keys this silo saw in its key lists, its own included)
// with those keys, and every member once (a record naming two runs' keys of one silo would charge
// them once). Success, or why not.
Status names_this_run(const std::string& line, std::uint64_t round, const std::string& setup,
                      const std::map<std::string, std::string>& known) {
  nlohmann::json r;
  try {
    r = nlohmann::json::parse(line);
    if (r.value("event", "") != protocol::kUnmaskBegun || r.value("round", std::uint64_t{0}) != round) {
      return Error(fmt::format("the record the server shows is not the unmask_begun of round {}", round));
    }
    if (r.at("privacy").value("setup_sha256", "") != setup) {
      return Error("the unmask_begun record the server shows names another distributed-DP setup than this silo's");
    }
    const auto named = protocol::record_keys(r);
    if (!named) return Error("the unmask_begun record the server shows: " + named.error().message());
    for (const auto& [member, keys] : known) {
      const auto it = named->find(member);
      if (it == named->end() || it->second != keys) {
        return Error("the unmask_begun record the server shows does not name member " + member +
                     " with the keys of this run: it charges another run of the round");
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return Error(std::string("the unmask_begun record the server shows cannot be read: ") + e.what());
  }
  return {};
}

}  // namespace

Status Session::check_unmask_begun(const wire::SecureAggregation& step) const {
  const auto& head = step.unmask_begun();
  if (!step.has_unmask_begun() || head.seq() == 0) {
    return Error("the server asks for the unmask shares of a distributed-DP round without the signed audit head of "
                 "the record that charges it (unmask_begun)");
  }
  if (round_audit_key_.empty() || !protocol::head_signed_by(head, round_audit_key_)) {
    return Error(fmt::format("the audit head {} the server names as this round's unmask_begun record is not signed by "
                             "the round's audit key",
                             head.seq()));
  }
  if (crypto::sha256_hex(step.unmask_begun_record()) != head.sha256()) {
    return Error(fmt::format("the record the server shows with audit head {} does not hash to it", head.seq()));
  }
  if (!run_keys_.count(name_)) return Error("no key list of this run named this silo's keys, so no record can name its run");
  if (auto st = names_this_run(step.unmask_begun_record(), round_, secure_.skellam_sha256(), run_keys_); !st) return st;
  // One release per record: a seq released against before (under any hash: a forked log) is refused.
  const std::string seq_prefix = std::to_string(head.seq()) + ":";
  if (const auto it = cfg_.unmask_released.lower_bound(seq_prefix);
      it != cfg_.unmask_released.end() && it->rfind(seq_prefix, 0) == 0) {
    return Error(fmt::format("this silo released its unmask shares against audit record {} already: another run of "
                             "round {} needs a record (a charge) of its own",
                             head.seq(), round_));
  }
  return {};
}

// The members' keys of this run: from the first key list this silo's member accepted (it accepts
// one a run; a list it refused changes nothing), whose entry for this silo must be the keys it
// advertised. Success, or why the run is over for this silo.
Status Session::take_run_keys(const wire::SecureAggregation& accepted) {
  if (!run_keys_.empty()) return {};
  auto keys = protocol::advertised_keys(accepted);
  if (keys.empty()) return {};
  for (auto& [member, sha] : keys) run_keys_[member] = std::move(sha);
  if (const auto own = run_keys_.find(name_); own == run_keys_.end() || own->second != own_keys_) {
    return Error("the key list names this silo with other keys than those it advertised in this run");
  }
  return {};
}

void Session::record_unmask_release(const wire::SecureAggregation& step) {
  const auto& head = step.unmask_begun();
  cfg_.unmask_released.insert(std::to_string(head.seq()) + ":" + head.sha256());
  actions_.push_back(action::Record{.entry = {{"time", iso_time(cfg_.sources.unix_ms())},
                                              {"kind", protocol::kUnmaskSharesReleased},
                                              {"federation", cfg_.federation},
                                              {"round", round_},
                                              {"upstream", upstream_},
                                              {"skellam_setup_sha256", secure_.skellam_sha256()},
                                              {"unmask_begun_seq", head.seq()},
                                              {"unmask_begun_sha256", head.sha256()},
                                              {"silo", name_},
                                              {"keys_sha256", run_keys_.at(name_)}},
                                    .required = true});
}

// Masks the encoded update once both it and the share deliveries are here (on the worker: one
// PRG expansion per group member), then announces it.
void Session::mask_when_ready() {
  if (auto j = secure_.masking_job(pending_, hook_)) job([j = std::move(*j)]() -> SessionJobResult { return j(); });
}

void Session::masked(MaskDone r) {
  if (r.clipped_to > 0) {
    // The server counts these (secure.clipped in its round record) but never sees the norm.
    spdlog::info("round {}: the update's norm {:.4g} is above the secure setup's clip norm {:.4g}: scaled down to it",
                 round_, r.norm, r.clipped_to);
  }
  auto sha = secure_.masked(std::move(r));
  if (!sha) {
    spdlog::error("round {}: masking failed: {}", round_, sha.error().message());
    reply_failure(wire::UPDATE_NOT_ENCODABLE);
    return;
  }
  pending_->sha256 = std::move(*sha);
  announce_ready();
  spdlog::info("round {}: update encoded and masked", round_);
}

void Session::on_job_done(std::uint64_t id, SessionJobResult result) {
  auto it = job_generation_.find(id);
  if (it == job_generation_.end()) return;
  const bool current = it->second == generation_;
  job_generation_.erase(it);
  if (auto* t = std::get_if<TrainDone>(&result); t && t->fatal) actions_.push_back(action::Fatal{t->error});
  if (auto* t = std::get_if<TrainDone>(&result); t && !current && !t->error.empty()) {
    // The round ended for this silo before its training did (a hung trainer past the server's
    // deadline, say): what happened is still the silo's to know.
    spdlog::warn("a training that ended after its round had moved on: {}", t->error);
  }
  if (!current || silent_) return;  // the round or the connection moved on
  if (auto* t = std::get_if<TrainDone>(&result)) {
    if (!t->fatal) trained(std::move(*t));
  } else if (auto* m = std::get_if<MaskDone>(&result)) {
    masked(std::move(*m));
  }
}

}  // namespace xsilo::agent
