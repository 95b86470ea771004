#include "silo_agent/builtin_trainer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "common/mlp.h"
#include "crypto/hash.h"
#include "crypto/sources.h"
#include "silo_agent/sgd.h"
#include "silo_agent/workers.h"

namespace xsilo::agent {

Dataset load_data_file(const AgentConfig& cfg, const std::filesystem::path& file) {
  try {
    return load_csv(file);
  } catch (const std::exception& e) {
    throw ConfigError("config " + cfg.file.string() + ": .data: " + e.what());
  }
}

LocalData load_local_data(const AgentConfig& cfg) {
  LocalData d;
  // Data that can never train is the operator's to mend, as a config error (exit 2: a unit that
  // restarts on failure does not retry it forever).
  auto refuse = [&](const std::string& why) { throw ConfigError("config " + cfg.file.string() + ": .data: " + why); };
  d.train = load_data_file(cfg, cfg.train_data);
  if (d.train.rows == 0) refuse(cfg.train_data.string() + " has no rows of data");
  if (!cfg.test_data.empty()) d.test = load_data_file(cfg, cfg.test_data);
  if (d.test.rows && d.test.features != d.train.features) {
    refuse("the test data " + cfg.test_data.string() + " has " + std::to_string(d.test.features) +
           " features, the training data " + cfg.train_data.string() + " " + std::to_string(d.train.features));
  }
  try {
    if (cfg.standardize == "local") {
      const auto s = Standardizer::fit(d.train);
      s.apply(d.train);
      if (d.test.rows) s.apply(d.test);
    } else if (cfg.standardize == "given") {
      cfg.given.apply(d.train);
      if (d.test.rows) cfg.given.apply(d.test);
    } else if (cfg.standardize == "federated") {  // the federation's statistics (data.feature_stats)
      const auto s = cfg.feature_stats.standardizer();
      s.apply(d.train);
      if (d.test.rows) s.apply(d.test);
    }
  } catch (const std::exception& e) {
    refuse(std::string("standardizing ") + cfg.train_data.string() + ": " + e.what());
  }
  if (cfg.local.workers > 1) {  // written once, as loaded and standardized: what the workers read
    d.workers_train = cfg.state_dir / "local" / "train.csv";
    save_csv(d.workers_train, d.train);
  }
  return d;
}

namespace {

// Labels index the model's outputs: one past them would be read and written out of bounds
// (a binary model's 2 would train as a target of 2). Refused with the file, as a wrong feature
// count is.
void check_labels(const Dataset& data, const Network& net, const std::filesystem::path& file) {
  if (data.rows == 0 || data.classes <= net.classes()) return;
  throw TrainerError(wire::LOCAL_DATA_MISMATCH,
                     "local data " + file.string() + " has label " + std::to_string(data.classes - 1) +
                         " but the federation's model has " + std::to_string(net.classes()) + " classes (labels 0 to " +
                         std::to_string(net.classes() - 1) + "): recode the labels, or give the model more classes");
}

}  // namespace

BuiltinTrainer::BuiltinTrainer(const AgentConfig& cfg, LocalData data, std::shared_ptr<const PrivacyBudget> budget)
    : cfg_(cfg), data_(std::move(data)), budget_(std::move(budget)) {}

wire::TrainMetrics BuiltinTrainer::evaluate(const Model& model, const TrainTask&) {
  wire::TrainMetrics m;
  if (!data_.test.rows) return m;
  const Network net(model);
  if (net.inputs() != data_.test.features) {
    throw TrainerError(wire::LOCAL_DATA_MISMATCH, "local test data has " + std::to_string(data_.test.features) +
                       " features but the federation's model takes " + std::to_string(net.inputs()));
  }
  check_labels(data_.test, net, cfg_.test_data);
  const auto ev = net.evaluate(model.flat(), data_.test);
  m.set_eval_loss(ev.loss);
  m.set_eval_accuracy(ev.accuracy);
  m.set_eval_samples(ev.samples);
  return m;
}

TrainOptions BuiltinTrainer::options(const TrainTask& task) const {
  const auto& plan = task.plan;
  TrainOptions opts;
  opts.epochs = plan.local_epochs();
  opts.batch_size = plan.batch_size();
  opts.learning_rate = plan.learning_rate();
  opts.weight_decay = plan.weight_decay();
  // Silos shuffle differently, runs repeat (and the local workers' 8-bit rounding derives its own from it).
  opts.seed = crypto::derive_seed(plan.seed(), task.round, "row-order", task.silo);
  if (budget_) {
    // DP-SGD at the plan's batch size as the expected one; the budget sets the noise.
    const auto& pc = budget_->config();
    opts.dp.clip_norm = pc.clip_norm;
    opts.dp.sample_rate = std::min(1.0, static_cast<double>(std::max<std::uint32_t>(1, opts.batch_size)) /
                                            static_cast<double>(std::max<std::size_t>(1, data_.train.rows)));
    const std::uint64_t steps = dp_steps_per_epoch(opts.dp.sample_rate) * opts.epochs;
    opts.dp.noise_multiplier = budget_->noise_for(opts.dp.sample_rate, steps);
  }
  return opts;
}

TrainResult BuiltinTrainer::train(const Model& global, const TrainTask& task, Model& local) {
  const Network net(global);
  if (net.inputs() != data_.train.features) {
    throw TrainerError(wire::LOCAL_DATA_MISMATCH, "local data has " + std::to_string(data_.train.features) +
                       " features but the federation's model takes " + std::to_string(net.inputs()));
  }
  check_labels(data_.train, net, cfg_.train_data);
  const auto t0 = std::chrono::steady_clock::now();
  const TrainOptions opts = options(task);
  std::copy(global.flat().begin(), global.flat().end(), local.flat().begin());
  TrainStats stats;
  if (cfg_.local.workers > 1) {
    // The silo's own rows, trained by its local workers; with data_parallel the result equals
    // the single process's within float tolerance, whatever workers die on the way; with gossip
    // it is the survivors' combined push-sum model (gossip.h).
    // The round's folder outlives a failed or cut-off run (its checkpoint resumes this round's
    // training, local.checkpoint_ms); another round's can go.
    const auto dir = cfg_.state_dir / "local" / ("round-" + std::to_string(task.round));
    if (std::filesystem::exists(dir.parent_path())) {
      for (const auto& e : std::filesystem::directory_iterator(dir.parent_path())) {
        const bool a_round = e.is_directory() && e.path().filename().string().rfind("round-", 0) == 0;
        if (a_round && e.path() != dir) std::filesystem::remove_all(e.path());
      }
    }
    const auto r = train_with_workers(cfg_.local, dir, local, data_.workers_train, opts);
    for (const auto& e : r.events) spdlog::warn("round {}: local workers: {}", task.round, e);
    spdlog::info("round {}: {} local workers trained {} steps", task.round, cfg_.local.workers, r.stats.steps);
    std::filesystem::remove_all(dir);
    stats = r.stats;
  } else {
    stats = train_sgd(net, local.flat(), data_.train, opts);
  }
  TrainResult out;
  if (opts.dp.on()) out.dp = DpSgdReport{.sample_rate = opts.dp.sample_rate,
                                          .noise_multiplier = opts.dp.noise_multiplier,
                                          .steps = stats.steps,
                                          .clip_norm = opts.dp.clip_norm};
  out.num_samples = data_.train.rows;
  out.metrics.set_train_loss(stats.mean_loss);
  out.metrics.set_train_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return out;
}

RoundOutput run_local_round(const AgentConfig& cfg, const LocalData& data, const Model& global,
                            const wire::TrainingPlan& plan, std::uint64_t round, const std::string& silo) {
  BuiltinTrainer trainer(cfg, data);
  const TrainTask task{round, silo, plan};
  auto out = run_round(trainer, global, task);
  if (out.update) out.sha256 = crypto::sha256_hex(out.update->flat());
  return out;
}

}  // namespace xsilo::agent
