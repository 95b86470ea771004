// The edge's protocol core, sans-I/O: what an edge does with each message from the server or
// from one of its silos, as Actions (send up, send down, stream a partial sum up, work for the
// worker). The daemon (edge.cpp) feeds it from real connections; the unit tests feed it
// directly, deterministically, with no sockets.
//
// Per round: RoundStart per selected silo (relayed), the model passed through chunk by chunk,
// UpdateReady relayed up, the silos' uploads taken one at a time (protocol::UploadSlot) and
// folded into the regional sum on the worker (secure: one masked sum per secure group); when no
// selected silo is pending the edge announces UpdateReady, and each UploadGrant from the server
// takes one partial sum up (UpdateEnd.more: another group's follows).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "common/model.h"
#include "common/result.h"
#include "common/thread_check.h"
#include "proto/message.h"
#include "proto/xsilo.pb.h"
#include "protocol/masked.h"
#include "protocol/round_start.h"
#include "protocol/tensor_stream.h"
#include "protocol/upload_slot.h"

namespace xsilo::edge {

namespace action {
struct ToServer {
  wire::Envelope env;
};
struct StreamToServer {  // chunks of a partial sum, produced lazily
  std::shared_ptr<protocol::ChunkSource> source;
};
struct ToSilo {
  std::string silo;
  wire::Envelope env;
};
// The same message to several silos (the model's chunks): framed once and shared by their
// connections, so a region of m silos does not hold m copies of the model.
struct ToSilos {
  std::vector<std::string> silos;
  wire::Envelope env;
};
// Work for the worker thread, in order: chunk checks (Background) and folds (Job, whose result
// comes back through on_job_done). They run on that one thread, one at a time (checked:
// common/thread_check.h): the folds write the regional sums without a lock.
struct Background {
  std::function<void()> work;
};
struct Job {
  std::uint64_t id;
  std::function<Status()> work;  // success: the upload matched its hash, was finite and is in the sum; else why not
};
}  // namespace action

using Action = std::variant<action::ToServer, action::StreamToServer, action::ToSilo, action::ToSilos,
                            action::Background, action::Job>;

struct RelayConfig {
  std::string federation;
  std::size_t chunk_bytes = 1u << 20;
  // A RoundStart whose model has more elements is refused (protocol::check_layout).
  std::uint64_t max_model_elements = protocol::kMaxModelElements;
};

class Relay {
 public:
  explicit Relay(RelayConfig cfg);

  void on_server_up();    // announces the region
  void on_server_down();  // the round in progress is void without the server
  void on_server_message(const wire::Envelope& e);
  void on_silo_up(const std::string& silo);
  void on_silo_down(const std::string& silo);
  void on_silo_message(const std::string& silo, const wire::Envelope& e);
  // The same for a message read with its TensorChunk's data left in the frame (the daemon's:
  // transport::serve_messages): an upload's data is copied once, into the slot.
  void on_silo_message(const std::string& silo, const proto::Message& m);
  void on_job_done(std::uint64_t id, const Status& folded);

  std::vector<Action> take_actions() { return std::exchange(actions_, {}); }
  bool finished() const { return finished_; }
  std::uint64_t round() const { return region_ ? region_->round : last_round_; }
  const std::set<std::string>& silos() const { return connected_; }

 private:
  enum class SiloState { Training, Ready, Uploading, Done, Gone };
  // The edge's part of one round: which of its silos take part, and the regional sums.
  struct Region {
    std::uint64_t round = 0;
    std::vector<TensorInfo> layout;
    std::map<std::string, SiloState> silos;
    std::map<std::string, wire::Contributor> contributors;  // Done silos, by name
    protocol::UploadSlot<std::string> slot;
    bool secure = false;
    std::shared_ptr<Model> sum, current;  // plain
    wire::Compression scheme;             // plain: how the silos compress their uploads
    std::map<std::string, std::uint32_t> group_of;  // secure
    std::set<std::string> settled;                  // secure: silos the server settled into their group
    std::shared_ptr<protocol::MaskedVector> current_words;
    std::map<std::uint32_t, std::shared_ptr<protocol::MaskedVector>> group_sums;
    bool folding = false;     // a fold (or a barrier) runs on the worker: job `job`
    std::uint64_t job = 0;
    bool announced = false;   // told the server the region is ready
    bool granted = false;     // the server granted the region's upload (or forced it)
    std::deque<std::uint32_t> unsent_groups;
    bool sent = false;
    // A compressed broadcast (RoundStart.broadcast): the model is rebuilt in model_ as it
    // arrives; silos that hold the round's base get the server's delta chunks, the others each
    // chunk's values.
    bool broadcast = false, model_failed = false;
    protocol::TensorReceiver model_rx;
    std::string model_sha256;       // what the RoundStart announces
    std::set<std::string> delta_ok;  // selected silos that hold the base
  };

