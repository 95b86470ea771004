// The round coordinator: a sans-I/O state machine. Connections, messages, timer expiries and
// finished jobs come in as calls; what to send, which timers to set and which CPU work to run
// come out as Actions. No sockets and no threads inside, so every dropout timing can be
// replayed deterministically in a unit test, and the same code runs behind the TLS daemon.
//
// A round: join -> select -> RoundStart + model -> silos train -> UpdateReady ->
// up to uploads_at_once uploads at a time (UploadGrant, TensorChunks, UpdateEnd), each into a
// buffer of its own, folded in grant order by the round's Aggregator -> close at the target (or the deadline) -> [secure: unmask] -> combine + server
// optimizer -> checkpoint and audit record -> RoundEnd.
//
// Its parts: Membership (who is connected, through which session), protocol::UploadLanes (up to
// uploads_at_once uploads at a time, checked chunk by chunk, folded in grant order), an Aggregator per round (the arithmetic, on the
// worker), SecureRound (the secure groups' messages), round_record() and metrics_row().
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/model.h"
#include "common/result.h"
#include "proto/message.h"
#include "proto/xsilo.pb.h"
#include "protocol/compression.h"
#include "protocol/upload_slot.h"
#include "server/aggregator.h"
#include "server/membership.h"
#include "server/optimizer.h"
#include "server/round_config.h"
#include "server/round_record.h"
#include "server/store.h"

namespace xsilo::server {

enum class Timer { Join, Train, Upload, SecAgg, Unmask };

// What a commit job found: the round's new model, or why the round aborted after all.
struct CommitOutcome {
  bool committed = false;
  std::string reason;
  std::shared_ptr<const Model> model;
  std::string model_sha256;
  AuditHead audit;  // the audit log after the round's record
  std::optional<double> next_clip_norm;  // adaptive clipping: the next round's clip norm
  std::size_t robust_rejected = 0;        // inputs the robust rule left out
  // A compressed broadcast: `model` as a delta against the round's model (its chunks); for an
  // aborted round, the unchanged model as a step of zeros against itself.
  std::shared_ptr<const std::vector<wire::TensorChunk>> delta;
};
// The value a job returns to on_job_done (a CommitOutcome also for an aborted round's record).
using JobResult = std::variant<std::monostate, FoldResult, std::vector<Rejection>, CommitOutcome>;

namespace action {
struct Send {
  SessionId to;
  wire::Envelope env;
};
// Stream `model` as TensorChunks, or, when `delta` is set, those chunks: the model as a delta
// against the one the receiver holds (RoundStart.base_sha256).
struct SendModel {
  SessionId to;
  std::shared_ptr<const Model> model;
  std::uint64_t round;
  std::shared_ptr<const std::vector<wire::TensorChunk>> delta = nullptr;
};
struct Close {
  SessionId id;
  wire::ErrorCode code;
  std::string reason;
};
struct StartTimer {
  Timer timer;
  std::chrono::milliseconds after;
};
struct CancelTimer {
  Timer timer;
};
// CPU or disk work: run `work` off the network thread, then on_job_done(id, its result).
struct Job {
  std::uint64_t id;
  std::function<JobResult()> work;
};
struct Finished {
  std::uint64_t committed, aborted;
  bool stopped_by_admin = false;  // an operator's stop, not the last round: the server exits 0
  std::string reason;             // why it ended ("all rounds done", ...), into the audit record
};
// Work for the same worker queue as Jobs, in order, without a completion call (checking an
// upload chunk by chunk while the next chunk is being received).
struct Background {
  std::function<void()> work;
};
// The server cannot go on without its operator (a silo witnessed audit records this log does
// not hold): the daemon logs `reason` and exits with code 2, telling no one the federation ended.
struct Stop {
  std::string reason;
};
// A structured progress event for whoever watches (the daemon writes them to events.jsonl).
struct Event {
  std::string name;  // round_started, upload_granted, round_closed, round_committed, round_aborted
  std::uint64_t round;
  std::string detail;
};
}  // namespace action

using Action = std::variant<action::Send, action::SendModel, action::Close, action::StartTimer, action::CancelTimer,
                            action::Job, action::Finished, action::Background, action::Event, action::Stop>;

enum class Phase { Joining, Collecting, Unmasking, Closing, Finished };
// "join", "collect", "unmask", "commit", "finished": as status and metrics name them.
std::string_view name(Phase p);

// A finished round as operators see it (xsilo status): what happened and who was lost, why.
struct RoundOutcome {
  struct Dropout {
    std::string silo, phase, cause, reason;
  };
  std::uint64_t round = 0;
  bool committed = false;
  std::string reason;  // why it aborted
  std::int64_t started_ms = 0, ended_ms = 0;
  std::size_t selected = 0, updates = 0;
  std::uint64_t upload_bytes = 0;
  std::size_t robust_rejected = 0;  // inputs the robust rule left out
  std::vector<Dropout> dropouts;
};

// Running totals since the server started, for the metrics endpoint.
struct CoordinatorTotals {
  std::map<std::string, std::pair<double, std::uint64_t>> phase_seconds;  // by phase: seconds spent, times entered
  std::map<std::string, std::uint64_t> dropouts;                           // by cause
  std::uint64_t robust_rejected = 0;        // inputs a robust rule left out
  std::uint64_t secure_group_failures = 0;  // secure groups whose sum could not be used
  std::uint64_t upload_bytes = 0;           // of the updates and partial sums folded
  std::uint64_t admin_commands = 0;
};

class Coordinator {
 public:
  Coordinator(RoundConfig cfg, Model initial, ServerOptimizer optimizer, Store& store, std::uint64_t first_round);
  ~Coordinator();

