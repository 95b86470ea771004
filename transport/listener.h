// Accepts TLS connections, authenticates them (certificate identity + allow-list + Hello)
// and hands each established Channel to the owner. A failed handshake is logged in one line
// and never disturbs the other connections.
#pragma once

#include <functional>
#include <memory>

#include "common/net.h"
#include "transport/channel.h"

namespace xsilo::transport {

class Listener {
 public:
  using Handler = std::function<void(std::shared_ptr<Channel>)>;
  using RoundFn = std::function<std::uint64_t()>;

  Listener(asio::any_io_executor ex, ssl::context& ctx, const Endpoint& at, ChannelOptions opts,
           AllowList allow, LocalInfo me, Handler on_channel, RoundFn current_round = {});
  std::uint16_t port() const { return port_; }
  void start();
  void stop();
  std::uint64_t refused() const { return refused_; }

 private:
  awaitable<void> accept_loop();
  awaitable<void> authenticate(tcp::socket socket);

  asio::any_io_executor ex_;
  ssl::context& ctx_;
  tcp::acceptor acceptor_;
  ChannelOptions opts_;
  AllowList allow_;
  LocalInfo me_;
  Handler on_channel_;
  RoundFn current_round_;
  std::uint16_t port_ = 0;
  std::uint64_t refused_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace xsilo::transport
