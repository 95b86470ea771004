// The coordinator's per-round state, shared by its implementation files (coordinator*.cpp).
// Not part of the coordinator's interface.
#pragma once

#include <array>
#include <deque>
#include <set>
#include <unordered_map>

#include "protocol/tensor_stream.h"
#include "server/coordinator.h"

namespace xsilo::server {

// Everything that lives for one round, from selection to RoundEnd: a fresh one each round,
// so nothing of a round survives into the next by accident.
struct Coordinator::Round {
  std::int64_t started_ms = 0;
  std::vector<Member> members;
  std::size_t target = 0;
  bool train_elapsed = false;
  // Secure rounds: the training deadline came while the groups' key phases still waited (on a
  // hung member, up to keys_s a step): it starts again once they settle (drain_secure), so that
  // only the hung member misses it.
  bool train_deferred = false;
  std::unique_ptr<Aggregator> agg;
  wire::Compression compression;         // the silos' uploads (an edge's sum is dense)
  SecureRound* secure = nullptr;         // agg's secure protocol state, if the mode has one
  explicit Round(std::size_t lanes) : slot(lanes), uploads(slot.size()) {}
  protocol::UploadLanes<Uploader> slot;  // uploads being received, folded in grant order
  std::set<SessionId> edge_queued;       // edges whose region upload is queued or done
  // Each lane's upload, once its UpdateEnd arrived.
  struct Upload {
    Contribution contribution;
    std::vector<std::size_t> members;
    bool more = false;                   // an edge: another secure group's sum follows
    std::int64_t granted_ms = 0;         // when its lane was granted (its members' timeline)
  };
  std::vector<Upload> uploads;           // by lane
  std::optional<std::size_t> folding;    // the lane whose fold job runs
  std::optional<std::int64_t> upload_timer;  // the deadline the Upload timer is set for
  std::uint64_t upload_bytes = 0;
  // The model's broadcast: bytes of model data sent, and to how many sessions as a delta or whole.
  std::uint64_t broadcast_bytes = 0;
  std::size_t broadcast_deltas = 0, broadcast_wholes = 0;
  std::string broadcast_base;  // the delta's base model, when one went out
  std::string abort_reason;
  // Buffered rounds: the round's start as every member got it (a silo that joins mid-round, or
  // whose stale update was refused, is sent it then), and the updates refused (the record's
  // "refused").
  wire::Envelope start;
  nlohmann::json refused = nlohmann::json::array();
  // Buffered rounds: the training deadlines this round has passed, and the drops of members that
  // rejoined since (the record's dropouts keep them; NonFinite ones still count as such).
  std::uint64_t deadlines = 0;
  nlohmann::json rejoined = nlohmann::json::array();
  std::size_t rejoined_nonfinite = 0;
  bool unmask_begun = false;  // distributed DP: its unmask_begun record is written (or being written)
  // Distributed DP: the audit log's signed head after that record, sent with each step of the
  // unmasking (SecureAggregation.unmask_begun) so each silo binds its release to it.
  std::optional<wire::AuditHead> unmask_begun_head;
  std::string unmask_begun_line;  // that record's line, sent with the head
  // Each member's keys of this run as its group's key lists named them (protocol::advertised_keys):
  // the unmask_begun record names them, so it charges this run only.
  std::map<std::string, std::string> run_keys;
  // When each phase after collection began, in ms since started_ms (the record's "phases").
  std::vector<std::pair<std::string, std::int64_t>> phases;
  std::int64_t since_start(std::int64_t now_ms) const { return now_ms - started_ms; }
  nlohmann::json regions = nlohmann::json::array();  // each edge's folded partial sums (round_record's "regions")
  std::size_t robust_rejected = 0;
  // Members by name, and how many are in each state: messages of every silo ask both, so
  // neither may cost a scan of the round's silos (hundreds of them). add() and set_state()
  // keep them; nothing else adds members or changes their state.
  std::unordered_map<std::string, std::size_t> by_name;
  std::array<std::size_t, kMemberStates> in_state{};
  void add(Member m) {
    by_name.emplace(m.silo, members.size());
    ++in_state[static_cast<std::size_t>(m.state)];
    members.push_back(std::move(m));
  }
  void set_state(Member& m, MemberState s) {
    --in_state[static_cast<std::size_t>(m.state)];
    ++in_state[static_cast<std::size_t>(s)];
    m.state = s;
  }
  std::size_t count(MemberState s) const { return in_state[static_cast<std::size_t>(s)]; }
  std::size_t done() const { return count(MemberState::Done); }
  double total_weight() const {
    double w = 0;
    for (const auto& m : members) w += m.state == MemberState::Done ? m.weight : 0.0;
    return w;
  }
};

// While the last committed model is awaited (Coordinator::await_model, coordinator_fetch.cpp).
struct Coordinator::Fetch {
  std::uint64_t round = 0;
  std::string sha256;
  std::function<void(const Model&)> restore;
  std::string refusal;
  std::deque<std::pair<std::string, SessionId>> waiting;  // silos to ask, in the order they came
  std::optional<std::pair<std::string, SessionId>> asking;
  std::set<std::string> answered;        // asked, and could not give a usable copy
  std::vector<std::string> answers;      // what each said, for the refusal
  std::shared_ptr<Model> copy;           // the asked silo's copy, as it arrives
  protocol::TensorReceiver rx;
  bool restoring = false;
  bool expired = false;  // the join deadline passed: the silos here are asked, then it stops
  bool stopped = false;  // action::Stop was sent
};

}  // namespace xsilo::server
