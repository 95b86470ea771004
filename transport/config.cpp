#include "transport/config.h"

#include <algorithm>
#include <thread>

#include "transport/pki.h"

namespace xsilo::transport {

namespace {
std::chrono::milliseconds seconds(const ConfigNode& n, const std::string& key, double def,
                                  double min, double max) {
  return std::chrono::milliseconds(static_cast<long>(n.number(key, def, min, max) * 1000.0));
}
}  // namespace

TlsFiles parse_tls(const ConfigNode& node) {
  TlsFiles f;
  if (node.has("kit")) {
    f = TlsFiles::from_kit(node.path("kit", ""));
    if (node.has("key") || node.has("cert") || node.has("ca")) {
      node.fail("kit", "give either kit or key/cert/ca, not both");
    }
  } else {
    if (!node.has("key")) node.fail("", "needs \"kit\" (a folder made by xsilo pki issue) or key, cert and ca");
    f.key = node.path("key", "");
    f.cert = node.path("cert", "");
    f.ca = node.path("ca", "");
  }
  if (node.has("crl")) f.crl = node.path("crl", "");
  node.finish();
  for (const auto& [key, p] : {std::pair{"key", f.key}, {"cert", f.cert}, {"ca", f.ca}, {"crl", f.crl}}) {
    if (p.empty() && std::string(key) != "crl") {
      node.fail(key, "is required (or give kit, a folder made by xsilo pki issue)");
    }
    node.require_exists(node.has("kit") ? "kit" : key, p);  // an empty crl (optional) is not checked
  }
  return f;
}

ChannelOptions parse_channel_options(const ConfigNode& node) {
  ChannelOptions o;
  o.max_frame_bytes = static_cast<std::size_t>(
      node.integer("max_frame_bytes", static_cast<std::int64_t>(o.max_frame_bytes), 1024,
                   std::int64_t{1} << 30));
  o.heartbeat_interval = seconds(node, "heartbeat_s", 5, 0, 3600);
  o.idle_timeout = seconds(node, "idle_timeout_s", 30, 0, 86400);
  o.handshake_timeout = seconds(node, "handshake_timeout_s", 10, 0.1, 3600);
  o.max_queued_bytes =
      static_cast<std::size_t>(node.integer("max_queued_mib", 512, 1, 1 << 20)) << 20;
  o.max_handshakes = static_cast<std::size_t>(node.integer("max_handshakes", 64, 1, 100000));
  o.max_handshakes_per_address =
      static_cast<std::size_t>(node.integer("max_handshakes_per_address", 8, 1, 100000));
  o.certificate_warn_days = static_cast<int>(node.integer("certificate_warn_days", 30, 0, 3650));
  node.finish();
  if (o.idle_timeout.count() > 0 && o.heartbeat_interval.count() > 0 &&
      o.idle_timeout <= o.heartbeat_interval) {
    node.fail("idle_timeout_s", "must exceed heartbeat_s, or peers are closed between heartbeats");
  }
  return o;
}

DialOptions parse_dial_options(const ConfigNode& node) {
  DialOptions o;
  o.initial_backoff = seconds(node, "initial_backoff_s", 0.2, 0.001, 3600);
  o.max_backoff = seconds(node, "max_backoff_s", 10, 0.001, 86400);
  o.max_attempts = static_cast<int>(node.integer("max_attempts", 0, 0, 1 << 30));
  node.finish();
  if (o.max_backoff < o.initial_backoff) node.fail("max_backoff_s", "must be >= initial_backoff_s");
  return o;
}

AllowList parse_allow(const ConfigNode& node) {
  AllowList allow;
  for (const char* role : {"server", "edge", "silo", "admin"}) {
    if (!node.has(role)) continue;
    auto names = node.str_list(role);
    if (names.empty()) node.fail(role, "must list at least one name, or \"*\"");
    allow.allow(parse_role(role), {names.begin(), names.end()});
  }
  node.finish();
  return allow;
}

Endpoint parse_endpoint_key(const ConfigNode& node, const std::string& key,
                            const std::string& def) {
  const auto s = def.empty() ? node.str_required(key) : node.str(key, def);
  try {
    return parse_endpoint(s);
  } catch (const std::invalid_argument& e) {
    node.fail(key, e.what());
  }
}

std::vector<Endpoint> parse_endpoint_list(const ConfigNode& node, const std::string& key) {
  std::vector<Endpoint> out;
  for (const auto& s : node.str_list(key)) {
    try {
      out.push_back(parse_endpoint(s));
    } catch (const std::invalid_argument& e) {
      node.fail(key, e.what());
    }
  }
  if (out.empty()) node.fail(key, "must list at least one host:port");
  return out;
}

namespace {
double secs(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }
std::string abs(const std::filesystem::path& p) { return std::filesystem::absolute(p).lexically_normal().string(); }
}  // namespace

nlohmann::json to_json(const TlsFiles& f) {
  nlohmann::json j = {{"key", abs(f.key)}, {"cert", abs(f.cert)}, {"ca", abs(f.ca)}};
  if (!f.crl.empty()) j["crl"] = abs(f.crl);
  return j;
}

nlohmann::json to_json(const ChannelOptions& o) {
  return {{"max_frame_bytes", o.max_frame_bytes},
          {"heartbeat_s", secs(o.heartbeat_interval)},
          {"idle_timeout_s", secs(o.idle_timeout)},
          {"handshake_timeout_s", secs(o.handshake_timeout)},
          {"max_queued_mib", o.max_queued_bytes >> 20},
          {"max_handshakes", o.max_handshakes},
          {"max_handshakes_per_address", o.max_handshakes_per_address},
          {"certificate_warn_days", o.certificate_warn_days}};
}

nlohmann::json to_json(const DialOptions& o) {
  return {{"initial_backoff_s", secs(o.initial_backoff)},
          {"max_backoff_s", secs(o.max_backoff)},
          {"max_attempts", o.max_attempts}};
}

nlohmann::json to_json(const AllowList& a) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [role, names] : a.names()) j[role_name(role)] = names;
  return j;
}

std::size_t default_network_threads() {
  return std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 4);
}

std::size_t parse_network_threads(const ConfigNode& root) {
  return static_cast<std::size_t>(
      root.integer("network_threads", static_cast<std::int64_t>(default_network_threads()), 1, kMaxNetworkThreads));
}

}  // namespace xsilo::transport
