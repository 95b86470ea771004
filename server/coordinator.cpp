#include "server/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "crypto/hash.h"
#include "proto/frame.h"
#include "server/secure_round.h"

namespace xsilo::server {

// Everything that lives for one round, from selection to RoundEnd: a fresh one each round,
// so nothing of a round survives into the next by accident.
struct Coordinator::Round {
  std::int64_t started_ms = 0;
  std::vector<Member> members;
  std::size_t target = 0;
  bool train_elapsed = false;
  std::unique_ptr<Aggregator> agg;
  SecureRound* secure = nullptr;         // agg's secure protocol state, if the mode has one
  protocol::UploadSlot<Uploader> slot;
  std::set<SessionId> edge_queued;       // edges whose region upload is queued or done
  // The upload in the slot, once its UpdateEnd arrived.
  Contribution upload;
  std::vector<std::size_t> upload_members;
  bool upload_more = false;              // an edge: another secure group's sum follows
  std::uint64_t upload_bytes = 0;
  std::string abort_reason;
  std::size_t done() const {
    return static_cast<std::size_t>(
        std::count_if(members.begin(), members.end(), [](const Member& m) { return m.state == MemberState::Done; }));
  }
  double total_weight() const {
    double w = 0;
    for (const auto& m : members) w += m.state == MemberState::Done ? m.weight : 0.0;
    return w;
  }
};

namespace {
const std::vector<Member> kNoMembers;
}  // namespace

Coordinator::Coordinator(RoundConfig cfg, Model initial, ServerOptimizer optimizer, Store& store,
                         std::uint64_t first_round)
    : cfg_(std::move(cfg)), optimizer_(std::move(optimizer)), store_(store), round_(first_round) {
  global_sha_ = crypto::sha256_hex(initial.flat());
  global_ = std::make_shared<const Model>(std::move(initial));
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
  const auto& ms = members();
  for (std::size_t i = 0; i < ms.size(); ++i) {
    if (ms[i].session == id) return i;
  }
  return std::nullopt;
}

std::optional<std::size_t> Coordinator::member_named(const std::string& silo) const {
  const auto& ms = members();
  for (std::size_t i = 0; i < ms.size(); ++i) {
    if (ms[i].silo == silo) return i;
  }
  return std::nullopt;
}

void Coordinator::send_to_member(std::size_t m, wire::Envelope e) {
  const auto& mb = r_->members[m];
  if (!mb.session || !membership_.peer(mb.session)) return;
  if (mb.relayed) e.set_silo(mb.silo);
  send(mb.session, std::move(e));
}

// ---- connections ---------------------------------------------------------------------------

void Coordinator::start(std::int64_t now_ms) {
  if (round_ > cfg_.rounds) {
    finish_round(false, now_ms);  // nothing left to do: resumed after the last round
    return;
  }
  phase_ = Phase::Joining;
  join_elapsed_ = false;
  actions_.push_back(action::StartTimer{Timer::Join, cfg_.deadlines.join});
  try_start_round(now_ms);
}

void Coordinator::on_connect(SessionId id, const std::string& silo, std::int64_t now_ms) {
  membership_.add_session(id, silo, false);
  silo_joined(silo, id, now_ms);
}

void Coordinator::on_edge_connect(SessionId id, const std::string& edge, std::int64_t /*now_ms*/) {
  membership_.add_session(id, edge, true);
  spdlog::info("edge {} connected", edge);
  if (phase_ == Phase::Finished) {
    auto e = env();
    e.mutable_finished()->set_reason("the federation has finished");
    e.mutable_finished()->set_rounds(cfg_.rounds);
    send(id, std::move(e));
  }
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
      silo_gone(silo, *old, "moved to another upstream", now_ms);
    }
  }
  membership_.route(silo, link);
  const Peer* via = membership_.peer(link);
  const bool via_edge = via && via->edge;
  if (auto m = member_named(silo); m && r_->members[*m].state == MemberState::Done && r_->secure) {
    // Its masked input is in the sum but its edge went away: it still holds shares for the
    // unmasking, so reach it through the new route (and ask again if it missed the request).
    auto& mb = r_->members[*m];
    mb.session = link;
    mb.relayed = via_edge;  // the record keeps the edge that carried its input
    if (phase_ == Phase::Unmasking) {
      if (auto req = r_->secure->unmask_request(silo)) send_to_member(*m, std::move(*req));
    }
  }
  spdlog::info("silo {} joined{} ({} connected)", silo, via_edge ? " via edge " + via->name : "",
               membership_.connected());
  if (phase_ == Phase::Finished) {
    if (!via_edge) {
      auto e = env();
      e.mutable_finished()->set_reason("the federation has finished");
      e.mutable_finished()->set_rounds(cfg_.rounds);
      send(link, std::move(e));
    }
    return;
  }
  try_start_round(now_ms);
}