  void start(std::int64_t now_ms);
  // The last committed model (round `round`, SHA-256 `sha256` as the audit log records it) is in
  // no copy the server holds (state.h, Resume::Missing). Call before start(): until a copy comes,
  // no round starts; each silo that connects (directly or through an edge) is asked for it
  // (ModelRequest), one at a time, and the first copy whose SHA-256 is `sha256` is taken:
  // `restore` (run on the worker) makes it that round's checkpoint and writes the start's
  // records, then the rounds go on from it. Each silo asked has the upload deadline to send its
  // copy. Once the join deadline has passed and every silo connected by then was asked in vain,
  // the daemon stops with `refusal` and what each silo answered (action::Stop: exit 2).
  void await_model(std::uint64_t round, std::string sha256, std::function<void(const Model&)> restore,
                   std::string refusal);
  bool awaiting_model() const { return fetch_ != nullptr; }
  void on_connect(SessionId id, const std::string& silo, std::int64_t now_ms);
  // An edge aggregator: it announces its silos with RegionStatus, relays their messages with
  // Envelope.silo set, and uploads one partial sum per region (per secure group, if any).
  void on_edge_connect(SessionId id, const std::string& edge, std::int64_t now_ms);
  void on_disconnect(SessionId id, std::int64_t now_ms);
  void on_message(SessionId id, const wire::Envelope& env, std::int64_t now_ms);
  // The same for a message read with its TensorChunk's data left in the frame (the daemon's:
  // transport::serve_messages); the data is copied once, into the upload's lane.
  void on_message(SessionId id, const proto::Message& msg, std::int64_t now_ms);
  void on_timer(Timer timer, std::int64_t now_ms);
  void on_job_done(std::uint64_t job, JobResult result, std::int64_t now_ms);
  // The model stream of round `round` to session `id` (a silo, or an edge) has been written to
  // its last byte: the members it reached get it in their timeline. Emits no action.
  void on_model_sent(SessionId id, std::uint64_t round, std::int64_t now_ms);

  std::vector<Action> take_actions() { return std::exchange(actions_, {}); }

  // An operator's command (xsilo admin), from `admin` (the name in its certificate). Pause and
  // stop take effect between rounds: the round in progress finishes first. Each command that
  // changes something is written to the audit log with the admin's name. Returns what
  // happened, for the reply; false when the command cannot apply (already paused, finished).
  std::pair<bool, std::string> admin(wire::AdminRequest::Command command, const std::string& admin, std::int64_t now_ms);
  // A server restarted while paused starts paused (the daemon keeps the flag in its state folder).
  void start_paused(const std::string& by) {
    paused_ = true;
    paused_by_ = by;
  }
  bool paused() const { return paused_; }
  bool stopping() const { return stop_requested_; }
  // The federation now, for xsilo status: round and phase, the round's members, connected
  // silos (with their certificates' expiry where the server saw them), the last rounds.
  nlohmann::json status(std::int64_t now_ms) const;
  const std::deque<RoundOutcome>& recent() const { return recent_; }
  const CoordinatorTotals& totals() const { return totals_; }
  // A silo's certificate expiry (seconds since the epoch) as its signed join through an edge
  // showed it, for status; the daemon knows the direct connections' own.
  std::optional<std::int64_t> relayed_not_after(const std::string& silo) const;

