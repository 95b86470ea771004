// The coordinator's buffered rounds (server/schedule.h, docs/buffered.md): a round is open to
// every connected silo, commits once `k` updates are folded (or at the training deadline, with
// what the buffer holds), and a silo still training when it commits goes on into the next round
// with the start it trains on. Each silo's messages carry the round of that start (its base
// round); model version v is the model of the federation's v-th commit (aborted rounds commit
// nothing, so versions and rounds part after an abort). The version and model a member's start
// was sent with are stored with it (its base version); its staleness is version_ - base version.
// An update is admitted by server::admit
// when it is announced and again when its upload is granted (it may have waited across a
// commit), and folded scaled by server::staleness_weight.
//
// A silo contributes at most one update to a commit: one whose update is folded waits for the
// commit, then gets the newest model with the next round's start (FedBuff's silos start again at
// once, on the version before the commit; this keeps each commit's record one entry per silo,
// and the round end that carries its audit head a witness of the commit that holds its update).
#include "server/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "protocol/privacy.h"
#include "protocol/round_start.h"
#include "server/coordinator_round.h"
#include "server/schedule.h"
#include "server/selection.h"

namespace xsilo::server {

void Coordinator::start_buffered(const std::vector<std::pair<std::string, SessionId>>& candidates,
                                 const wire::Envelope& start, std::int64_t now_ms) {
  r_->start = start;
  // One signature for every member: a plain round's start is the same for all.
  if (cfg_.signer) protocol::sign_round_start(*r_->start.mutable_round_start(), *cfg_.signer, cfg_.federation);
  std::set<std::string> carried;
  std::set<std::string> chosen;
  for (const auto& c : candidates) chosen.insert(c.first);
  for (auto& mb : std::exchange(carried_, {})) {
    const auto route = membership_.route_of(mb.silo);
    if (!route || *route != mb.session) continue;  // gone since, or back on another connection: a fresh start below
    // The selection's rules hold for carried members too (leaving, disowned, budget spent).
    if (!chosen.count(mb.silo)) continue;
    const bool ready = mb.state == MemberState::Ready;
    mb.times = {};
    if (ready) mb.times.ready = 0;
    carried.insert(mb.silo);
    r_->add(std::move(mb));
    if (ready) r_->slot.enqueue(Uploader{r_->members.size() - 1, 0});
  }
  for (const auto& [silo, session] : candidates) {
    const Peer* peer = membership_.peer(session);
    if (carried.count(silo) || !peer || peer->edge) continue;
    r_->add(newest_member(silo, session));
    send_start(r_->members.size() - 1);
  }
  pump(now_ms);  // a carried member's update may be ready already
}

void Coordinator::join_buffered(const std::string& silo, SessionId link, std::int64_t now_ms) {
  const auto known = member_named(silo);
  // A member of this round already, unless dropped: a dropped member (gone, failed, timed out)
  // takes part again on the newest version, so that no silo waits out a round that may not
  // commit for long (review B1). Not while its old upload is being folded.
  if (known && (r_->members[*known].state != MemberState::Dropped || r_->slot.lane_of(Uploader{*known, 0}))) return;
  // The same rules as at the round's start (a silo leaving, disowned or out of budget is not taken).
  const Selection selection = select(membership_.candidates(), round_, cfg_.selection, cfg_.seed);
  const bool eligible = std::any_of(selection.chosen.begin(), selection.chosen.end(),
                                    [&](const auto& c) { return c.first == silo; });
  if (!eligible) return;
  Member mb = newest_member(silo, link);
  std::size_t m = r_->members.size();
  if (known) {
    // Its drop stays in the record; its entry is the rejoined member from here on.
    m = *known;
    auto& old = r_->members[m];
    r_->rejoined.push_back({{"silo", silo},
                            {"phase", std::string(name(old.drop_phase))},
                            {"cause", std::string(name(old.drop_cause))},
                            {"reason", old.drop_reason},
                            {"rejoined", true}});
    if (old.drop_cause == DropCause::NonFinite) ++r_->rejoined_nonfinite;
    r_->set_state(old, mb.state);
    old = std::move(mb);
    spdlog::info("round {}: silo {}, dropped, rejoins the buffered round", round_, silo);
  } else {
    r_->add(std::move(mb));
    spdlog::info("round {}: silo {} joins the buffered round", round_, silo);
  }
  send_start(m);
  pump(now_ms);
}

bool Coordinator::admit_member(std::size_t m) {
  auto& mb = r_->members[m];
  const Admission adm = admit(cfg_.schedule, mb.base_version, version_);
  if (adm.admitted) {
    mb.staleness = adm.staleness;
    mb.staleness_weight = staleness_weight(cfg_.schedule, adm.staleness);
    return true;
  }
  r_->refused.push_back({{"silo", mb.silo},
                         {"base_version", mb.base_version},
                         {"staleness", adm.staleness},
                         {"reason", adm.reason}});
  restart_member(m, adm.reason);
  return false;
}

void Coordinator::restart_member(std::size_t m, const std::string& why) {
  auto& mb = r_->members[m];
  spdlog::warn("round {}: silo {}'s update refused: {}; it starts again on the newest version", round_, mb.silo, why);
  event("update_refused", mb.silo + ": " + why);
  send_round_end(m, false, "your update was refused: " + why);  // ends its round (of its base)
  r_->set_state(mb, MemberState::Training);
  mb = newest_member(mb.silo, mb.session);  // nothing of its refused update stays
  send_start(m);
}

void Coordinator::send_start(std::size_t m) {
  send_to_member(m, r_->start);
  send_model(r_->members[m].session, nullptr);
}

bool Coordinator::on_carried_message(const std::string& silo, SessionId id, const wire::Envelope& e) {
  if (!buffered() || phase_ == Phase::Collecting || carried_.empty()) return false;
  const auto it = std::find_if(carried_.begin(), carried_.end(),
                               [&](const Member& mb) { return mb.silo == silo && mb.session == id; });
  if (it == carried_.end() || e.round() != it->base_round) return false;
  using B = wire::Envelope::BodyCase;
  if (e.body_case() == B::kError) {
    if (e.error().code() != wire::TRAINING_FAILED || it->state != MemberState::Training) return true;  // logged
    // Its training failed: the next round starts it afresh (unless its own budget is spent,
    // as member_failed() marks it in a round).
    if (e.error().failure() == wire::PRIVACY_BUDGET_SPENT) {
      membership_.set_budget_spent(silo);
      event("privacy_budget_spent", silo);
    }
    carried_.erase(it);
    return true;
  }
  if (e.body_case() != B::kUpdateReady || it->state != MemberState::Training) return false;
  const auto& ready = e.update_ready();
  const bool bad_privacy = ready.has_privacy() && !protocol::check_privacy(ready.privacy());
  if (ready.num_samples() == 0 || bad_privacy) {
    spdlog::warn("silo {}: an unusable UpdateReady between rounds; it starts afresh in the next", silo);
    carried_.erase(it);  // the next round's start replaces its round
    return true;
  }
  // Kept for the next round, which grants its upload once its staleness is checked then.
  it->state = MemberState::Ready;
  it->num_samples = ready.num_samples();
  it->metrics = ready.metrics();
  if (ready.has_privacy()) it->privacy = ready.privacy();
  return true;
}

void Coordinator::buffered_deadline(std::int64_t now_ms) {
  // The longest a commit waits for its buffer: then it commits what it holds, if that is enough;
  // the silos still training go on into the next round. With too little folded it waits again
  // (an abort would only make every update in flight staler), but not forever (review B1): a
  // member training through max_staleness + 1 deadlines is dropped (a silo that hangs, or lost
  // its start), and a round still short of updates at its (max_staleness + 1)-th deadline
  // aborts, so that the next round's start reaches every connected silo.
  const std::uint64_t limit = cfg_.schedule.max_staleness + 1;
  ++r_->deadlines;
  for (std::size_t i = 0; i < r_->members.size(); ++i) {
    auto& mb = r_->members[i];
    if (mb.state != MemberState::Training || ++mb.deadlines < limit) continue;
    drop(i, DropPhase::Train, DropCause::Deadline,
         "still training after " + std::to_string(mb.deadlines) + " training deadlines");
  }
  if (r_->done() < commit_needs() && r_->deadlines < limit) {
    actions_.push_back(action::StartTimer{Timer::Train, cfg_.deadlines.train});
    return;
  }
  r_->train_elapsed = true;  // commits, or (too few updates) aborts once the uploads in flight end
  pump(now_ms);
}

}  // namespace xsilo::server
