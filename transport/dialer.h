// Outbound connections: silos and edges never listen towards their upstream, they dial out
// and keep the connection. Failed attempts back off exponentially with jitter; retries are
// unbounded unless the config says otherwise.
#pragma once

#include <chrono>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "common/net.h"
#include "transport/channel.h"

namespace xsilo::transport {

struct DialOptions {
  std::chrono::milliseconds initial_backoff{200};
  std::chrono::milliseconds max_backoff{10000};
  int max_attempts = 0;  // 0: unbounded
};

// Exponential backoff with "equal jitter": the k-th wait lies in [b/2, b] with
// b = min(max, initial * 2^k).
class Backoff {
 public:
  explicit Backoff(DialOptions opts, std::uint64_t seed = std::random_device{}());
  std::chrono::milliseconds next();
  void reset() { attempt_ = 0; }
  int attempts() const { return attempt_; }

 private:
  DialOptions opts_;
  int attempt_ = 0;
  std::mt19937_64 rng_;
};

// One attempt: TCP connect, TLS handshake, Hello/Welcome.
awaitable<proto::Result<std::shared_ptr<Channel>>> dial_once(asio::any_io_executor ex,
                                                             ssl::context& ctx,
                                                             const Endpoint& to,
                                                             const AllowList& upstreams,
                                                             const LocalInfo& me,
                                                             ChannelOptions opts);

}  // namespace xsilo::transport
