// The coordinator's broadcasts: which model each receiver is sent, whole or as the round's
// delta (or, after an aborted round, the step of zeros) from a base it said it holds, and what
// the round counts of them. The pacing of the streams is the daemon's
// (server/broadcast_planner.h).
#include <algorithm>
#include <set>

#include "protocol/compression.h"
#include "server/coordinator.h"
#include "server/coordinator_round.h"

namespace xsilo::server {

Coordinator::BroadcastDelta Coordinator::broadcast_delta(std::shared_ptr<const std::vector<wire::TensorChunk>> chunks,
                                                         std::string base) {
  BroadcastDelta d{std::move(chunks), std::move(base), 0};
  for (const auto& ch : *d.chunks) d.bytes += ch.data().size();
  return d;
}

// The delta this round offers: the one whose base more of the sessions the model goes to hold
// (the selected silos that connect directly, and their edges), none when no one holds either.
const Coordinator::BroadcastDelta* Coordinator::choose_offer(
    const std::vector<std::pair<std::string, SessionId>>& candidates) const {
  std::set<SessionId> receivers;
  for (const auto& c : candidates) receivers.insert(c.second);  // a relayed silo's session is its edge's
  auto holders = [&](const std::optional<BroadcastDelta>& d) {
    if (!d) return std::size_t{0};
    return static_cast<std::size_t>(std::count_if(receivers.begin(), receivers.end(), [&](SessionId id) {
      const Peer* p = membership_.peer(id);
      return p && p->held_model == d->base;
    }));
  };
  const std::size_t by_delta = holders(delta_), by_same = holders(same_);
  if (by_same > by_delta) return &*same_;
  if (by_delta > 0) return &*delta_;
  return nullptr;
}

// After an aborted round: the step of zeros the job made, kept until the next commit. When the
// job could not make one (a delta-coded -0.0 would come back +0.0), later aborts of the same
// model do not try again.
void Coordinator::keep_same(std::shared_ptr<const std::vector<wire::TensorChunk>> chunks) {
  if (!wants_same()) return;
  if (chunks) {
    same_ = broadcast_delta(std::move(chunks), global_sha_);
  } else {
    same_refused_ = global_sha_;
  }
}

// The round's model to one session: as the round's delta when the session said it holds the
// delta's base, else whole. Either way it holds no model the server knows of until it says so
// again.
void Coordinator::send_model(SessionId to, const BroadcastDelta* offer) {
  const Peer* peer = membership_.peer(to);
  const bool delta = offer && peer && peer->held_model == offer->base;
  membership_.model_sent(to, round_);
  if (delta) {
    actions_.push_back(action::SendModel{.to = to, .model = global_, .round = round_, .delta = offer->chunks});
    r_->broadcast_bytes += offer->bytes;
    r_->broadcast_base = offer->base;
    ++r_->broadcast_deltas;
  } else {
    actions_.push_back(action::SendModel{.to = to, .model = global_, .round = round_, .delta = nullptr});
    r_->broadcast_bytes += global_->size() * sizeof(float);
    ++r_->broadcast_wholes;
  }
}

// A session's word, in a message of round `round`, that it holds a model: kept when it is the
// current model (the base of the next delta) and said since the last model went to the session
// (a word from before it, arriving late, speaks of a model the session may have replaced).
void Coordinator::held_model(SessionId id, const std::string& sha256, std::uint64_t round) {
  if (!protocol::compressed(cfg_.broadcast)) return;
  membership_.set_held_model(id, sha256 == global_sha_ ? sha256 : "", round);
}

void Coordinator::on_model_sent(SessionId id, std::uint64_t round, std::int64_t now_ms) {
  if (!r_ || round != round_ || id == 0) return;
  for (auto& m : r_->members) {
    if (m.session == id && m.times.model_sent < 0) m.times.model_sent = r_->since_start(now_ms);
  }
}

}  // namespace xsilo::server
