// The silo's own record-level privacy budget (docs/privacy.md): the hospital, not the server,
// decides how much epsilon its patients' records may spend, and the agent enforces it.
//
// What the silo has spent is what left it: every line of its sent.jsonl (silo_state.h) that
// carries a "privacy" spend, written durably before the upload it names leaves. The budget
// reads those lines afresh each round and composes them with the accountant
// (protocol/privacy.h); nothing else counts, so a crash, a restart or a lost round can never make
// the silo forget a release. A line it cannot read stops training (fail closed).
//
// Before a built-in round, the budget chooses the noise multiplier (the config's, or the
// smallest that lets the planned rounds fit); after any round, it charges the trainer's DP-SGD
// report and refuses the update (PRIVACY_BUDGET_SPENT) when it would go past max_epsilon, or
// when the trainer ran no DP-SGD at all.
#pragma once

#include <filesystem>
#include <vector>

#include "proto/xsilo.pb.h"
#include "silo_agent/config.h"
#include "silo_agent/trainer.h"

namespace xsilo::agent {

class PrivacyBudget {
 public:
  PrivacyBudget(PrivacyConfig cfg, std::filesystem::path sent_log);
  const PrivacyConfig& config() const { return cfg_; }

  // One spend per upload in sent.jsonl (an upload sent twice counts once). Throws a fatal
  // TrainerError when a line's spend cannot be read, or when sent.jsonl is gone while the
  // audit heads beside it show the silo uploaded before.
  std::vector<wire::PrivacySpend> spent() const;
  // The noise multiplier for a round of `steps` DP-SGD steps at rate q. Throws TrainerError
  // (PRIVACY_BUDGET_SPENT) when no round fits any more.
  double noise_for(double q, std::uint64_t steps) const;
  // The spend of a trained round, epsilon so far included. Throws TrainerError
  // (PRIVACY_BUDGET_SPENT) when it would exceed max_epsilon, and (TRAINER_MISCONFIGURED) when
  // the trainer reported no DP-SGD.
  wire::PrivacySpend charge(const std::optional<DpSgdReport>& report) const;

 private:
  wire::PrivacySpend charge(std::vector<wire::PrivacySpend> spent, const DpSgdReport& report) const;
  PrivacyConfig cfg_;
  std::filesystem::path sent_log_;
};

// Any trainer under a budget: each trained round is charged before its update can leave, and
// nothing else computed on the records leaves with it: no metrics (evaluate() answers none),
// and a sample count of 1, so every silo's update weighs the same.
class BudgetedTrainer final : public Trainer {
 public:
  BudgetedTrainer(std::unique_ptr<Trainer> inner, std::shared_ptr<const PrivacyBudget> budget);
  wire::TrainMetrics evaluate(const Model& model, const TrainTask& task) override;
  TrainResult train(const Model& global, const TrainTask& task, Model& local) override;
  void cancel() override { inner_->cancel(); }

 private:
  std::unique_ptr<Trainer> inner_;
  std::shared_ptr<const PrivacyBudget> budget_;
};

}  // namespace xsilo::agent