  Phase phase() const { return phase_; }
  std::uint64_t round() const { return round_; }
  std::uint64_t committed() const { return committed_; }
  // Rounds the federation has run to their end (committed or not), this start's and before: what
  // Finished tells the silos (an admin's stop ends it short of the config's rounds).
  std::uint64_t rounds_run() const { return round_ - 1; }
  // Buffered rounds: the newest model version, the number of commits in the federation so far
  // (aborted rounds commit nothing). A restarted server passes the committed rounds its audit
  // log holds (Resume::commits) before start().
  void resume_version(std::uint64_t commits) { version_ = commits; }
  std::uint64_t version() const { return version_; }
  std::uint64_t aborted() const { return aborted_; }
  std::shared_ptr<const Model> model() const { return global_; }
  const std::string& model_sha256() const { return global_sha_; }
  const std::vector<Member>& members() const;
  std::size_t connected() const { return membership_.connected(); }

 private:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  // Who uploads: one silo (a member), or an edge with the partial sum of its region.
  struct Uploader {
    std::size_t member = kNone;
    SessionId edge = 0;
    bool operator==(const Uploader&) const = default;
  };
  struct Round;  // everything that lives for one round (coordinator.cpp)
  enum class JobKind { None, Fold, BeginUnmask, Prepare, Commit, Record, Barrier, Restore };

