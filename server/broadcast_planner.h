// Which of a round's model streams go out now. Every stream is paced by its own connection: a
// stream makes its next chunk only when the connection's last write completed (Channel's
// send_stream), so a slow link holds its own stream and nothing else. What is left to plan is
// how many streams run at once: all of them (0: every link carries the model at its own rate
// from the start), or at most `at_once` (the server's default is 16: each running stream holds a
// chunk in memory) in the order the coordinator sent them (the
// first receivers get the whole model early and train while the others still receive: on one
// shared link, such as loopback, that is what 2 at a time bought).
//
// Plain and single-threaded: the daemon calls it on its network thread.
#pragma once

#include <cstddef>
#include <deque>
#include <optional>
#include <utility>

namespace xsilo::server {

template <class Stream>
class BroadcastPlanner {
 public:
  explicit BroadcastPlanner(std::size_t at_once = 0) : at_once_(at_once) {}

  void add(Stream s) { pending_.push_back(std::move(s)); }
  // The next stream to start now, counted as running until finished(); nothing when the limit
  // is reached or none waits.
  std::optional<Stream> next() {
    if (pending_.empty() || (at_once_ > 0 && running_ >= at_once_)) return std::nullopt;
    Stream s = std::move(pending_.front());
    pending_.pop_front();
    ++running_;
    return s;
  }
  // A stream that next() gave ended (sent, or dropped with its connection), or never started.
  void finished() {
    if (running_ > 0) --running_;
  }
  std::size_t running() const { return running_; }
  std::size_t waiting() const { return pending_.size(); }

 private:
  std::size_t at_once_;
  std::size_t running_ = 0;
  std::deque<Stream> pending_;
};

}  // namespace xsilo::server
