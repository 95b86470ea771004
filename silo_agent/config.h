// The silo agent's JSON config; docs/configs.md documents every key.
#pragma once

#include <chrono>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/dataset.h"
#include "common/net.h"
#include "silo_agent/attack.h"
#include "silo_agent/workers.h"
#include "transport/channel.h"
#include "transport/dialer.h"
#include "transport/tls.h"

namespace xsilo::agent {

struct AgentConfig {
  std::filesystem::path file;
  std::string federation;
  std::vector<Endpoint> upstreams;   // failover order: preferred first
  transport::TlsFiles tls;
  transport::ChannelOptions channel;
  transport::DialOptions reconnect;
  std::chrono::milliseconds failover_probe{10000};  // how often a backup looks for the preferred upstream
  std::size_t chunk_bytes = 1u << 20;
  std::string trainer = "builtin";   // "builtin" (CSV data) or "synthetic" (benchmarks)
  std::filesystem::path train_data, test_data;
  std::string standardize = "none";  // "none", "local", or "given" (mean/std below)
  Standardizer given;
  std::uint64_t synthetic_samples = 100;
  std::filesystem::path state_dir;
  LocalWorkersConfig local;  // data-parallel local training ("local" in the file)
  std::string log_level = "info";
  AttackConfig attack;  // simulation only
  // Simulation only: exit right after sending this secure-aggregation step ("keys" or
  // "shares") in this round, as a crash would.
  std::string crash_step;
  std::uint64_t crash_round = 0;
};

AgentConfig load_agent_config(const std::filesystem::path& file);

}  // namespace xsilo::agent