// The route of `silo` through `link` is gone (the membership already forgot it).
void Coordinator::silo_gone(const std::string& silo, SessionId link, const std::string& why, std::int64_t now_ms) {
  spdlog::info("silo {} left: {} ({} connected)", silo, why, membership_.connected());
  if (!r_) return;
  if (r_->secure && phase_ == Phase::Collecting) {
    r_->secure->silo_gone(silo);
    drain_secure();
  }
  auto m = member_named(silo);
  if (!m) return;
  auto& mb = r_->members[*m];
  if (mb.session == link) {
    const bool mid_upload = r_->slot.held_by(Uploader{*m, 0}) && !r_->slot.complete();
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
    for (const auto& silo : gone) silo_gone(silo, id, "disconnected", now_ms);
    return;
  }
  spdlog::warn("edge {} disconnected; its {} silos are gone with it", peer.name, gone.size());
  if (r_ && r_->slot.held_by(Uploader{kNone, id}) && !r_->slot.complete()) abandon_upload();
  for (const auto& silo : gone) silo_gone(silo, id, "its edge " + peer.name + " disconnected", now_ms);
  if (r_) {
    for (auto& mb : r_->members) {
      if (mb.session == id) mb.session = 0;
    }
  }
  pump(now_ms);
}

void Coordinator::on_timer(Timer timer, std::int64_t now_ms) {
  switch (timer) {
    case Timer::Join:
      join_elapsed_ = true;
      if (phase_ == Phase::Joining) {
        if (membership_.connected() < cfg_.selection.min_silos) {
          spdlog::warn("round {}: {} of the {} silos needed are connected; waiting", round_,
                       membership_.connected(), cfg_.selection.min_silos);
        }
        try_start_round(now_ms);
      }
      break;
    case Timer::Train:
      if (phase_ != Phase::Collecting) break;
      r_->train_elapsed = true;
      for (std::size_t i = 0; i < r_->members.size(); ++i) {
        if (r_->members[i].state == MemberState::Training) {
          drop(i, DropPhase::Train, DropCause::Deadline, "missed the training deadline");
        }
      }
      // Edges still collecting are told to upload what they have now.
      for (const auto& [id, peer] : membership_.sessions()) {
        if (peer.edge && edge_pending(id) && r_->edge_queued.insert(id).second) r_->slot.enqueue(Uploader{kNone, id});
      }
      pump(now_ms);
      break;
    case Timer::SecAgg:
      if (phase_ != Phase::Collecting || !r_->secure) break;
      r_->secure->keys_deadline();
      drain_secure();
      if (!r_->secure->shared()) actions_.push_back(action::StartTimer{Timer::SecAgg, cfg_.secure.keys_deadline});
      pump(now_ms);
      break;
    case Timer::Unmask:
      finish_unmask();
      break;
    case Timer::Upload: {
      if (phase_ != Phase::Collecting || !r_->slot.busy() || job_ != JobKind::None) break;
      const Uploader u = *r_->slot.holder();
      if (u.edge) {
        const Peer* p = membership_.peer(u.edge);
        drop_region(p ? p->name : "", DropPhase::Upload, DropCause::Deadline, "its edge missed the upload deadline");
        abandon_upload();
      } else {
        drop(u.member, DropPhase::Upload, DropCause::Deadline, "missed the upload deadline");
      }
      pump(now_ms);
      break;
    }
  }
}

// ---- the round ------------------------------------------------------------------------------

void Coordinator::try_start_round(std::int64_t now_ms) {
  if (phase_ != Phase::Joining || job_ != JobKind::None) return;
  if (membership_.connected() < cfg_.selection.min_silos) return;
  // Only silos never seen are worth the join wait: one that was connected and has left joins
  // the next round when it comes back, and does not hold this one back.
  if (membership_.all_accounted_for(cfg_.expected_silos) || join_elapsed_) start_round(now_ms);
}

