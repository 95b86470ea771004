// The external trainer: the hospital's own training script, kept running across rounds and
// driven over a private socket pair with the protocol of docs/trainer-protocol.md (the Python
// SDK in python/ speaks it). Tensors travel as safetensors files in a private folder, on
// /dev/shm where it has room; the agent maps what the trainer writes and checks every name,
// shape, dtype, size and value before it uses any of it.
//
// With local.workers N it starts N copies with the torchrun environment (RANK, WORLD_SIZE,
// MASTER_ADDR, ...): the script's torch.distributed does the all-reduce inside the silo; rank
// 0's answer carries the weights. A copy that fails ends the round for the silo; all copies
// start afresh for the next round, after a backoff; after max_failures failed rounds in a row
// the trainer's errors are fatal.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/process.h"
#include "silo_agent/config.h"
#include "silo_agent/trainer.h"
#include "silo_agent/trainer_protocol.h"

namespace xsilo::agent {

inline constexpr int kTrainerProtocol = trainer_protocol::kVersion;

class ExternalTrainer final : public Trainer {
 public:
  explicit ExternalTrainer(const AgentConfig& cfg);
  ~ExternalTrainer() override;  // asks the copies to shut down, then stops them

  wire::TrainMetrics evaluate(const Model& model, const TrainTask& task) override;
  TrainResult train(const Model& global, const TrainTask& task, Model& local) override;
  // From any thread: the agent is stopping; a task in progress fails at once.
  void cancel() override { cancelled_ = true; }

  // Where tensors are exchanged (empty before the first task).
  const std::filesystem::path& exchange_dir() const { return exchange_; }

 private:
  struct Copy;
  using Clock = std::chrono::steady_clock;
  void start(const TrainTask& task, std::size_t model_bytes);
  void stop_copies(std::chrono::milliseconds grace);
  // Sends a task to every copy and waits for every answer; rank 0's answer is returned.
  nlohmann::json run(const std::string& kind, const Model& model, const TrainTask& task, Clock::time_point deadline);
  nlohmann::json receive(Copy& c, Clock::time_point deadline, const char* waiting_for);
  [[noreturn]] void fail(const std::string& why);
  // Runs `f`, turning what a misbehaving trainer can make the agent's code throw (bad JSON
  // types, file errors) into a failed round.
  template <class F>
  auto guarded(F&& f);
  TrainResult read_weights(const nlohmann::json& result, const Model& global, Model& local, const TrainTask& task);
  void clear_exchange();
  std::string logs() const;

  AgentConfig cfg_;
  std::filesystem::path dir_;       // state_dir/trainer: the copies' logs
  std::filesystem::path exchange_;  // tensor files
  bool exchange_in_shm_ = false;
  std::vector<std::unique_ptr<Copy>> copies_;
  std::uint64_t next_id_ = 0;
  int consecutive_failures_ = 0;
  std::atomic<bool> cancelled_{false};
  std::vector<std::string> local_only_logged_;
};

}  // namespace xsilo::agent
