// The config sections every daemon shares: "tls", "transport" and "reconnect".
#pragma once

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/net.h"
#include "transport/channel.h"
#include "transport/dialer.h"
#include "transport/tls.h"

namespace xsilo::transport {

// "tls": {"kit": DIR} or {"key": F, "cert": F, "ca": F}
TlsFiles parse_tls(const ConfigNode& node);
// "transport": {"max_frame_bytes", "heartbeat_s", "idle_timeout_s", "handshake_timeout_s",
//               "max_queued_mib", "max_handshakes", "max_handshakes_per_address"}
ChannelOptions parse_channel_options(const ConfigNode& node);
// "reconnect": {"initial_backoff_s", "max_backoff_s", "max_attempts"}
DialOptions parse_dial_options(const ConfigNode& node);
// "allow": {"silo": [names or "*"], "edge": [...], "server": [...]}
AllowList parse_allow(const ConfigNode& node);
Endpoint parse_endpoint_key(const ConfigNode& node, const std::string& key,
                            const std::string& def = "");
std::vector<Endpoint> parse_endpoint_list(const ConfigNode& node, const std::string& key);

// "network_threads": threads that carry a daemon's connections (transport/runtime.h), 1..64. By
// default the machine's hardware threads up to 4 (docs/benchmarks.md, "Network threads"); the
// ceiling keeps a typo from starting thousands of threads.
inline constexpr std::int64_t kMaxNetworkThreads = 64;
std::size_t default_network_threads();
std::size_t parse_network_threads(const ConfigNode& root);

// The same sections back as JSON (paths absolute), for tools that write configs from structs.
nlohmann::json to_json(const TlsFiles& f);
nlohmann::json to_json(const ChannelOptions& o);
nlohmann::json to_json(const DialOptions& o);
nlohmann::json to_json(const AllowList& a);

}  // namespace xsilo::transport
