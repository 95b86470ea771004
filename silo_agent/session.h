// The silo's side of a round, sans-I/O: messages from the upstream (an edge or the server; the
// silo cannot tell which) in, Actions out. The daemon (agent.cpp) feeds it from the TLS
// channel; the unit tests feed it directly.
//
//   RoundStart -> model chunks -> [secure: setup checked, keys out at once] -> train (a worker job)
//   -> [secure: key list -> shares out; share delivery -> receipt; settled -> mask (a worker
//   job)] -> UpdateReady -> UploadGrant -> chunks + UpdateEnd (and a line in the silo's own
//   send log) -> [secure: survivors -> confirmation; unmask request -> sealed shares] -> RoundEnd
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "common/thread_check.h"
#include "crypto/secagg.h"
#include "crypto/sources.h"
#include "proto/xsilo.pb.h"
#include "protocol/masked.h"
#include "protocol/round_start.h"
#include "protocol/tensor_stream.h"
#include "silo_agent/model_receipt.h"
#include "silo_agent/secure_client.h"
#include "silo_agent/session_types.h"
#include "silo_agent/trainer.h"
#include "silo_agent/update.h"

namespace xsilo::agent {

namespace action {
struct Send {
  wire::Envelope env;
};
struct SendStream {  // an update's chunks, produced lazily from the buffer
  std::shared_ptr<protocol::ChunkSource> source;
  bool update = true;  // false: the global model a restarted server asked for (not an upload)
};
// Work for the worker thread; its result comes back through on_job_done. Jobs run on that one
// thread, one at a time (checked: common/thread_check.h).
struct Job {
  std::uint64_t id;
  std::function<SessionJobResult()> work;
};
// A line for one of the silo's own logs in its state folder: what it sent (hashes, never
// data), or the server's signed audit heads it witnessed.
struct Record {
  nlohmann::json entry;
  std::string log = "sent.jsonl";
  // Once the line is durable: `staged` (a file a job wrote) is renamed onto `onto`
  // (silo_state.h: the error feedback moves on with its upload's line).
  std::filesystem::path staged{}, onto{};
  // The actions after it must not run unless the line is durable: the line carries a privacy
  // spend, and an update whose spend is not on record would leave the budget behind.
  bool required = false;
};
struct Finished {};
// The trainer failed too many rounds in a row: stop with this reason.
struct Fatal {
  std::string reason;
};
}  // namespace action

using Action = std::variant<action::Send, action::SendStream, action::Job, action::Record, action::Finished,
                            action::Fatal>;

struct SessionConfig {
  std::string federation;
  std::size_t chunk_bytes = 1u << 20;
  // This silo's certificate key and the federation CA: the silo signs what it says in secure
  // aggregation and checks what its group and the server say. Secure rounds need both.
  std::optional<crypto::CertSigner> signer;
  std::optional<crypto::CertVerifier> ca;
  // The wall clock (the times in the silo's own logs) and randomness (the encoding's rounding),
  // which the session never takes from the world itself.
  crypto::Sources sources = crypto::Sources::system();
  // When not empty, only a server certificate with one of these names may run this silo's
  // secure groups (pinning, on top of the CA).
  std::set<std::string> servers;
  // Where the silo's momentum (TrainingPlan.silo_momentum) is kept across rounds and restarts;
  // empty: in memory only.
  std::filesystem::path momentum_file;
  // Where the silo's error feedback (what compression left out, docs/compression.md) is kept
  // across rounds and restarts; empty: in memory only.
  std::filesystem::path residual_file;
  // A RoundStart whose model has more elements is refused (protocol::check_layout).
  std::uint64_t max_model_elements = protocol::kMaxModelElements;
  // The last audit head this silo witnessed (state_dir/audit_heads.jsonl) and the key it checked
  // it under: sent to the upstream after each connection, and the key this silo takes part
  // under (or a key rotations signed by it lead to). Unset: nothing witnessed yet.
  std::optional<wire::Witness> witnessed;
  // The audit records ("SEQ:SHA256") this silo released unmask shares against under distributed
  // DP (state_dir/sent.jsonl: unmask_releases): it releases against each once.
  std::set<std::string> unmask_released;
  // The weakest secure setup this silo joins (the agent's secure_floor), whatever the server signs.
  crypto::secagg::Floor floor;
  // The largest message this silo's transport carries (transport.max_frame_bytes): a secure
  // setup whose steps could not fit (LightSecAgg's encoded shares) is refused before any work.
  std::size_t max_message_bytes = std::size_t{4} << 20;
};

class Session {
 public:
  // `trainer` and `hook` outlive the session; jobs call the trainer on the worker thread.
  Session(SessionConfig cfg, Trainer& trainer, FaultHook& hook);

  // A new connection to an upstream at address `upstream`: `identity` is the name its Welcome
  // says we have, `upstream_name` the name in its TLS certificate (`upstream_identity` that name
  // with its role, for logs).
  void on_connected(const std::string& identity, const std::string& upstream, const std::string& upstream_name,
                    const std::string& upstream_identity);
  // The connection is gone: work in flight is moot (the secure client stays, to answer an
  // unmask request that finds it through another route).
  void on_disconnected();
  void on_message(const wire::Envelope& e);
  void on_job_done(std::uint64_t id, SessionJobResult result);

