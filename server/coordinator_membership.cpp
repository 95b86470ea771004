// The coordinator's connections and messages: silos and edges coming and going, their routes,
// and the dispatch of every message to the step it belongs to.
#include "server/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "crypto/keys.h"
#include "proto/frame.h"
#include "protocol/audit_key.h"
#include "protocol/failure.h"
#include "protocol/join.h"
#include "protocol/privacy.h"
#include "server/coordinator_round.h"
#include "server/secure_round.h"

namespace xsilo::server {

// ---- connections ---------------------------------------------------------------------------

void Coordinator::on_connect(SessionId id, const std::string& silo, std::int64_t now_ms) {
  membership_.add_session(id, silo, false);
  silo_joined(silo, id, now_ms);
}

void Coordinator::on_edge_connect(SessionId id, const std::string& edge, std::int64_t now_ms) {
  // One live session per edge certificate: a newer one replaces the older (a restarted edge
  // whose old connection is not noticed gone yet), so one name cannot hold many.
  std::optional<SessionId> older;
  for (const auto& [other, peer] : membership_.sessions()) {
    if (other != id && peer.edge && peer.name == edge) older = other;
  }
  if (older) {
    actions_.push_back(action::Close{*older, wire::UNEXPECTED, "replaced by a newer connection"});
    on_disconnect(*older, now_ms);
  }
  if (buffered()) {
    // Buffered rounds take silos connected directly only (docs/buffered.md).
    actions_.push_back(action::Close{id, wire::NOT_ALLOWED, "this server runs buffered rounds, which take no edges"});
    return;
  }
  membership_.add_session(id, edge, true);
  spdlog::info("edge {} connected", edge);
  challenge_edge(id);  // the silos behind this session join by signing its nonce (protocol/join.h)
  if (phase_ == Phase::Finished) {
    auto e = env();
    e.mutable_finished()->set_reason("the federation has finished");
    e.mutable_finished()->set_rounds(rounds_run());
    send(id, std::move(e));
  }
}

void Coordinator::challenge_edge(SessionId edge) {
  std::string nonce(32, '\0');
  cfg_.sources.random_bytes({reinterpret_cast<std::uint8_t*>(nonce.data()), nonce.size()});
  membership_.set_join_nonce(edge, std::move(nonce));
  auto challenge = env();
  challenge.mutable_join_challenge()->set_nonce(membership_.peer(edge)->join_nonce);
  send(edge, std::move(challenge));
}

void Coordinator::silo_joined(const std::string& silo, SessionId link, std::int64_t now_ms) {
  if (auto old = membership_.route_of(silo); old && *old != link) {
    // The silo is back through another connection (it reconnected, or failed over to another
    // upstream) before the old one was noticed gone.
    if (!membership_.is_edge(*old)) {
      actions_.push_back(action::Close{*old, wire::UNEXPECTED, "replaced by a newer connection"});
      on_disconnect(*old, now_ms);
    } else {
      membership_.leave_region(*old, silo);
      membership_.unroute(silo, *old);
      challenge_edge(*old);  // its proof for this silo is void now
      silo_gone(silo, *old, "moved to another upstream", now_ms);
    }
  }
  membership_.route(silo, link);
  const Peer* via = membership_.peer(link);
  const bool via_edge = via && via->edge;
  if (auto m = member_named(silo);
      m && r_->members[*m].state == MemberState::Done && r_->members[*m].session == 0 && r_->secure) {
    // Its masked input is in the sum but the route that carried it is gone: it still holds
    // shares for the unmasking, so reach it through the new route (and ask again if it missed
    // the request). A member whose route is alive is never moved.
    auto& mb = r_->members[*m];
    mb.session = link;
    mb.relayed = via_edge;  // the record keeps the edge that carried its input
    if (phase_ == Phase::Unmasking) {
      r_->secure->silo_back(silo);
      // While its unmask_begun record is written nothing is asked yet: begin_unmask() asks it then.
      if (job_ != JobKind::BeginUnmask) {
        if (auto req = r_->secure->unmask_request(silo)) {
          with_unmask_begun(*req);
          send_to_member(*m, std::move(*req));
        }
      }
    }
  }
  spdlog::info("silo {} joined{} ({} connected)", silo, via_edge ? " via edge " + via->name : "",
               membership_.connected());
  if (phase_ == Phase::Finished) {
    if (!via_edge) {
      auto e = env();
      e.mutable_finished()->set_reason("the federation has finished");
      e.mutable_finished()->set_rounds(rounds_run());
      send(link, std::move(e));
    }
    return;
  }
  if (fetch_) return fetch_from(silo, link);
  if (buffered() && phase_ == Phase::Collecting && !via_edge) return join_buffered(silo, link, now_ms);
  try_start_round(now_ms);
}

// The route of `silo` through `link` is gone (the membership already forgot it).
void Coordinator::silo_gone(const std::string& silo, SessionId link, const std::string& why, std::int64_t now_ms) {
  spdlog::info("silo {} left: {} ({} connected)", silo, why, membership_.connected());
  if (fetch_) fetch_link_gone(link);
  if (!r_) return;
  if (r_->secure && phase_ == Phase::Collecting) {
    r_->secure->silo_gone(silo);
    drain_secure();
  } else if (r_->secure && phase_ == Phase::Unmasking && !membership_.route_of(silo)) {
    // Known to be gone: its group does not wait for it until the deadline (issue 37); if it
    // comes back through another route before the phase closes, it is asked again.
    r_->secure->silo_away(silo);
    drain_secure();
    if (r_->secure->unmask_complete()) finish_unmask(now_ms);
  }
  auto m = member_named(silo);
  if (!m) return;
  auto& mb = r_->members[*m];
  if (mb.session == link) {
    const auto lane = r_->slot.lane_of(Uploader{*m, 0});
    const bool mid_upload = lane && !r_->slot[*lane].complete();
    if (mb.state == MemberState::Training) {
      drop(*m, DropPhase::Train, DropCause::Disconnected, why + " while training", false);
    } else if (mb.state == MemberState::Ready || (mb.state == MemberState::Uploading && mid_upload)) {
      drop(*m, DropPhase::Upload, DropCause::Disconnected, why + " before its update arrived", false);
    }
    if (!mb.relayed) mb.session = 0;
  }
  pump(now_ms);
}

void Coordinator::on_disconnect(SessionId id, std::int64_t now_ms) {
  const Peer* p = membership_.peer(id);
  if (!p) return;
  const Peer peer = *p;
  const auto gone = membership_.remove_session(id);
  if (!peer.edge) {
    for (const auto& silo : gone) {
      silo_gone(silo, id, "disconnected", now_ms);
      // An edge that announced it while it was connected here carries it from now on.
      if (auto edge = membership_.edge_announcing(silo)) silo_joined(silo, *edge, now_ms);
    }
    return;
  }
  spdlog::warn("edge {} disconnected; its {} silos are gone with it", peer.name, gone.size());
  if (r_) {
    if (const auto lane = r_->slot.lane_of(Uploader{kNone, id}); lane && !r_->slot[*lane].complete()) {
      abandon_upload(*lane);
    }
  }
  for (const auto& silo : gone) silo_gone(silo, id, "its edge " + peer.name + " disconnected", now_ms);
  if (r_) {
    for (auto& mb : r_->members) {
      if (mb.session == id) mb.session = 0;
    }
  }
  pump(now_ms);
}

// ---- messages -------------------------------------------------------------------------------

void Coordinator::on_message(SessionId id, const wire::Envelope& e, std::int64_t now_ms) {
  on_message(id, e, proto::bytes_of(e.tensor_chunk().data()), now_ms);
}

void Coordinator::on_message(SessionId id, const proto::Message& msg, std::int64_t now_ms) {
  on_message(id, msg.env, msg.chunk_data(), now_ms);
}

void Coordinator::on_message(SessionId id, const wire::Envelope& e, ChunkData data, std::int64_t now_ms) {
  const Peer* peer = membership_.peer(id);
  if (!peer) return;
  if (peer->edge) return on_edge_message(id, e, data, now_ms);
  using B = wire::Envelope::BodyCase;
  const auto body = e.body_case();
  if (body == B::kError) {
    spdlog::warn("silo {} reports an error: {}", peer->name, proto::printable(e.error().message()));
    if (on_carried_message(peer->name, id, e)) return;
    if (auto m = member_of(id)) member_failed(*m, e, now_ms);
    return;
  }
  if (body == B::kLeaving) return on_leaving(peer->name, id);
  if (body == B::kWitness) return on_witness(peer->name, e.witness());
  if (fetch_ && (body == B::kTensorChunk || body == B::kModelOffer)) return on_fetch_message(peer->name, id, e, data);
  // Whatever round it is for: the model the silo trained on is the one it holds now.
  if (body == B::kUpdateReady) held_model(id, e.update_ready().model_sha256(), e.round());
  const bool secure_body = body == B::kSecure;
  if (body != B::kUpdateReady && body != B::kTensorChunk && body != B::kUpdateEnd && !secure_body) {
    send_error(id, wire::UNEXPECTED, "a silo may not send " + proto::body_name(e));
    return;
  }
  if (on_carried_message(peer->name, id, e)) return;
  const auto m = member_of(id);
  if (secure_body && m && e.round() == round_) return on_secure_message(*m, e, now_ms);
  // The round a member's messages are of: this one, or in buffered rounds the one it trains on.
  if (!m || e.round() != r_->members[*m].base_round || phase_ != Phase::Collecting) {
    send_error(id, wire::WRONG_ROUND,
               proto::body_name(e) + " for round " + std::to_string(e.round()) + ", but round " +
                   std::to_string(round_) +
                   (m && phase_ == Phase::Collecting ? " is collecting" : " does not expect it from you"));
    return;
  }
  switch (body) {
    case B::kUpdateReady: on_update_ready(*m, e, now_ms); break;
    case B::kTensorChunk: on_chunk(Uploader{*m, 0}, id, e, data, now_ms); break;
    case B::kUpdateEnd: on_update_end(*m, e, now_ms); break;
    default: break;
  }
}

void Coordinator::on_edge_message(SessionId id, const wire::Envelope& e, ChunkData data, std::int64_t now_ms) {
  using B = wire::Envelope::BodyCase;
  const std::string edge = membership_.peer(id)->name;
  const auto body = e.body_case();
  if (body == B::kError) {
    spdlog::warn("edge {} reports{}: {}", edge, e.silo().empty() ? "" : " for silo " + proto::printable(e.silo(), 64),
                 proto::printable(e.error().message()));
    const auto m = e.silo().empty() ? std::nullopt : member_named(e.silo());
    if (m && r_->members[*m].session == id) member_failed(*m, e, now_ms);
    return;
  }
  if (body == B::kRegionStatus) {
    held_model(id, e.region_status().model_sha256(), e.round());
    return on_region_status(id, e.region_status(), now_ms);
  }
  if (!e.silo().empty()) {
    if (body == B::kLeaving) return on_leaving(e.silo(), id);
    if (fetch_ && (body == B::kTensorChunk || body == B::kModelOffer)) return on_fetch_message(e.silo(), id, e, data);
    if (body == B::kWitness) {
      const Peer* p = membership_.peer(id);
      if (p->region.count(e.silo())) on_witness(e.silo(), e.witness());
      return;
    }
    // Relayed from one of its silos: UpdateReady and the secure protocol (its uploads go into
    // the region's sum).
    const auto m = member_named(e.silo());
    const bool ours = m && r_->members[*m].session == id && e.round() == round_;
    const bool secure_body = body == B::kSecure;
    if (secure_body && ours) return on_secure_message(*m, e, now_ms);
    const Peer* p = membership_.peer(id);
    if (!ours || !p->region.count(e.silo()) || body != B::kUpdateReady || phase_ != Phase::Collecting) {
      auto err = env();
      err.set_silo(e.silo());
      err.mutable_error()->set_code(e.round() != round_ ? wire::WRONG_ROUND : wire::UNEXPECTED);
      err.mutable_error()->set_message(proto::body_name(e) + " from " + e.silo() + " via edge " + edge +
                                       " is not expected in round " + std::to_string(round_));
      send(id, std::move(err));
      return;
    }
    return on_update_ready(*m, e, now_ms);
  }
  if (e.round() != round_ || phase_ != Phase::Collecting) {
    send_error(id, wire::WRONG_ROUND, proto::body_name(e) + " for round " + std::to_string(e.round()) + " but round " +
                                          std::to_string(round_) + " is not collecting");
    return;
  }
  switch (body) {
    case B::kUpdateReady:
      if (r_->edge_queued.insert(id).second) {
        r_->slot.enqueue(Uploader{kNone, id});
        pump(now_ms);
      }
      break;
    case B::kTensorChunk: on_chunk(Uploader{kNone, id}, id, e, data, now_ms); break;
    case B::kUpdateEnd: on_region_end(id, e, now_ms); break;
    default: send_error(id, wire::UNEXPECTED, "an edge may not send " + proto::body_name(e));
  }
}

// A head signed by one of this log's keys that the log does not hold proves the log lost or
// rewrote records: the server stops rather than sign on (a silo cannot fake one; it needs the
// server's signature). A head under another key proves nothing about this log, but that silo
// witnessed another history and refuses this one's rounds: it is left out of selection, said
// so in the log.
void Coordinator::on_witness(const std::string& silo, const wire::Witness& w) {
  const auto keys = store_.audit_keys();
  if (keys.empty()) return;  // a store that keeps no log
  const bool ours = std::any_of(keys.begin(), keys.end(), [&](const AuditKeySpan& k) { return k.public_key == w.public_key(); });
  const std::string head = "record " + std::to_string(w.head().seq()) + " (" + proto::printable(w.head().sha256(), 12) + ")";
  if (!ours) {
    membership_.set_disowned(silo);
    spdlog::error("silo {} witnessed audit {} of a log signed by another key: it took part in another history (this "
                  "state folder started again, or another server's) and will refuse this server's rounds; it is not "
                  "selected ({} such silos). If this folder is the wrong one, stop and restore it; if the federation "
                  "restarted on purpose, the silo moves its audit_heads.jsonl aside",
                  silo, head, membership_.disowned());
    return;
  }
  if (!protocol::head_signed_by(w.head(), w.public_key())) {
    spdlog::warn("silo {} sent a witnessed head ({}) this server's key did not sign; ignored", silo, head);
    return;
  }
  if (const auto st = store_.check_witness(silo, w.head().seq(), w.head().sha256(), w.public_key()); !st) {
    actions_.push_back(action::Stop{st.error().message()});
  }
}

// A silo moving to its preferred upstream asks to leave this route between rounds: no later
// round selects it here (until it has a new route), and the answer goes after every RoundStart
// sent to it, so that it leaves only when no round holds it. An edge can ask this only for a
// silo it carries, which it could drop anyway.
void Coordinator::on_leaving(const std::string& silo, SessionId via) {
  auto reply = env();
  if (membership_.is_edge(via)) reply.set_silo(silo);
  if (membership_.route_of(silo) != via) {
    reply.mutable_error()->set_code(wire::UNEXPECTED);
    reply.mutable_error()->set_message("Leaving from " + proto::printable(silo, 64) +
                                       ", which is not connected through this link");
    send(via, std::move(reply));
    return;
  }
  membership_.set_leaving(silo);
  spdlog::info("silo {} is moving to another upstream: no round after {} selects it here", silo, round_);
  reply.mutable_leaving();
  send(via, std::move(reply));
}

void Coordinator::on_region_status(SessionId id, const wire::RegionStatus& status, std::int64_t now_ms) {
  const Peer& peer = *membership_.peer(id);
  const std::string edge = peer.name;
  const std::string nonce = peer.join_nonce;
  const auto change = membership_.set_region(id, {status.silos().begin(), status.silos().end()});
  for (const auto& silo : change.left) {
    if (membership_.unroute(silo, id)) silo_gone(silo, id, "left edge " + edge, now_ms);
  }
  if (!change.left.empty()) challenge_edge(id);  // the proofs of those that left are void now
  std::map<std::string, const wire::JoinProof*> proofs;
  for (const auto& p : status.proofs()) proofs.emplace(p.silo(), &p);
  for (const auto& silo : change.joined) {
    if (!cfg_.any_silo && !cfg_.expected_silos.count(silo)) {
      send_error(id, wire::NOT_ALLOWED, "silo " + silo + " is not on the server's allow-list");
      continue;
    }
    // The silo exists for the server only once it has signed its join through this edge.
    auto proof = proofs.find(silo);
    const Status joined = proof == proofs.end() ? Error("no signed join from it")
                          : !cfg_.ca           ? Error("the server has no CA to check joins with")
                                               : protocol::check_join(*cfg_.ca, *proof->second, cfg_.federation, edge,
                                                                      nonce, silo);
    if (!joined) {
      const std::string& why = joined.error().message();
      spdlog::warn("edge {} announces silo {}, refused: {}", edge, silo, why);
      send_error(id, wire::NOT_ALLOWED, "silo " + silo + " refused: " + why);
      continue;
    }
    membership_.join_region(id, silo);
    if (auto t = crypto::certificate_not_after(proof->second->certificate())) relayed_not_after_[silo] = *t;
    if (auto route = membership_.route_of(silo); route && !membership_.is_edge(*route)) {
      // Connected here directly: an edge's word does not replace a live connection of the silo's
      // own. The claim waits until that connection ends (a silo moving to its preferred edge).
      spdlog::info("edge {} announces silo {}, which is connected directly; the edge carries it once that ends", edge,
                   silo);
      continue;
    }
    silo_joined(silo, id, now_ms);
  }
}

// A member that reports an error while it trains has failed its round (its trainer could not
// produce an update): it is a dropout now, not at the training deadline. Its reason is the
// code's fixed text: words a silo sends with it are not logged or audited (a trainer's output
// stays in the silo, protocol/failure.h).
void Coordinator::member_failed(std::size_t m, const wire::Envelope& e, std::int64_t now_ms) {
  if (e.error().code() != wire::TRAINING_FAILED || phase_ != Phase::Collecting || e.round() != r_->members[m].base_round ||
      r_->members[m].state != MemberState::Training) {
    return;
  }
  if (e.error().failure() == wire::PRIVACY_BUDGET_SPENT) {
    // The silo's own budget: it will refuse every later round too, so none selects it again.
    membership_.set_budget_spent(r_->members[m].silo);
    event("privacy_budget_spent", r_->members[m].silo);
  }
  drop(m, DropPhase::Train, DropCause::TrainingFailed, "its training failed: " + std::string(protocol::failure_text(e.error().failure())), false);
  pump(now_ms);
}

void Coordinator::on_update_ready(std::size_t m, const wire::Envelope& e, std::int64_t now_ms) {
  auto& mb = r_->members[m];
  auto error = [&](wire::ErrorCode code, const std::string& msg) {
    auto err = env();
    err.mutable_error()->set_code(code);
    err.mutable_error()->set_message(msg);
    send_to_member(m, std::move(err));
  };
  if (mb.state != MemberState::Training) {
    error(wire::UNEXPECTED, "UpdateReady while " + std::string(name(mb.state)));
    return;
  }
  if (e.update_ready().num_samples() == 0) {
    error(wire::BAD_UPDATE, "an update must come from at least one sample");
    drop(m, DropPhase::Train, DropCause::ZeroSamples, "reported zero samples", false);
    pump(now_ms);
    return;
  }
  if (r_->secure && !r_->secure->may_upload(mb.silo)) {
    error(wire::UNEXPECTED, "UpdateReady from a silo that is not a settled member of its secure group");
    drop(m, DropPhase::Secure, DropCause::Excluded, "announced an update without being a settled member of its group",
         false);
    pump(now_ms);
    return;
  }
  if (e.update_ready().has_privacy()) {
    if (const auto st = protocol::check_privacy(e.update_ready().privacy()); !st) {
      const std::string& why = st.error().message();
      error(wire::BAD_UPDATE, "a malformed privacy spend: " + why);
      drop(m, DropPhase::Train, DropCause::BadUpload, "announced a malformed privacy spend (" + why + ")", false);
      pump(now_ms);
      return;
    }
    mb.privacy = e.update_ready().privacy();
  }
  if (buffered() && !admit_member(m)) {  // too stale: it starts again on the newest version
    pump(now_ms);
    return;
  }
  r_->set_state(mb, MemberState::Ready);
  mb.times.ready = r_->since_start(now_ms);
  mb.num_samples = e.update_ready().num_samples();
  mb.metrics = e.update_ready().metrics();
  if (!mb.relayed) r_->slot.enqueue(Uploader{m, 0});  // an edge uploads for its silos
  pump(now_ms);
}

}  // namespace xsilo::server
