// The transport's timing and admission decisions as plain classes: no socket, timer or clock is
// read here; time comes in as an argument. The listener, the channel and the metrics endpoint
// apply what these decide; tests/transport_policy_test.cpp drives them by hand, so each decision
// is checked exactly, the same way every time, where the loopback tests in pki_tls_test.cpp and
// metrics_test.cpp can only watch real time pass.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace xsilo::transport {

using SteadyTime = std::chrono::steady_clock::time_point;

// How long the accept loop pauses after a failed accept (out of descriptors, say): 10 ms after
// the first failure in a row, doubling to at most 1 s; an accept that succeeds starts over.
class AcceptBackoff {
 public:
  static constexpr std::chrono::milliseconds kFirst{10};
  static constexpr std::chrono::milliseconds kMax{1000};
  // One more failure in a row; returns the pause before the next attempt.
  std::chrono::milliseconds failed();
  void succeeded();
  std::uint64_t failures_in_a_row() const { return failures_; }

 private:
  std::chrono::milliseconds pause_{0};
  std::uint64_t failures_ = 0;
};

// A rate limit for one repeated log line: at most one a period (the listener's "closed a
// connection at accept" warning, one a second under a flood).
class LogLimit {
 public:
  explicit LogLimit(std::chrono::milliseconds period) : period_(period) {}
  // True when the line may be logged at `now` (and then counts as logged).
  bool allow(SteadyTime now);

 private:
  std::chrono::milliseconds period_;
  std::optional<SteadyTime> last_;
};

// A channel's idle watchdog: the peer is silent too long once more than `idle_timeout` has
// passed since the last frame read (a heartbeat counts). The watchdog looks every `tick()`:
// a quarter of the timeout, between 50 ms and 1 s, so a silent peer is closed at most a tick
// after its timeout. A zero timeout never closes.
class IdleWatch {
 public:
  IdleWatch(std::chrono::milliseconds idle_timeout, SteadyTime now) : timeout_(idle_timeout), last_heard_(now) {}
  void heard(SteadyTime now) { last_heard_ = now; }
  bool silent_too_long(SteadyTime now) const;
  // A write that has waited on the peer since `writing_since` (nullopt: none waiting) for more
  // than the timeout: the peer keeps its connection alive but takes nothing we send (it would
  // otherwise hold a model stream's place, and its memory, for good). `writing_since` is the
  // last time the socket took any bytes, so a slow reader is never closed, only one whose
  // window stays shut for the whole timeout.
  bool write_stalled(std::optional<SteadyTime> writing_since, SteadyTime now) const;
  std::chrono::milliseconds tick() const;
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::chrono::milliseconds timeout_;
  SteadyTime last_heard_;
};

// Handshakes in progress at a listener (TLS + Hello/Welcome not finished), capped in all and
// per source address, so that unauthenticated peers hold at most the caps; a connection over
// either cap is closed at accept, before any TLS work. take() and give_back() pair up for
// every admitted connection however its handshake ends.
class HandshakeSlots {
 public:
  HandshakeSlots(std::size_t max_total, std::size_t max_per_address)
      : max_total_(max_total), max_per_address_(max_per_address) {}
  // True (and the slot taken) when a connection from `address` may start its handshake.
  bool take(const std::string& address);
  void give_back(const std::string& address);
  std::size_t in_progress() const { return total_; }
  std::size_t from(const std::string& address) const;

 private:
  std::size_t max_total_, max_per_address_;
  std::size_t total_ = 0;
  std::map<std::string, std::size_t> from_;  // only addresses with a handshake in progress
};

// The metrics endpoint's connections: at most `max_at_once`, each with `request_timeout` to
// send its request head. A newcomer that finds every slot taken evicts the connection that has
// waited longest without sending its request (so silent connections cannot keep a scraper
// out); when every slot is busy answering, the newcomer is refused.
class ScrapeSlots {
 public:
  using Id = std::uint64_t;
  struct Admission {
    bool admitted = false;
    std::optional<Id> evict;  // close this one first
    SteadyTime deadline{};    // the newcomer's request is due by then
  };
  ScrapeSlots(std::size_t max_at_once, std::chrono::milliseconds request_timeout)
      : max_(max_at_once), timeout_(request_timeout) {}
  Admission admit(Id id, SteadyTime now);
  // `id` sent its request: it is answering and no longer evictable.
  void request_read(Id id);
  // `id` ended (answered, timed out, evicted or failed): its slot is free.
  void done(Id id);
  std::size_t in_use() const { return open_.size(); }

 private:
  std::size_t max_;
  std::chrono::milliseconds timeout_;
  std::set<Id> open_;
  std::deque<Id> waiting_;  // waiting for their request, oldest first
};

}  // namespace xsilo::transport
