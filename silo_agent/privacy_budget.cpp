#include "silo_agent/privacy_budget.h"

#include <fmt/format.h>

#include <set>
#include <sstream>

#include "common/fs.h"
#include "protocol/privacy.h"

namespace xsilo::agent {

PrivacyBudget::PrivacyBudget(PrivacyConfig cfg, std::filesystem::path sent_log)
    : cfg_(cfg), sent_log_(std::move(sent_log)) {}

std::vector<wire::PrivacySpend> PrivacyBudget::spent() const {
  std::vector<wire::PrivacySpend> out;
  if (!std::filesystem::exists(sent_log_)) {
    // Audit heads reach a silo only with the end of a round it uploaded to: with heads and no
    // log of its uploads, the log is lost, not empty.
    const auto heads = sent_log_.parent_path() / "audit_heads.jsonl";
    if (std::filesystem::exists(heads) && std::filesystem::file_size(heads) > 0) {
      throw TrainerError("privacy budget: " + sent_log_.string() + " is gone, but " + heads.string() +
                             " shows this silo uploaded before; it cannot know what it has spent, so it trains no "
                             "more (restore the file from a backup)",
                         true, wire::PRIVACY_BUDGET_SPENT);
    }
    return out;
  }
  std::istringstream in(read_file(sent_log_));
  std::set<std::string> uploads;
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    try {
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("privacy")) continue;
      if (!uploads.insert(j.value("update_sha256", "")).second) continue;  // the same upload again
      out.push_back(protocol::privacy_from_json(j.at("privacy")));
    } catch (const std::exception& e) {
      throw TrainerError(fmt::format("privacy budget: line {} of {} cannot be read ({}); the silo cannot know what "
                                     "it has spent, so it trains no more (restore the file from a backup)",
                                     n, sent_log_.string(), e.what()),
                         true, wire::PRIVACY_BUDGET_SPENT);
    }
  }
  return out;
}

double PrivacyBudget::noise_for(double q, std::uint64_t steps) const {
  const auto s = spent();
  if (cfg_.noise_multiplier > 0) {  // a fixed noise: train only if the round fits
    charge(s, DpSgdReport{.sample_rate = q, .noise_multiplier = cfg_.noise_multiplier, .steps = steps, .clip_norm = cfg_.clip_norm});
    return cfg_.noise_multiplier;
  }
  if (s.size() >= cfg_.rounds) {
    throw TrainerError(wire::PRIVACY_BUDGET_SPENT,
                       fmt::format("privacy budget: the {} rounds privacy.rounds planned for are spent (epsilon {:.3f} "
                                   "of {})", cfg_.rounds, protocol::dp_sgd_epsilon(s, cfg_.delta), cfg_.max_epsilon));
  }
  const double sigma = protocol::dp_sgd_noise_for(s, q, steps, cfg_.rounds - s.size(), cfg_.max_epsilon, cfg_.delta);
  if (sigma == 0) {
    throw TrainerError(wire::PRIVACY_BUDGET_SPENT,
                       fmt::format("privacy budget: no noise multiplier fits {} more rounds in epsilon {}",
                                   cfg_.rounds - s.size(), cfg_.max_epsilon));
  }
  return sigma;
}

wire::PrivacySpend PrivacyBudget::charge(const std::optional<DpSgdReport>& report) const {
  if (!report) {
    throw TrainerError(wire::TRAINER_MISCONFIGURED,
                       "privacy.max_epsilon is set but the trainer ran no DP-SGD (an external trainer reports its "
                       "sample rate, noise multiplier and steps: docs/privacy.md); the update stays here");
  }
  return charge(spent(), *report);
}

wire::PrivacySpend PrivacyBudget::charge(std::vector<wire::PrivacySpend> spent, const DpSgdReport& report) const {
  wire::PrivacySpend p;
  p.set_mechanism(protocol::kDpSgd);
  p.set_sample_rate(report.sample_rate);
  p.set_noise_multiplier(report.noise_multiplier);
  p.set_steps(report.steps);
  p.set_clip_norm(report.clip_norm);
  p.set_delta(cfg_.delta);
  p.set_max_epsilon(cfg_.max_epsilon);
  if (const auto st = protocol::check_privacy(p); !st) {
    throw TrainerError(wire::TRAINER_MISCONFIGURED, "the trainer's DP-SGD report is not usable: " + st.error().message());
  }
  spent.push_back(p);
  const double eps = protocol::dp_sgd_epsilon(spent, cfg_.delta);
  if (eps > cfg_.max_epsilon) {
    throw TrainerError(wire::PRIVACY_BUDGET_SPENT,
                       fmt::format("privacy budget: this round would bring epsilon to {:.3f}, past privacy.max_epsilon "
                                   "{} (delta {}); the silo trains no more rounds", eps, cfg_.max_epsilon, cfg_.delta));
  }
  p.set_epsilon(eps);
  return p;
}

BudgetedTrainer::BudgetedTrainer(std::unique_ptr<Trainer> inner, std::shared_ptr<const PrivacyBudget> budget)
    : inner_(std::move(inner)), budget_(std::move(budget)) {}

// Under a budget nothing but the DP-SGD update leaves the silo: metrics computed on its records
// (losses, accuracy, even the training time) are exact functions of them and would be
// released uncharged, as would the sample count that weighs the update.
wire::TrainMetrics BudgetedTrainer::evaluate(const Model&, const TrainTask&) { return {}; }

TrainResult BudgetedTrainer::train(const Model& global, const TrainTask& task, Model& local) {
  TrainResult r = inner_->train(global, task, local);
  r.privacy = budget_->charge(r.dp);
  r.metrics = {};
  r.num_samples = 1;  // every silo's update weighs the same: a record's presence changes nothing
  return r;
}

}  // namespace xsilo::agent