void Coordinator::start_round(std::int64_t now_ms) {
  actions_.push_back(action::CancelTimer{Timer::Join});
  std::vector<std::pair<std::string, SessionId>> candidates(membership_.routes().begin(), membership_.routes().end());
  std::mt19937_64 rng(cfg_.seed ^ (round_ * 0x9e3779b97f4a7c15ull));
  std::shuffle(candidates.begin(), candidates.end(), rng);
  const auto& sel = cfg_.selection;
  std::size_t n_select = candidates.size();
  std::size_t target = n_select;
  if (sel.silos_per_round > 0) {
    const auto want = static_cast<std::size_t>(
        std::ceil(static_cast<double>(sel.silos_per_round) * (1.0 + sel.over_selection)));
    n_select = std::min(n_select, want);
    target = std::min(sel.silos_per_round, n_select);
  }
  candidates.resize(n_select);
  std::sort(candidates.begin(), candidates.end());

  phase_ = Phase::Collecting;
  r_ = std::make_unique<Round>();
  r_->started_ms = now_ms;
  r_->target = target;
  std::vector<std::string> names;
  for (const auto& c : candidates) names.push_back(c.first);
  r_->agg = make_aggregator(cfg_, *global_, round_, names);
  r_->secure = r_->agg->secure();

  wire::Envelope start = env();
  auto* rs = start.mutable_round_start();
  rs->set_round(round_);
  *rs->mutable_plan() = cfg_.plan;
  for (const auto& t : global_->tensors()) {
    auto* spec = rs->add_tensors();
    spec->set_name(t.name);
    spec->set_dtype(wire::F32);
    for (auto d : t.shape) spec->add_shape(d);
  }
  rs->set_model_sha256(global_sha_);
  std::set<SessionId> edges;
  for (const auto& [silo, session] : candidates) {
    Member mb;
    mb.silo = silo;
    mb.session = session;
    const Peer* peer = membership_.peer(session);
    if (peer->edge) {
      mb.relayed = true;
      mb.edge = peer->name;
      edges.insert(session);
    }
    r_->members.push_back(std::move(mb));
    wire::Envelope mine = start;
    if (r_->secure) *mine.mutable_round_start()->mutable_secagg() = r_->secure->setup(r_->secure->group_of(silo));
    send_to_member(r_->members.size() - 1, std::move(mine));
    if (!peer->edge) actions_.push_back(action::SendModel{session, global_, round_});
  }
  // An edge receives the model once and passes it to its selected silos.
  for (auto edge : edges) actions_.push_back(action::SendModel{edge, global_, round_});
  if (r_->secure) {
    actions_.push_back(action::StartTimer{Timer::SecAgg, cfg_.secure.keys_deadline});
    drain_secure();
  }
  actions_.push_back(action::StartTimer{Timer::Train, cfg_.deadlines.train});
  spdlog::info("round {}/{}: {} silos selected, closing at {}", round_, cfg_.rounds, r_->members.size(), target);
  event("round_started", std::to_string(r_->members.size()) + " selected");
}

void Coordinator::pump(std::int64_t now_ms) {
  if (phase_ != Phase::Collecting || job_ != JobKind::None || r_->slot.busy()) return;
  if (r_->done() >= r_->target) return close_round(now_ms);
  auto eligible = [&](const Uploader& u) {
    if (u.edge) return membership_.peer(u.edge) != nullptr && edge_pending(u.edge);
    return r_->members[u.member].state == MemberState::Ready;
  };
  if (auto u = r_->slot.next(eligible)) return grant(*u);
  const bool anyone_left = std::any_of(r_->members.begin(), r_->members.end(), [](const Member& mb) {
    return mb.state == MemberState::Training || mb.state == MemberState::Ready;
  });
  if (!anyone_left || r_->train_elapsed) close_round(now_ms);
}

