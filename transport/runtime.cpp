#include "transport/runtime.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

namespace xsilo::transport {

Runtime::Runtime() : signals_(io_, SIGINT, SIGTERM) {}

Runtime::~Runtime() { pool_.join(); }

void Runtime::background(std::function<void()> work) { asio::post(pool_, std::move(work)); }

void Runtime::fail(const std::string& what) {
  asio::post(io_, [this, what] {
    spdlog::critical("worker job failed: {}; stopping", what);
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
  io_.run();
  pool_.join();
  return exit_code_;
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

awaitable<void> serve_channel(std::shared_ptr<Channel> ch, const std::function<bool(const wire::Envelope&)>& handle) {
  for (;;) {
    auto env = co_await ch->read();
    if (!env) {
      if (env.error().code() != wire::ERROR_UNSPECIFIED) {
        spdlog::warn("{}: {}", ch->peer().str(), env.error().message());
        ch->close_with_error(env.error().code(), env.error().message());
      }
      break;
    }
    bool more = false;
    try {
      more = handle(*env);
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

Upstream::Upstream(asio::io_context& io, ssl::context& tls, UpstreamOptions opts)
    : io_(io), tls_(tls), opts_(std::move(opts)), backoff_(opts_.reconnect) {}

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
      backoff_.reset();
      auto ch = *r;
      if (index > 0 && opts_.probe.count() > 0 && preferred_back) {
        asio::co_spawn(io_, probe(ch, preferred_back), asio::detached);
      }
      co_await session(ch, to);
      if (stopped_ || done()) break;
      next = 0;  // start again from the preferred upstream
      continue;
    }
    spdlog::warn("{}", r.error().message());
    if (opts_.reconnect.max_attempts > 0 && backoff_.attempts() >= opts_.reconnect.max_attempts) {
      spdlog::error("giving up after {} attempts", backoff_.attempts());
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
