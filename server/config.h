// The server's JSON config; docs/configs.md documents every key.
#pragma once

#include <chrono>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/mlp.h"
#include "crypto/fixed_point.h"
#include "common/net.h"
#include "proto/xsilo.pb.h"
#include "server/optimizer.h"
#include "server/round_config.h"
#include "transport/channel.h"
#include "transport/metrics_endpoint.h"
#include "transport/tls.h"

namespace xsilo::server {

// A duration in seconds, as the config's messages quote it.
inline double secs_of(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

// The server daemon's config: the round's settings (RoundConfig, all the coordinator sees) and
// the daemon's own (listener, TLS, state folder, the initial model).
// `uploads_at_once`: its default (chosen from docs/benchmarks.md, "Concurrent uploads") and its
// ceiling (each lane holds a model's buffer, or a staged file, of its own).
inline constexpr std::int64_t kDefaultUploadsAtOnce = 4;
inline constexpr std::int64_t kMaxUploadsAtOnce = 64;
// `broadcasts_at_once`: each stream holds a frame (a chunk) in memory while its link drains it,
// so "every receiver" is capped: 200 silos at once held 200 frames (tests/scale_test.cpp).
inline constexpr std::int64_t kDefaultBroadcastsAtOnce = 16;

struct ServerConfig : RoundConfig {
  std::filesystem::path file;
  Endpoint listen;
  std::filesystem::path port_file;   // written with the bound port (useful with port 0)
  transport::TlsFiles tls;
  transport::AllowList allow;
  // How many model streams go out at once, each paced by its own connection: at most N in the
  // order the rounds send them, or 0: every receiver (server/broadcast_planner.h).
  std::size_t broadcasts_at_once = kDefaultBroadcastsAtOnce;
  // Threads that run connections (TLS, framing); the coordinator stays on the first. 1: one
  // thread for everything.
  std::size_t network_threads = 1;
  transport::ChannelOptions channel;
  std::filesystem::path state_dir;
  // A second copy of the checkpoints, the audit log and its public key, on another disk: the
  // last committed model and the log survive the loss or damage of one (server/state.h).
  std::filesystem::path state_mirror;
  std::size_t keep_checkpoints = 5;  // 0: keep all
  ModelSpec model;
  OptimizerConfig optimizer;
  std::vector<std::string> training_user_keys;  // training keys passed on to external trainers
  std::string log_level = "info";
  transport::MetricsOptions metrics;  // "metrics": the Prometheus endpoint, off unless listen is set
  std::string log_format = "text";  // or "json": one object per line (common/log.h)
  // What validation accepted but an operator should hear about (a robust rule over two inputs,
  // which protects nothing), each naming its key: logged as the server starts.
  std::vector<std::string> warnings;
};

// Throws ConfigError ("config FILE: .key.path: reason") on any invalid or unknown key.
ServerConfig load_server_config(const std::filesystem::path& file);
// The config as the JSON load_server_config reads back (paths absolute).
nlohmann::json to_json(const ServerConfig& c);

}  // namespace xsilo::server