void Coordinator::close_round(std::int64_t now_ms) {
  phase_ = Phase::Closing;
  for (auto t : {Timer::Train, Timer::Upload, Timer::SecAgg}) actions_.push_back(action::CancelTimer{t});
  const bool enough = r_->done() >= r_->target;
  for (std::size_t i = 0; i < r_->members.size(); ++i) {
    auto& mb = r_->members[i];
    if (mb.state != MemberState::Training && mb.state != MemberState::Ready) continue;
    if (enough) {
      mb.state = MemberState::Surplus;
      send_round_end(i, false, "the round closed with enough updates; yours was not needed");
    } else {
      drop(i, mb.state == MemberState::Training ? DropPhase::Train : DropPhase::Upload, DropCause::StillPending,
           "still pending when the round closed");
    }
  }
  event("round_closed", std::to_string(r_->done()) + " updates");
  if (r_->secure) {
    // Ask each group's survivors for the shares that remove the masks.
    phase_ = Phase::Unmasking;
    r_->secure->begin_unmask();
    drain_secure();
    actions_.push_back(action::StartTimer{Timer::Unmask, cfg_.secure.unmask_deadline});
    if (r_->secure->unmask_complete()) finish_unmask();
    return;
  }
  decide(now_ms);
}

// Unmasking is over (every survivor answered, or the deadline): rebuild and decode the group
// sums on the worker. From here no secure message is fed to the groups.
void Coordinator::finish_unmask() {
  if (phase_ != Phase::Unmasking || job_ != JobKind::None) return;
  actions_.push_back(action::CancelTimer{Timer::Unmask});
  phase_ = Phase::Closing;
  run_job(JobKind::Prepare, [agg = r_->agg.get()]() -> JobResult { return agg->prepare(); });
}

void Coordinator::decide(std::int64_t now_ms) {
  phase_ = Phase::Closing;
  const std::size_t done = r_->done();
  const std::size_t need = std::max<std::size_t>(1, cfg_.selection.min_updates);
  if (done < need) {
    r_->abort_reason = "only " + std::to_string(done) + " updates arrived, " + std::to_string(need) + " needed";
    spdlog::warn("round {} aborted: {}", round_, r_->abort_reason);
    const auto s = summary(false, r_->abort_reason, now_ms);
    run_job(JobKind::Record, [&store = store_, rec = round_record(s), row = metrics_row(s)]() -> JobResult {
      store.record(rec, &row);
      return {};
    });
    return;
  }
  const auto s = summary(true, "", now_ms);
  CombineContext ctx;
  ctx.round = round_;
  ctx.nonfinite = static_cast<std::size_t>(std::count_if(r_->members.begin(), r_->members.end(), [](const Member& m) {
    return m.state == MemberState::Dropped && m.drop_cause == DropCause::NonFinite;
  }));
  run_job(JobKind::Commit, [agg = r_->agg.get(), &optimizer = optimizer_, &store = store_, global = global_,
                            round = round_, ctx, rec = round_record(s), row = metrics_row(s)]() mutable -> JobResult {
    auto next = std::make_shared<Model>(global->zeros_like());
    const Combined c = agg->combine(next->flat(), ctx);
    if (c.record.is_object()) rec.merge_patch(c.record);
    if (!c.ok) {
      rec["status"] = "aborted";
      rec["reason"] = c.reason;
      row.committed = false;
      store.record(rec, &row);
      return CommitOutcome{false, c.reason, nullptr, ""};
    }
    // The optimizer writes the new model into the same buffer, which becomes the global model.
    optimizer.step_into(global->flat(), next->flat());
    const std::string sha = crypto::sha256_hex(next->flat());
    rec["model_sha256_after"] = sha;
    store.commit(round, *next, optimizer.state(), rec, row);
    return CommitOutcome{true, "", std::move(next), sha};
  });
}

void Coordinator::finish_round(bool committed, std::int64_t now_ms) {
  if (phase_ == Phase::Closing && r_) {
    for (std::size_t i = 0; i < r_->members.size(); ++i) {
      if (r_->members[i].state == MemberState::Done) {
        send_round_end(i, committed, committed ? "committed" : r_->abort_reason);
      }
    }
    spdlog::info("round {} {}: {} updates, model {}", round_, committed ? "committed" : "aborted", r_->done(),
                 global_sha_.substr(0, 12));
    event(committed ? "round_committed" : "round_aborted", committed ? global_sha_ : r_->abort_reason);
    ++round_;
  }
  r_.reset();
  if (round_ > cfg_.rounds) {
    phase_ = Phase::Finished;
    for (const auto& [id, peer] : membership_.sessions()) {
      auto e = env();
      e.mutable_finished()->set_reason("all rounds done");
      e.mutable_finished()->set_rounds(cfg_.rounds);
      send(id, std::move(e));
    }
    actions_.push_back(action::Finished{committed_, aborted_});
    return;
  }
  phase_ = Phase::Joining;
  join_elapsed_ = false;
  actions_.push_back(action::StartTimer{Timer::Join, cfg_.deadlines.join});
  try_start_round(now_ms);
}

