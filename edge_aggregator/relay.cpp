#include "edge_aggregator/relay.h"

#include "crypto/hash.h"
#include "protocol/compression.h"
#include "protocol/signed_update.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include <cmath>

#include "proto/frame.h"

namespace xsilo::edge {

namespace {
constexpr std::uint64_t kBarrier = 1ull << 63;  // job ids with this bit only drain the worker queue
}  // namespace

Relay::Relay(RelayConfig cfg) : cfg_(std::move(cfg)) {}

wire::Envelope Relay::env() const {
  wire::Envelope e;
  e.set_federation(cfg_.federation);
  e.set_round(round());
  return e;
}

// ---- upstream: the server -------------------------------------------------------------------

void Relay::on_server_up() {
  nonce_.clear();  // proofs answer one server connection's challenge
  proofs_.clear();
  proof_sent_.clear();
  announced_.clear();
  send_region_status();
}

void Relay::on_server_down() {
  if (region_) last_round_ = region_->round;
  region_.reset();  // the round (if any) is void without the server
}

void Relay::send_region_status() {
  auto e = env();
  auto* status = e.mutable_region_status();  // set even when the region is empty
  for (const auto& name : connected_) {
    auto proof = proofs_.find(name);
    if (proof == proofs_.end() && !announced_.count(name)) continue;  // not signed yet: not ours to announce
    status->add_silos(name);
    announced_.insert(name);
    if (proof != proofs_.end() && proof_sent_.insert(name).second) *status->add_proofs() = proof->second;
  }
  status->set_model_sha256(model_sha_);
  to_server(std::move(e));
  // A silo's witnessed audit head goes up once the server knows the silo is behind this edge.
  for (auto it = witnesses_.begin(); it != witnesses_.end();) {
    if (proof_sent_.count(it->first)) {
      to_server(std::move(it->second));
      it = witnesses_.erase(it);
    } else {
      ++it;
    }
  }
}

void Relay::on_server_message(const wire::Envelope& e) {
  using B = wire::Envelope::BodyCase;
  const bool this_round = region_ && e.round() == region_->round;
  switch (e.body_case()) {
    case B::kRoundStart: start_round(e); break;
    case B::kJoinChallenge:
      nonce_ = e.join_challenge().nonce();
      proofs_.clear();
      proof_sent_.clear();
      for (const auto& silo : connected_) to_silo(silo, e);
      break;
    case B::kSecure:
      // Carried down unread. A step that admits the silo to its group's sum lets it upload
      // through this edge (the server's word: the edge only guards its region's sum).
      if (this_round && !e.silo().empty() && e.secure().admits_upload()) region_->settled.insert(e.silo());
      if (!e.silo().empty()) to_silo(e.silo(), e);
      break;
    case B::kLeaving:
      if (!e.silo().empty()) to_silo(e.silo(), e);  // the edge only carries them
      break;
    case B::kModelRequest: model_request(e); break;
    case B::kTensorChunk:
      if (this_round) pass_model_chunk(e);
      break;
    case B::kUploadGrant:
      if (this_round) upload_grant();
      break;
    case B::kRoundEnd:
      // The server ended this silo's round (dropped, surplus or done): stop waiting for it.
      if (!e.silo().empty() && this_round) silo_gone(e.silo());
      [[fallthrough]];
    case B::kError: server_report(e); break;
    case B::kFinished:
      spdlog::info("the federation finished: {}", e.finished().reason());
      for (const auto& name : connected_) to_silo(name, e);
      finished_ = true;
      break;
    default: spdlog::warn("unexpected {} from the server", proto::body_name(e));
  }
}

// A restarted server asks one silo for its last committed model, before its first round:
// the silo's answer (its chunks, then a ModelOffer) is carried up as it is, outside any
// upload slot. Never while a round runs on this connection: a server that asked then
// would get the silo's own update, which only the region's sum may carry up; nor while the
// silo still streams an upload it was granted before the server went.
void Relay::model_request(const wire::Envelope& e) {
  if (e.silo().empty() || !connected_.count(e.silo())) return;
  if (region_ || uploading_.count(e.silo())) {
    wire::Envelope none = e;
    none.clear_model_request();
    none.mutable_model_offer()->set_model_sha256(e.model_request().model_sha256());
    none.mutable_model_offer()->set_held(false);
    to_server(std::move(none));
    return;
  }
  model_asked_.insert(e.silo());
  to_silo(e.silo(), e);
}

// The model passes through: each chunk goes on to the selected silos as it arrives.
void Relay::pass_model_chunk(const wire::Envelope& e) {
  if (region_->broadcast) {
    model_chunk(e);
    return;
  }
  action::ToSilos out;
  for (const auto& [name, state] : region_->silos) {
    if (state != SiloState::Gone && connected_.count(name)) out.silos.push_back(name);
  }
  if (out.silos.empty()) return;
  out.env = e;
  out.env.clear_silo();
  actions_.push_back(std::move(out));
}

void Relay::upload_grant() {
  if (region_->sent) {
    send_next_sum();  // one grant per secure group's partial sum
    return;
  }
  region_->granted = true;
  pump();
}

// A RoundEnd or an Error for one silo goes down to it; an error for the edge itself is logged.
void Relay::server_report(const wire::Envelope& e) {
  if (!e.silo().empty()) {
    to_silo(e.silo(), e);
  } else if (e.has_error()) {
    spdlog::warn("server reports: {}", e.error().message());
  }
}

// One RoundStart per selected silo (each with its own secure group, if any); the first of a new
// round sets the region up.
void Relay::start_round(const wire::Envelope& e) {
  model_asked_.clear();  // a round began: a ModelRequest left unanswered is void
  const auto& rs = e.round_start();
  // Nothing is allocated from a layout before it is checked: a server that sent an impossible
  // one gets an error, and the edge goes on.
  // The error names the silo whose start it was, so that the server drops it from the round at
  // once rather than at a deadline.
  auto refuse = [&](const std::string& why) {
    spdlog::error("round {}: refusing the start for {}: {}", rs.round(), proto::printable(e.silo(), 64), why);
    auto err = env();
    err.set_round(rs.round());
    err.set_silo(e.silo());
    err.mutable_error()->set_code(wire::BAD_UPDATE);
    err.mutable_error()->set_message("edge: " + why);
    to_server(std::move(err));
  };
  if (const auto st = protocol::check_layout(rs, cfg_.max_model_elements); !st) {
    refuse("model layout: " + st.error().message());
    return;
  }
  if (!region_ || rs.round() != region_->round) {
    region_ = std::make_unique<Region>();
    region_->round = rs.round();
    Model layout;
    for (const auto& t : rs.tensors()) layout.add(t.name(), {t.shape().begin(), t.shape().end()});
    region_->layout = layout.tensors();
    region_->broadcast = protocol::compressed(rs.broadcast());
    if (region_->broadcast) {
      const bool have_base = !model_sha_.empty() && model_sha_ == rs.base_sha256() && model_ &&
                             model_->same_layout(layout);
      if (!have_base && (!model_ || !model_->same_layout(layout))) model_ = std::make_shared<Model>(layout.zeros_like());
      model_sha_.clear();
      region_->model_rx.reset_model(model_->flat(), model_->tensors(), rs.broadcast(), have_base, /*hash=*/true);
      region_->model_sha256 = rs.model_sha256();
    } else {
      model_.reset();  // nothing to keep a copy for
      model_sha_.clear();
    }
    region_->secure = rs.has_secagg();
    if (region_->secure) {
      region_->current_words = std::make_shared<protocol::MaskedVector>(protocol::MaskedVector::for_setup(rs.secagg()));
    } else {
      region_->current = std::make_shared<Model>(layout.zeros_like());
      region_->scheme = rs.compression();  // silos' uploads are decoded here; the region's sum goes up dense
      region_->sum = std::make_shared<Model>(std::move(layout));
    }
    spdlog::info("round {} starts", region_->round);
  } else if (region_->secure != rs.has_secagg() ||
             (region_->secure && !region_->current_words->same_words(rs.secagg()))) {
    // The region's sum is kept in the first start's words; a later start of the round in other
    // words (another ring, length or packed width) would have its silo's upload read wrongly.
    refuse("its secure words (ring, length, packed width) are not those of the round's first start");
    return;
  }
  const std::string silo = e.silo();
  if (region_->broadcast) {
    const auto held = silo_held_.find(silo);
    if (held != silo_held_.end() && !rs.base_sha256().empty() && held->second == rs.base_sha256()) {
      region_->delta_ok.insert(silo);
    }
    silo_held_.erase(silo);  // its model is replaced now
  }
  if (rs.has_secagg()) region_->group_of[silo] = rs.secagg().group();
  if (!connected_.count(silo)) {
    region_->silos[silo] = SiloState::Gone;
    return;
  }
  region_->silos[silo] = SiloState::Training;
  to_silo(silo, e);
}

// A chunk of a compressed broadcast: into the edge's copy of the model, then on to the selected
// silos: the server's chunk as it is where it applies (values, or a delta for a silo that holds
// the base), the chunk's new values for the others. The copy, once complete and matching the
// round's SHA-256, is the base this edge asks the next delta for.
void Relay::model_chunk(const wire::Envelope& e) {
  Region& r = *region_;
  const auto& chunk = e.tensor_chunk();
  if (r.model_failed) {
    // The edge's copy is lost for this round; the silos that hold the base check the server's
    // chunks themselves.
    action::ToSilos as_sent;
    for (const auto& name : r.delta_ok) {
      if (r.silos[name] != SiloState::Gone && connected_.count(name)) as_sent.silos.push_back(name);
    }
    if (as_sent.silos.empty()) return;
    as_sent.env = e;
    as_sent.env.clear_silo();
    actions_.push_back(std::move(as_sent));
    return;
  }
  if (auto st = r.model_rx.add(chunk); !st) {
    r.model_failed = true;
    spdlog::error("round {}: bad model chunk: {}", r.round, st.error().message());
    // Every selected silo that needs the edge's copy is out of the round now, and says so at
    // once (the server would otherwise wait for it until the training deadline).
    for (auto& [name, state] : r.silos) {
      if (state == SiloState::Gone || state == SiloState::Done || r.delta_ok.count(name)) continue;
      auto err = env();
      err.set_round(r.round);
      err.set_silo(name);
      err.mutable_error()->set_code(wire::BAD_UPDATE);
      err.mutable_error()->set_message("edge: the round's model could not be rebuilt here: " + st.error().message());
      to_server(err);
      silo_error(name, wire::BAD_UPDATE, err.error().message());
      state = SiloState::Gone;
    }
    pump();
    r.model_failed = true;
    model_chunk(e);  // on to the silos that hold the base, as it is
    return;
  }
  action::ToSilos as_sent, as_values;
  for (const auto& [name, state] : r.silos) {
    if (state == SiloState::Gone || !connected_.count(name)) continue;
    const bool delta = chunk.encoding() != wire::Compression::NONE;
    (delta && !r.delta_ok.count(name) ? as_values : as_sent).silos.push_back(name);
  }
  if (!as_sent.silos.empty()) {
    as_sent.env = e;
    as_sent.env.clear_silo();
    actions_.push_back(std::move(as_sent));
  }
  if (!as_values.silos.empty()) {
    as_values.env = e;
    as_values.env.clear_silo();
    auto* c = as_values.env.mutable_tensor_chunk();
    c->set_encoding(wire::Compression::NONE);
    c->clear_count();
    const float* v = model_->flat().data() + r.model_rx.last_first();
    c->set_data(std::string(reinterpret_cast<const char*>(v), r.model_rx.last_count() * sizeof(float)));
    actions_.push_back(std::move(as_values));
  }
  if (!r.model_rx.complete()) return;
  const std::string sha = r.model_rx.finish_sha256();
  if (sha != r.model_sha256) {
    spdlog::warn("round {}: the model received does not match the round's SHA-256; keeping no base", r.round);
    return;
  }
  model_sha_ = sha;
  send_region_status();  // the server may send the next model as a delta
}

// ---- downstream: the region's silos ---------------------------------------------------------

void Relay::to_silo(const std::string& silo, wire::Envelope e) {
  if (!connected_.count(silo)) return;
  e.clear_silo();
  actions_.push_back(action::ToSilo{silo, std::move(e)});
}

void Relay::silo_error(const std::string& silo, wire::ErrorCode code, const std::string& msg) {
  auto e = env();
  e.mutable_error()->set_code(code);
  e.mutable_error()->set_message(msg);
  to_silo(silo, std::move(e));
}

void Relay::on_silo_up(const std::string& silo) {
  connected_.insert(silo);
  if (finished_) {
    auto e = env();
    e.mutable_finished()->set_reason("the federation has finished");
    to_silo(silo, std::move(e));
    return;
  }
  spdlog::info("silo {} connected ({} in the region)", silo, connected_.size());
  if (!nonce_.empty()) {
    auto e = env();
    e.mutable_join_challenge()->set_nonce(nonce_);
    to_silo(silo, std::move(e));
  }
}

void Relay::on_silo_down(const std::string& silo) {
  if (!connected_.erase(silo)) return;
  model_asked_.erase(silo);
  uploading_.erase(silo);
  silo_held_.erase(silo);
  proofs_.erase(silo);
  proof_sent_.erase(silo);
  witnesses_.erase(silo);
  announced_.erase(silo);
  silo_gone(silo);
  spdlog::info("silo {} left ({} in the region)", silo, connected_.size());
  send_region_status();
}

// The asked silo's copy of the model, checked by the server against its audit log.
void Relay::relay_model(const std::string& silo, const wire::Envelope& e) {
  wire::Envelope relay = e;
  relay.set_silo(silo);
  to_server(std::move(relay));
}

void Relay::on_silo_message(const std::string& silo, const wire::Envelope& e) {
  on_silo_message(silo, e, proto::bytes_of(e.tensor_chunk().data()));
}

void Relay::on_silo_message(const std::string& silo, const proto::Message& m) {
  on_silo_message(silo, m.env, m.chunk_data());
}

void Relay::on_silo_message(const std::string& silo, const wire::Envelope& e, ChunkData data) {
  using B = wire::Envelope::BodyCase;
  switch (e.body_case()) {
    case B::kJoinProof: join_proof(silo, e); break;
    case B::kModelOffer:
      if (!model_asked_.erase(silo)) {
        silo_error(silo, wire::UNEXPECTED, "ModelOffer, but the server asked this silo for no model");
        break;
      }
      relay_model(silo, e);
      break;
    case B::kWitness: witness(silo, e); break;
    case B::kSecure:
    case B::kLeaving: {
      wire::Envelope relay = e;  // signed or sealed protocol steps, and Leaving, pass through unread
      relay.set_silo(silo);
      to_server(std::move(relay));
      break;
    }
    case B::kUpdateReady: update_ready(silo, e); break;
    case B::kTensorChunk: upload_chunk(silo, e, data); break;
    case B::kUpdateEnd: update_end(silo, e); break;
    case B::kError: silo_report(silo, e); break;
    default: silo_error(silo, wire::UNEXPECTED, "a silo may not send " + proto::body_name(e));
  }
}

Relay::SiloState* Relay::in_round(const std::string& silo, std::uint64_t round) {
  Region* r = region_.get();
  if (!r || round != r->round || r->sent) return nullptr;
  const auto st = r->silos.find(silo);
  return st == r->silos.end() ? nullptr : &st->second;
}

void Relay::join_proof(const std::string& silo, const wire::Envelope& e) {
  // The server checks the signature; the edge only keeps answers to its current challenge
  // from the silo that connected under that name.
  if (e.join_proof().silo() != silo || nonce_.empty() || e.join_proof().nonce() != nonce_) {
    silo_error(silo, wire::NOT_ALLOWED, "a join proof must answer this edge's current challenge in your own name");
    return;
  }
  proofs_[silo] = e.join_proof();
  proof_sent_.erase(silo);
  spdlog::info("silo {} signed its join ({} in the region)", silo, proofs_.size());
  send_region_status();
}

void Relay::witness(const std::string& silo, const wire::Envelope& e) {
  // Passed up unread (the server checks the audit key's signature), after the silo's join.
  wire::Envelope relay = e;
  relay.set_silo(silo);
  if (proof_sent_.count(silo)) {
    to_server(std::move(relay));
  } else {
    witnesses_[silo] = std::move(relay);
  }
}

void Relay::update_ready(const std::string& silo, const wire::Envelope& e) {
  SiloState* state = in_round(silo, e.round());
  if (!state || *state != SiloState::Training) {
    silo_error(silo, wire::WRONG_ROUND, "UpdateReady not expected for round " + std::to_string(e.round()));
    return;
  }
  Region* r = region_.get();
  if (r->secure && !r->settled.count(silo)) {
    silo_error(silo, wire::UNEXPECTED, "UpdateReady before the server settled this silo into its secure group");
    return;
  }
  *state = SiloState::Ready;
  if (!e.update_ready().model_sha256().empty()) silo_held_[silo] = e.update_ready().model_sha256();
  wire::Contributor c;
  c.set_silo(silo);
  c.set_num_samples(e.update_ready().num_samples());
  r->contributors[silo] = c;  // counts only once it is Done
  wire::Envelope relay = e;
  relay.set_silo(silo);
  to_server(std::move(relay));  // the server tracks every silo's readiness and metrics
  r->slot.enqueue(silo);
  pump();
}

void Relay::upload_chunk(const std::string& silo, const wire::Envelope& e, ChunkData data) {
  // A silo granted an upload sends that upload's chunks until its UpdateEnd, whatever
  // happened to the round (the server may have gone meanwhile): never relayed as a model.
  if (model_asked_.count(silo) && !uploading_.count(silo)) {
    if (e.tensor_chunk().data().size() == data.size()) return relay_model(silo, e);
    wire::Envelope whole = e;  // read as a view: the data goes back into the message passed up
    whole.mutable_tensor_chunk()->set_data(data.data(), data.size());
    return relay_model(silo, whole);
  }
  SiloState* state = in_round(silo, e.round());
  Region* r = region_.get();
  if (!state || !r->slot.held_by(silo) || r->slot.complete() || r->folding) {
    silo_error(silo, wire::UNEXPECTED, "TensorChunk without an UploadGrant");
    return;
  }
  auto check = r->slot.add(e.tensor_chunk(), data);
  if (!check) {
    silo_error(silo, check.error().code(), check.error().message());
    *state = SiloState::Gone;
    silo_gone(silo);
    return;
  }
  to_worker(std::move(*check));
}

void Relay::update_end(const std::string& silo, const wire::Envelope& e) {
  uploading_.erase(silo);  // whatever comes from it next is not this upload
  SiloState* state = in_round(silo, e.round());
  Region* r = region_.get();
  if (!state || !r->slot.held_by(silo) || r->slot.complete() || r->folding) {
    silo_error(silo, wire::UNEXPECTED, "UpdateEnd without an UploadGrant");
    return;
  }
  const double w = e.update_end().weight();
  const Status ended = [&]() -> Status {
    if (auto whole = r->slot.end("update"); !whole) return whole;
    if (!r->secure && (!std::isfinite(w) || w <= 0)) return Error("update weight must be a positive number");
    if (e.update_end().update_sha256().empty()) return Error("UpdateEnd declares no SHA-256 of the update");
    return {};
  }();
  if (!ended) {
    silo_error(silo, wire::BAD_UPDATE, ended.error().message());
    *state = SiloState::Gone;
    silo_gone(silo);
    return;
  }
  // The silo's own signed word on its upload, as it said it (the server checks it).
  auto& c = r->contributors[silo];
  c.set_weight(r->secure ? 0.0 : w);
  if (!e.update_end().silo_signature().empty()) c.set_num_samples(e.update_end().num_samples());  // as signed
  protocol::copy_signed_word(e.update_end(), c);
  r->folding = true;
  const std::uint64_t id = r->job = ++job_id_;
  // On the worker, after the chunks' checks: the bytes must be what the silo declared (and,
  // plain, finite) before they touch the sum.
  auto checked = [check = r->slot.check(), declared = e.update_end().update_sha256()]() -> Status {
    const auto verdict = protocol::verify_upload(*check, declared, "update");  // the server's own check
    if (verdict.problem != protocol::UploadVerdict::Problem::None) return Error(verdict.why);
    return {};
  };
  if (r->secure) {
    auto& sum = r->group_sums[r->group_of[silo]];
    if (!sum) sum = std::make_shared<protocol::MaskedVector>(r->current_words->zeros_like());
    // Masked words of one group add up mod 2^bits (or mod p); the edge never sees anything else.
    to_worker(id, [sum, cur = r->current_words, checked]() -> Status {
      if (auto st = checked(); !st) return st;
      sum->add(*cur);
      return {};
    });
  } else {
    to_worker(id, [sum = r->sum, cur = r->current, checked]() -> Status {
      if (auto st = checked(); !st) return st;
      const auto c = cur->flat();
      auto acc = sum->flat();
      for (std::size_t i = 0; i < c.size(); ++i) acc[i] += c[i];
      return {};
    });
  }
}

void Relay::silo_report(const std::string& silo, const wire::Envelope& e) {
  spdlog::warn("silo {} reports: {}", silo, e.error().message());
  if (in_round(silo, e.round()) && e.error().code() == wire::TRAINING_FAILED) {
    // Its trainer failed: the server drops it from the round, the region stops waiting.
    wire::Envelope relay = e;
    relay.set_silo(silo);
    to_server(std::move(relay));
    silo_gone(silo);
  }
}

void Relay::on_job_done(std::uint64_t id, const Status& folded) {
  Region* r = region_.get();
  if (!r || !r->folding || id != r->job) return;  // a job of a round that is gone
  r->folding = false;
  if (id & kBarrier) return pump();  // the abandoned upload's checks have drained
  const std::string silo = *r->slot.holder();
  r->slot.release();
  if (!folded) {
    silo_error(silo, wire::BAD_UPDATE, folded.error().message());
    r->silos[silo] = SiloState::Gone;
  } else {
    r->silos[silo] = SiloState::Done;
  }
  pump();
}

void Relay::to_worker(std::uint64_t id, std::function<Status()> work) {
  actions_.push_back(action::Job{id, [worker = worker_, work = std::move(work)] {
                                   worker->check("the edge's worker job");
                                   return work();
                                 }});
}

void Relay::to_worker(std::function<void()> work) {
  actions_.push_back(action::Background{[worker = worker_, work = std::move(work)] {
    worker->check("the edge's chunk check");
    work();
  }});
}

void Relay::silo_gone(const std::string& silo) {
  Region* r = region_.get();
  if (!r) return;
  auto st = r->silos.find(silo);
  if (st == r->silos.end()) return;
  if (r->slot.held_by(silo) && !r->folding) {
    // Abandon its upload; its chunk checks may still be queued on the worker, so let them
    // drain before the next upload reuses the buffer.
    r->slot.release();
    r->folding = true;
    r->job = kBarrier | ++job_id_;
    to_worker(r->job, [] { return Status(); });
  }
  if (st->second != SiloState::Done) st->second = SiloState::Gone;
  pump();
}

protocol::UploadBuffer Relay::buffer() {
  Region& r = *region_;
  if (r.secure) {
    return {.bytes = r.current_words->bytes(),
            .dtype = r.current_words->dtype(),
            .layout = {{"masked", {r.current_words->words()}, 0}},
            .hash = true,
            .keep = r.current_words,
            .scheme = {},
            .sink = nullptr,
            .packed_bits = r.current_words->wire_bits()};
  }
  return {.bytes = {reinterpret_cast<std::uint8_t*>(r.current->flat().data()), r.current->bytes()},
          .dtype = wire::F32,
          .layout = r.layout,
          .hash = true,
          .keep = r.current,
          .scheme = r.scheme,
          .sink = nullptr};
}

// Grants the next silo's upload, or finishes the region when nothing is left to wait for.
void Relay::pump() {
  Region* r = region_.get();
  if (!r || r->sent || r->folding) return;
  if (!r->granted && !r->slot.busy()) {
    auto ready = [&](const std::string& s) { return r->silos[s] == SiloState::Ready; };
    if (auto next = r->slot.next(ready)) {
      r->silos[*next] = SiloState::Uploading;
      r->slot.open(*next, buffer());
      uploading_.insert(*next);
      auto g = env();
      g.mutable_upload_grant();
      to_silo(*next, std::move(g));
      return;
    }
  }
  bool waiting = false;
  for (const auto& [name, state] : r->silos) {
    waiting = waiting || state == SiloState::Training || state == SiloState::Ready || state == SiloState::Uploading;
  }
  if (!r->granted) {
    if (!waiting && !r->announced) {
      // Every selected silo is done or gone: ask the server for the upload slot.
      r->announced = true;
      auto e = env();
      std::uint64_t n = 0;
      for (const auto& [name, c] : r->contributors) n += r->silos[name] == SiloState::Done ? c.num_samples() : 0;
      e.mutable_update_ready()->set_num_samples(n);
      to_server(std::move(e));
    }
    return;
  }
  // Granted (or forced at the server's deadline): send the sum of what arrived.
  r->sent = true;
  if (r->slot.busy()) {
    silo_error(*r->slot.holder(), wire::UNEXPECTED, "the region's upload closed before yours arrived");
    r->slot.release();
  }
  std::vector<wire::Contributor> done;
  for (const auto& [name, c] : r->contributors) {
    if (r->silos[name] == SiloState::Done) done.push_back(c);
  }
  if (r->secure && !done.empty()) {
    // One partial sum per secure group, each in its own upload slot.
    for (const auto& [g, sum] : r->group_sums) r->unsent_groups.push_back(g);
    spdlog::info("round {}: masked partial sums of {} silos in {} groups to send", r->round, done.size(),
                 r->unsent_groups.size());
    send_next_sum();
    return;
  }
  double weight = 0;
  auto end = env();
  for (const auto& c : done) {
    weight += c.weight();
    *end.mutable_update_end()->add_contributors() = c;
  }
  end.mutable_update_end()->set_weight(weight);
  // A secure region with nothing to send has no plain sum (found by fuzzing): an empty end.
  if (r->sum) end.mutable_update_end()->set_update_sha256(crypto::sha256_hex(r->sum->flat()));
  if (!done.empty() && r->sum) {
    actions_.push_back(action::StreamToServer{std::make_shared<protocol::ChunkSource>(
        r->sum, r->sum->flat(), r->layout, cfg_.federation, r->round, cfg_.chunk_bytes)});
  }
  to_server(std::move(end));
  spdlog::info("round {}: partial sum of {} silos sent", r->round, done.size());
}

void Relay::send_next_sum() {
  Region* r = region_.get();
  if (!r || r->unsent_groups.empty()) return;
  const std::uint32_t g = r->unsent_groups.front();
  r->unsent_groups.pop_front();
  const auto& sum = r->group_sums[g];
  // The packed wire: the region's sum mod 2^wire_bits is what travels and what is hashed, as the
  // silos' words were (nothing changes without one).
  sum->reduce_to_wire();
  actions_.push_back(action::StreamToServer{std::make_shared<protocol::ChunkSource>(
      sum, sum->bytes(), sum->dtype(), std::vector<TensorInfo>{{"masked", {sum->words()}, 0}}, cfg_.federation,
      r->round, cfg_.chunk_bytes, sum->wire_bits())});
  auto end = env();
  auto* u = end.mutable_update_end();
  u->set_group(g);
  const auto bytes = sum->bytes();
  u->set_update_sha256(crypto::sha256_hex(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
  u->set_more(!r->unsent_groups.empty());
  std::size_t n = 0;
  for (const auto& [name, c] : r->contributors) {
    if (r->silos[name] == SiloState::Done && r->group_of[name] == g) {
      *u->add_contributors() = c;
      ++n;
    }
  }
  to_server(std::move(end));
  spdlog::info("round {}: masked partial sum of group {} ({} silos) sent", r->round, g, n);
}

}  // namespace xsilo::edge