  // The preferred upstream is back: ask this one to select the silo for no more rounds
  // (wire Leaving). Once it has answered, any round that selected the silo has started.
  void request_leave();
  // Answered, and in no round: the silo can leave without dropping out of anything.
  bool may_leave() const { return leave_granted_ && !in_round_; }

  std::vector<Action> take_actions() { return std::exchange(actions_, {}); }
  bool in_round() const { return in_round_; }
  bool finished() const { return finished_; }
  const std::string& name() const { return name_; }

 private:
  void on_join_challenge(const wire::Envelope& e);
  void on_round_start(const wire::Envelope& e);
  bool accept_round_start(const wire::RoundStart& rs);
  void witness(const wire::Envelope& round_end);
  // Secure aggregation: the secure client's answers sent, its refusals answered and logged.
  void start_secure(const wire::SecAggSetup& setup);
  void on_secure(const wire::Envelope& e);
  // Distributed DP: whether the unmask request `step` shows the record that charges this run
  // (checked before the member sees it), the members' keys of the run from the key list the member
  // accepted, and the line of sent.jsonl that says this silo released its unmask shares.
  Status check_unmask_begun(const wire::SecureAggregation& step) const;
  Status take_run_keys(const wire::SecureAggregation& accepted);
  void record_unmask_release(const wire::SecureAggregation& step);
  void on_model_chunk(const wire::Envelope& e);
  // A restarted server lost its last committed model and asks for it (ModelRequest): the
  // model this silo holds goes up if it is the one asked for, and a ModelOffer says which.
  void on_model_request(const wire::Envelope& e);
  void on_model();
  void on_streamed_model();
  void trained(TrainDone r);
  void mask_when_ready();
  void masked(MaskDone r);
  void upload();
  void announce_ready();
  void reply_error(wire::ErrorCode code, const std::string& msg);
  // TRAINING_FAILED with a reason code and its fixed text (protocol/failure.h), never the
  // trainer's own words.
  void reply_failure(wire::FailureReason reason);
  void send(wire::Envelope e);
  // Fresh randomness for a job (drawn here, on the network thread, from cfg_.sources).
  std::uint64_t draw_seed() const;
  void job(std::function<SessionJobResult()> work);
  wire::Envelope env() const;

  SessionConfig cfg_;
  Trainer& trainer_;
  FaultHook& hook_;
  std::vector<Action> actions_;
  std::string name_, upstream_, upstream_name_, upstream_identity_;
  bool connected_ = false, finished_ = false, silent_ = false;
  bool leave_requested_ = false, leave_granted_ = false;  // on this connection

  // The round in progress. `generation_` moves on with every round and connection: a job's
  // result for an older generation is dropped.
  std::uint64_t generation_ = 0;
  // The generation, for jobs to look at on the worker before they start.
  std::shared_ptr<std::atomic<std::uint64_t>> live_generation_ = std::make_shared<std::atomic<std::uint64_t>>(0);
  std::uint64_t job_id_ = 0;
  std::map<std::uint64_t, std::uint64_t> job_generation_;
  std::shared_ptr<ThreadCheck> worker_ = std::make_shared<ThreadCheck>();  // shared with the queued jobs
  bool in_round_ = false;
  std::uint64_t round_ = 0;
  std::uint64_t round_failed_ = 0;  // the round whose model this silo refused (0: none)
  std::string start_nonce_;         // of the RoundStart acted on last: a replay of it is refused
  // The audit key: the one this silo witnessed last (from cfg_.witnessed, then each head kept),
  // and the one the round's RoundStart named, reached from it.
  std::string witnessed_key_, round_audit_key_;
  // The members' keys of this round's run, as its key lists named them (member -> keys_sha256).
  std::map<std::string, std::string> run_keys_;
  std::string own_keys_;  // the hash of the keys this silo advertised in this run (advertised_own_keys)
  wire::TrainingPlan plan_;
  wire::Compression compression_;   // the round's (none when unset)
  std::string model_sha_;           // the round's model, as its RoundStart announced it
  // The round's model as it arrives, and the one this silo holds (model_receipt.h).
  ModelReceipt receipt_;
  // The silo's momentum: used by one training job at a time (jobs run in order on the worker);
  // loaded from cfg_.momentum_file on first use, written back after each update.
  std::shared_ptr<std::optional<Model>> momentum_ = std::make_shared<std::optional<Model>>();
  // The error feedback of compressed rounds, kept the same way (cfg_.residual_file).
  std::shared_ptr<std::optional<Model>> residual_ = std::make_shared<std::optional<Model>>();
  bool training_ = false;
  std::optional<RoundOutput> pending_;   // trained, not yet uploaded
  bool uploaded_ = false;
  std::shared_ptr<Model> spare_;         // last round's update buffer, reused
  // Secure aggregation: the round's group, its masking and the masked words (secure_client.h).
  SecureClient secure_;
};

}  // namespace xsilo::agent
