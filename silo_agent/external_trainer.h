// The external trainer: the hospital's own training script, kept running across rounds and
// driven over a private socket pair with the protocol of docs/trainer-protocol.md (the Python
// SDK in python/ speaks it). Tensors travel as safetensors files in a private folder, on
// /dev/shm where it has room; the agent maps what the trainer writes and checks every name,
// shape, dtype, size and value before it uses any of it.
//
// With local.workers N it starts N copies with the torchrun environment (RANK, WORLD_SIZE,
// MASTER_ADDR, ...): the script's torch.distributed does the all-reduce inside the silo; rank
// 0's answer carries the weights (and copies that never joined a process group are refused).
//
// Budgets: start-up (trainer.startup_s, from start to every copy's hello) and each task
// (trainer.task_timeout_s, else the round's training deadline, from the task's start) are
// separate. A failed round is a TrainerError with a reason code (protocol/failure.h): the
// server gets the code, the silo's log gets the whole story (with the copies' last lines). A
// copy out of step with the agent (hung, exited, broke the protocol) is stopped, and all copies
// start afresh for the next round after a backoff; a result the agent refuses (bad weights,
// NaN, no samples, the script's own error) leaves the healthy copies running, their optimizer
// state and counters kept. After max_failures failed rounds in a row the errors are fatal.
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
#include "silo_agent/trainer_budget.h"
#include "silo_agent/trainer_protocol.h"

namespace xsilo::agent {

inline constexpr int kTrainerProtocol = trainer_protocol::kVersion;

class ExternalTrainer final : public Trainer {
 public:
  explicit ExternalTrainer(const AgentConfig& cfg);
  ~ExternalTrainer() override;  // asks the copies to shut down, then stops them

  wire::TrainMetrics evaluate(const Model& model, const TrainTask& task) override;
  TrainResult train(const Model& global, const TrainTask& task, Model& local) override;
  // The script's initial weights, asked through the protocol (an "init" task): every tensor
  // it federates, as float32. The server's initial model without a separate --init mode.
  Model initial_model(const TrainTask& task);
  // From any thread: the agent is stopping; a task in progress fails at once.
  void cancel() override { cancelled_ = true; }
  // Asked once and not again after a failure (xsilo sim's initial model, --write-initial-model):
  // its errors do not say "it is started again for the next round".
  void set_one_shot() { one_shot_ = true; }

  // Where tensors are exchanged (empty before the first task).
  const std::filesystem::path& exchange_dir() const { return exchange_; }

 private:
  struct Copy;
  using Clock = std::chrono::steady_clock;
  void start(const TrainTask& task, std::size_t model_bytes);
  // start()'s steps, in order.
  void back_off();
  void open_exchange(const std::string& silo, std::size_t model_bytes);
  void launch_copy(const std::string& silo, int rank, int workers, const std::string& port);
  void greet_copies(const std::string& silo, Clock::time_point since);
  // Waits up to `grace` for the copies to exit, then stops those left (SIGTERM, then SIGKILL);
  // `log_kills`: says so in the log (the end of a run, where the script should exit by itself).
  void stop_copies(std::chrono::milliseconds grace, bool log_kills = false);
  [[noreturn]] void not_started(Copy& c);
  // How long the copies get to exit after the shutdown task (the script's code after its loop:
  // a final save, say) before they are stopped.
  static constexpr std::chrono::milliseconds kShutdownGrace{10000};
  // Sends a task to every copy and waits for every answer (within the task's budget, from now:
  // the copies are started first); rank 0's answer is returned. `model` may be null (init).
  nlohmann::json run(const std::string& kind, const Model* model, const TrainTask& task);
  nlohmann::json receive(Copy& c, const TrainerWait& wait);
  // The round failed for `why` (the silo's log; the server gets `reason`). `stop`: the copies
  // are out of step with the agent and are stopped; otherwise they keep running. `fatal`: no
  // later round can do better (the agent exits now).
  [[noreturn]] void fail(wire::FailureReason reason, const std::string& why, bool stop = true, bool fatal = false);
  // Runs `f`, turning what a misbehaving trainer can make the agent's code throw (bad JSON
  // types, file errors) into a failed round.
  template <class F>
  auto guarded(F&& f);
  TrainResult read_weights(const nlohmann::json& result, const Model& global, Model& local, const TrainTask& task);
  // Rank 0 of every copy joined a process group of local.workers (what the SDK reports).
  void check_process_group(const nlohmann::json& result);
  void log_notes(const nlohmann::json& result);
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
  bool one_shot_ = false;
  std::vector<std::string> local_only_logged_;
  bool process_group_checked_ = false;
  double last_task_seconds_ = 0;  // the last task's time, start-up not included
};

}  // namespace xsilo::agent
