// The round coordinator: a sans-I/O state machine. Connections, messages, timer expiries and
// finished jobs come in as calls; what to send, which timers to set and which CPU work to run
// come out as Actions. No sockets and no threads inside, so every dropout timing can be
// replayed deterministically in a unit test, and the same code runs behind the TLS daemon.
//
// A round: join -> select -> RoundStart + model -> silos train -> UpdateReady ->
// one upload at a time (UploadGrant, TensorChunks, UpdateEnd) folded into a running sum ->
// close at the target (or the deadline) -> aggregate + server optimizer -> checkpoint and
// audit record -> RoundEnd. Uploads are taken one at a time so that a silo that vanishes
// mid-upload never leaves half an update in the sum; the server holds the global model, the
// running sum and one upload buffer (3x the model) whatever the number of silos.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "common/model.h"
#include "crypto/hash.h"
#include "proto/xsilo.pb.h"
#include "server/config.h"
#include "server/optimizer.h"
#include "server/secure_round.h"
#include "server/store.h"
#include "transport/tensor_stream.h"

namespace xsilo::server {

using SessionId = std::uint64_t;
enum class Timer { Join, Train, Upload, SecAgg, Unmask };

namespace action {
struct Send {
  SessionId to;
  wire::Envelope env;
};
// Stream `model` as TensorChunks of at most `chunk_elems` elements.
struct SendModel {
  SessionId to;
  std::shared_ptr<const Model> model;
  std::uint64_t round;
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
// CPU or disk work: run `work` off the network thread, then call on_job_done(id).
struct Job {
  std::uint64_t id;
  std::function<void()> work;
};
struct Finished {
  std::uint64_t committed, aborted;
};
// Work for the same worker queue as Jobs, in order, without a completion call (hashing and
// checking an upload chunk by chunk while the next chunk is being received).
struct Background {
  std::function<void()> work;
};
}  // namespace action

using Action = std::variant<action::Send, action::SendModel, action::Close, action::StartTimer,
                            action::CancelTimer, action::Job, action::Finished, action::Background>;

struct CoordinatorConfig {
  std::string federation;
  std::string config_sha256;
  std::uint64_t rounds = 1;
  std::uint64_t seed = 1;
  SelectionConfig selection;
  Deadlines deadlines;
  wire::TrainingPlan plan;
  std::set<std::string> expected_silos;
  bool any_silo = true;   // the allow-list admits every silo ("*"); else only expected_silos
  std::string optimizer = "fedavg";
  AggregationConfig aggregation;
  SecureConfig secure;

  static CoordinatorConfig from(const ServerConfig& c);
};

enum class Phase { Joining, Collecting, Unmasking, Closing, Finished };
enum class MemberState { Training, Ready, Uploading, Done, Dropped, Surplus };

struct Member {
  std::string silo;
  SessionId session = 0;       // its own connection, or its edge's; 0 once gone
  bool via_edge = false;
  std::string edge;            // the edge that carries it, if any
  bool relayed = false;        // `session` is an edge's: messages to it name the silo
  MemberState state = MemberState::Training;
  std::string drop_phase, drop_reason;
  std::uint64_t num_samples = 0;
  double weight = 0;
  wire::TrainMetrics metrics;
  std::string update_sha256;
};

class Coordinator {
 public:
  Coordinator(CoordinatorConfig cfg, Model initial, ServerOptimizer optimizer, Store& store,
              std::uint64_t first_round);

  void start(std::int64_t now_ms);
  void on_connect(SessionId id, const std::string& silo, std::int64_t now_ms);
  // An edge aggregator: it announces its silos with RegionStatus, relays their messages with
  // Envelope.silo set, and uploads one partial sum for its region.
  void on_edge_connect(SessionId id, const std::string& edge, std::int64_t now_ms);
  void on_disconnect(SessionId id, std::int64_t now_ms);
  void on_message(SessionId id, const wire::Envelope& env, std::int64_t now_ms);
  void on_timer(Timer timer, std::int64_t now_ms);
  void on_job_done(std::uint64_t job, std::int64_t now_ms);

  std::vector<Action> take_actions() { return std::exchange(actions_, {}); }

  Phase phase() const { return phase_; }
  std::uint64_t round() const { return round_; }
  std::uint64_t committed() const { return committed_; }
  std::uint64_t aborted() const { return aborted_; }
  std::shared_ptr<const Model> model() const { return global_; }
  const std::string& model_sha256() const { return global_sha_; }
  const std::vector<Member>& members() const { return members_; }
  std::size_t connected() const { return routes_.size(); }

 private:
  enum class JobKind { None, Fold, Commit, Record, Barrier, Unmask };
  // Written by background work on the worker thread only.
  struct UploadCheck {
    crypto::Sha256 hash;
    bool finite = true;
  };
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  // Who uploads: one silo, or an edge with the partial sum of its region.
  struct Uploader {
    std::size_t member = kNone;
    SessionId edge = 0;
  };
  struct Peer {
    std::string name;
    bool edge = false;
    std::set<std::string> region;  // edges: the silos behind it
  };
  struct Upload {
    std::size_t member = kNone;
    SessionId edge = 0;
    std::vector<std::size_t> contributors;  // edge uploads: the members in the sum
    std::uint32_t group = 0;                // secure aggregation: the group of this (partial) sum
    bool more = false;                      // an edge sends another group's sum next
    transport::TensorReceiver rx;
    std::shared_ptr<UploadCheck> check = std::make_shared<UploadCheck>();
    std::string declared_sha256;
    bool complete = false;       // UpdateEnd arrived; being validated and folded
  };