  void start_round(const wire::Envelope& e);
  void model_chunk(const wire::Envelope& e);
  // What on_server_message does with the longer kinds of message from the server (a chunk or a
  // grant only when it is for the region's round).
  void model_request(const wire::Envelope& e);
  void pass_model_chunk(const wire::Envelope& e);
  void upload_grant();
  void server_report(const wire::Envelope& e);
  void relay_model(const std::string& silo, const wire::Envelope& e);
  // A silo's state when `round` is the region's round and its sum has not gone up; else null.
  SiloState* in_round(const std::string& silo, std::uint64_t round);
  // What on_silo_message does with each kind of message from a silo.
  void join_proof(const std::string& silo, const wire::Envelope& e);
  void witness(const std::string& silo, const wire::Envelope& e);
  void update_ready(const std::string& silo, const wire::Envelope& e);
  using ChunkData = std::span<const std::uint8_t>;
  void on_silo_message(const std::string& silo, const wire::Envelope& e, ChunkData data);
  void upload_chunk(const std::string& silo, const wire::Envelope& e, ChunkData data);
  void update_end(const std::string& silo, const wire::Envelope& e);
  void silo_report(const std::string& silo, const wire::Envelope& e);
  void to_silo(const std::string& silo, wire::Envelope e);
  void to_server(wire::Envelope e) { actions_.push_back(action::ToServer{std::move(e)}); }
  void silo_error(const std::string& silo, wire::ErrorCode code, const std::string& msg);
  void send_region_status();
  void silo_gone(const std::string& silo);
  void pump();
  void send_next_sum();
  protocol::UploadBuffer buffer();
  wire::Envelope env() const;
  // Work for the worker, each piece under worker_'s check.
  void to_worker(std::uint64_t id, std::function<Status()> work);
  void to_worker(std::function<void()> work);

  RelayConfig cfg_;
  std::set<std::string> connected_;
  // Signed joins (protocol/join.h): the server's current nonce for this connection (it sends a
  // new one whenever a silo leaves the region), each silo's answer to it, the answers already
  // sent, and the silos announced in this connection. A silo is listed in RegionStatus once it
  // has signed, and stays listed while connected; a new nonce asks every silo to sign again,
  // so one whose proof the server refused as stale gets in with the fresh one.
  std::string nonce_;
  std::map<std::string, wire::JoinProof> proofs_;
  std::set<std::string> proof_sent_, announced_;
  std::map<std::string, wire::Envelope> witnesses_;  // a silo's Witness, until its join has gone up
  std::unique_ptr<Region> region_;
  // Compressed broadcasts: the last model this edge received and checked against its round's
  // SHA-256 (model_sha_; empty while it is being replaced), and what each connected silo said it
  // holds in its last UpdateReady. Kept across rounds and server connections.
  std::shared_ptr<Model> model_;
  std::string model_sha_;
  std::map<std::string, std::string> silo_held_;
  std::set<std::string> model_asked_;  // silos the server asked for its lost model (ModelRequest)
  std::set<std::string> uploading_;    // silos granted an upload whose UpdateEnd has not come (kept across rounds)
  std::uint64_t last_round_ = 0;
  bool finished_ = false;
  std::uint64_t job_id_ = 0;
  std::shared_ptr<ThreadCheck> worker_ = std::make_shared<ThreadCheck>();  // shared with the queued work
  std::vector<Action> actions_;
};

}  // namespace xsilo::edge
