#include "transport/listener.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

namespace xsilo::transport {

Listener::Listener(asio::any_io_executor ex, ssl::context& ctx, const Endpoint& at,
                   ChannelOptions opts, AllowList allow, LocalInfo me, Handler on_channel,
                   RoundFn current_round)
    : ex_(ex), ctx_(ctx), acceptor_(ex), opts_(opts), allow_(std::move(allow)),
      me_(std::move(me)), on_channel_(std::move(on_channel)),
      current_round_(std::move(current_round)) {
  tcp::resolver resolver(ex);
  auto results = resolver.resolve(at.host, std::to_string(at.port));
  tcp::endpoint ep = results.begin()->endpoint();
  acceptor_.open(ep.protocol());
  acceptor_.set_option(tcp::acceptor::reuse_address(true));
  acceptor_.bind(ep);
  acceptor_.listen();
  port_ = acceptor_.local_endpoint().port();
}

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
  while (*alive && acceptor_.is_open()) {
    boost::system::error_code ec;
    tcp::socket socket = co_await acceptor_.async_accept(
        asio::redirect_error(asio::use_awaitable, ec));
    if (!*alive) break;
    if (ec) {
      if (ec == asio::error::operation_aborted) break;
      spdlog::warn("accept failed: {}", ec.message());
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);
    asio::co_spawn(ex_, authenticate(std::move(socket)), asio::detached);
  }
}

awaitable<void> Listener::authenticate(tcp::socket socket) {
  auto alive = alive_;
  auto channel = std::make_shared<Channel>(std::move(socket), ctx_, opts_);
  const std::uint64_t round = current_round_ ? current_round_() : 0;
  auto st = co_await channel->accept(allow_, me_, round);
  if (!*alive) co_return;
  if (!st) {
    ++refused_;
    spdlog::warn("refused connection from {}: {}", channel->remote(), st.message);
    co_return;
  }
  spdlog::debug("{} connected from {}", channel->peer().str(), channel->remote());
  channel->start();
  on_channel_(channel);
}

}  // namespace xsilo::transport
