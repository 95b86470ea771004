#include "transport/runtime.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

namespace xsilo::transport {

Runtime::Runtime(std::size_t network_threads) : signals_(io_, SIGINT, SIGTERM) {
  for (std::size_t i = 1; i < network_threads; ++i) connection_io_.push_back(std::make_unique<Context>(1));
}

Runtime::~Runtime() {
  join_connection_threads();
  pool_.join();
  // A connection left in its handshake after the grace period still has operations pending on
  // its context, each holding work on io_: destroy every pending handler while all the contexts
  // exist (the review's use after free at exit, 2026-12-06).
  for (auto& io : connection_io_) io->abandon();
  io_.abandon();
}

asio::any_io_executor Runtime::connection_executor() {
  const std::size_t i = next_connection_++ % network_threads();
  return i == 0 ? io_.get_executor() : connection_io_[i - 1]->get_executor();
}

void Runtime::background(std::function<void()> work) { asio::post(pool_, std::move(work)); }

void Runtime::fail(const std::string& who, const std::string& what) {
  asio::post(io_, [this, who, what] {
    spdlog::critical("{} failed: {}; stopping", who, what);
    stop(1);
  });
}

int Runtime::run(std::function<void()> start, std::function<void(int)> on_signal) {
  signals_.async_wait([this, on_signal](boost::system::error_code ec, int sig) {
    if (ec) return;
    spdlog::warn("signal {}: stopping", sig);
    if (on_signal) {
      on_signal(sig);
    } else {
      stop(130);
    }
  });
  asio::post(io_, std::move(start));
  // The other network threads run until the core's has stopped and their connections are gone.
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> busy;
  for (auto& io : connection_io_) {
    busy.push_back(asio::make_work_guard(*io));
    // An exception on a connection's thread (bad_alloc encoding a frame) stops the daemon as one
    // on the core's would, instead of terminating the process.
    connection_threads_.emplace_back([this, &io = *io] {
      try {
        io.run();
      } catch (const std::exception& e) {
        fail("network thread", e.what());
      }
    });
  }
  io_.run();
  busy.clear();
  join_connection_threads();
  pool_.join();
  return exit_code_;
}

// The core closed its connections before it stopped (stop()'s `last`): their threads end as
// soon as the closes have run. A connection still in its handshake could hold one until its
// timeout, so after a grace period the rest are stopped where they are.
void Runtime::join_connection_threads() {
  if (connection_threads_.empty()) return;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (auto& io : connection_io_) {
    while (!io->stopped() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    io->stop();
  }
  for (auto& t : connection_threads_) t.join();
  connection_threads_.clear();
}

void Runtime::stop(int exit_code, std::chrono::milliseconds linger, std::function<void()> last) {
  if (exit_code != 0 && exit_code_ == 0) exit_code_ = exit_code;
  if (stopping_) return;
  stopping_ = true;
  // A second SIGINT or SIGTERM now ends the process the default way.
  boost::system::error_code ec;
  signals_.clear(ec);
  auto t = std::make_shared<asio::steady_timer>(io_, linger);
  t->async_wait([this, t, last = std::move(last)](boost::system::error_code) {
    if (last) last();
    io_.stop();
  });
}

namespace {

// serve_channel's loop, for messages of type T, read by `read` (a Channel member).
template <class T>
awaitable<void> serve_with(std::shared_ptr<Channel> ch, awaitable<proto::Result<T>> (Channel::*read)(),
                           const std::function<bool(const T&)>& handle) {
  for (;;) {
    // Read (decrypted and decoded) on the channel's thread, handled on the caller's.
    auto msg = co_await run_on(ch->executor(), ((*ch).*read)());
    if (!msg) {
      if (msg.error().code() != wire::ERROR_UNSPECIFIED) {
        spdlog::warn("{}: {}", ch->peer().str(), msg.error().message());
        ch->close_with_error(msg.error().code(), msg.error().message());
      }
      break;
    }
    bool more = false;
    try {
      more = handle(*msg);
    } catch (const std::exception& e) {
      // A message the role's core could not handle (a layout it cannot allocate, say): this
      // connection ends with the reason; the process goes on.
      spdlog::error("{}: {}", ch->peer().str(), e.what());
      ch->close_with_error(wire::INTERNAL, e.what());
      break;
    }
    if (!more) break;
  }
}

}  // namespace

awaitable<void> serve_channel(std::shared_ptr<Channel> ch, const std::function<bool(const wire::Envelope&)>& handle) {
  co_await serve_with<wire::Envelope>(std::move(ch), &Channel::read, handle);
}

awaitable<void> serve_messages(std::shared_ptr<Channel> ch, const std::function<bool(const proto::Message&)>& handle) {
  co_await serve_with<proto::Message>(std::move(ch), &Channel::read_message, handle);
}

Upstream::Upstream(asio::io_context& io, ssl::context& tls, UpstreamOptions opts)
    : io_(io), tls_(tls), opts_(std::move(opts)), backoff_(opts_.reconnect), refused_(opts_.reconnect) {}

awaitable<void> Upstream::run(const Session& session, const std::function<bool()>& done,
                              const std::function<void()>& preferred_back) {
  std::size_t next = 0;
  const auto& ups = opts_.endpoints;
  while (!stopped_) {
    const std::size_t index = next % ups.size();
    const Endpoint& to = ups[index];
    auto r = co_await dial_once(io_.get_executor(), tls_, to, opts_.upstreams, opts_.me, opts_.channel);
    if (stopped_) break;
    if (r) {
      backoff_.reset();  // max_attempts counts failed dials in a row
      auto ch = *r;
      // Set when the probe finds the preferred upstream back: the owner then ends this session.
      // Shared: the detached probe may outlive this iteration.
      auto leaving = std::make_shared<bool>(false);
      if (index > 0 && opts_.probe.count() > 0 && preferred_back) {
        asio::co_spawn(io_, probe(ch, [leaving, preferred_back] {
                         *leaving = true;
                         preferred_back();
                       }),
                       asio::detached);
      }
      const auto began = std::chrono::steady_clock::now();
      co_await session(ch, to);
      if (stopped_ || done()) break;
      next = 0;  // start again from the preferred upstream
      // A session the upstream ended within a moment of the handshake (a refusal: a server that
      // takes no edges, one shutting down) waits before the next dial, longer each time in a row,
      // so a refusal is not redialled a hundred times a second. One that lasted (the upstream
      // went away: a restart), or that this side ended to move, is redialled at once.
      if (*leaving || std::chrono::steady_clock::now() - began >= kRefusalSession) {
        refused_.reset();
        continue;
      }
      asio::steady_timer t(io_, refused_.next());
      boost::system::error_code ec;
      co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    spdlog::warn("{}", r.error().message());
    // This failed dial is failure attempts() + 1 in a row (each one before it drew a wait).
    if (opts_.reconnect.max_attempts > 0 && backoff_.attempts() + 1 >= opts_.reconnect.max_attempts) {
      spdlog::error("giving up after {} failed attempts in a row", backoff_.attempts() + 1);
      exhausted_ = true;
      break;
    }
    ++next;
    asio::steady_timer t(io_, backoff_.next());
    boost::system::error_code ec;
    co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
}

// While `current` (a backup) is in use: every probe interval, dial the preferred upstream;
// once it answers, say so and stop probing.
awaitable<void> Upstream::probe(std::shared_ptr<Channel> current, std::function<void()> preferred_back) {
  while (!stopped_ && current->is_open()) {
    asio::steady_timer t(io_, opts_.probe);
    boost::system::error_code ec;
    co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (stopped_ || !current->is_open()) break;
    auto r = co_await dial_once(io_.get_executor(), tls_, opts_.endpoints[0], opts_.upstreams, opts_.me, opts_.channel);
    if (!r) continue;
    (*r)->close();
    if (current->is_open()) preferred_back();
    break;
  }
}

}  // namespace xsilo::transport
