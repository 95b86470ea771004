// The server's JSON config; docs/configs.md documents every key.
#pragma once

#include <chrono>
#include <filesystem>
#include <set>
#include <string>

#include "common/mlp.h"
#include "crypto/fixed_point.h"
#include "common/net.h"
#include "proto/xsilo.pb.h"
#include "server/optimizer.h"
#include "transport/channel.h"
#include "transport/tls.h"

namespace xsilo::server {

struct SelectionConfig {
  std::size_t min_silos = 2;        // connected silos needed to start a round
  std::size_t min_updates = 0;      // updates needed to commit (0: min_silos)
  std::size_t silos_per_round = 0;  // k; 0: every connected silo
  double over_selection = 0.0;      // select ceil(k * (1 + s)), close at k
};

struct Deadlines {
  std::chrono::milliseconds join{30000};
  std::chrono::milliseconds train{120000};
  std::chrono::milliseconds upload{60000};
};

// How the updates of a round are combined (docs/robust.md has the exact definitions).
struct AggregationConfig {
  std::string rule = "fedavg";  // fedavg, krum, multi_krum, median, trimmed_mean, bulyan, centered_clip
  std::size_t f = 0;            // Byzantine silos tolerated (krum, multi_krum, bulyan, trimmed_mean)
  std::size_t m = 0;            // multi_krum: how many to average (0: n - f)
  double beta = 0;              // trimmed_mean: b = floor(beta * n) instead of b = f
  double tau = 1.0;             // centered_clip radius
  std::size_t iterations = 1;   // centered_clip
  double clip_norm = 0;         // clip each update to this L2 norm first (0: off)
  std::string fallback = "median";  // when dropouts leave too few updates: median, fedavg, abort
  bool needs_all_updates() const { return rule != "fedavg" || clip_norm > 0; }
};

// Secure aggregation (docs/security.md).
struct SecureConfig {
  std::string mode = "off";        // off, global, grouped
  std::size_t min_group = 3;       // grouped: every group has at least this many silos
  double threshold = 2.0 / 3.0;    // t = max(2, ceil(threshold * group size))
  std::uint32_t bits = 32;
  std::uint32_t fraction_bits = 16;
  double clip_norm = 1.0;
  double max_weight = 1000.0;
  std::chrono::milliseconds keys_deadline{30000};    // each of the two key phases
  std::chrono::milliseconds unmask_deadline{30000};
  bool on() const { return mode != "off"; }
  crypto::FixedPointParams codec() const { return {bits, fraction_bits, clip_norm, max_weight}; }
};

struct ServerConfig {
  std::filesystem::path file;
  std::string config_sha256;
  std::string federation;
  Endpoint listen;
  std::filesystem::path port_file;   // written with the bound port (useful with port 0)
  transport::TlsFiles tls;
  transport::AllowList allow;
  std::set<std::string> expected_silos;  // the silo allow-list when it names silos
  transport::ChannelOptions channel;
  std::size_t chunk_bytes = 1u << 20;
  std::filesystem::path state_dir;
  std::size_t keep_checkpoints = 5;  // 0: keep all
  ModelSpec model;
  std::uint64_t rounds = 10;
  std::uint64_t seed = 1;
  SelectionConfig selection;
  Deadlines deadlines;
  wire::TrainingPlan plan;
  OptimizerConfig optimizer;
  AggregationConfig aggregation;
  SecureConfig secure;
  std::string log_level = "info";
};

// Throws ConfigError ("config FILE: .key.path: reason") on any invalid or unknown key.
ServerConfig load_server_config(const std::filesystem::path& file);

}  // namespace xsilo::server
