// Links for gossip between the local workers of one silo: one TCP connection per pair of ranks,
// over which each worker sends messages that nobody waits for. Unlike the Mesh of the
// all-reduce, a link that fails is that link's affair alone: the peer is marked dead here, the
// messages not yet fully written to it come back to the sender (returned()), and every other
// link goes on. There is no barrier and no agreement: each worker knows who is alive from its
// own links only (a killed worker's links all close, so every peer sees it within a poll; a
// stalled one is seen by whoever waits on it for the timeout).
//
// Wire: each message is a 48-byte header (kind, float count, weight, loss sum, steps, rows) and the
// floats. A push or final carries exactly the model's float count, done and written none: a header
// that says otherwise drops its peer before anything is allocated for it. A message cut off by a
// closing link is dropped by the receiver, and the sender, which did not write it to the end,
// gets it back: no message is counted by both sides (no path duplicates mass). Mass can be lost,
// which reweights the result: a link this side drops itself (drop(): a timeout, a malformed
// message) discards the complete messages still unread in its socket, and what comes back to a
// worker after it sent its final is not in the combination.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "silo_agent/collective/communicator.h"

namespace xsilo::collective {

enum class GossipKind : std::uint32_t {
  push = 1,     // half of the sender's mass (x, w)
  done = 2,     // the sender has stopped training: nothing more follows but its final message
  final = 3,    // the sender's whole mass for the combination, with its loss sum and steps
  written = 4,  // the collector has written the combined model
};

struct GossipMessage {
  int from = -1;
  GossipKind kind = GossipKind::push;
  double weight = 0;      // w of push-sum
  double loss_sum = 0;    // final: the sender's summed step losses
  std::uint64_t steps = 0;  // final: the sender's steps
  std::uint64_t rows = 0;   // push, done: the rows the sender has trained on so far
  std::vector<float> x;
};

class GossipLinks {
 public:
  // Forms one link to every other rank of `peers` (detail::connect_peers). `floats`: the model's
  // float count, the only size a push or final may have. `timeout`: a message that makes no
  // progress for this long marks its peer dead.
  GossipLinks(int rank, const std::vector<PeerAddress>& peers, int listen_fd, std::size_t floats,
              std::chrono::milliseconds timeout);
  ~GossipLinks();
  GossipLinks(const GossipLinks&) = delete;
  GossipLinks& operator=(const GossipLinks&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(links_.size()); }
  std::size_t floats() const { return floats_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Queues `m` for `peer` and writes what the socket takes now; false (and nothing queued) when
  // the peer is dead.
  bool send(int peer, GossipMessage m);
  // Moves bytes both ways on every live link, waiting at most `wait` for the first to move;
  // returns the messages that arrived, complete, in the order they did.
  std::vector<GossipMessage> pump(std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  // The messages that could not be written to the end to a peer that died (kind push and final:
  // their mass belongs to this worker again). Taken once.
  std::vector<GossipMessage> take_returned();
  bool live(int peer) const;
  std::vector<int> live_peers() const;  // every live rank but this one, ascending
  // Gives up on `peer`: closes its link (it sees this worker as dead too) and returns its queue.
  void drop(int peer, const std::string& why);
  // Why peers were given up, in order ("rank 2 closed its link", "rank 3 did not take a message
  // within 2000 ms").
  const std::vector<std::string>& events() const { return events_; }
  // Bytes not yet written to `peer`.
  std::size_t pending(int peer) const;

 private:
  struct Outgoing {
    GossipMessage message;  // kept until written to the end
    std::vector<std::uint8_t> bytes;
    std::size_t sent = 0;
  };
  struct Link {
    int fd = -1;
    std::deque<Outgoing> out;
    std::chrono::steady_clock::time_point moved;  // last progress of `out`
    std::vector<std::uint8_t> in;  // the message being read: header, then floats
    std::size_t have = 0;
  };
  void write_some(int peer);
  void read_some(int peer, std::vector<GossipMessage>& arrived);

  int rank_;
  std::size_t floats_;
  std::chrono::milliseconds timeout_;
  std::vector<Link> links_;
  std::vector<GossipMessage> returned_;
  std::vector<std::string> events_;
};

}  // namespace xsilo::collective