  // Membership
  void silo_joined(const std::string& silo, SessionId link, std::int64_t now_ms);
  void silo_gone(const std::string& silo, SessionId link, const std::string& why, std::int64_t now_ms);
  // A TensorChunk's data, wherever it lies (in the Envelope, or in its frame: proto::Message).
  using ChunkData = std::span<const std::uint8_t>;
  void on_message(SessionId id, const wire::Envelope& env, ChunkData data, std::int64_t now_ms);
  void on_edge_message(SessionId id, const wire::Envelope& env, ChunkData data, std::int64_t now_ms);
  void on_leaving(const std::string& silo, SessionId via);
  // A silo's last witnessed audit head (docs/audit.md, "Witnesses").
  void on_witness(const std::string& silo, const wire::Witness& w);
  void on_region_status(SessionId id, const wire::RegionStatus& status, std::int64_t now_ms);
  // A fresh join nonce for an edge session, sent to it: every proof made for the old one is
  // void. On connect, and whenever a silo leaves the edge's region (so that the edge cannot
  // replay that silo's proof to claim it back).
  void challenge_edge(SessionId edge);
  // The last committed model asked of the silos (await_model; coordinator_fetch.cpp)
  struct Fetch;
  void fetch_from(const std::string& silo, SessionId link);
  void ask_next_holder();
  // A ModelOffer or a TensorChunk from `silo` (through `link`) while the model is awaited.
  void on_fetch_message(const std::string& silo, SessionId link, const wire::Envelope& e, ChunkData data);
  // The silo asked cannot give a usable copy (`why`): the next one is asked.
  void fetch_refused(const std::string& why);
  void fetch_link_gone(SessionId link);
  void restored(CommitOutcome outcome, std::int64_t now_ms);
  void fetch_expired();
  // Round lifecycle
  void try_start_round(std::int64_t now_ms);
  void start_round(std::int64_t now_ms);
  // on_timer()'s longer cases.
  void join_deadline(std::int64_t now_ms);
  void train_deadline(std::int64_t now_ms);
  void upload_deadline(std::int64_t now_ms);
  // start_round()'s steps.
  void add_audit_key(wire::RoundStart& rs) const;
  void pump(std::int64_t now_ms);
  void held_model(SessionId id, const std::string& sha256, std::uint64_t round);
  void close_round(std::int64_t now_ms);
  void finish_unmask(std::int64_t now_ms);
  void set_phase(Phase p, std::int64_t now_ms);
  // Tells every connected silo and edge that the federation is over, and the daemon to stop.
  void end_federation(const std::string& reason, std::int64_t now_ms);
  // Silo-level central DP: when another committed round would pass the budget, ends the
  // federation (audited, with the reason) and returns true.
  bool central_budget_spent(std::int64_t now_ms);
  // Silo-level DP, either mode: this round's mechanism (distributed: as its signed setup states
  // it, whatever the config says) and its record part for the spend `spent`; whether an aborted
  // round is charged (distributed DP once its unmask_begun was written: the server asked for the
  // shares that may unmask its noisy sums).
  std::pair<wire::SkellamSetup, std::size_t> signed_skellam() const;
  privacy::Mechanism round_dp_mechanism() const;
  nlohmann::json privacy_record(const privacy::Ledger& spent) const;
  bool charged_on_abort() const;
  // Distributed DP: the "unmask_begun" record written before any silo is asked for unmask shares
  // (the round, its signed parameters, the spend were it charged; all known when collection
  // closes). From then on the round is charged, aborted or not.
  nlohmann::json unmask_begun_record(std::int64_t now_ms) const;
  void with_unmask_begun(wire::Envelope& e) const;
  // A secure round: asks each group's survivors for the shares that remove the masks.
  void begin_unmask(std::int64_t now_ms);
  void audit_admin(const std::string& command, const std::string& admin, std::int64_t now_ms);
  void decide(std::int64_t now_ms);
  void record_abort(std::int64_t now_ms);
  void finish_round(bool committed, const AuditHead& audit, std::int64_t now_ms);
  // Uploads
  void on_update_ready(std::size_t member, const wire::Envelope& env, std::int64_t now_ms);
  void member_failed(std::size_t member, const wire::Envelope& error, std::int64_t now_ms);
  void grant(const Uploader& u, std::size_t lane, std::int64_t now_ms);
  void arm_upload_timer(std::int64_t now_ms);
  bool fold_next();
  void on_chunk(const Uploader& u, SessionId reply_to, const wire::Envelope& env, ChunkData data, std::int64_t now_ms);
  void on_update_end(std::size_t member, const wire::Envelope& env, std::int64_t now_ms);
  void on_region_end(SessionId edge, const wire::Envelope& env, std::int64_t now_ms);
  struct Contributors {
    std::vector<std::size_t> members;
    double weight = 0;  // their weights' sum
  };
  Result<Contributors> check_contributors(const std::string& edge, const wire::UpdateEnd& end) const;
  void folded(FoldResult r, std::int64_t now_ms);
  void fail_upload(const Uploader& u, DropPhase phase, DropCause cause, const std::string& why);
  // A plain upload's weight above the plan's cap (review N5: one silo claiming 1e300 decided a step).
  bool heavier_than_allowed(double weight) const {
    return cfg_.plan.max_weight() > 0 && weight > static_cast<double>(cfg_.plan.max_weight()) * (1 + 1e-6);
  }
  void abandon_upload(std::size_t lane);
  // Secure aggregation
  void on_secure_message(std::size_t member, const wire::Envelope& env, std::int64_t now_ms);
  void drain_secure();
  // Members
  void drop(std::size_t member, DropPhase phase, DropCause cause, const std::string& reason, bool notify = true);
  // The members an edge carries this round that have not finished.
  void drop_region(const std::string& edge, DropPhase phase, DropCause cause, const std::string& reason);
  bool edge_pending(SessionId edge) const;
  std::optional<std::size_t> member_of(SessionId id) const;
  std::optional<std::size_t> member_named(const std::string& silo) const;
  void send_to_member(std::size_t m, wire::Envelope env);
  // `audit`: the log's signed head after the round's record, for the silo to keep as a witness.
  void send_round_end(std::size_t member, bool committed, const std::string& reason, const AuditHead* audit = nullptr);
  // Buffered rounds (coordinator_buffered.cpp)
  bool buffered() const { return cfg_.schedule.buffered(); }
  // The updates a round needs to commit: selection.min_updates (at least 1), at most k when buffered.
  std::size_t commit_needs() const {
    const std::size_t need = std::max<std::size_t>(1, cfg_.selection.min_updates);
    return buffered() ? std::min(need, cfg_.schedule.k) : need;
  }
  // The round's members carried over from the last commit (still training, or ready), then a
  // start for every other connected silo.
  void start_buffered(const std::vector<std::pair<std::string, SessionId>>& candidates, const wire::Envelope& start,
                      std::int64_t now_ms);
  // A silo that connects while a buffered round collects takes part at once.
  void join_buffered(const std::string& silo, SessionId link, std::int64_t now_ms);
  // Whether member `m`'s update may join the buffer now (server::admit); when not, the refusal
  // goes into the record and the member starts again on the newest version.
  bool admit_member(std::size_t m);
  void restart_member(std::size_t m, const std::string& why);
  // A member starting (again) on the newest version; send_start sends a buffered member that
  // start: the round's start and the newest model.
  Member newest_member(const std::string& silo, SessionId session) const {
    Member mb;
    mb.silo = silo;
    mb.session = session;
    based_on_newest(mb);
    return mb;
  }
  void send_start(std::size_t m);
  // Between commits (the commit job, a pause) carried members' messages are kept for the next
  // round: true when `e` from `silo` was one of theirs.
  bool on_carried_message(const std::string& silo, SessionId id, const wire::Envelope& e);
  // A member's start: its base round, version and model are the round's and the newest.
  void based_on_newest(Member& mb) const {
    mb.base_round = round_;
    mb.base_version = version_;
    mb.base_sha256 = global_sha_;
  }
  // The buffered train deadline: drops members training through max_staleness + 1 deadlines;
  // commits what the buffer holds, if enough; else waits again, up to max_staleness + 1
  // deadlines, then aborts (docs/buffered.md, "Deadlines").
  void buffered_deadline(std::int64_t now_ms);
  // Output
  RoundSummary summary(bool committed, const std::string& reason, std::int64_t now_ms) const;
  void run_job(JobKind kind, std::function<JobResult()> work);
  void send(SessionId to, wire::Envelope env) { actions_.push_back(action::Send{to, std::move(env)}); }
  void send_error(SessionId to, wire::ErrorCode code, const std::string& msg);
  void event(std::string name, std::string detail = {}) {
    actions_.push_back(action::Event{std::move(name), round_, std::move(detail)});
  }
  wire::Envelope env() const;

