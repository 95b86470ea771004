// Record-level differential privacy in the silo (docs/privacy.md): DP-SGD in the built-in
// trainer, the noise source, the silo's budget over its sent.jsonl, the trainer protocol's
// report, the audit check of every claimed epsilon, and the configs.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <random>

#include "common/config.h"
#include "common/dataset.h"
#include "common/fs.h"
#include "common/mlp.h"
#include "crypto/noise.h"
#include "protocol/privacy.h"
#include "server/audit.h"
#include "silo_agent/config.h"
#include "silo_agent/privacy_budget.h"
#include "silo_agent/sgd.h"
#include "silo_agent/silo_state.h"
#include "silo_agent/trainer_protocol.h"
#include "tests/testlib.h"
#include "tests/result_util.h"

namespace xsilo {
namespace {

Dataset separable(std::size_t rows, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0, 1);
  Dataset d;
  d.rows = rows;
  d.features = 3;
  d.classes = 2;
  for (std::size_t i = 0; i < rows * 3; ++i) d.x.push_back(n(rng));
  for (std::size_t i = 0; i < rows; ++i) d.y.push_back(d.x[i * 3] + 0.5f * d.x[i * 3 + 1] > 0 ? 1 : 0);
  return d;
}

crypto::NoiseSource::Key key(std::uint8_t b) {
  crypto::NoiseSource::Key k{};
  k.fill(b);
  return k;
}

TEST(Noise, TheNoiseIsAStandardNormalAndOnlyAFixedKeyRepeatsIt) {
  crypto::NoiseSource a(key(1)), b(key(1)), c(key(2)), fresh1, fresh2;
  const int n = 200000;
  double sum = 0, sq = 0;
  int same_key = 0, other_key = 0, fresh_same = 0;
  for (int i = 0; i < n; ++i) {
    const double x = a.gaussian();
    sum += x;
    sq += x * x;
    same_key += x == b.gaussian();
    other_key += x == c.gaussian();
    fresh_same += fresh1.gaussian() == fresh2.gaussian();
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 5.0 / std::sqrt(n));                 // five standard errors
  EXPECT_NEAR(var, 1.0, 5.0 * std::sqrt(2.0 / n));
  EXPECT_EQ(same_key, n);
  EXPECT_EQ(other_key, 0);
  EXPECT_EQ(fresh_same, 0);  // two fresh keys: nobody can replay the noise
}

TEST(DpSgd, WithoutClippingOrNoiseAFullBatchStepIsTheMeanGradient) {
  const auto d = separable(64, 3);
  Model plain = init_model({"logistic", 3, 2, {}, 1, 0, {}});
  Model dp = plain;
  const Network net(plain);
  agent::TrainOptions o;
  o.epochs = 1;
  o.batch_size = 64;  // one step over every row
  o.learning_rate = 0.5f;
  agent::train_sgd(net, plain.flat(), d, o);
  o.dp = {.clip_norm = 1e9, .noise_multiplier = 0, .sample_rate = 1.0, .noise_key = key(3)};
  const auto stats = agent::train_sgd(net, dp.flat(), d, o);
  EXPECT_EQ(stats.steps, 1u);
  EXPECT_EQ(stats.examples, 64u);
  for (std::size_t i = 0; i < plain.size(); ++i) EXPECT_NEAR(dp.flat()[i], plain.flat()[i], 1e-5) << i;
}

TEST(DpSgd, EachRecordMovesTheModelByAtMostTheClipNorm) {
  const auto d = separable(50, 4);
  Model before = init_model({"mlp", 3, 2, {8}, 1, 0, {}});
  Model after = before;
  const Network net(before);
  agent::TrainOptions o;
  o.learning_rate = 1.0f;
  const double clip = 1e-3;
  o.dp = {.clip_norm = clip, .noise_multiplier = 0, .sample_rate = 1.0, .noise_key = key(4)};
  agent::train_sgd(net, after.flat(), d, o);
  double sq = 0;
  for (std::size_t i = 0; i < before.size(); ++i) {
    const double step = after.flat()[i] - before.flat()[i];
    sq += step * step;
  }
  // lr * |sum of 50 clipped gradients| / 50 <= lr * clip; unclipped the step is far larger.
  EXPECT_LE(std::sqrt(sq), clip * (1 + 1e-4));
  EXPECT_GT(std::sqrt(sq), clip * 0.1);
}

TEST(DpSgd, StepsTakePoissonSamplesOfTheRateAndAddNoiseOfTheMultiplierTimesTheClip) {
  const auto d = separable(1000, 5);
  Model m = init_model({"logistic", 3, 2, {}, 1, 0, {}});
  const Network net(m);
  agent::TrainOptions o;
  o.epochs = 4;
  o.learning_rate = 0.0f;  // the model stays put: only the sampling is measured here
  o.dp = {.clip_norm = 1, .noise_multiplier = 1, .sample_rate = 0.05, .noise_key = key(5)};
  const auto stats = agent::train_sgd(net, m.flat(), d, o);
  EXPECT_EQ(stats.steps, 4u * 20u);  // an epoch is 1 / q steps
  const double expect = 0.05 * 1000 * 80, sd = std::sqrt(80 * 1000 * 0.05 * 0.95);
  EXPECT_NEAR(static_cast<double>(stats.examples), expect, 5 * sd);

  // The noise: with a zero clip contribution (lr 1, one step, no rows sampled at rate ~0) the
  // parameters move by N(0, (sigma C / (q N))^2) each.
  Model z = init_model({"logistic", 3, 2, {}, 1, 0, {}});
  Model z0 = z;
  agent::TrainOptions n;
  n.learning_rate = 1.0f;
  n.dp = {.clip_norm = 2, .noise_multiplier = 3, .sample_rate = 1.0, .noise_key = key(6)};
  Dataset one = separable(1, 6);
  one.x.assign(3, 0.0f);  // a record whose gradient is 0 in the weights (its bias moves by it)
  agent::train_sgd(Network(z), z.flat(), one, n);
  // sigma * C / (q * N) = 6: each weight's step is one draw of N(0, 36); four draws stay within 5 sd.
  for (std::size_t i = 0; i < 3; ++i) EXPECT_LT(std::abs(z.flat()[i] - z0.flat()[i]), 30.0) << i;
  EXPECT_NE(z.flat()[0], z0.flat()[0]);
}

TEST(DpSgd, ARecordWhoseGradientOverflowsAddsNothing) {
  Dataset d = separable(20, 7);
  for (std::size_t f = 0; f < 3; ++f) d.x[f] = std::numeric_limits<float>::quiet_NaN();  // row 0
  Model m = init_model({"logistic", 3, 2, {}, 1, 0, {}});
  agent::TrainOptions o;
  o.learning_rate = 0.5f;
  o.dp = {.clip_norm = 1, .noise_multiplier = 0.5, .sample_rate = 1.0, .noise_key = key(7)};
  agent::train_sgd(Network(m), m.flat(), d, o);
  for (float v : m.flat()) EXPECT_TRUE(std::isfinite(v));
}

agent::PrivacyConfig budget_config(double max_epsilon, std::uint64_t rounds, double sigma = 0) {
  agent::PrivacyConfig c;
  c.max_epsilon = max_epsilon;
  c.delta = 1e-5;
  c.rounds = rounds;
  c.noise_multiplier = sigma;
  return c;
}

void record_upload(const std::filesystem::path& log, std::uint64_t round, const wire::PrivacySpend& p,
                   const std::string& sha = "") {
  agent::commit_record(log, {{"round", round},
                             {"update_sha256", sha.empty() ? "u" + std::to_string(round) : sha},
                             {"privacy", protocol::privacy_json(p)}});
}

TEST(PrivacyBudget, TheNoiseSpreadsTheBudgetOverThePlannedRoundsAndTheSiloRefusesTheNext) {
  test::TempDir dir;
  const auto log = dir / "sent.jsonl";
  const agent::PrivacyBudget budget(budget_config(3.0, 4), log);
  const double q = 0.02;
  const std::uint64_t steps = 50;
  double last = 0;
  for (std::uint64_t round = 1; round <= 4; ++round) {
    const double sigma = budget.noise_for(q, steps);
    const auto p = budget.charge(agent::DpSgdReport{q, sigma, steps, 1.0});
    EXPECT_GT(p.epsilon(), last);
    EXPECT_LE(p.epsilon(), 3.0);
    last = p.epsilon();
    record_upload(log, round, p);
  }
  EXPECT_GT(last, 2.9);  // the plan spends the budget, not a fraction of it
  EXPECT_NEAR(protocol::dp_sgd_epsilon(budget.spent(), 1e-5), last, 1e-12);
  try {
    (void)budget.noise_for(q, steps);
    FAIL() << "a fifth round was allowed";
  } catch (const agent::TrainerError& e) {
    EXPECT_EQ(e.reason(), wire::PRIVACY_BUDGET_SPENT);
    EXPECT_FALSE(e.fatal());
  }
}

TEST(PrivacyBudget, AFixedNoiseTrainsUntilTheNextRoundWouldPassTheBudget) {
  test::TempDir dir;
  const auto log = dir / "sent.jsonl";
  const agent::PrivacyBudget budget(budget_config(1.0, 0, 1.1), log);
  int rounds = 0;
  for (;; ++rounds) {
    double sigma = 0;
    try {
      sigma = budget.noise_for(0.01, 100);
    } catch (const agent::TrainerError& e) {
      EXPECT_EQ(e.reason(), wire::PRIVACY_BUDGET_SPENT);
      EXPECT_NE(std::string(e.what()).find("past privacy.max_epsilon"), std::string::npos) << e.what();
      break;
    }
    record_upload(dir / "sent.jsonl", static_cast<std::uint64_t>(rounds + 1),
                  budget.charge(agent::DpSgdReport{0.01, sigma, 100, 1.0}));
    ASSERT_LT(rounds, 1000);
  }
  EXPECT_GT(rounds, 0);
  // The rounds it trained are within the budget; one more is not.
  auto spent = budget.spent();
  EXPECT_LE(protocol::dp_sgd_epsilon(spent, 1e-5), 1.0);
  spent.push_back(spent.back());
  EXPECT_GT(protocol::dp_sgd_epsilon(spent, 1e-5), 1.0);
  // An external trainer's report past the budget is refused the same way, after training.
  EXPECT_THROW((void)budget.charge(agent::DpSgdReport{0.01, 1.1, 100, 1.0}), agent::TrainerError);
  // And a trainer that ran no DP-SGD sends nothing.
  try {
    (void)budget.charge(std::nullopt);
    FAIL();
  } catch (const agent::TrainerError& e) {
    EXPECT_EQ(e.reason(), wire::TRAINER_MISCONFIGURED);
  }
}

TEST(PrivacyBudget, AnUploadLoggedTwiceCountsOnceAndADamagedLogStopsTraining) {
  test::TempDir dir;
  const auto log = dir / "sent.jsonl";
  const agent::PrivacyBudget budget(budget_config(8.0, 10), log);
  const auto p = budget.charge(agent::DpSgdReport{0.1, 1.0, 10, 1.0});
  record_upload(log, 1, p, "same");
  record_upload(log, 1, p, "same");  // the same upload, sent again after a reconnect
  EXPECT_EQ(budget.spent().size(), 1u);
  append_durable(log, "{\"round\": 2, \"update_sha256\": \"x\", \"privacy\": {\"mechanism\": \"dp_sgd\"}}\n");
  try {
    (void)budget.spent();
    FAIL() << "a damaged spend was read as nothing";
  } catch (const agent::TrainerError& e) {
    EXPECT_TRUE(e.fatal());
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
}

TEST(PrivacyBudget, ALostLedgerStopsASiloThatUploadedBeforeButNotAFreshOne) {
  test::TempDir dir;
  const auto log = dir / "sent.jsonl";
  const agent::PrivacyBudget budget(budget_config(8.0, 10), log);
  EXPECT_TRUE(budget.spent().empty());  // a fresh silo
  record_upload(log, 1, budget.charge(agent::DpSgdReport{0.1, 1.0, 10, 1.0}));
  append_durable(dir / "audit_heads.jsonl", "{\"seq\": 3}\n");  // the head that ended that round
  std::filesystem::remove(log);  // the state folder damaged
  try {
    (void)budget.spent();
    FAIL() << "a lost ledger was read as nothing spent";
  } catch (const agent::TrainerError& e) {
    EXPECT_TRUE(e.fatal());
    EXPECT_NE(std::string(e.what()).find("is gone"), std::string::npos) << e.what();
  }
}

// A trainer that reports what a builtin DP-SGD run would, with metrics computed on its records.
class RecordsTrainer final : public agent::Trainer {
 public:
  wire::TrainMetrics evaluate(const Model&, const agent::TrainTask&) override {
    wire::TrainMetrics m;
    m.set_eval_accuracy(0.93);
    m.set_eval_samples(40);
    return m;
  }
  agent::TrainResult train(const Model& global, const agent::TrainTask&, Model& local) override {
    std::copy(global.flat().begin(), global.flat().end(), local.flat().begin());
    agent::TrainResult r;
    r.num_samples = 137;
    r.metrics.set_train_loss(0.41);
    r.metrics.set_train_seconds(2.5);
    r.dp = agent::DpSgdReport{0.1, 1.0, 10, 1.0};
    return r;
  }
};

TEST(PrivacyBudget, UnderABudgetOnlyTheChargedUpdateLeavesTheSilo) {
  test::TempDir dir;
  agent::BudgetedTrainer t(std::make_unique<RecordsTrainer>(),
                           std::make_shared<agent::PrivacyBudget>(budget_config(8.0, 10), dir / "sent.jsonl"));
  Model m = init_model({"logistic", 3, 2, {}, 1, 0, {}});
  Model local = m.zeros_like();
  const agent::TrainTask task{1, "a", {}};
  EXPECT_EQ(t.evaluate(m, task).eval_samples(), 0u);  // no evaluation of the records leaves
  const auto r = t.train(m, task, local);
  EXPECT_EQ(r.num_samples, 1u);  // every silo weighs the same
  EXPECT_EQ(r.metrics.train_loss(), 0.0);
  EXPECT_EQ(r.metrics.train_seconds(), 0.0);
  EXPECT_EQ(r.privacy.mechanism(), "dp_sgd");
  EXPECT_GT(r.privacy.epsilon(), 0.0);
}

TEST(PrivacyBudget, TheTrainerProtocolCarriesAnExternalTrainersReport) {
  test::TempDir dir;
  const nlohmann::json ok = {{"type", "result"}, {"id", 1}, {"weights", (dir / "w.safetensors").string()},
                             {"num_samples", 10},
                             {"privacy", {{"sample_rate", 0.01}, {"noise_multiplier", 1.2}, {"steps", 300}}}};
  agent::trainer_protocol::TrainAnswer a;
  ASSERT_EQ(error_text(agent::trainer_protocol::parse_train_answer(ok, dir.path(), a)), "");
  ASSERT_TRUE(a.dp.has_value());
  EXPECT_EQ(a.dp->steps, 300u);
  EXPECT_DOUBLE_EQ(a.dp->noise_multiplier, 1.2);
  for (const auto& bad : {nlohmann::json{{"sample_rate", 0}, {"noise_multiplier", 1}, {"steps", 1}},
                          nlohmann::json{{"sample_rate", 0.1}, {"noise_multiplier", -1}, {"steps", 1}},
                          nlohmann::json{{"sample_rate", 0.1}, {"noise_multiplier", 1}, {"steps", 0}},
                          nlohmann::json{{"sample_rate", 0.1}, {"noise_multiplier", 1}}, nlohmann::json("many")}) {
    auto j = ok;
    j["privacy"] = bad;
    agent::trainer_protocol::TrainAnswer b;
    EXPECT_NE(error_text(agent::trainer_protocol::parse_train_answer(j, dir.path(), b)), "") << bad.dump();
  }
}

nlohmann::json round_record(std::uint64_t round, const std::vector<std::pair<std::string, wire::PrivacySpend>>& ps) {
  nlohmann::json parts = nlohmann::json::array();
  for (const auto& [silo, p] : ps) parts.push_back({{"silo", silo}, {"privacy", protocol::privacy_json(p)}});
  return {{"event", "round"}, {"round", round}, {"participants", parts}};
}

wire::PrivacySpend spend(double q, double sigma, std::uint64_t steps, double epsilon, double max_epsilon = 10) {
  wire::PrivacySpend p;
  p.set_mechanism(protocol::kDpSgd);
  p.set_sample_rate(q);
  p.set_noise_multiplier(sigma);
  p.set_steps(steps);
  p.set_clip_norm(1);
  p.set_delta(1e-5);
  p.set_epsilon(epsilon);
  p.set_max_epsilon(max_epsilon);
  return p;
}

TEST(PrivacyAudit, EveryClaimIsRecomputedFromTheRecordedRoundsOfItsSilo) {
  std::vector<wire::PrivacySpend> a_rounds, b_rounds;
  std::vector<nlohmann::json> log = {{{"event", "federation_start"}}};
  for (std::uint64_t r = 1; r <= 3; ++r) {
    a_rounds.push_back(spend(0.02, 1.0, 50, 0));
    b_rounds.push_back(spend(0.05, 2.0, 20, 0));
    auto a = a_rounds.back(), b = b_rounds.back();
    a.set_epsilon(protocol::dp_sgd_epsilon(a_rounds, 1e-5));
    b.set_epsilon(protocol::dp_sgd_epsilon(b_rounds, 1e-5) + 0.5);  // claiming more is allowed
    log.push_back(round_record(r, {{"a", a}, {"b", b}}));
  }
  auto ok = server::check_privacy_claims(log);
  EXPECT_TRUE(succeeded(ok));
  EXPECT_EQ(ok->spends, 6u);
  EXPECT_NEAR(ok->epsilon["a"], protocol::dp_sgd_epsilon(a_rounds, 1e-5), 1e-12);

  // Silo a claims only its last round's epsilon in round 3: less than its three rounds give.
  auto lie = log;
  auto p = a_rounds.back();
  p.set_epsilon(protocol::dp_sgd_epsilon(std::vector{p}, 1e-5));
  lie[3]["participants"][0]["privacy"] = protocol::privacy_json(p);
  const auto bad = server::check_privacy_claims(lie);
  EXPECT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("record 4 (round 3), silo a: claims epsilon"), std::string::npos) << bad.error().message();

  // A silo whose recorded rounds pass its own budget.
  auto over = log;
  over[3]["participants"][1]["privacy"]["max_epsilon"] = 0.1;
  EXPECT_FALSE(server::check_privacy_claims(over).has_value());
  // A spend that cannot be read.
  auto broken = log;
  broken[2]["participants"][0]["privacy"]["steps"] = -1;
  const auto unread = server::check_privacy_claims(broken);
  EXPECT_FALSE(unread.has_value());
  EXPECT_NE(unread.error().message().find("cannot be read"), std::string::npos) << unread.error().message();
}

TEST(PrivacyConfig, TheAgentsBudgetIsCheckedWhereItIsWritten) {
  auto parse = [](const nlohmann::json& j, agent::TrainerKind kind = agent::TrainerKind::Builtin, int workers = 1) {
    agent::LocalWorkersConfig local;
    local.workers = workers;
    return agent::parse_privacy(ConfigNode(j, "agent.json", ".privacy"), kind, local);
  };
  const auto c = parse({{"max_epsilon", 3}, {"delta", 1e-5}, {"rounds", 20}});
  EXPECT_TRUE(c.on());
  EXPECT_EQ(c.rounds, 20u);
  EXPECT_DOUBLE_EQ(c.clip_norm, 1.0);
  auto fails_with = [&](const nlohmann::json& j, const std::string& what, agent::TrainerKind kind = agent::TrainerKind::Builtin,
                        int workers = 1) {
    try {
      (void)parse(j, kind, workers);
      ADD_FAILURE() << j.dump() << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  fails_with({{"delta", 1e-5}, {"rounds", 3}}, ".privacy.max_epsilon: is required");
  fails_with({{"max_epsilon", 3}}, ".privacy.rounds: is required without a noise_multiplier");
  fails_with({{"max_epsilon", 3}, {"rounds", 3}, {"delta", 0.5}}, ".privacy.delta");
  fails_with({{"max_epsilon", 3}, {"rounds", 3}, {"clip_norm", 0}}, ".privacy.clip_norm");
  fails_with({{"max_epsilon", 3}, {"rounds", 3}, {"epsilon", 3}}, "epsilon");
  fails_with({{"max_epsilon", 3}, {"rounds", 3}}, "local.workers", agent::TrainerKind::Builtin, 4);
  fails_with({{"max_epsilon", 3}}, "feature-statistics", agent::TrainerKind::FeatureStats);
  // An external trainer reports its own noise: no rounds needed.
  EXPECT_TRUE(parse({{"max_epsilon", 3}}, agent::TrainerKind::External).on());
}

}  // namespace
}  // namespace xsilo
