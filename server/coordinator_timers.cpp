// The coordinator's timers: the join, training and upload deadlines, and the expiries of secure
// aggregation's key and unmask deadlines.
#include "server/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "server/coordinator_round.h"
#include "server/secure_round.h"

namespace xsilo::server {

// ---- timers ---------------------------------------------------------------------------------

// The join deadline: a model fetch has had its time; else the round starts with the silos there.
void Coordinator::join_deadline(std::int64_t now_ms) {
  if (fetch_) {
    fetch_->expired = true;  // a copy on its way still gets its upload deadline
    if (!fetch_->asking) fetch_expired();
    return;
  }
  join_elapsed_ = true;
  if (phase_ == Phase::Joining) {
    if (membership_.selectable() < cfg_.selection.min_silos) {
      spdlog::warn("round {}: {} of the {} silos needed are connected; waiting", round_,
                   membership_.selectable(), cfg_.selection.min_silos);
    }
    try_start_round(now_ms);
  }
}

// The training deadline: members still training are dropped and edges upload what they have,
// unless secure groups still wait for keys (then it starts again at their settlement).
void Coordinator::train_deadline(std::int64_t now_ms) {
  if (phase_ != Phase::Collecting) return;
  if (r_->secure && !r_->secure->settled()) {
    // Members mask (and announce) only once their group settles, which a hung member holds
    // up until the key deadlines pass. Dropping everyone still "training" now would blame
    // them all for the one (issue 37): the deadline starts again at the settlement.
    if (!r_->train_deferred) {
      spdlog::warn("round {}: the training deadline came while secure groups still wait for keys; it starts "
                   "again once they settle",
                   round_);
    }
    r_->train_deferred = true;
    return;
  }
  if (buffered()) return buffered_deadline(now_ms);
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
}

// The upload deadline: the holder of the upload slot (a silo, or an edge with its region) is
// dropped; a model fetch's copy that did not come whole is refused.
void Coordinator::upload_deadline(std::int64_t now_ms) {
  if (fetch_) {
    if (fetch_->asking && !fetch_->restoring) {
      fetch_refused("sent no whole copy within the upload deadline (" +
                    std::to_string(cfg_.deadlines.upload.count() / 1000) + " s)");
    }
    return;
  }
  if (phase_ != Phase::Collecting || !r_->upload_timer) return;
  // Every lane still receiving whose deadline has come (the timer is set for the earliest).
  const std::int64_t due = std::max(now_ms, *std::exchange(r_->upload_timer, std::nullopt));
  for (const auto lane : r_->slot.overdue(due)) {
    const Uploader u = *r_->slot[lane].holder();
    if (u.edge) {
      const Peer* p = membership_.peer(u.edge);
      drop_region(p ? p->name : "", DropPhase::Upload, DropCause::Deadline, "its edge missed the upload deadline");
      abandon_upload(lane);
    } else {
      drop(u.member, DropPhase::Upload, DropCause::Deadline, "missed the upload deadline");
    }
  }
  pump(now_ms);
}

void Coordinator::on_timer(Timer timer, std::int64_t now_ms) {
  switch (timer) {
    case Timer::Join:
      join_deadline(now_ms);
      break;
    case Timer::Train:
      train_deadline(now_ms);
      break;
    case Timer::SecAgg:
      if (phase_ != Phase::Collecting || !r_->secure) break;
      r_->secure->keys_deadline();
      drain_secure();
      if (!r_->secure->settled()) actions_.push_back(action::StartTimer{Timer::SecAgg, cfg_.secure.keys_deadline});
      pump(now_ms);
      break;
    case Timer::Unmask:
      if (phase_ == Phase::Unmasking && r_->secure->unmask_deadline()) {
        // Confirmations closed with those that came: now the unmask answers get their time.
        drain_secure();
        actions_.push_back(action::StartTimer{Timer::Unmask, cfg_.secure.unmask_deadline});
        if (r_->secure->unmask_complete()) finish_unmask(now_ms);
        break;
      }
      finish_unmask(now_ms);
      break;
    case Timer::Upload:
      upload_deadline(now_ms);
      break;
  }
}

}  // namespace xsilo::server