  RoundConfig cfg_;
  std::shared_ptr<const Model> global_;
  std::string global_sha_;
  // A compressed broadcast (cfg_.broadcast): global_ as a delta against the model before the
  // last commit (`delta_`), for receivers that hold that one, and, after an aborted round, as a
  // step of zeros against itself (`same_`), for receivers that hold global_ already. A round
  // offers the one more of its receivers hold (choose_offer); the others get the whole model.
  struct BroadcastDelta {
    std::shared_ptr<const std::vector<wire::TensorChunk>> chunks;
    std::string base;  // the model it applies to
    std::uint64_t bytes = 0;
  };
  void send_model(SessionId to, const BroadcastDelta* offer);
  const BroadcastDelta* choose_offer(const std::vector<std::pair<std::string, SessionId>>& candidates) const;
  // start_round()'s last step: each selected silo's round start, and the model.
  void send_round_start(const wire::Envelope& start, const std::vector<std::pair<std::string, SessionId>>& candidates,
                        const BroadcastDelta* offer);
  bool wants_same() const { return protocol::compressed(cfg_.broadcast) && !same_ && same_refused_ != global_sha_; }
  void keep_same(std::shared_ptr<const std::vector<wire::TensorChunk>> chunks);
  static BroadcastDelta broadcast_delta(std::shared_ptr<const std::vector<wire::TensorChunk>> chunks, std::string base);
  std::optional<BroadcastDelta> delta_, same_;
  std::string same_refused_;  // the model no step of zeros can rebuild bit for bit
  std::optional<double> clip_norm_;  // adaptive clipping: this round's clip norm
  ServerOptimizer optimizer_;  // touched by commit jobs only, one at a time
  Store& store_;
  std::vector<Action> actions_;
  Membership membership_;

  Phase phase_ = Phase::Joining;
  std::uint64_t round_;
  std::uint64_t committed_ = 0, aborted_ = 0;
  std::uint64_t version_ = 0;  // commits in the federation so far (this start's and before)
  bool join_elapsed_ = false;
  std::unique_ptr<Round> r_;  // the round in progress (Collecting, Unmasking, Closing)
  // Buffered rounds: the members still training (or ready) when the last round closed; the next
  // round takes them over with their base rounds.
  std::vector<Member> carried_;
  std::unique_ptr<Fetch> fetch_;  // set while the last committed model is awaited
  JobKind job_ = JobKind::None;
  std::uint64_t job_id_ = 0;
  std::int64_t phase_since_ms_ = 0;
  bool paused_ = false, stop_requested_ = false;
  std::string paused_by_, stopped_by_;
  static constexpr std::size_t kRecentRounds = 10;
  std::deque<RoundOutcome> recent_;
  CoordinatorTotals totals_;
  // Each silo's last record-level privacy spend the server took in (xsilo status).
  std::map<std::string, wire::PrivacySpend> privacy_;
  // Silo-level central DP: every committed round's mechanism, from the audit chain at start on.
  privacy::Ledger central_spent_;
  std::map<std::string, std::int64_t> relayed_not_after_;
};

}  // namespace xsilo::server