// ---- messages -------------------------------------------------------------------------------

void Coordinator::on_message(SessionId id, const wire::Envelope& e, std::int64_t now_ms) {
  const Peer* peer = membership_.peer(id);
  if (!peer) return;
  if (peer->edge) return on_edge_message(id, e, now_ms);
  using B = wire::Envelope::BodyCase;
  const auto body = e.body_case();
  if (body == B::kError) {
    spdlog::warn("silo {} reports an error: {}", peer->name, e.error().message());
    if (auto m = member_of(id)) member_failed(*m, e, now_ms);
    return;
  }
  const bool secure_body = body == B::kSecaggKeys || body == B::kSecaggShares || body == B::kSecaggUnmaskShares;
  if (body != B::kUpdateReady && body != B::kTensorChunk && body != B::kUpdateEnd && !secure_body) {
    send_error(id, wire::UNEXPECTED, "a silo may not send " + proto::body_name(e));
    return;
  }
  const auto m = member_of(id);
  if (secure_body && m && e.round() == round_) return on_secure_message(*m, e, now_ms);
  if (e.round() != round_ || phase_ != Phase::Collecting || !m) {
    send_error(id, wire::WRONG_ROUND,
               proto::body_name(e) + " for round " + std::to_string(e.round()) + ", but round " +
                   std::to_string(round_) +
                   (m && phase_ == Phase::Collecting ? " is collecting" : " does not expect it from you"));
    return;
  }
  switch (body) {
    case B::kUpdateReady: on_update_ready(*m, e, now_ms); break;
    case B::kTensorChunk: on_chunk(Uploader{*m, 0}, id, e, now_ms); break;
    case B::kUpdateEnd: on_update_end(*m, e, now_ms); break;
    default: break;
  }
}

void Coordinator::on_edge_message(SessionId id, const wire::Envelope& e, std::int64_t now_ms) {
  using B = wire::Envelope::BodyCase;
  const std::string edge = membership_.peer(id)->name;
  const auto body = e.body_case();
  if (body == B::kError) {
    spdlog::warn("edge {} reports{}: {}", edge, e.silo().empty() ? "" : " for silo " + e.silo(), e.error().message());
    const auto m = e.silo().empty() ? std::nullopt : member_named(e.silo());
    if (m && r_->members[*m].session == id) member_failed(*m, e, now_ms);
    return;
  }
  if (body == B::kRegionStatus) return on_region_status(id, e.region_status(), now_ms);
  if (!e.silo().empty()) {
    // Relayed from one of its silos: UpdateReady and the secure protocol (its uploads go into
    // the region's sum).
    const auto m = member_named(e.silo());
    const bool ours = m && r_->members[*m].session == id && e.round() == round_;
    const bool secure_body = body == B::kSecaggKeys || body == B::kSecaggShares || body == B::kSecaggUnmaskShares;
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
    case B::kTensorChunk: on_chunk(Uploader{kNone, id}, id, e, now_ms); break;
    case B::kUpdateEnd: on_region_end(id, e, now_ms); break;
    default: send_error(id, wire::UNEXPECTED, "an edge may not send " + proto::body_name(e));
  }
}

void Coordinator::on_region_status(SessionId id, const wire::RegionStatus& status, std::int64_t now_ms) {
  const std::string edge = membership_.peer(id)->name;
  const auto change = membership_.set_region(id, {status.silos().begin(), status.silos().end()});
  for (const auto& silo : change.left) {
    if (membership_.unroute(silo, id)) silo_gone(silo, id, "left edge " + edge, now_ms);
  }
  for (const auto& silo : change.joined) {
    if (!cfg_.any_silo && !cfg_.expected_silos.count(silo)) {
      send_error(id, wire::NOT_ALLOWED, "silo " + silo + " is not on the server's allow-list");
      continue;
    }
    membership_.join_region(id, silo);
    silo_joined(silo, id, now_ms);
  }
}

