// The built-in trainer: logistic regression or an MLP (common/mlp.h) on the silo's CSV data,
// trained by mini-batch SGD in the agent's process or, with local.workers > 1, by N worker
// processes that sum their gradients by all-reduce (silo_agent/workers.h).
#pragma once

#include <filesystem>
#include <memory>

#include "common/dataset.h"
#include "silo_agent/config.h"
#include "silo_agent/privacy_budget.h"
#include "silo_agent/sgd.h"
#include "silo_agent/trainer.h"
#include "silo_agent/update.h"

namespace xsilo::agent {

struct LocalData {
  Dataset train, test;
  std::filesystem::path workers_train;  // local.workers > 1: the prepared rows the workers read
};

// Loads and standardizes the local data as the config says. Data that can never train (a bad
// value, no rows, another width, statistics of another width) throws ConfigError naming .data.
LocalData load_local_data(const AgentConfig& cfg);
// One CSV of the agent's data; ConfigError naming .data and the file's line on bad data.
Dataset load_data_file(const AgentConfig& cfg, const std::filesystem::path& file);

class BuiltinTrainer final : public Trainer {
 public:
  // `budget`: DP-SGD under the silo's privacy budget, which sets each round's noise.
  BuiltinTrainer(const AgentConfig& cfg, LocalData data, std::shared_ptr<const PrivacyBudget> budget = nullptr);
  wire::TrainMetrics evaluate(const Model& model, const TrainTask& task) override;
  TrainResult train(const Model& global, const TrainTask& task, Model& local) override;
  const LocalData& data() const { return data_; }
  // The options a round's training runs under, in this process or in the local workers: the
  // plan's, the row order's seed for this silo and round, DP-SGD's under a budget.
  TrainOptions options(const TrainTask& task) const;

 private:
  AgentConfig cfg_;
  LocalData data_;
  std::shared_ptr<const PrivacyBudget> budget_;
};

// One silo's round with a BuiltinTrainer over `data` (its update with its sha256): the reference
// the multi-process tests compare the daemons against.
RoundOutput run_local_round(const AgentConfig& cfg, const LocalData& data, const Model& global,
                            const wire::TrainingPlan& plan, std::uint64_t round, const std::string& silo);

}  // namespace xsilo::agent
