// Accepts TLS connections, authenticates them (certificate identity + allow-list + Hello)
// and hands each established Channel to the owner. A failed handshake is logged in one line
// and never disturbs the other connections.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <memory>

#include "common/net.h"
#include "transport/channel.h"
#include "transport/policy.h"

namespace xsilo::transport {

class Listener {
 public:
  using Handler = std::function<void(std::shared_ptr<Channel>)>;
  using RoundFn = std::function<std::uint64_t()>;

  Listener(asio::any_io_executor ex, ssl::context& ctx, const Endpoint& at, ChannelOptions opts,
           AllowList allow, LocalInfo me, Handler on_channel, RoundFn current_round = {});
  ~Listener();  // stops: coroutines still running (a paused accept loop) see it gone
  std::uint16_t port() const { return port_; }
  // Where each accepted connection lives (its TLS handshake included): a network thread of
  // several (Runtime::connection_executor). By default the listener's own executor. The
  // listener's bookkeeping and `on_channel` stay on the listener's executor.
  void place_connections(std::function<asio::any_io_executor()> where) { place_ = std::move(where); }
  void start();
  void stop();
  std::uint64_t refused() const { return refused_; }
  // Connections refused or lost before they were established, by reason: "shed" (handshake
  // caps full), "tls_handshake", "handshake_error", or the refusal's error code
  // ("not_allowed", "wrong_federation", "version_mismatch", ...). For the metrics.
  const std::map<std::string, std::uint64_t>& refused_by_reason() const { return refused_by_reason_; }
  // Connections closed at accept because the handshake caps were full.
  std::uint64_t shed() const { return shed_; }
  std::size_t handshaking() const { return slots_.in_progress(); }
  // Failed accept calls (out of descriptors, say), each followed by a pause.
  std::uint64_t accept_failures() const { return accept_failures_; }

 private:
  awaitable<void> accept_loop();
  awaitable<void> authenticate(tcp::socket socket, std::string address);

  asio::any_io_executor ex_;
  ssl::context& ctx_;
  tcp::acceptor acceptor_;
  ChannelOptions opts_;
  // Who may connect and who this end is: shared with each handshake in flight, which can
  // outlive the listener (a handshake that completes after stop() still reads them).
  struct Admission {
    AllowList allow;
    LocalInfo me;
  };
  std::shared_ptr<const Admission> admission_;
  Handler on_channel_;
  RoundFn current_round_;
  std::function<asio::any_io_executor()> place_;
  std::uint16_t port_ = 0;
  std::uint64_t refused_ = 0;
  // Handshakes in progress, in all and per source address (ChannelOptions caps them).
  HandshakeSlots slots_;
  std::uint64_t shed_ = 0;
  std::map<std::string, std::uint64_t> refused_by_reason_;
  std::uint64_t accept_failures_ = 0;
  LogLimit shed_log_{std::chrono::seconds(1)};
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace xsilo::transport
