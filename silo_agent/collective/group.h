// A group of local workers that survives losing some of them. A coordinator (in the agent)
// gives every worker the address table; when a collective fails, every survivor reports the
// operation it was in, the coordinator waits for all live workers (or a grace period), drops
// the dead or stalled ones, and sends a new table with the operation to resume from: the
// earliest any survivor was in. Each survivor rolls back to that operation's kept inputs and
// redoes it on the smaller ring.
//
// Backup pool: with `backups` K > 0 the coordinator also waits for K more workers (ids
// expected..expected+K-1; for those still missing, at most the grace period after the last
// member joined), hot standbys that joined and listen but are in no table. When a
// re-formation excludes members, it promotes one connected standby per excluded member into the
// new table, so the step is redone at the same width; the standby starts at the resume op (its
// Group's first_op()). When every member has finished, the standbys still waiting are released.
//
// Control protocol (text lines over TCP, inside the silo's network):
//   worker -> coordinator   HELLO <id> <host> <port>      FAILED <epoch> <op>      DONE
//                           ALIVE (a heartbeat: any line counts as one; gossip workers send it)
//   coordinator -> worker   TABLE <epoch> <resume_op> <n> (<id> <host> <port>){n}      EXCLUDED
//                           RELEASED (a standby the group finished without)
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "silo_agent/collective/communicator.h"

namespace xsilo::collective {

class Coordinator {
 public:
  // Waits for `expected` workers and `backups` standbys (those missing `grace` after the last
  // worker joined are not waited for); `grace` also bounds how long a failure waits for slow
  // reports.
  // `fixed`: the first table is the only one: a member that leaves or dies is recorded (gone())
  // but never re-forms the group, for workers that tolerate failures themselves (gossip).
  enum class Membership { reform, fixed };
  Coordinator(int expected, std::chrono::milliseconds grace, const std::string& host = "127.0.0.1", int backups = 0,
              Membership membership = Membership::reform);
  ~Coordinator();
  std::uint16_t port() const { return port_; }
  // Called (from the coordinator's thread) with the ids it dropped: the owner kills them.
  void on_excluded(std::function<void(const std::vector<int>&)> fn);
  int epoch() const { return epoch_; }
  std::vector<int> members() const;
  // Every worker whose control connection closed (it exited or died).
  std::vector<int> gone() const;
  // The members still connected and not done that have sent nothing for at least `quiet`:
  // for workers that send heartbeats (Group::alive), those stalled (stopped, swapped out, hung).
  std::vector<int> silent(std::chrono::milliseconds quiet) const;

 private:
  void loop();
  void broadcast_table(std::uint64_t resume);
  void maybe_start();
  void maybe_reform();
  void release_standbys();

  int expected_, backups_;
  std::chrono::milliseconds grace_;
  Membership membership_;
  int listen_fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  struct Worker {
    int fd = -1;
    std::string host;
    std::uint16_t port = 0;
    std::string buffer;
    bool member = false;
    bool standby = false;  // a backup not yet in any table
    bool done = false;  // finished its work: its connection closing is not a failure
    std::chrono::steady_clock::time_point heard{};  // when its last line arrived
    std::optional<std::uint64_t> failed_op;
  };
  std::map<int, Worker> workers_;  // by id
  std::vector<int> gone_;
  std::atomic<int> epoch_{-1};
  std::chrono::steady_clock::time_point table_at_{};  // when the last table went out
  std::optional<std::chrono::steady_clock::time_point> failure_since_;
  std::optional<std::chrono::steady_clock::time_point> members_since_;  // every member had joined
  std::function<void(const std::vector<int>&)> on_excluded_;
};

// A standby that the group finished without: it has nothing to do, and that is not a failure.
class StandbyReleased : public GroupEnded {
 public:
  StandbyReleased() : GroupEnded("this backup worker was not needed: the group finished without it") {}
};

class Group {
 public:
  // Joins the coordinator as worker `id`, listening for peers on `host`. A standby waits here
  // until it is promoted (or throws StandbyReleased).
  Group(const std::string& coordinator_host, std::uint16_t coordinator_port, int id, const std::string& host,
        Options opts);
  // Leaving scope normally tells the coordinator this worker is done; unwinding from an
  // exception (or dying) does not.
  ~Group();
  Communicator& comm() { return *comm_; }
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }
  // The current table's addresses, in rank order, and the socket this worker listens on: for
  // links other than the communicator's (Options::communicator false).
  const std::vector<PeerAddress>& peers() const { return peers_; }
  int listen_fd() const { return listen_fd_; }
  const Options& options() const { return opts_; }
  int epoch() const { return epoch_; }
  int id() const { return id_; }
  // The operation this worker starts at: 0, or the resume op of the re-formation that
  // promoted it from the backup pool.
  std::uint64_t first_op() const { return first_op_; }
  // Whether this worker came from the backup pool (its first table was a re-formation's, not
  // the group's first), even where it was promoted in operation 0.
  bool promoted() const { return promoted_; }
  // The ids of the current members, in rank order.
  const std::vector<int>& members() const { return members_; }

  // Tells the coordinator this worker is alive (Coordinator::silent). Not to be called while
  // another thread may use the control connection (attempt(), or the destructor).
  void alive();

  // Runs fn for operation `op`. Returns nullopt when it succeeded; otherwise the group has
  // re-formed and the caller must roll back to the returned operation and go on from there.
  // Throws CollectiveError when this worker was excluded or the coordinator is gone.
  std::optional<std::uint64_t> attempt(std::uint64_t op, const std::function<void(Communicator&)>& fn);

 private:
  std::uint64_t wait_table();  // reads until a TABLE; builds the communicator; returns resume op

  int id_;
  Options opts_;
  int control_fd_ = -1, listen_fd_ = -1;
  std::uint16_t listen_port_ = 0;
  std::string host_;
  int epoch_ = -1;
  std::uint64_t first_op_ = 0;
  bool promoted_ = false;
  std::string buffer_;
  std::vector<int> members_;
  std::vector<PeerAddress> peers_;
  int rank_ = -1;
  std::unique_ptr<Communicator> comm_;
};

}  // namespace xsilo::collective
