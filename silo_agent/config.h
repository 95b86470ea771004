// The silo agent's JSON config; docs/configs.md documents every key.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/dataset.h"
#include "common/feature_stats.h"
#include "common/net.h"
#include "crypto/secagg.h"
#include "silo_agent/workers.h"
#include "transport/channel.h"
#include "transport/dialer.h"
#include "transport/metrics_endpoint.h"
#include "transport/tls.h"

namespace xsilo::agent {

// FeatureStats: the silo's part of the federation's feature statistics (silo_agent/stats_trainer.h).
enum class TrainerKind { Builtin, External, FeatureStats };

// "trainer": {"kind": "external", ...}: the hospital's own training script
// (docs/bring-your-own-model.md, docs/trainer-protocol.md).
struct ExternalTrainerConfig {
  std::vector<std::string> command;                       // argv; the first is found on PATH
  std::filesystem::path cwd;                              // empty: the agent's folder
  std::vector<std::pair<std::string, std::string>> env;   // added to the agent's environment
  std::chrono::milliseconds startup{60000};               // from start to its hello
  std::chrono::milliseconds task_timeout{0};              // 0: the server's training deadline
  int max_failures = 3;                                   // consecutive failed rounds, then exit
  bool evaluate = false;                                  // also send evaluate tasks each round
};

// "privacy": the silo's own record-level budget (docs/privacy.md). The agent enforces it: it
// refuses to train, or to send an update, past max_epsilon at delta.
struct PrivacyConfig {
  double max_epsilon = 0;  // 0: no budget
  double delta = 1e-5;
  // The built-in trainer's DP-SGD: the per-example clip norm, and the noise multiplier (0: the
  // smallest that lets `rounds` rounds of the server's plan fit in max_epsilon).
  double clip_norm = 1.0;
  double noise_multiplier = 0;
  std::uint64_t rounds = 0;
  bool on() const { return max_epsilon > 0; }
};

struct AgentConfig {
  std::filesystem::path file;
  std::string federation;
  std::vector<Endpoint> upstreams;   // failover order: preferred first
  transport::TlsFiles tls;
  // Which upstreams this silo talks to, by certificate name and role ("trust" in the file):
  // by default any server or edge the federation CA certified. A pinned server list also
  // decides which server may run the silo's secure groups.
  transport::AllowList trust{wire::SERVER, wire::EDGE};
  transport::ChannelOptions channel;
  transport::DialOptions reconnect;
  std::chrono::milliseconds failover_probe{10000};  // how often a backup looks for the preferred upstream
  std::size_t chunk_bytes = 1u << 20;
  TrainerKind trainer = TrainerKind::Builtin;
  ExternalTrainerConfig external;
  // The silo's data: read by the built-in trainer; told to an external trainer as
  // XSILO_TRAIN_DATA / XSILO_TEST_DATA.
  std::filesystem::path train_data, test_data;
  std::string standardize = "none";  // builtin: "none", "local", "federated" or "given" (mean/std below)
  Standardizer given;
  // "data.feature_stats": the federation's feature statistics (a JSON file of mean, var, count):
  // handed to an external trainer with every task (task.feature_stats); the built-in trainer
  // standardizes with them under "standardize": "federated".
  std::filesystem::path feature_stats_file;
  FeatureStats feature_stats;
  std::filesystem::path state_dir;
  // "secure_floor": the weakest secure setup this silo joins, whatever the server's signed setup
  // states (crypto/secagg.h, Floor): sums of at least min_sum silos, and safety against a server
  // colluding with `corrupt` of each group, and (min_noise_multiplier, when above 0) distributed
  // DP's noise: a setup whose Skellam part gives a smaller noise multiplier once the shares of
  // the `corrupt` colluders are discounted, or has none, is refused (docs/privacy.md).
  crypto::secagg::Floor secure_floor;
  LocalWorkersConfig local;  // data-parallel local training ("local" in the file)
  PrivacyConfig privacy;
  std::string log_level = "info";
  transport::MetricsOptions metrics;  // "metrics": the Prometheus endpoint, off unless listen is set
  std::string log_format = "text";  // or "json": one object per line (common/log.h)
};

// Throws ConfigError ("config FILE: .key.path: reason") on any invalid or unknown key.
AgentConfig load_agent_config(const std::filesystem::path& file);
// The "privacy" section.
PrivacyConfig parse_privacy(const ConfigNode& node, TrainerKind trainer, const LocalWorkersConfig& local);
// The "local" section (data-parallel workers).
LocalWorkersConfig parse_local(const ConfigNode& node, TrainerKind trainer);
// The config as the JSON load_agent_config reads back (paths absolute where they were given so).
nlohmann::json to_json(const AgentConfig& c);

}  // namespace xsilo::agent