// A member that reports an error while it trains has failed its round (its trainer could not
// produce an update): it is a dropout now, not at the training deadline.
void Coordinator::member_failed(std::size_t m, const wire::Envelope& e, std::int64_t now_ms) {
  if (e.error().code() != wire::TRAINING_FAILED || phase_ != Phase::Collecting || e.round() != round_ ||
      r_->members[m].state != MemberState::Training) {
    return;
  }
  drop(m, DropPhase::Train, DropCause::TrainingFailed, "its training failed: " + e.error().message(), false);
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
  mb.state = MemberState::Ready;
  mb.num_samples = e.update_ready().num_samples();
  mb.metrics = e.update_ready().metrics();
  if (!mb.relayed) r_->slot.enqueue(Uploader{m, 0});  // an edge uploads for its silos
  pump(now_ms);
}

// ---- uploads --------------------------------------------------------------------------------

void Coordinator::grant(const Uploader& u) {
  r_->slot.open(u, r_->agg->buffer());
  const std::string who = u.edge ? "edge " + membership_.peer(u.edge)->name : "silo " + r_->members[u.member].silo;
  spdlog::info("round {}: upload slot to {}", round_, who);
  event("upload_granted", who);
  auto e = env();
  e.mutable_upload_grant();
  if (u.edge) {
    send(u.edge, std::move(e));
  } else {
    r_->members[u.member].state = MemberState::Uploading;
    send(r_->members[u.member].session, std::move(e));
  }
  actions_.push_back(action::StartTimer{Timer::Upload, cfg_.deadlines.upload});
}

void Coordinator::on_chunk(const Uploader& u, SessionId reply_to, const wire::Envelope& e, std::int64_t now_ms) {
  if (!r_->slot.held_by(u) || r_->slot.complete()) {
    send_error(reply_to, wire::UNEXPECTED, "TensorChunk without an open UploadGrant");
    return;
  }
  auto check = r_->slot.add(e.tensor_chunk());
  if (!check) {
    send_error(reply_to, check.status().code, check.status().message);
    fail_upload(u, DropPhase::Upload, DropCause::BadUpload, check.status().message);
    pump(now_ms);
    return;
  }
  // Hash (and, for plain updates, check) what this chunk wrote, while the next one arrives.
  actions_.push_back(action::Background{std::move(*check)});
}

void Coordinator::on_update_end(std::size_t m, const wire::Envelope& e, std::int64_t now_ms) {
  auto& mb = r_->members[m];
  const Uploader u{m, 0};
  if (mb.state != MemberState::Uploading || !r_->slot.held_by(u) || r_->slot.complete()) {
    send_error(mb.session, wire::UNEXPECTED, "UpdateEnd without an open UploadGrant");
    return;
  }
  const auto& end = e.update_end();
  std::string why = r_->slot.end("update");
  if (why.empty() && !r_->secure && (!std::isfinite(end.weight()) || end.weight() <= 0)) {
    why = "update weight must be a positive number";
  }
  actions_.push_back(action::CancelTimer{Timer::Upload});
  if (!why.empty()) {
    send_error(mb.session, wire::BAD_UPDATE, why);
    fail_upload(u, DropPhase::Upload, DropCause::BadUpload, why);
    pump(now_ms);
    return;
  }
  mb.weight = end.weight();
  r_->upload_bytes += r_->slot.bytes_received();
  r_->upload = Contribution{{mb.silo}, mb.weight, r_->secure ? r_->secure->group_of(mb.silo) : 0,
                            end.update_sha256(), false};
  r_->upload_members = {m};
  r_->upload_more = false;
  // Validate and fold off the network thread, after the chunks' checks (the worker's queue is
  // in order).
  run_job(JobKind::Fold, [agg = r_->agg.get(), c = r_->upload, check = r_->slot.check()]() -> JobResult {
    return agg->fold(c, *check);
  });
}

