// What a simulation adds to a silo agent, and nothing in production has: `xsilo agent --config
// FILE --simulate SIMFILE` runs the ordinary agent with these hooks. Attacks (a Byzantine
// silo's update), crashes at a secure-aggregation step, hostile protocol messages, and the
// synthetic trainer of the benchmarks (no data, as little compute as possible).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "silo_agent/agent.h"
#include "tools/sim_attack.h"

namespace xsilo::tools {

// The exit code of a silo that died of its own simulated crash (`crash_after`): the sim tells it
// from a kill it made itself (128 + SIGKILL) and counts the fault as fired.
inline constexpr int kCrashExit = 97;

struct SimAgentConfig {
  AttackConfig attack;                 // kind "": honest
  std::string crash_after;             // "keys" or "shares": die right after sending that step, with kCrashExit
  std::uint64_t crash_round = 0;
  std::optional<std::uint64_t> synthetic_samples;  // the synthetic trainer, with this sample count
  // A silo hostile inside secure aggregation, signing what it sends with its own key:
  // "bad_keys" (an unusable mask key), "garbage_shares" (boxes that open to nothing).
  std::string hostile;
  // Simulated compute: each round's training takes at least a time drawn in [min, max] ms from
  // the round and the silo (the trainer sleeps the rest), so that rounds last long enough for
  // the sim's faults to land inside the phases they name. 0: as fast as it goes.
  std::uint64_t train_min_ms = 0, train_max_ms = 0;
  bool active() const {
    return attack.active() || !crash_after.empty() || synthetic_samples || !hostile.empty() || train_max_ms > 0;
  }
};

// A silo's simulated training time for its `round`-th training, in [min_ms, max_ms]: drawn from
// the plan's seed, the round and the silo (purpose "sim-training-time"). The paced trainer
// sleeps it; `xsilo sim --in-process` advances its simulated clock by it.
std::uint64_t sim_training_ms(std::uint64_t seed, std::uint64_t round, const std::string& silo, std::uint64_t min_ms,
                              std::uint64_t max_ms);

SimAgentConfig load_sim_agent_config(const std::filesystem::path& file);
nlohmann::json to_json(const SimAgentConfig& c);

// The trainer and fault hook the simulation asks for, on top of the agent's own config.
agent::AgentHooks make_sim_hooks(const agent::AgentConfig& cfg, const SimAgentConfig& sim);

}  // namespace xsilo::tools
