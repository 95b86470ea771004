// The coordinator: its helpers, the round's lifecycle (start, close, unmask, decide, finish),
// secure aggregation's messages, jobs and the round summary. Connections and messages are in
// coordinator_membership.cpp, uploads in coordinator_uploads.cpp, the deadlines in
// coordinator_timers.cpp, the model each receiver is sent (whole or as a delta) in
// coordinator_broadcast.cpp.
#include "server/coordinator.h"

#include "server/commit.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "crypto/hash.h"
#include "crypto/keys.h"
#include "crypto/sources.h"
#include "proto/frame.h"
#include "protocol/round_start.h"
#include "protocol/compression.h"
#include "protocol/secagg_wire.h"
#include "server/coordinator_round.h"
#include "server/secure_round.h"
#include "server/selection.h"

namespace xsilo::server {

namespace {
const std::vector<Member> kNoMembers;

// The inputs a round's robust rule left out, from its audit record.
std::size_t robust_rejected(const nlohmann::json& rec) {
  if (!rec.contains("robust") || !rec["robust"].contains("decisions")) return 0;
  std::size_t n = 0;
  for (const auto& d : rec["robust"]["decisions"]) n += d.value("kept", true) ? 0 : 1;
  return n;
}

// The audit record's cause for a silo its secure group dropped: the step it missed, when the
// group says which, so an operator can tell a silo that never started the protocol from one
// that vanished halfway.
DropCause secure_cause(const SecureDrop& d) {
  switch (d.reason) {
    case secure::DropReason::NoKeys: return DropCause::SecureNoKeys;
    case secure::DropReason::NoShares: return DropCause::SecureNoShares;
    case secure::DropReason::NoReceipt: return DropCause::SecureNoReceipt;
    case secure::DropReason::Excluded: return DropCause::Excluded;
    case secure::DropReason::GroupFailed: break;
  }
  return DropCause::SecureGroupFailed;
}

// After an aborted round (on the worker): the unchanged model for receivers that hold it, as a
// step of zeros, when `make` (a compressed broadcast with no such chunks yet) and the model
// allows it (protocol::encode_same_model).
std::shared_ptr<const std::vector<wire::TensorChunk>> same_model_chunks(bool make, const wire::Compression& broadcast,
                                                                        const Model& model, std::size_t chunk_elems,
                                                                        std::uint64_t seed) {
  if (!make) return nullptr;
  auto enc = protocol::encode_same_model(broadcast, model.flat(), model.tensors(), chunk_elems, seed);
  if (!enc) return nullptr;
  return std::make_shared<const std::vector<wire::TensorChunk>>(std::move(enc->chunks));
}
}  // namespace

Coordinator::Coordinator(RoundConfig cfg, Model initial, ServerOptimizer optimizer, Store& store,
                         std::uint64_t first_round)
    : cfg_(std::move(cfg)), optimizer_(std::move(optimizer)), store_(store), round_(first_round) {
  cfg_.secure.random_bytes = cfg_.sources.random_bytes;  // one source of randomness for the whole core
  global_sha_ = crypto::sha256_hex(initial.flat());
  global_ = std::make_shared<const Model>(std::move(initial));
  if (cfg_.aggregation.adaptive_clip.on()) clip_norm_ = cfg_.aggregation.adaptive_clip.initial;
  if (cfg_.central_dp) central_spent_ = cfg_.central_dp->spent;
  if (cfg_.distributed_dp) {
    // Gamma and mu depend on the model's size (the daemon and the sim have done it already,
    // refusing a config whose bits cannot hold the sum; a test's config may come unfinished).
    if (!cfg_.distributed_dp->ready()) {
      finalize_distributed_dp(*cfg_.distributed_dp, protocol::skellam_dim(cfg_.compression, global_->tensors()));
    }
    central_spent_ = cfg_.distributed_dp->spent;
  }
}

Coordinator::~Coordinator() = default;

const std::vector<Member>& Coordinator::members() const { return r_ ? r_->members : kNoMembers; }

wire::Envelope Coordinator::env() const {
  wire::Envelope e;
  e.set_federation(cfg_.federation);
  e.set_round(round_);
  return e;
}

void Coordinator::send_error(SessionId to, wire::ErrorCode code, const std::string& msg) {
  auto e = env();
  e.mutable_error()->set_code(code);
  e.mutable_error()->set_message(msg);
  send(to, std::move(e));
}

std::optional<std::size_t> Coordinator::member_of(SessionId id) const {
  // A silo's own connection carries its name (an edge's carries many: those name the silo).
  const Peer* p = membership_.peer(id);
  if (!p || p->edge) return std::nullopt;
  const auto m = member_named(p->name);
  if (m && r_->members[*m].session == id) return m;
  return std::nullopt;
}

std::optional<std::size_t> Coordinator::member_named(const std::string& silo) const {
  if (!r_) return std::nullopt;
  const auto it = r_->by_name.find(silo);
  if (it == r_->by_name.end()) return std::nullopt;
  return it->second;
}

void Coordinator::send_to_member(std::size_t m, wire::Envelope e) {
  const auto& mb = r_->members[m];
  if (!mb.session || !membership_.peer(mb.session)) return;
  if (mb.relayed) e.set_silo(mb.silo);
  // Buffered rounds: a member may train on the start of an earlier round; what it is sent is of that one.
  if (mb.base_round) e.set_round(mb.base_round);
  send(mb.session, std::move(e));
}

void Coordinator::start(std::int64_t now_ms) {
  phase_since_ms_ = now_ms;
  if (round_ > cfg_.rounds) {
    finish_round(false, AuditHead{}, now_ms);  // nothing left to do: resumed after the last round
    return;
  }
  set_phase(Phase::Joining, now_ms);
  join_elapsed_ = false;
  actions_.push_back(action::StartTimer{Timer::Join, cfg_.deadlines.join});
  if (fetch_) {
    spdlog::warn("the model of committed round {} is in no copy here: asking the silos for it as they connect",
                 fetch_->round);
    return;
  }
  if (paused_) spdlog::warn("paused by admin {}: no round starts until `xsilo admin resume`", paused_by_);
  if (central_budget_spent(now_ms)) return;
  try_start_round(now_ms);
}

void Coordinator::set_phase(Phase p, std::int64_t now_ms) {
  if (p == phase_) return;
  if (r_ && (p == Phase::Unmasking || p == Phase::Closing)) r_->phases.emplace_back(name(p), r_->since_start(now_ms));
  auto& [seconds, times] = totals_.phase_seconds[std::string(name(phase_))];
  seconds += static_cast<double>(now_ms - phase_since_ms_) / 1000.0;
  ++times;
  phase_ = p;
  phase_since_ms_ = now_ms;
}

// ---- the round ------------------------------------------------------------------------------

void Coordinator::try_start_round(std::int64_t now_ms) {
  if (phase_ != Phase::Joining || job_ != JobKind::None || paused_ || fetch_) return;
  if (membership_.selectable() < cfg_.selection.min_silos) return;
  // Only silos never seen are worth the join wait: one that was connected and has left joins
  // the next round when it comes back, and does not hold this one back.
  if (membership_.all_accounted_for(cfg_.expected_silos) || join_elapsed_) start_round(now_ms);
}

// The audit key the silos take part under, and the rotations that lead to it from the first.
void Coordinator::add_audit_key(wire::RoundStart& rs) const {
  if (const auto keys = store_.audit_keys(); !keys.empty()) {
    auto* k = rs.mutable_audit_key();
    k->set_public_key(keys.back().public_key);
    for (std::size_t i = 1; i < keys.size(); ++i) {
      auto* rot = k->add_rotations();
      rot->set_old_key(keys[i - 1].public_key);
      rot->set_next_key(keys[i].public_key);
      rot->set_signature(keys[i].rotation_signature);
    }
  }
}

// Each selected silo's round start, signed for it with its group's secure setup, and the model
// (the silos behind an edge get theirs from the edge).
void Coordinator::send_round_start(const wire::Envelope& start,
                                   const std::vector<std::pair<std::string, SessionId>>& candidates,
                                   const BroadcastDelta* offer) {
  std::set<SessionId> edges;
  for (const auto& [silo, session] : candidates) {
    Member mb = newest_member(silo, session);
    const Peer* peer = membership_.peer(session);
    if (peer->edge) {
      mb.relayed = true;
      mb.edge = peer->name;
      edges.insert(session);
    }
    r_->add(std::move(mb));
    wire::Envelope mine = start;
    if (r_->secure) *mine.mutable_round_start()->mutable_secagg() = r_->secure->setup(r_->secure->group_of(silo));
    // Signed per silo, the secure setup included: a relay can neither change nor drop it.
    if (cfg_.signer) protocol::sign_round_start(*mine.mutable_round_start(), *cfg_.signer, cfg_.federation);
    send_to_member(r_->members.size() - 1, std::move(mine));
    if (!peer->edge) send_model(session, offer);
  }
  // An edge receives the model once and passes it to its selected silos.
  for (auto edge : edges) send_model(edge, offer);
}

void Coordinator::start_round(std::int64_t now_ms) {
  actions_.push_back(action::CancelTimer{Timer::Join});
  // Selection is a pure function (server/selection.h); try_start_round saw enough eligible silos.
  const Selection selection = select(membership_.candidates(), round_, cfg_.selection, cfg_.seed);
  const auto& candidates = selection.chosen;
  const std::size_t target = selection.target;

  set_phase(Phase::Collecting, now_ms);
  r_ = std::make_unique<Round>(cfg_.uploads_at_once);
  r_->started_ms = now_ms;
  r_->target = buffered() ? cfg_.schedule.k : target;
  std::vector<std::string> names;
  for (const auto& c : candidates) names.push_back(c.first);
  r_->agg = make_aggregator(cfg_, *global_, round_, names, clip_norm_);
  r_->secure = r_->agg->secure();

  wire::Envelope start = env();
  const BroadcastDelta* offer = nullptr;  // into delta_ or same_, which only a finished job changes
  auto* rs = start.mutable_round_start();
  rs->set_round(round_);
  {
    std::string nonce(16, '\0');
    cfg_.sources.random_bytes({reinterpret_cast<std::uint8_t*>(nonce.data()), nonce.size()});
    rs->set_nonce(std::move(nonce));
  }
  *rs->mutable_plan() = cfg_.plan;
  protocol::add_layout(*rs, global_->tensors());
  rs->set_model_sha256(global_sha_);
  if (protocol::compressed(cfg_.broadcast)) {
    *rs->mutable_broadcast() = cfg_.broadcast;
    // Buffered rounds send whole models: their silos hold models of many versions.
    if (!buffered()) offer = choose_offer(candidates);
    if (offer) rs->set_base_sha256(offer->base);
  }
  r_->compression = round_compression(cfg_, round_);
  if (protocol::compressed(r_->compression)) *rs->mutable_compression() = r_->compression;
  add_audit_key(*rs);
  if (buffered()) {
    start_buffered(candidates, start, now_ms);
    actions_.push_back(action::StartTimer{Timer::Train, cfg_.deadlines.train});
    spdlog::info("round {}/{}: buffered, {} silos training, commits at {} updates", round_, cfg_.rounds,
                 r_->members.size(), r_->target);
    event("round_started", std::to_string(r_->members.size()) + " training");
    return;
  }
  send_round_start(start, candidates, offer);
  if (r_->secure) {
    actions_.push_back(action::StartTimer{Timer::SecAgg, cfg_.secure.keys_deadline});
    drain_secure();
  }
  actions_.push_back(action::StartTimer{Timer::Train, cfg_.deadlines.train});
  spdlog::info("round {}/{}: {} silos selected, closing at {}", round_, cfg_.rounds, r_->members.size(), target);
  event("round_started", std::to_string(r_->members.size()) + " selected");
}

void Coordinator::pump(std::int64_t now_ms) {
  if (phase_ != Phase::Collecting) return;
  auto eligible = [&](const Uploader& u) {
    if (u.edge) return membership_.peer(u.edge) != nullptr && edge_pending(u.edge);
    return r_->members[u.member].state == MemberState::Ready;
  };
  // Grants while a lane is free and the round can still use another upload: never more
  // uploads in flight than the target lacks, so a round closes with no upload half-received.
  while (r_->done() + r_->slot.held() < r_->target) {
    const auto lane = r_->slot.free_lane();
    if (!lane) break;
    auto u = r_->slot.next(eligible);
    if (!u) break;
    // Buffered: its staleness now (a member carried over from the last commit may be too stale).
    if (buffered() && !u->edge && !admit_member(u->member)) continue;
    grant(*u, *lane, now_ms);
  }
  if (!fold_next() && job_ == JobKind::None && r_->slot.draining()) {
    run_job(JobKind::Barrier, []() -> JobResult { return {}; });
  }
  arm_upload_timer(now_ms);
  if (job_ != JobKind::None || r_->slot.held() > 0 || r_->slot.draining()) return;
  if (r_->done() >= r_->target) return close_round(now_ms);
  const bool anyone_left = r_->count(MemberState::Training) + r_->count(MemberState::Ready) > 0;
  if (!anyone_left || r_->train_elapsed) close_round(now_ms);
}

void Coordinator::close_round(std::int64_t now_ms) {
  // A secure round unmasks before it commits.
  set_phase(r_->secure ? Phase::Unmasking : Phase::Closing, now_ms);
  for (auto t : {Timer::Train, Timer::Upload, Timer::SecAgg}) actions_.push_back(action::CancelTimer{t});
  const bool enough = r_->done() >= r_->target;
  for (std::size_t i = 0; i < r_->members.size() && buffered(); ++i) {
    // Buffered: who is still training (or ready) goes on into the next round, its base kept.
    const auto& mb = r_->members[i];
    if (mb.state == MemberState::Training || mb.state == MemberState::Ready) carried_.push_back(mb);
  }
  for (std::size_t i = 0; i < r_->members.size() && !buffered(); ++i) {
    auto& mb = r_->members[i];
    if (mb.state != MemberState::Training && mb.state != MemberState::Ready) continue;
    if (enough) {
      r_->set_state(mb, MemberState::Surplus);
      send_round_end(i, false, "the round closed with enough updates; yours was not needed");
    } else {
      drop(i, mb.state == MemberState::Training ? DropPhase::Train : DropPhase::Upload, DropCause::StillPending,
           "still pending when the round closed");
    }
  }
  event("round_closed", std::to_string(r_->done()) + " updates");
  if (r_->secure) {
    set_phase(Phase::Unmasking, now_ms);
    if (!cfg_.distributed_dp) return begin_unmask(now_ms);
    // Distributed DP: the round's spend goes on record, durably, before any silo is asked for
    // unmask shares: a silo that released its shares could let the server unmask the round's noisy
    // sum, so every such round is charged, aborted (too few answered) or interrupted by a crash
    // (UnmaskingWatch), and `audit verify --sent` finds each release charged. A record that cannot
    // be written throws on the worker, before anything is asked, and stops the server. Until it is
    // written no secure message is fed to the groups (on_secure_message).
    r_->unmask_begun = true;
    run_job(JobKind::BeginUnmask, [&store = store_, begun = unmask_begun_record(now_ms)]() -> JobResult {
      CommitOutcome o;
      o.audit = store.record(begun, nullptr);
      return o;
    });
    return;
  }
  decide(now_ms);
}

void Coordinator::begin_unmask(std::int64_t now_ms) {
  // Ask each group's survivors to confirm the survivor set, then for the shares that remove the masks.
  r_->secure->begin_unmask();
  drain_secure();
  actions_.push_back(action::StartTimer{Timer::Unmask, cfg_.secure.unmask_deadline});
  if (r_->secure->unmask_complete()) finish_unmask(now_ms);
}

// Unmasking is over (every survivor answered, or the deadline): rebuild and decode the group
// sums on the worker. From here no secure message is fed to the groups.
void Coordinator::finish_unmask(std::int64_t now_ms) {
  if (phase_ != Phase::Unmasking || job_ != JobKind::None) return;
  actions_.push_back(action::CancelTimer{Timer::Unmask});
  set_phase(Phase::Closing, now_ms);
  // Distributed DP: the round's unmask_begun record was written before unmasking began (close_round).
  run_job(JobKind::Prepare, [agg = r_->agg.get()]() -> JobResult { return agg->prepare(); });
}

// An aborted round: its record (spending nothing), and the same model for the next round.
void Coordinator::record_abort(std::int64_t now_ms) {
  const auto s = summary(false, r_->abort_reason, now_ms);
  auto rec = round_record(s);
  // Spends nothing, unless distributed DP's noisy sums were unmasked before the abort.
  auto spent = central_spent_;
  if (charged_on_abort()) spent.add(round_dp_mechanism(), 1);
  if (cfg_.central_dp || cfg_.distributed_dp) rec["privacy"] = privacy_record(spent);
  run_job(JobKind::Record, [&store = store_, rec = std::move(rec), row = metrics_row(s), global = global_,
                            broadcast = cfg_.broadcast, chunk_elems = cfg_.chunk_bytes / sizeof(float),
                            seed = broadcast_seed(cfg_, round_), make_same = wants_same()]() -> JobResult {
    CommitOutcome o;
    o.audit = store.record(rec, &row);
    o.delta = same_model_chunks(make_same, broadcast, *global, chunk_elems, seed);
    return o;
  });
}

void Coordinator::decide(std::int64_t now_ms) {
  set_phase(Phase::Closing, now_ms);
  const std::size_t done = r_->done();
  const std::size_t need = commit_needs();
  if (done < need) {
    r_->abort_reason = "only " + std::to_string(done) + " updates arrived, " + std::to_string(need) + " needed";
    spdlog::warn("round {} aborted: {}", round_, r_->abort_reason);
    return record_abort(now_ms);
  }
  const auto s = summary(true, "", now_ms);
  CombineContext ctx;
  ctx.round = round_;
  ctx.seed = cfg_.seed;
  ctx.nonfinite = static_cast<std::size_t>(std::count_if(r_->members.begin(), r_->members.end(), [](const Member& m) {
    return m.state == MemberState::Dropped && m.drop_cause == DropCause::NonFinite;
  })) + r_->rejoined_nonfinite;
  // Silo-level DP: what the round spends once committed, recorded with it; an aborted round's
  // record states the spend so far, unchanged, unless its noisy sums were already unmasked
  // (distributed DP): then it spends as if committed.
  nlohmann::json privacy_part, privacy_unspent;
  if (cfg_.central_dp || cfg_.distributed_dp) {
    auto after = central_spent_;
    after.add(round_dp_mechanism(), 1);
    privacy_part = privacy_record(after);
    privacy_unspent = charged_on_abort() ? privacy_part : privacy_record(central_spent_);
  }
  run_job(JobKind::Commit, [agg = r_->agg.get(), &optimizer = optimizer_, &store = store_, global = global_,
                            round = round_, ctx, rec = round_record(s), row = metrics_row(s), broadcast = cfg_.broadcast,
                            privacy_part = std::move(privacy_part), privacy_unspent = std::move(privacy_unspent),
                            chunk_elems = cfg_.chunk_bytes / sizeof(float),
                            seed = broadcast_seed(cfg_, round_), make_same = wants_same()]() mutable -> JobResult {
    auto next = agg->output(*global);
    ctx.centre = optimizer.last_step();  // read here, where only this job moves the optimizer
    // The optimizer writes the new model into the same buffer, which becomes the global model.
    CombineResult c = commit_round([&](std::span<float> step) { return agg->combine(step, ctx); }, next->flat(),
                                   optimizer, global->flat());
    if (const auto& part = record_of(c); part.is_object()) rec.merge_patch(part);
    if (!c) {
      rec["status"] = "aborted";
      rec["reason"] = c.error().reason;
      if (!privacy_unspent.is_null()) {
        rec["privacy"] = std::move(privacy_unspent);
        // An uncharged round releases nothing noised: not the count adaptive clipping drew either.
        if (auto r = rec.find("robust"); r != rec.end() && r->is_object()) r->erase("adaptive_clip");
      }
      row.committed = false;
      return CommitOutcome{.committed = false,
                           .reason = c.error().reason,
                           .model = nullptr,
                           .model_sha256 = "",
                           .audit = store.record(rec, &row),
                           .next_clip_norm = std::nullopt,
                           .robust_rejected = robust_rejected(rec),
                           .delta = same_model_chunks(make_same, broadcast, *global, chunk_elems, seed)};
    }
    // A compressed broadcast: the new model is the old one plus the rounded step, exactly what
    // a silo holding the old one rebuilds from the delta (so every silo trains on the model
    // whose hash the round announces, whichever way it came).
    std::shared_ptr<const std::vector<wire::TensorChunk>> delta;
    if (protocol::compressed(broadcast)) {
      auto enc = protocol::encode_model_delta(broadcast, global->flat(), next->flat(), next->tensors(), chunk_elems, seed);
      rec["broadcast_delta_bytes"] = enc.bytes;
      delta = std::make_shared<const std::vector<wire::TensorChunk>>(std::move(enc.chunks));
    }
    const std::string sha = crypto::sha256_hex(next->flat());
    rec["model_sha256_after"] = sha;
    if (!privacy_part.is_null()) rec["privacy"] = std::move(privacy_part);
    AuditHead audit = store.commit(round, *next, optimizer.state(), rec, row);
    return CommitOutcome{.committed = true,
                         .reason = "",
                         .model = std::move(next),
                         .model_sha256 = sha,
                         .audit = std::move(audit),
                         .next_clip_norm = c->next_clip_norm,
                         .robust_rejected = robust_rejected(rec),
                         .delta = std::move(delta)};
  });
}

void Coordinator::finish_round(bool committed, const AuditHead& audit, std::int64_t now_ms) {
  if (phase_ == Phase::Closing && r_) {
    for (std::size_t i = 0; i < r_->members.size(); ++i) {
      if (r_->members[i].state == MemberState::Done) {
        send_round_end(i, committed, committed ? "committed" : r_->abort_reason, &audit);
      }
    }
    spdlog::info("round {} {}: {} updates, model {}", round_, committed ? "committed" : "aborted", r_->done(),
                 global_sha_.substr(0, 12));
    event(committed ? "round_committed" : "round_aborted", committed ? global_sha_ : r_->abort_reason);
    RoundOutcome o{.round = round_,
                   .committed = committed,
                   .reason = committed ? "" : r_->abort_reason,
                   .started_ms = r_->started_ms,
                   .ended_ms = now_ms,
                   .selected = r_->members.size(),
                   .updates = r_->done(),
                   .upload_bytes = r_->upload_bytes,
                   .robust_rejected = r_->robust_rejected,
                   .dropouts = {}};
    for (const auto& m : r_->members) {
      if (m.state == MemberState::Done && !m.privacy.mechanism().empty()) privacy_[m.silo] = m.privacy;
      if (m.state != MemberState::Dropped) continue;
      o.dropouts.push_back({.silo = m.silo,
                            .phase = std::string(name(m.drop_phase)),
                            .cause = std::string(name(m.drop_cause)),
                            .reason = m.drop_reason});
      ++totals_.dropouts[std::string(name(m.drop_cause))];
    }
    for (const auto& d : r_->rejoined) {  // buffered: drops of members that rejoined since
      o.dropouts.push_back({.silo = d.value("silo", ""),
                            .phase = d.value("phase", ""),
                            .cause = d.value("cause", ""),
                            .reason = d.value("reason", "")});
      ++totals_.dropouts[d.value("cause", "")];
    }
    totals_.upload_bytes += r_->upload_bytes;
    totals_.robust_rejected += r_->robust_rejected;
    recent_.push_back(std::move(o));
    if (recent_.size() > kRecentRounds) recent_.pop_front();
    ++round_;
  }
  r_.reset();
  if (round_ > cfg_.rounds) {
    end_federation("all rounds done", now_ms);
    return;
  }
  if (membership_.budget_spent() > 0 && membership_.could_train(cfg_.expected_silos) < cfg_.selection.min_silos) {
    // Silos' own privacy budgets: fewer silos can still train than a round needs, for good.
    end_federation("privacy budgets spent: " + std::to_string(membership_.budget_spent()) +
                       " silos can train no more, and a round needs " + std::to_string(cfg_.selection.min_silos),
                   now_ms);
    return;
  }
  if (central_budget_spent(now_ms)) return;
  set_phase(Phase::Joining, now_ms);
  if (stop_requested_) {
    end_federation("stopped by admin " + stopped_by_, now_ms);
    return;
  }
  join_elapsed_ = false;
  actions_.push_back(action::StartTimer{Timer::Join, cfg_.deadlines.join});
  try_start_round(now_ms);
}

void Coordinator::end_federation(const std::string& reason, std::int64_t now_ms) {
  set_phase(Phase::Finished, now_ms);
  actions_.push_back(action::CancelTimer{Timer::Join});
  for (const auto& [id, peer] : membership_.sessions()) {
    auto e = env();
    e.mutable_finished()->set_reason(reason);
    e.mutable_finished()->set_rounds(rounds_run());
    send(id, std::move(e));
  }
  actions_.push_back(action::Finished{.committed = committed_, .aborted = aborted_, .stopped_by_admin = stop_requested_, .reason = reason});
}

// ---- secure aggregation ---------------------------------------------------------------------

void Coordinator::on_secure_message(std::size_t m, const wire::Envelope& e, std::int64_t now_ms) {
  if (!r_->secure) {
    auto err = env();
    err.mutable_error()->set_code(wire::UNEXPECTED);
    err.mutable_error()->set_message("this round is not securely aggregated");
    send_to_member(m, std::move(err));
    return;
  }
  // Fed only while no job holds the groups (the finish runs on the worker), and not while the
  // unmask_begun record is written (the unmasking has not begun); each group takes the steps its
  // own stage expects and ignores the rest.
  if (phase_ == Phase::Collecting || (phase_ == Phase::Unmasking && job_ != JobKind::BeginUnmask)) {
    r_->secure->on_message(r_->members[m].silo, e.secure());
  }
  drain_secure();
  if (phase_ == Phase::Unmasking && job_ == JobKind::None && r_->secure->unmask_complete()) finish_unmask(now_ms);
  pump(now_ms);
}

void Coordinator::drain_secure() {
  for (auto& [silo, e] : r_->secure->take_out()) {
    for (auto& [member, keys] : protocol::advertised_keys(e.secure())) r_->run_keys[member] = std::move(keys);
    with_unmask_begun(e);
    if (auto m = member_named(silo)) send_to_member(*m, std::move(e));
  }
  for (const auto& d : r_->secure->take_dropped()) {
    if (auto m = member_named(d.silo)) {
      drop(*m, phase_ == Phase::Unmasking ? DropPhase::Unmask : DropPhase::Secure, secure_cause(d), d.why);
    }
  }
  if (r_->train_deferred && phase_ == Phase::Collecting && r_->secure->settled()) {
    r_->train_deferred = false;
    actions_.push_back(action::StartTimer{Timer::Train, cfg_.deadlines.train});
  }
}

// ---- jobs and output ------------------------------------------------------------------------

void Coordinator::run_job(JobKind kind, std::function<JobResult()> work) {
  job_ = kind;
  actions_.push_back(action::Job{++job_id_, std::move(work)});
}

void Coordinator::on_job_done(std::uint64_t job, JobResult result, std::int64_t now_ms) {
  if (job != job_id_ || job_ == JobKind::None) return;
  const JobKind kind = std::exchange(job_, JobKind::None);
  if (r_) r_->slot.drained(job);
  switch (kind) {
    case JobKind::Fold: folded(std::get<FoldResult>(std::move(result)), now_ms); break;
    case JobKind::BeginUnmask: {  // its unmask_begun record is durable: its head goes with each step
      const AuditHead head = std::get<CommitOutcome>(std::move(result)).audit;
      auto& h = r_->unmask_begun_head.emplace();
      h.set_seq(head.seq);
      h.set_sha256(head.sha256);
      h.set_signature(head.signature);
      r_->unmask_begun_line = head.line;
      begin_unmask(now_ms);
      break;
    }
    case JobKind::Prepare:
      for (const auto& rej : std::get<std::vector<Rejection>>(result)) {
        spdlog::warn("round {}: {}", round_, rej.why);
        ++totals_.secure_group_failures;
        for (const auto& silo : rej.silos) {
          auto m = member_named(silo);
          if (m && r_->members[*m].state == MemberState::Done) {
            drop(*m, DropPhase::Unmask, DropCause::SecureGroupFailed, rej.why);
          }
        }
      }
      decide(now_ms);
      break;
    case JobKind::Restore: restored(std::get<CommitOutcome>(std::move(result)), now_ms); break;
    case JobKind::Commit: {
      auto outcome = std::get<CommitOutcome>(std::move(result));
      r_->robust_rejected = outcome.robust_rejected;
      if (!outcome.committed) {
        ++aborted_;
        r_->abort_reason = outcome.reason;
        spdlog::warn("round {} aborted: {}", round_, outcome.reason);
        if (charged_on_abort()) central_spent_.add(round_dp_mechanism(), 1);
        keep_same(std::move(outcome.delta));
        finish_round(false, outcome.audit, now_ms);
        break;
      }
      if (outcome.delta) delta_ = broadcast_delta(std::move(outcome.delta), global_sha_);
      same_.reset();
      global_ = std::move(outcome.model);
      global_sha_ = outcome.model_sha256;
      if (outcome.next_clip_norm) clip_norm_ = outcome.next_clip_norm;
      if (cfg_.central_dp || cfg_.distributed_dp) central_spent_.add(round_dp_mechanism(), 1);
      ++committed_;
      ++version_;
      finish_round(true, outcome.audit, now_ms);
      break;
    }
    case JobKind::Record: {
      auto outcome = std::get<CommitOutcome>(std::move(result));
      ++aborted_;
      if (charged_on_abort()) central_spent_.add(round_dp_mechanism(), 1);  // as its record states
      keep_same(std::move(outcome.delta));
      finish_round(false, outcome.audit, now_ms);
      break;
    }
    case JobKind::Barrier: pump(now_ms); break;
    case JobKind::None: break;
  }
}

RoundSummary Coordinator::summary(bool committed, const std::string& reason, std::int64_t now_ms) const {
  RoundSummary s;
  s.federation = cfg_.federation;
  s.round = round_;
  s.committed = committed;
  s.reason = reason;
  s.started_ms = r_->started_ms;
  s.ended_ms = now_ms;
  s.members = &r_->members;
  s.target = r_->target;
  s.rule = std::string(robust::name(cfg_.aggregation.rule.rule));
  s.optimizer = optimizer_.config().kind;
  s.silo_momentum = cfg_.plan.silo_momentum();
  s.total_weight = r_->total_weight();
  s.upload_bytes = r_->upload_bytes;
  if (protocol::compressed(r_->compression)) s.compression = protocol::to_json(r_->compression);
  s.broadcast_bytes = r_->broadcast_bytes;
  if (protocol::compressed(cfg_.broadcast)) {
    s.broadcast = protocol::to_json(cfg_.broadcast);
    s.broadcast.erase("error_feedback");
    s.broadcast["deltas"] = r_->broadcast_deltas;
    s.broadcast["whole"] = r_->broadcast_wholes;
    if (!r_->broadcast_base.empty()) s.broadcast["base_sha256"] = r_->broadcast_base;
  }
  s.secure = r_->secure != nullptr;
  if (r_->secure) s.secure_groups = r_->secure->describe();
  s.regions = r_->regions;
  s.model_sha256_before = s.model_sha256_after = global_sha_;
  s.config_sha256 = cfg_.config_sha256;
  s.phases = r_->phases;
  if (buffered()) {
    s.schedule = to_json(cfg_.schedule);
    s.refused = r_->refused;
    s.rejoined = r_->rejoined;
  }
  return s;
}

}  // namespace xsilo::server
