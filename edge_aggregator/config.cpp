#include "edge_aggregator/config.h"

#include "common/config.h"
#include "transport/config.h"

namespace xsilo::edge {

EdgeConfig load_edge_config(const std::filesystem::path& file) {
  const auto j = ConfigNode::load_file(file);
  ConfigNode root(j, file.string());
  EdgeConfig c;
  c.file = file;
  c.federation = root.str_required("federation");
  c.listen = transport::parse_endpoint_key(root, "listen", "0.0.0.0:7444");
  c.port_file = root.path("port_file", "");
  c.upstreams = transport::parse_endpoint_list(root, "upstreams");
  c.tls = transport::parse_tls(root.child("tls"));
  c.allow = transport::parse_allow(root.child("allow"));
  if (!c.allow.allows_role(wire::SILO)) root.fail("allow", "must admit silos (\"silo\": [names] or [\"*\"])");
  if (c.allow.allows_role(wire::EDGE) || c.allow.allows_role(wire::SERVER) || c.allow.allows_role(wire::ADMIN)) {
    root.fail("allow", "an edge serves silos only (admins talk to the server)");
  }
  c.channel = transport::parse_channel_options(root.child("transport"));
  c.reconnect = transport::parse_dial_options(root.child("reconnect"));
  c.chunk_bytes = static_cast<std::size_t>(root.integer("chunk_bytes", 1 << 20, 1024, std::int64_t{1} << 30));
  if (c.chunk_bytes + 4096 > c.channel.max_frame_bytes) {
    root.fail("chunk_bytes", "leaves no room for the envelope in transport.max_frame_bytes");
  }
  c.network_threads = transport::parse_network_threads(root);
  c.log_level = root.one_of("log_level", "info", {"trace", "debug", "info", "warn", "error"});
  c.log_format = root.one_of("log_format", "text", {"text", "json"});
  c.metrics = transport::parse_metrics(root);
  root.finish();
  return c;
}

nlohmann::json to_json(const EdgeConfig& c) {
  nlohmann::json ups = nlohmann::json::array();
  for (const auto& u : c.upstreams) ups.push_back(u.str());
  nlohmann::json j = {{"federation", c.federation},
                      {"listen", c.listen.str()},
                      {"upstreams", ups},
                      {"tls", transport::to_json(c.tls)},
                      {"allow", transport::to_json(c.allow)},
                      {"transport", transport::to_json(c.channel)},
                      {"reconnect", transport::to_json(c.reconnect)},
                      {"chunk_bytes", c.chunk_bytes},
                      {"network_threads", c.network_threads},
                      {"log_level", c.log_level}, {"log_format", c.log_format}};
  if (!c.port_file.empty()) j["port_file"] = std::filesystem::absolute(c.port_file).string();
  if (c.metrics.listen) j["metrics"] = transport::to_json(c.metrics);
  return j;
}

}  // namespace xsilo::edge
