// The skeleton every daemon shares: network threads, one worker thread for CPU and disk work,
// SIGINT and SIGTERM, and for silos and edges the dialler towards their upstream with failover.
//
// The network threads each run an io_context. The first, io(), is the core's: the role's
// sans-I/O core, its timers, the listener and every job's `done` run there and nowhere else,
// so the core is single-threaded whatever the count. A connection lives on one network thread
// (connection_executor() deals them out in turn): its TLS, framing and encoding run there, and
// the core's calls on it (send, close) are posted to it (Channel). With one network thread,
// everything shares io(), as it always did.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/thread_pool.hpp>

#include "common/net.h"
#include "transport/channel.h"
#include "transport/dialer.h"

namespace xsilo::transport {

class Runtime {
 public:
  explicit Runtime(std::size_t network_threads = 1);
  ~Runtime();
  // The core's context: its thread is the only one that calls into the role's core.
  asio::io_context& io() { return io_; }
  // Where the next connection lives: the network threads in turn, io()'s included.
  asio::any_io_executor connection_executor();
  std::size_t network_threads() const { return 1 + connection_io_.size(); }

  // Runs `work` on the worker thread (in order with all other work), then `done(result)` on the
  // core's network thread (io()). An exception from `work` stops the daemon with exit code 1.
  template <class R>
  void work(std::function<R()> work, std::function<void(R)> done) {
    asio::post(pool_, [this, work = std::move(work), done = std::move(done)]() mutable {
      std::optional<R> r;
      try {
        r.emplace(work());
      } catch (const std::exception& e) {
        fail("worker job", e.what());
        return;
      }
      asio::post(io_, [done = std::move(done), r = std::move(r)]() mutable { done(std::move(*r)); });
    });
  }
  // Fire and forget on the worker thread, in order with the other work.
  void background(std::function<void()> work);

  // Calls `start` on the core's network thread (io()), then runs until stop(); returns the exit
  // code. The first SIGINT or SIGTERM calls `on_signal` (default: stop with 130).
  int run(std::function<void()> start, std::function<void(int)> on_signal = {});
  // Ends the loop after `linger` (queued messages get that long to leave); `last` runs just
  // before (closing the connections).
  void stop(int exit_code, std::chrono::milliseconds linger = std::chrono::milliseconds(50),
            std::function<void()> last = {});
  bool stopping() const { return stopping_; }
  void set_exit_code(int code) { exit_code_ = code; }

 private:
  // An io_context whose pending handlers can be destroyed while every context still exists:
  // the core's pending handlers may hold connections whose sockets live on another context, and
  // a connection's pending coroutine holds work on the core's, so neither order of destruction
  // alone is safe. ~Runtime abandons all of them first, then the contexts go.
  class Context : public asio::io_context {
   public:
    using asio::io_context::io_context;
    void abandon() { shutdown(); }
  };
  // What failed ("worker job", "network thread") and why: logged, and the daemon stops with 1.
  void fail(const std::string& who, const std::string& what);
  void join_connection_threads();
  std::vector<std::unique_ptr<Context>> connection_io_;
  std::vector<std::thread> connection_threads_;
  std::size_t next_connection_ = 0;
  Context io_;
  asio::thread_pool pool_{1};
  asio::signal_set signals_;
  bool stopping_ = false;
  int exit_code_ = 0;
};

// (`handle` is held by reference: pass a named function.)
// Reads messages from `ch` on the channel's thread and hands each to `handle` on the caller's
// (the core's) until the channel closes, `handle` returns false, or a frame is bad (the peer then
// gets an Error naming it and is closed).
awaitable<void> serve_channel(std::shared_ptr<Channel> ch, const std::function<bool(const wire::Envelope&)>& handle);
// The same with a TensorChunk's data left in its frame (Channel::read_message): the uploads the
// server and the edges read, copied from the frame straight into their lanes.
awaitable<void> serve_messages(std::shared_ptr<Channel> ch, const std::function<bool(const proto::Message&)>& handle);

// Dials a silo's or an edge's upstreams in failover order, with backoff and jitter, and runs a
// session on each established channel. While on a backup it probes the preferred upstream
// and, when that answers, calls `preferred_back` (the owner closes the channel when it is a
// good moment; the next dial starts from the preferred one).
struct UpstreamOptions {
  std::vector<Endpoint> endpoints;     // failover order: preferred first
  AllowList upstreams;                 // roles (and names) the upstream's certificate may have
  LocalInfo me;
  ChannelOptions channel;
  DialOptions reconnect;
  std::chrono::milliseconds probe{0};  // 0: never probe the preferred upstream
};

class Upstream {
 public:
  using Session = std::function<awaitable<void>(std::shared_ptr<Channel>, const Endpoint&)>;
  // `session` runs on each established channel until it closes; `done` says whether to stop
  // dialling after it. Pass named functions (they are held by reference while running: GCC 12
  // mishandles temporaries inside co_await expressions).
  Upstream(asio::io_context& io, ssl::context& tls, UpstreamOptions opts);
  // Returns when `done()` holds after a session, stop() was called, or max_attempts failed in a
  // row (then `exhausted()` is true).
  awaitable<void> run(const Session& session, const std::function<bool()>& done,
                      const std::function<void()>& preferred_back);
  void stop() { stopped_ = true; }
  bool exhausted() const { return exhausted_; }

 private:
  awaitable<void> probe(std::shared_ptr<Channel> current, std::function<void()> preferred_back);
  asio::io_context& io_;
  ssl::context& tls_;
  UpstreamOptions opts_;
  // A session shorter than this that the upstream ended is a refusal (Upstream::run).
  static constexpr std::chrono::seconds kRefusalSession{2};
  Backoff backoff_;   // failed dials in a row (reset by a dial that succeeds)
  Backoff refused_;   // sessions the upstream ended at once, in a row
  bool stopped_ = false, exhausted_ = false;
};

}  // namespace xsilo::transport
