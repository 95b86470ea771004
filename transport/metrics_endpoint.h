// The Prometheus scrape endpoint of a daemon: plain HTTP/1.1 on its own port (`metrics.listen`,
// off by default), GET /metrics only, one response per connection. It runs on the daemon's core
// network thread (the gauges are read there, where the daemon's state lives; rendering the text
// is microseconds), shares nothing with the TLS port, never reads more than a request head,
// cuts off a client silent for 2 s, and, with every slot taken, drops the oldest connection
// still waiting for its request rather than the newcomer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "common/config.h"
#include "common/net.h"
#include "common/prometheus.h"
#include "transport/channel.h"
#include "transport/policy.h"
#include "transport/tls.h"

namespace xsilo::transport {

// "metrics": {"listen": "127.0.0.1:9464", "allow_remote": false, "port_file": F}
struct MetricsOptions {
  std::optional<Endpoint> listen;    // absent: no endpoint
  bool allow_remote = false;         // listening beyond loopback must be asked for
  std::filesystem::path port_file;   // written with the bound port (useful with port 0)
};
// The "metrics" section of a daemon's config (`parent`). Refuses a non-loopback `listen` unless
// `allow_remote` is true: the numbers tell an outsider who is in the federation and when it
// rounds; and a section without `listen`.
MetricsOptions parse_metrics(const ConfigNode& parent);
nlohmann::json to_json(const MetricsOptions& o);

class MetricsEndpoint {
 public:
  // `refresh` runs (on the network thread) before each scrape renders: gauges read then.
  MetricsEndpoint(asio::any_io_executor ex, const Endpoint& at, const MetricRegistry& registry,
                  std::function<void()> refresh = {});
  ~MetricsEndpoint();
  std::uint16_t port() const { return port_; }
  void start();
  void stop();

 private:
  awaitable<void> accept_loop();
  awaitable<void> serve(std::shared_ptr<tcp::socket> socket, ScrapeSlots::Id id,
                        std::chrono::steady_clock::time_point deadline);
  asio::any_io_executor ex_;
  tcp::acceptor acceptor_;
  const MetricRegistry& registry_;
  std::function<void()> refresh_;
  std::uint16_t port_ = 0;
  ScrapeSlots slots_;  // which connection goes when every slot is taken, and each one's deadline
  std::map<ScrapeSlots::Id, std::weak_ptr<tcp::socket>> sockets_;
  ScrapeSlots::Id next_id_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// Starts the endpoint `o` asks for (nullptr when off), writes its port file and logs where it is.
std::unique_ptr<MetricsEndpoint> start_metrics(asio::any_io_executor ex, const MetricsOptions& o,
                                               const MetricRegistry& registry, std::function<void()> refresh = {});

// The families every daemon has: build info, its own certificate's expiry, bytes in and out,
// connections refused by reason (server and edges), resident memory and open descriptors;
// `role` labels the build info.
void declare_daemon_metrics(MetricRegistry& m, const std::string& role, const TlsFiles& tls);
// At scrape time: the byte totals, the listener's refusals (none for an agent), this process's
// memory and descriptors.
void set_connection_metrics(MetricRegistry& m, std::uint64_t bytes_in, std::uint64_t bytes_out,
                            const std::map<std::string, std::uint64_t>& refused);

// The loopback test: "localhost" or an address of 127.0.0.0/8 or ::1.
bool is_loopback_host(const std::string& host);

}  // namespace xsilo::transport