void Coordinator::on_region_end(SessionId id, const wire::Envelope& e, std::int64_t now_ms) {
  const Uploader u{kNone, id};
  if (!r_->slot.held_by(u) || r_->slot.complete()) {
    send_error(id, wire::UNEXPECTED, "UpdateEnd without an open UploadGrant");
    return;
  }
  const auto& end = e.update_end();
  const std::string edge = membership_.peer(id)->name;
  actions_.push_back(action::CancelTimer{Timer::Upload});
  // Contributors must be this edge's members of the round; their weights must add up.
  std::vector<std::size_t> who;
  double weight = 0;
  std::string why;
  for (const auto& c : end.contributors()) {
    const auto m = member_named(c.silo());
    if (!m || r_->members[*m].edge != edge || r_->members[*m].state == MemberState::Done ||
        std::find(who.begin(), who.end(), *m) != who.end()) {
      why = "edge " + edge + " lists " + c.silo() + ", which is not one of its silos in this round";
      break;
    }
    if (r_->secure) {
      if (r_->secure->group_of(c.silo()) != end.group() || end.group() == 0) {
        why = "edge " + edge + " put " + c.silo() + " into the partial sum of secure group " +
              std::to_string(end.group()) + ", which is not its group";
        break;
      }
    } else if (!std::isfinite(c.weight()) || c.weight() <= 0) {
      why = "edge " + edge + " lists a non-positive weight for " + c.silo();
      break;
    }
    who.push_back(*m);
    weight += c.weight();
  }
  if (why.empty() && who.empty()) {
    drop_region(edge, DropPhase::Upload, DropCause::NotInPartialSum, "its edge had no update from it");
    abandon_upload();
    pump(now_ms);
    return;
  }
  if (r_->secure) weight = end.weight();  // weights travel inside the masked sum
  if (why.empty()) why = r_->slot.end("partial sum");
  if (why.empty() && std::abs(weight - end.weight()) > 1e-6 * std::max(1.0, weight)) {
    why = "partial sum weight " + std::to_string(end.weight()) + " is not the sum of its contributors' " +
          std::to_string(weight);
  }
  if (!why.empty()) {
    send_error(id, wire::BAD_UPDATE, why);
    fail_upload(u, DropPhase::Upload, DropCause::BadUpload, why);
    pump(now_ms);
    return;
  }
  for (std::size_t k = 0; k < who.size(); ++k) {
    r_->members[who[k]].weight = end.contributors(static_cast<int>(k)).weight();
    r_->members[who[k]].num_samples = end.contributors(static_cast<int>(k)).num_samples();
  }
  r_->upload_bytes += r_->slot.bytes_received();
  r_->upload = Contribution{{}, weight, end.group(), end.update_sha256(), true};
  for (auto m : who) r_->upload.silos.push_back(r_->members[m].silo);
  r_->upload_members = who;
  r_->upload_more = end.more();
  run_job(JobKind::Fold, [agg = r_->agg.get(), c = r_->upload, check = r_->slot.check()]() -> JobResult {
    return agg->fold(c, *check);
  });
}

// The fold job is done: the upload is in the aggregate, or refused with the reason.
void Coordinator::folded(FoldResult r, std::int64_t now_ms) {
  const Uploader u = *r_->slot.holder();
  r_->slot.release();
  if (!r.ok()) {
    if (u.edge) {
      send_error(u.edge, wire::BAD_UPDATE, r.why);
      drop_region(r_->members[r_->upload_members.front()].edge, DropPhase::Validation, DropCause::EdgeRejected,
                  "its edge's partial sum was rejected: " + r.why);
    } else {
      send_error(r_->members[u.member].session, wire::BAD_UPDATE, r.why);
      drop(u.member, DropPhase::Validation,
           r.error == FoldError::NonFinite ? DropCause::NonFinite : DropCause::HashMismatch, r.why, false);
    }
    pump(now_ms);
    return;
  }
  for (auto m : r_->upload_members) {
    r_->members[m].state = MemberState::Done;
    r_->members[m].update_sha256 = r.sha256;
    if (r_->secure) r_->secure->masked_from(r_->members[m].silo);
  }
  if (u.edge) {
    const Peer* p = membership_.peer(u.edge);
    if (r_->upload_more && p) {
      grant(u);  // the edge has another secure group's partial sum: the slot again
      return;
    }
    drop_region(p ? p->name : r_->members[r_->upload_members.front()].edge, DropPhase::Upload,
                DropCause::NotInPartialSum, "its edge's partial sum did not include it");
  }
  pump(now_ms);
}

