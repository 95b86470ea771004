// The coordinator's uploads: grants (up to uploads_at_once at a time, each into a lane of its
// own), chunks checked as they come, the end of a silo's upload or of an edge's partial sum,
// the folds in grant order and their outcome, and dropouts.
#include "server/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "proto/frame.h"
#include "protocol/signed_update.h"
#include "server/coordinator_round.h"
#include "server/secure_round.h"

namespace xsilo::server {

// ---- uploads --------------------------------------------------------------------------------

void Coordinator::grant(const Uploader& u, std::size_t lane, std::int64_t now_ms) {
  auto buffer = r_->agg->buffer(lane);
  if (!u.edge && !r_->secure) buffer.scheme = r_->compression;  // secure: fewer ring words, not encoded chunks
  r_->slot.open(lane, u, std::move(buffer), now_ms + cfg_.deadlines.upload.count());
  r_->uploads[lane] = {};
  r_->uploads[lane].granted_ms = now_ms;
  const std::string who = u.edge ? "edge " + membership_.peer(u.edge)->name : "silo " + r_->members[u.member].silo;
  spdlog::info("round {}: upload slot to {}", round_, who);
  event("upload_granted", who);
  auto e = env();
  e.mutable_upload_grant();
  if (u.edge) {
    send(u.edge, std::move(e));
  } else {
    r_->set_state(r_->members[u.member], MemberState::Uploading);
    r_->members[u.member].times.granted = r_->since_start(now_ms);
    send_to_member(u.member, std::move(e));
  }
  arm_upload_timer(now_ms);
}

// The Upload timer follows the earliest deadline of the lanes still receiving.
void Coordinator::arm_upload_timer(std::int64_t now_ms) {
  const auto next = r_->slot.next_deadline();
  if (next == r_->upload_timer) return;
  r_->upload_timer = next;
  if (next) {
    actions_.push_back(action::StartTimer{Timer::Upload, std::chrono::milliseconds(std::max<std::int64_t>(0, *next - now_ms))});
  } else {
    actions_.push_back(action::CancelTimer{Timer::Upload});
  }
}

// The upload granted first, once whole, is folded (one fold job at a time, in grant order, so
// the sum is the same whichever upload ends first). True when a fold started.
bool Coordinator::fold_next() {
  if (job_ != JobKind::None) return false;
  const auto lane = r_->slot.oldest();
  if (!lane || !r_->slot[*lane].complete()) return false;
  r_->folding = *lane;
  // Validate and fold off the network thread, after the chunks' checks (the worker's queue is
  // in order).
  run_job(JobKind::Fold, [agg = r_->agg.get(), c = r_->uploads[*lane].contribution, check = r_->slot[*lane].check(),
                          lane = *lane]() -> JobResult { return agg->fold(c, *check, lane); });
  return true;
}

void Coordinator::on_chunk(const Uploader& u, SessionId reply_to, const wire::Envelope& e, ChunkData data,
                           std::int64_t now_ms) {
  const auto lane = r_->slot.lane_of(u);
  if (!lane || r_->slot[*lane].complete()) {
    send_error(reply_to, wire::UNEXPECTED, "TensorChunk without an open UploadGrant");
    return;
  }
  auto check = r_->slot[*lane].add(e.tensor_chunk(), data);
  if (!check) {
    send_error(reply_to, check.error().code(), check.error().message());
    fail_upload(u, DropPhase::Upload, DropCause::BadUpload, check.error().message());
    pump(now_ms);
    return;
  }
  // Hash (and, for plain updates, check) what this chunk wrote, while the next one arrives.
  actions_.push_back(action::Background{std::move(*check)});
}

void Coordinator::on_update_end(std::size_t m, const wire::Envelope& e, std::int64_t now_ms) {
  auto& mb = r_->members[m];
  const Uploader u{m, 0};
  const auto lane = r_->slot.lane_of(u);
  if (mb.state != MemberState::Uploading || !lane || r_->slot[*lane].complete()) {
    send_error(mb.session, wire::UNEXPECTED, "UpdateEnd without an open UploadGrant");
    return;
  }
  const auto& end = e.update_end();
  const Status ended = [&]() -> Status {
    if (auto whole = r_->slot[*lane].end("update"); !whole) return whole;
    if (r_->secure) return {};  // weights travel inside the masked sum
    if (!std::isfinite(end.weight()) || end.weight() <= 0) return Error("update weight must be a positive number");
    if (heavier_than_allowed(end.weight())) {
      return Error("update weight " + std::to_string(end.weight()) + " exceeds training.max_weight " +
                   std::to_string(cfg_.plan.max_weight()));
    }
    return {};
  }();
  if (!ended) {
    const std::string& why = ended.error().message();
    send_error(mb.session, wire::BAD_UPDATE, why);
    fail_upload(u, DropPhase::Upload, DropCause::BadUpload, why);
    pump(now_ms);
    return;
  }
  mb.weight = end.weight();
  mb.times.received = r_->since_start(now_ms);
  r_->upload_bytes += r_->slot[*lane].bytes_received();
  auto& up = r_->uploads[*lane];
  up.contribution = Contribution{.silos = {mb.silo},
                                 .weight = mb.weight,
                                 .group = r_->secure ? r_->secure->group_of(mb.silo) : 0,
                                 .declared_sha256 = end.update_sha256(),
                                 .partial_sum = false,
                                 .scale = mb.staleness_weight};
  up.members = {m};
  up.more = false;
  pump(now_ms);  // folds it now if the uploads granted before it are folded
}

// The contributors an edge's partial sum lists, checked: this edge's members of the round, each
// once, in the sum's secure group and settled there (or with a weight the round allows), each
// with its own signed word. Their members and weight, or why the sum is refused.
Result<Coordinator::Contributors> Coordinator::check_contributors(const std::string& edge,
                                                                  const wire::UpdateEnd& end) const {
  Contributors listed;
  auto& who = listed.members;
  for (const auto& c : end.contributors()) {
    const auto m = member_named(c.silo());
    if (!m || r_->members[*m].edge != edge || r_->members[*m].state == MemberState::Done ||
        std::find(who.begin(), who.end(), *m) != who.end()) {
      return Error("edge " + edge + " lists " + c.silo() + ", which is not one of its silos in this round");
    }
    if (r_->secure) {
      if (r_->secure->group_of(c.silo()) != end.group() || end.group() == 0) {
        return Error("edge " + edge + " put " + c.silo() + " into the partial sum of secure group " +
                     std::to_string(end.group()) + ", which is not its group");
      }
      if (!r_->secure->may_upload(c.silo())) {
        return Error("edge " + edge + " put " + c.silo() +
                     " into a partial sum, but it is not a settled member of its group");
      }
    } else if (!std::isfinite(c.weight()) || c.weight() <= 0) {
      return Error("edge " + edge + " lists a non-positive weight for " + c.silo());
    } else if (heavier_than_allowed(c.weight())) {
      return Error("edge " + edge + " lists weight " + std::to_string(c.weight()) + " for " + c.silo() +
                   ", above training.max_weight " + std::to_string(cfg_.plan.max_weight()));
    }
    // The silo's own signed word on what it sent: an edge can neither alter it nor make one up.
    if (cfg_.ca) {
      if (const auto signed_word = protocol::check_signed_word(c, *cfg_.ca, cfg_.federation, round_); !signed_word) {
        return Error("edge " + edge + "'s partial sum: " + signed_word.error().message());
      }
    }
    who.push_back(*m);
    listed.weight += c.weight();
  }
  return listed;
}

void Coordinator::on_region_end(SessionId id, const wire::Envelope& e, std::int64_t now_ms) {
  const Uploader u{kNone, id};
  const auto lane = r_->slot.lane_of(u);
  if (!lane || r_->slot[*lane].complete()) {
    send_error(id, wire::UNEXPECTED, "UpdateEnd without an open UploadGrant");
    return;
  }
  const auto& end = e.update_end();
  const std::string edge = membership_.peer(id)->name;
  // Contributors must be this edge's members of the round; their weights must add up.
  auto listed = check_contributors(edge, end);
  if (listed && listed->members.empty()) {
    drop_region(edge, DropPhase::Upload, DropCause::NotInPartialSum, "its edge had no update from it");
    abandon_upload(*lane);
    pump(now_ms);
    return;
  }
  double weight = listed ? listed->weight : 0;
  if (r_->secure) weight = end.weight();  // weights travel inside the masked sum
  const Status ended = [&]() -> Status {
    if (!listed) return listed.error();
    if (auto whole = r_->slot[*lane].end("partial sum"); !whole) return whole;
    if (std::abs(weight - end.weight()) > 1e-6 * std::max(1.0, weight)) {
      return Error("partial sum weight " + std::to_string(end.weight()) + " is not the sum of its contributors' " +
                   std::to_string(weight));
    }
    return {};
  }();
  if (!ended) {
    const std::string& why = ended.error().message();
    send_error(id, wire::BAD_UPDATE, why);
    fail_upload(u, DropPhase::Upload, DropCause::BadUpload, why);
    pump(now_ms);
    return;
  }
  const auto& who = listed->members;
  for (std::size_t k = 0; k < who.size(); ++k) {
    const auto& c = end.contributors(static_cast<int>(k));
    auto& mb = r_->members[who[k]];
    mb.weight = c.weight();
    // Secure: the count stays inside the masked sum (the silo signs 0); the 1 its UpdateReady
    // said stands, as for a silo uploading straight to the server, so its train loss counts.
    if (!r_->secure) mb.num_samples = c.num_samples();
    // What the silo itself says it sent (its sent.jsonl names the same), signed by it.
    mb.update_sha256 = c.update_sha256();
    mb.update_signed = cfg_.ca.has_value();
  }
  r_->upload_bytes += r_->slot[*lane].bytes_received();
  auto& up = r_->uploads[*lane];
  up.contribution = Contribution{
      .silos = {}, .weight = weight, .group = end.group(), .declared_sha256 = end.update_sha256(), .partial_sum = true,
      .scale = 1};
  for (auto m : who) {
    up.contribution.silos.push_back(r_->members[m].silo);
    r_->members[m].times.granted = r_->since_start(up.granted_ms);
    r_->members[m].times.received = r_->since_start(now_ms);
  }
  up.members = who;
  up.more = end.more();
  pump(now_ms);
}

// The fold job is done: the upload is in the aggregate, or refused with the reason.
void Coordinator::folded(FoldResult r, std::int64_t now_ms) {
  const std::size_t lane = *std::exchange(r_->folding, std::nullopt);
  const Uploader u = *r_->slot[lane].holder();
  r_->slot.release(lane);
  const Round::Upload up = std::move(r_->uploads[lane]);
  if (!r) {
    const FoldFailure& refused = r.error();
    if (u.edge) {
      send_error(u.edge, wire::BAD_UPDATE, refused.why);
      drop_region(r_->members[up.members.front()].edge, DropPhase::Validation, DropCause::EdgeRejected,
                  "its edge's partial sum was rejected: " + refused.why);
    } else {
      send_error(r_->members[u.member].session, wire::BAD_UPDATE, refused.why);
      drop(u.member, DropPhase::Validation,
           refused.cause == FoldFailure::Cause::NonFinite ? DropCause::NonFinite : DropCause::HashMismatch, refused.why,
           false);
    }
    pump(now_ms);
    return;
  }
  for (auto m : up.members) {
    r_->set_state(r_->members[m], MemberState::Done);
    r_->members[m].times.folded = r_->since_start(now_ms);
    if (!u.edge) r_->members[m].update_sha256 = r->sha256;  // an edge's silos keep their own word
    if (r_->secure) r_->secure->masked_from(r_->members[m].silo);
  }
  if (u.edge) {
    const Peer* p = membership_.peer(u.edge);
    // The region's sum, apart from its silos' own updates.
    nlohmann::json region = {{"edge", r_->members[up.members.front()].edge}, {"sum_sha256", r->sha256}};
    if (r_->secure) region["group"] = up.contribution.group;
    for (auto m : up.members) region["silos"].push_back(r_->members[m].silo);
    r_->regions.push_back(std::move(region));
    if (up.more && p) {
      grant(u, lane, now_ms);  // the edge has another secure group's partial sum: its lane again
      pump(now_ms);
      return;
    }
    drop_region(p ? p->name : r_->members[up.members.front()].edge, DropPhase::Upload,
                DropCause::NotInPartialSum, "its edge's partial sum did not include it");
  }
  pump(now_ms);
}

// The upload `u` is sending is refused: its silo, or the edge's unfinished silos, are dropped.
void Coordinator::fail_upload(const Uploader& u, DropPhase phase, DropCause cause, const std::string& why) {
  const auto lane = r_->slot.lane_of(u);
  if (u.edge) {
    const Peer* p = membership_.peer(u.edge);
    std::string edge = p ? p->name : "";
    if (edge.empty() && lane && !r_->uploads[*lane].members.empty()) {
      edge = r_->members[r_->uploads[*lane].members.front()].edge;
    }
    drop_region(edge, phase, cause, u.edge && cause == DropCause::BadUpload ? "its edge sent a bad partial sum: " + why
                                                                             : why);
  } else {
    drop(u.member, phase, cause, why, false);
  }
  if (lane && r_->slot[*lane].held_by(u)) abandon_upload(*lane);
}

void Coordinator::abandon_upload(std::size_t lane) {
  // Its chunk checks may still be queued on the worker: the lane is granted again only once
  // they have drained (a job started after this one is done).
  r_->slot.abandon(lane, job_id_);
  if (!r_->slot.next_deadline() && r_->upload_timer) {
    r_->upload_timer.reset();
    actions_.push_back(action::CancelTimer{Timer::Upload});
  }
  if (job_ == JobKind::None) run_job(JobKind::Barrier, []() -> JobResult { return {}; });
}

void Coordinator::drop_region(const std::string& edge, DropPhase phase, DropCause cause, const std::string& reason) {
  for (std::size_t i = 0; i < r_->members.size(); ++i) {
    const auto& mb = r_->members[i];
    const bool unfinished = mb.state == MemberState::Training || mb.state == MemberState::Ready ||
                            mb.state == MemberState::Uploading;
    if (!edge.empty() && mb.edge == edge && unfinished) drop(i, phase, cause, reason, false);
  }
}

bool Coordinator::edge_pending(SessionId edge) const {
  return std::any_of(r_->members.begin(), r_->members.end(), [&](const Member& mb) {
    return mb.relayed && mb.session == edge && (mb.state == MemberState::Training || mb.state == MemberState::Ready);
  });
}

void Coordinator::drop(std::size_t m, DropPhase phase, DropCause cause, const std::string& reason, bool notify) {
  auto& mb = r_->members[m];
  if (mb.state == MemberState::Dropped) return;
  // A half-received update is simply never folded in; nor is a whole one still waiting behind
  // the lanes granted before it (the member is out of the round). Only the one being folded
  // now goes on: its job is on the worker.
  if (const auto lane = r_->slot.lane_of(Uploader{m, 0}); lane && (!r_->slot[*lane].complete() || r_->folding != lane)) {
    abandon_upload(*lane);
  }
  r_->set_state(mb, MemberState::Dropped);
  mb.drop_phase = phase;
  mb.drop_cause = cause;
  mb.drop_reason = reason;
  spdlog::warn("round {}: silo {} dropped in phase {}: {}", round_, mb.silo, name(phase), reason);
  if (notify) send_round_end(m, false, "you were dropped from this round: " + reason);
}

void Coordinator::send_round_end(std::size_t m, bool committed, const std::string& reason, const AuditHead* audit) {
  auto e = env();
  auto* re = e.mutable_round_end();
  re->set_committed(committed);
  re->set_reason(reason);
  re->set_model_sha256(global_sha_);
  if (audit && audit->seq) {
    re->mutable_audit_head()->set_seq(audit->seq);
    re->mutable_audit_head()->set_sha256(audit->sha256);
    re->mutable_audit_head()->set_signature(audit->signature);
  }
  send_to_member(m, std::move(e));
}

}  // namespace xsilo::server
