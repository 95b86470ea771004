#include "transport/dialer.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace xsilo::transport {

Backoff::Backoff(DialOptions opts, std::uint64_t seed) : opts_(opts), rng_(seed) {}

std::chrono::milliseconds Backoff::next() {
  const int shift = std::min(attempt_, 30);
  ++attempt_;
  const double base = std::min<double>(static_cast<double>(opts_.max_backoff.count()),
                                       static_cast<double>(opts_.initial_backoff.count()) *
                                           static_cast<double>(1ull << shift));
  std::uniform_real_distribution<double> u(0.5, 1.0);
  return std::chrono::milliseconds(static_cast<long>(base * u(rng_)));
}

awaitable<proto::Result<std::shared_ptr<Channel>>> dial_once(asio::any_io_executor ex,
                                                             ssl::context& ctx,
                                                             const Endpoint& to,
                                                             const AllowList& upstreams,
                                                             const LocalInfo& me,
                                                             ChannelOptions opts) {
  tcp::socket socket(ex);
  try {
    tcp::resolver resolver(ex);
    auto results = co_await resolver.async_resolve(to.host, std::to_string(to.port),
                                                   asio::use_awaitable);
    co_await asio::async_connect(socket, results, asio::use_awaitable);
    socket.set_option(tcp::no_delay(true));
  } catch (const boost::system::system_error& e) {
    co_return proto::error(wire::ERROR_UNSPECIFIED,
                           "cannot connect to " + to.str() + ": " + e.code().message());
  }
  auto channel = std::make_shared<Channel>(std::move(socket), ctx, opts);
  auto st = co_await channel->connect(upstreams, me);
  if (!st) co_return st.error();
  channel->start();
  co_return channel;
}

}  // namespace xsilo::transport