// The upload in the slot is refused: its silo, or the edge's unfinished silos, are dropped.
void Coordinator::fail_upload(const Uploader& u, DropPhase phase, DropCause cause, const std::string& why) {
  if (u.edge) {
    const Peer* p = membership_.peer(u.edge);
    std::string edge = p ? p->name : "";
    if (edge.empty() && !r_->upload_members.empty()) edge = r_->members[r_->upload_members.front()].edge;
    drop_region(edge, phase, cause, u.edge && cause == DropCause::BadUpload ? "its edge sent a bad partial sum: " + why
                                                                             : why);
  } else {
    drop(u.member, phase, cause, why, false);
  }
  abandon_upload();
}

void Coordinator::abandon_upload() {
  r_->slot.release();
  actions_.push_back(action::CancelTimer{Timer::Upload});
  // Its chunk checks may still be queued on the worker: let them drain before the next upload
  // reuses the buffer.
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
  if (r_->slot.held_by(Uploader{m, 0}) && !r_->slot.complete()) {
    abandon_upload();  // the half-received update is simply never folded in
  }
  mb.state = MemberState::Dropped;
  mb.drop_phase = phase;
  mb.drop_cause = cause;
  mb.drop_reason = reason;
  spdlog::warn("round {}: silo {} dropped in phase {}: {}", round_, mb.silo, name(phase), reason);
  if (notify) send_round_end(m, false, "you were dropped from this round: " + reason);
}

void Coordinator::send_round_end(std::size_t m, bool committed, const std::string& reason) {
  auto e = env();
  auto* re = e.mutable_round_end();
  re->set_committed(committed);
  re->set_reason(reason);
  re->set_model_sha256(global_sha_);
  send_to_member(m, std::move(e));
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
  // Key messages while collecting, unmask shares while unmasking; anything else is late.
  const bool keys = e.has_secagg_keys() || e.has_secagg_shares();
  if ((keys && phase_ == Phase::Collecting) || (e.has_secagg_unmask_shares() && phase_ == Phase::Unmasking)) {
    r_->secure->on_message(r_->members[m].silo, e);
  }
  drain_secure();
  if (phase_ == Phase::Unmasking && job_ == JobKind::None && r_->secure->unmask_complete()) finish_unmask();
  pump(now_ms);
}

void Coordinator::drain_secure() {
  for (auto& [silo, e] : r_->secure->take_out()) {
    if (auto m = member_named(silo)) send_to_member(*m, std::move(e));
  }
  for (const auto& [silo, why] : r_->secure->take_failed()) {
    if (auto m = member_named(silo)) {
      drop(*m, phase_ == Phase::Unmasking ? DropPhase::Unmask : DropPhase::Secure, DropCause::SecureGroupFailed, why);
    }
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
  switch (kind) {
    case JobKind::Fold: folded(std::get<FoldResult>(std::move(result)), now_ms); break;
    case JobKind::Prepare:
      for (const auto& rej : std::get<std::vector<Rejection>>(result)) {
        spdlog::warn("round {}: {}", round_, rej.why);
        for (const auto& silo : rej.silos) {
          auto m = member_named(silo);
          if (m && r_->members[*m].state == MemberState::Done) {
            drop(*m, DropPhase::Unmask, DropCause::SecureGroupFailed, rej.why);
          }
        }
      }
      decide(now_ms);
      break;
    case JobKind::Commit: {
      auto outcome = std::get<CommitOutcome>(std::move(result));
      if (!outcome.committed) {
        ++aborted_;
        r_->abort_reason = outcome.reason;
        spdlog::warn("round {} aborted: {}", round_, outcome.reason);
        finish_round(false, now_ms);
        break;
      }
      global_ = std::move(outcome.model);
      global_sha_ = outcome.model_sha256;
      ++committed_;
      finish_round(true, now_ms);
      break;
    }
    case JobKind::Record:
      ++aborted_;
      finish_round(false, now_ms);
      break;
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
  s.total_weight = r_->total_weight();
  s.upload_bytes = r_->upload_bytes;
  s.secure = r_->secure != nullptr;
  if (r_->secure) s.secure_groups = r_->secure->describe();
  s.model_sha256_before = s.model_sha256_after = global_sha_;
  s.config_sha256 = cfg_.config_sha256;
  return s;
}

}  // namespace xsilo::server