  void try_start_round(std::int64_t now_ms);
  void start_round(std::int64_t now_ms);
  void pump(std::int64_t now_ms);
  void grant(const Uploader& u);
  void close_round(std::int64_t now_ms);
  void finish_round(bool committed, std::int64_t now_ms);
  void drop(std::size_t member, const std::string& phase, const std::string& reason,
            bool notify = true);
  void on_chunk(std::size_t member, const wire::Envelope& env, std::int64_t now_ms);
  void on_update_end(std::size_t member, const wire::Envelope& env, std::int64_t now_ms);
  void on_update_ready(std::size_t member, const wire::Envelope& env, std::int64_t now_ms);
  void on_edge_message(SessionId id, const wire::Envelope& env, std::int64_t now_ms);
  void on_region_end(SessionId id, const wire::Envelope& env, std::int64_t now_ms);
  void silo_joined(const std::string& silo, SessionId link, std::int64_t now_ms);
  void silo_gone(const std::string& silo, SessionId link, const std::string& why, std::int64_t now_ms);
  void abandon_upload();
  void send_to_member(std::size_t m, wire::Envelope env);
  std::optional<std::size_t> member_named(const std::string& silo) const;
  bool edge_pending(SessionId edge) const;
  void run_job(JobKind kind, std::function<void()> work);
  void send(SessionId to, wire::Envelope env) { actions_.push_back(action::Send{to, std::move(env)}); }
  void send_error(SessionId to, wire::ErrorCode code, const std::string& msg);
  void send_round_end(std::size_t member, bool committed, const std::string& reason);
  wire::Envelope env() const;
  std::optional<std::size_t> member_of(SessionId id) const;
  nlohmann::json round_record(bool committed, const std::string& reason, std::int64_t now_ms) const;
  MetricsRow metrics_row(bool committed, std::int64_t now_ms) const;
  // Runs the configured rule over rows_ into acc_; false when the round must abort.
  bool aggregate_robust(nlohmann::json& rec);
  void on_secure_message(std::size_t member, const wire::Envelope& env, std::int64_t now_ms);
  void drain_secure();
  void finish_unmask();
  // After unmasking: drops the members of groups that failed or whose sum proves that a
  // member skipped clipping, then decides like any round.
  void check_groups();
  void decide(std::int64_t now_ms);
  // Commit job, secure mode: the mean (or the robust rule across group means) into acc_.
  bool aggregate_groups(nlohmann::json& rec);
  void arm_receiver();

  CoordinatorConfig cfg_;
  std::shared_ptr<const Model> global_;
  std::string global_sha_;
  ServerOptimizer optimizer_;
  Store& store_;
  std::vector<Action> actions_;

  std::map<SessionId, Peer> sessions_;
  std::map<std::string, SessionId> routes_;  // silo -> its session or its edge's
  std::set<std::string> seen_;               // silos connected at some time since start

  Phase phase_ = Phase::Joining;
  std::uint64_t round_;
  std::uint64_t committed_ = 0, aborted_ = 0;
  bool join_elapsed_ = false;
  bool train_elapsed_ = false;
  std::int64_t round_started_ms_ = 0;
  std::vector<Member> members_;
  std::size_t target_ = 0;
  std::deque<Uploader> ready_;
  std::set<SessionId> edge_queued_;  // edges whose region upload is queued or done this round
  std::optional<Upload> upload_;
  std::size_t completed_ = 0;
  std::size_t nonfinite_rejected_ = 0;  // silos whose update had NaN/inf this round: Byzantine, caught
  double total_weight_ = 0;
  std::uint64_t upload_bytes_ = 0;
  std::unique_ptr<Model> acc_;   // running sum of weight * delta
  Model current_;                // one upload being received
  // Robust rules and clipping need every update (or, with secure groups, every group mean):
  // row i is row_label_[i]'s delta, with weight row_weight_[i].
  std::vector<float> rows_;
  std::vector<std::string> row_label_;
  std::vector<double> row_weight_;
  std::vector<double> row_norm_;
  // Secure aggregation: this round's groups, one masked upload buffer, the decoded sums.
  std::unique_ptr<SecureRound> secure_;
  std::vector<std::uint8_t> masked_buf_;
  std::vector<GroupResult> group_results_;
  bool commit_aborted_ = false;
  std::string abort_reason_;

  JobKind job_ = JobKind::None;
  std::uint64_t job_id_ = 0;
  bool fold_ok_ = false;
  std::string fold_error_, fold_sha_;
  std::shared_ptr<const Model> next_global_;
  std::string next_sha_;
};

std::string iso_time(std::int64_t unix_ms);

}  // namespace xsilo::server
