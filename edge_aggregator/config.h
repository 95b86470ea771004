// The edge aggregator's JSON config; docs/configs.md documents every key.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/net.h"
#include "transport/channel.h"
#include "transport/dialer.h"
#include "transport/metrics_endpoint.h"
#include "transport/tls.h"

namespace xsilo::edge {

struct EdgeConfig {
  std::filesystem::path file;
  std::string federation;
  Endpoint listen;                    // where its region's silos connect
  std::filesystem::path port_file;
  std::vector<Endpoint> upstreams;    // the server (several: failover order)
  transport::TlsFiles tls;            // an edge kit
  transport::AllowList allow;         // which silos may connect here
  transport::ChannelOptions channel;
  transport::DialOptions reconnect;
  std::size_t chunk_bytes = 1u << 20;
  // Threads that carry the connections (TLS, framing); the relay stays on the first. 1: one
  // thread for everything.
  std::size_t network_threads = 1;
  std::string log_level = "info";
  transport::MetricsOptions metrics;  // "metrics": the Prometheus endpoint, off unless listen is set
  std::string log_format = "text";  // or "json": one object per line (common/log.h)
};

EdgeConfig load_edge_config(const std::filesystem::path& file);
// The config as the JSON load_edge_config reads back (paths absolute).
nlohmann::json to_json(const EdgeConfig& c);

}  // namespace xsilo::edge
