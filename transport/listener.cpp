#include "transport/listener.h"

#include <boost/asio/co_spawn.hpp>
#include <algorithm>
#include <cctype>
#include <optional>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

namespace xsilo::transport {

Listener::Listener(asio::any_io_executor ex, ssl::context& ctx, const Endpoint& at,
                   ChannelOptions opts, AllowList allow, LocalInfo me, Handler on_channel,
                   RoundFn current_round)
    : ex_(ex), ctx_(ctx), acceptor_(ex), opts_(opts),
      admission_(std::make_shared<const Admission>(Admission{std::move(allow), std::move(me)})),
      on_channel_(std::move(on_channel)),
      current_round_(std::move(current_round)), slots_(opts.max_handshakes, opts.max_handshakes_per_address) {
  tcp::resolver resolver(ex);
  auto results = resolver.resolve(at.host, std::to_string(at.port));
  tcp::endpoint ep = results.begin()->endpoint();
  acceptor_.open(ep.protocol());
  acceptor_.set_option(tcp::acceptor::reuse_address(true));
  acceptor_.bind(ep);
  acceptor_.listen();
  port_ = acceptor_.local_endpoint().port();
}

Listener::~Listener() { stop(); }

void Listener::start() {
  asio::co_spawn(ex_, accept_loop(), asio::detached);
}

void Listener::stop() {
  *alive_ = false;
  boost::system::error_code ec;
  acceptor_.close(ec);
}

awaitable<void> Listener::accept_loop() {
  auto alive = alive_;
  AcceptBackoff backoff;
  asio::steady_timer pause(ex_);
  while (*alive && acceptor_.is_open()) {
    boost::system::error_code ec;
    const asio::any_io_executor where = place_ ? place_() : ex_;
    tcp::socket socket = co_await acceptor_.async_accept(where, asio::redirect_error(asio::use_awaitable, ec));
    if (!*alive) break;
    if (ec) {
      if (ec == asio::error::operation_aborted) break;
      // Out of descriptors or memory, most likely: wait before trying again (AcceptBackoff)
      // rather than spin, and say so once per pause, not once per attempt.
      ++accept_failures_;
      const auto wait = backoff.failed();
      spdlog::warn("accept failed ({} in a row): {}; next attempt in {} ms", backoff.failures_in_a_row(),
                   ec.message(), wait.count());
      pause.expires_after(wait);
      co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    backoff.succeeded();
    auto from = socket.remote_endpoint(ec);
    const std::string address = ec ? std::string("?") : from.address().to_string();
    if (!slots_.take(address)) {
      // Shed before any TLS work: unauthenticated peers cannot hold more than the caps.
      ++shed_;
      ++refused_by_reason_["shed"];
      if (shed_log_.allow(std::chrono::steady_clock::now())) {
        spdlog::warn("closed a connection from {} at accept: {} handshakes in progress ({} from that address); "
                     "{} closed so far",
                     address, slots_.in_progress(), slots_.from(address), shed_);
      }
      socket.close(ec);
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);
    asio::co_spawn(ex_, authenticate(std::move(socket), address), asio::detached);
  }
}

awaitable<void> Listener::authenticate(tcp::socket socket, std::string address) {
  auto alive = alive_;
  const auto admission = admission_;  // held here: the listener may be gone when it is read
  // The handshake slot is given back however this ends (an exception included), unless the
  // listener is gone.
  struct Slot {
    Slot(Listener* l, std::shared_ptr<bool> a, std::string from) : self(l), alive(std::move(a)), address(std::move(from)) {}
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() {
      if (*alive) self->slots_.give_back(address);
    }
    Listener* self;
    std::shared_ptr<bool> alive;
    std::string address;
  };
  std::optional<Slot> slot;
  slot.emplace(this, alive, address);
  std::shared_ptr<Channel> channel;
  proto::Status st;
  try {
    channel = std::make_shared<Channel>(std::move(socket), ctx_, opts_);
    const std::uint64_t round = current_round_ ? current_round_() : 0;
    // The handshake on the connection's own thread; this coroutine waits on the listener's.
    st = co_await run_on(channel->executor(), channel->accept(admission->allow, admission->me, round));
  } catch (const std::exception& e) {
    if (*alive) {
      spdlog::warn("connection from {} failed before it was authenticated: {}", address, e.what());
      ++refused_by_reason_["handshake_error"];
    }
    co_return;
  }
  if (!*alive) co_return;
  slot.reset();
  if (!st) {
    ++refused_;
    std::string reason = st.error().message().rfind("TLS handshake", 0) == 0 ? "tls_handshake" : wire::ErrorCode_Name(st.error().code());
    std::transform(reason.begin(), reason.end(), reason.begin(), [](unsigned char c) { return std::tolower(c); });
    ++refused_by_reason_[reason];
    spdlog::warn("refused connection from {}: {}", channel->remote(), st.error().message());
    co_return;
  }
  spdlog::debug("{} connected from {}", channel->peer().str(), channel->remote());
  channel->start();
  on_channel_(channel);
}

}  // namespace xsilo::transport
