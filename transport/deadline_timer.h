// A steady timer for a deadline that is re-armed and cancelled as a round goes on.
//
// asio cancels only the waits still in the timer queue. A wait that has already expired, and
// whose handler is queued behind other work on the core's network thread (a daemon's timers run
// there only: transport/runtime.h), still runs with success after the timer was re-armed or
// cancelled, and would fire for a deadline that no longer holds (a later upload lane dropped
// early). Each start() and cancel() retires every earlier
// wait, expired or not: a handler runs only for the wait the timer was last armed with.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

namespace xsilo::transport {

class DeadlineTimer {
 public:
  explicit DeadlineTimer(boost::asio::io_context& io) : timer_(io) {}
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  // Calls `fire` on the io context's thread `after` from now, unless start() or cancel() is
  // called again first.
  void start(std::chrono::milliseconds after, std::function<void()> fire) {
    timer_.expires_after(after);
    timer_.async_wait([this, armed = ++generation_, fire = std::move(fire)](boost::system::error_code ec) {
      // An aborted wait may run after the timer is gone: `this` is read only on success.
      if (!ec && armed == generation_) fire();
    });
  }
  void cancel() {
    ++generation_;
    timer_.cancel();
  }

 private:
  boost::asio::steady_timer timer_;
  std::uint64_t generation_ = 0;  // of the last start() or cancel()
};

}  // namespace xsilo::transport
