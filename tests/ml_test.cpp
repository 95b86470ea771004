// The built-in models, trainer, data loading and splits.
#include <gtest/gtest.h>

#include "silo_agent/update.h"

#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include "common/dataset.h"
#include "common/finite.h"
#include "common/fs.h"
#include "common/mlp.h"
#include "server/optimizer.h"
#include "silo_agent/builtin_trainer.h"
#include "silo_agent/sgd.h"
#include "tests/testlib.h"
#include "tools/sim.h"

namespace xsilo {
namespace {

Dataset random_data(std::size_t rows, std::size_t features, int classes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0, 1);
  Dataset d;
  d.rows = rows;
  d.features = features;
  d.classes = classes;
  for (std::size_t i = 0; i < rows * features; ++i) d.x.push_back(n(rng));
  for (std::size_t i = 0; i < rows; ++i) d.y.push_back(static_cast<int>(rng() % classes));
  return d;
}

// Central differences against the analytic gradient, for every parameter.
void check_gradient(const ModelSpec& spec) {
  Model m = init_model(spec);
  const Network net(m);
  const auto d = random_data(7, spec.inputs, static_cast<int>(spec.classes), 3);
  std::vector<float> grad(m.size());
  net.loss_and_grad(m.flat(), d.x.data(), d.y.data(), d.rows, grad);
  const float eps = 1e-3f;
  for (std::size_t k = 0; k < m.size(); ++k) {
    Model p = m, q = m;
    p.flat()[k] += eps;
    q.flat()[k] -= eps;
    std::vector<float> g(m.size());
    const double lp = net.loss_and_grad(p.flat(), d.x.data(), d.y.data(), d.rows, g);
    const double lq = net.loss_and_grad(q.flat(), d.x.data(), d.y.data(), d.rows, g);
    const double numeric = (lp - lq) / (2 * eps);
    EXPECT_NEAR(grad[k], numeric, 2e-3 + 2e-2 * std::abs(numeric)) << "parameter " << k;
  }
}

// The upload check's scan: every kind of non-finite float, at every position of a vector longer
// than any vector register (the loop's tail included), of either sign; the largest finite float
// and subnormals are finite.
TEST(Finite, EveryNanAndInfinityIsFoundWhereverItIsAndNothingElse) {
  std::vector<float> v(37, 0.5f);
  v[3] = std::numeric_limits<float>::max();
  v[4] = -std::numeric_limits<float>::max();
  v[5] = std::numeric_limits<float>::denorm_min();
  EXPECT_TRUE(xsilo::all_finite(v));
  EXPECT_TRUE(xsilo::all_finite({}));
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::signaling_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    for (std::size_t at = 0; at < v.size(); ++at) {
      auto w = v;
      w[at] = bad;
      EXPECT_FALSE(xsilo::all_finite(w)) << bad << " at " << at;
    }
  }
}

TEST(Mlp, LogisticGradientMatchesFiniteDifferences) { check_gradient({"logistic", 4, 2, {}, 1, 0, {}}); }
TEST(Mlp, SoftmaxMlpGradientMatchesFiniteDifferences) { check_gradient({"mlp", 5, 3, {6, 4}, 2, 0, {}}); }

TEST(Mlp, LayoutIsADenseStackWithOneOutputForBinaryTasks) {
  Model m = init_model({"mlp", 30, 2, {8}, 1, 0, {}});
  ASSERT_EQ(m.tensors().size(), 4u);
  EXPECT_EQ(m.tensors()[0].name, "layers.0.weight");
  EXPECT_EQ(m.tensors()[0].shape, (std::vector<std::uint64_t>{8, 30}));
  EXPECT_EQ(m.tensors()[3].shape, (std::vector<std::uint64_t>{1}));
  EXPECT_EQ(Network(m).classes(), 2);
  Model bad;
  bad.add("weights", {3});
  EXPECT_THROW(Network{bad}, std::invalid_argument);
}

TEST(Trainer, LearnsASeparableProblemAndRepeatsBitForBit) {
  Dataset d = random_data(200, 3, 2, 5);
  for (std::size_t i = 0; i < d.rows; ++i) d.y[i] = d.x[i * 3] + 0.5f * d.x[i * 3 + 1] > 0 ? 1 : 0;
  Model a = init_model({"logistic", 3, 2, {}, 1, 0, {}});
  Model b = a;
  const Network net(a);
  agent::TrainOptions o;
  o.epochs = 20;
  o.learning_rate = 0.5f;
  o.seed = 9;
  agent::train_sgd(net, a.flat(), d, o);
  agent::train_sgd(net, b.flat(), d, o);
  EXPECT_GT(net.evaluate(a.flat(), d).accuracy, 0.95);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a.flat()[i], b.flat()[i]);
}

TEST(Dataset, ReadsTheVendoredFilesWithAndWithoutHeaders) {
  const auto bc = load_csv(tools::data_dir() / "breast_cancer.csv");
  EXPECT_EQ(bc.rows, 569u);
  EXPECT_EQ(bc.features, 30u);
  EXPECT_EQ(bc.classes, 2);
  const auto digits = load_csv(tools::data_dir() / "digits.csv.gz");
  EXPECT_EQ(digits.rows, 1797u);
  EXPECT_EQ(digits.features, 64u);
  EXPECT_EQ(digits.classes, 10);
}

TEST(Dataset, MalformedRowsAreReportedWithTheirLine) {
  test::TempDir dir;
  atomic_write_file(dir / "bad.csv", "1,2,0\n3,4,1\n5,x,1\n");
  try {
    load_csv(dir / "bad.csv");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.csv:3"), std::string::npos) << e.what();
  }
  atomic_write_file(dir / "neg.csv", "1,2,0\n3,4,-1\n");
  EXPECT_THROW(load_csv(dir / "neg.csv"), std::runtime_error);
}

TEST(Dataset, DirichletSplitPartitionsTheRowsAndSkewsLabels) {
  const auto d = load_csv(tools::data_dir() / "breast_cancer.csv");
  auto [train, test] = train_test_split(d, 0.2, 1);
  EXPECT_EQ(train.size() + test.size(), d.rows);
  const auto parts = split_dirichlet(d, train, 5, 0.5, 2);
  std::set<std::size_t> seen;
  std::size_t total = 0;
  double max_skew = 0;
  for (const auto& p : parts) {
    EXPECT_GE(p.size(), 8u);
    total += p.size();
    seen.insert(p.begin(), p.end());
    double pos = 0;
    for (auto r : p) pos += d.y[r];
    max_skew = std::max(max_skew, std::abs(pos / static_cast<double>(p.size()) - 0.627));
  }
  EXPECT_EQ(total, train.size());
  EXPECT_EQ(seen.size(), train.size());
  EXPECT_GT(max_skew, 0.1);  // alpha 0.5 gives visibly non-IID silos
}

TEST(ServerOptimizer, FedAvgMAndFedAdamFollowTheirUpdateRules) {
  Model layout;
  layout.add("w", {2});
  server::OptimizerConfig m{"fedavgm", 0.5f, 0.9f};
  server::ServerOptimizer avgm(m, layout);
  std::vector<float> x{1, 1};
  avgm.step(x, std::vector<float>{1, -2});  // m = (1, -2)
  EXPECT_FLOAT_EQ(x[0], 1.5f);
  EXPECT_FLOAT_EQ(x[1], 0.0f);
  avgm.step(x, std::vector<float>{1, -2});  // m = 0.9*(1,-2) + (1,-2) = (1.9, -3.8)
  EXPECT_FLOAT_EQ(x[0], 1.5f + 0.95f);
  EXPECT_FLOAT_EQ(x[1], -1.9f);

  server::OptimizerConfig a{"fedadam", 0.1f, 0.9f, 0.9f, 0.99f, 1e-3f};
  server::ServerOptimizer adam(a, layout);
  std::vector<float> y{0, 0};
  adam.step(y, std::vector<float>{2, -2});
  // m = 0.2, v = 0.04 -> step = 0.1 * 0.2 / (0.2 + 0.001)
  EXPECT_NEAR(y[0], 0.1 * 0.2 / 0.201, 1e-6);
  EXPECT_NEAR(y[1], -0.1 * 0.2 / 0.201, 1e-6);
  // State round-trips through a checkpoint.
  server::ServerOptimizer again(a, layout);
  again.load_state(adam.state());
  std::vector<float> y2 = y;
  adam.step(y, std::vector<float>{1, 1});
  again.step(y2, std::vector<float>{1, 1});
  EXPECT_EQ(y, y2);
}


// Centered clipping starts each round from the last aggregate step: the optimizer keeps it, and
// a restarted server (its checkpointed state) goes on from the same centre.
TEST(ServerOptimizer, TheLastStepIsKeptForCenteredClippingAndSurvivesARestart) {
  Model layout;
  layout.add("w", {3});
  server::OptimizerConfig c{"fedavgm", 1.0f, 0.5f};
  c.keep_last_step = true;
  server::ServerOptimizer opt(c, layout);
  EXPECT_TRUE(opt.last_step().empty());
  std::vector<float> model{1, 2, 3}, d{0.5f, -1, 2};
  opt.step_into(model, d);
  const std::vector<float> want{0.5f, -1, 2};
  EXPECT_EQ(std::vector<float>(opt.last_step().begin(), opt.last_step().end()), want);
  server::ServerOptimizer restarted(c, layout);
  restarted.load_state(opt.state());
  EXPECT_EQ(std::vector<float>(restarted.last_step().begin(), restarted.last_step().end()), want);
  // A checkpoint from before the step was kept: zeros, as in the first round.
  server::OptimizerConfig plain = c;
  plain.keep_last_step = false;
  server::ServerOptimizer old(plain, layout);
  old.step_into(model, d);
  server::ServerOptimizer from_old(c, layout);
  from_old.load_state(old.state());
  EXPECT_TRUE(from_old.last_step().empty());
  Model wrong;
  wrong.add("m", {3});
  wrong.add("last_step", {2});
  EXPECT_THROW(restarted.load_state(wrong), std::runtime_error);
  // The optimizer changed since the checkpoint (fedavg with centered clipping kept only the
  // step): the momentum starts from zeros, the centre goes on.
  server::OptimizerConfig avg{"fedavg", 1.0f};
  avg.keep_last_step = true;
  server::ServerOptimizer first(avg, layout);
  std::vector<float> fresh{0.5f, -1, 2};  // step_into leaves model + step in its argument
  first.step_into(model, fresh);
  server::ServerOptimizer switched(c, layout);
  EXPECT_NO_THROW(switched.load_state(first.state()));
  EXPECT_EQ(std::vector<float>(switched.last_step().begin(), switched.last_step().end()), want);
}

// Review N8: a trainer's finite but huge values (3e38) passed the agent, overflowed to infinity
// once weighted, and only the server refused them. The agent refuses them itself, naming the
// tensor, with the reason code a non-finite update has.
TEST(Update, AnUpdateThatOverflowsOnceWeightedIsRefusedByTheAgent) {
  Model global;
  global.add("w", {2});
  global.add("b", {1});
  Model local = global;
  local.flat()[0] = 3e38f;
  global.flat()[0] = -3e38f;  // finite both, their difference is not
  agent::TrainResult r;
  r.num_samples = 10;
  try {
    agent::form_update(global, local, r, wire::TrainingPlan{});
    ADD_FAILURE() << "an update that is not finite once weighted was formed";
  } catch (const agent::TrainerError& e) {
    EXPECT_NE(std::string(e.what()).find("overflows float32 in tensor w"), std::string::npos) << e.what();
    EXPECT_EQ(e.reason(), wire::TRAINER_NON_FINITE);
  }
}

// A label past the model's classes (a hospital's 1/2 coding on a binary model, a stray code)
// once indexed the outputs out of bounds (a segfault) or trained as a target of 2: the network
// refuses it, and the silo's trainer names the file and the classes before it trains.
TEST(Network, ALabelPastTheModelsClassesIsRefusedWithTheFileAndNeverIndexed) {
  ModelSpec spec;
  spec.inputs = 3;
  spec.classes = 2;
  const Model binary = init_model(spec);
  const Network net(binary);
  const float x[3] = {0.1f, 0.2f, 0.3f};
  std::vector<float> grad(binary.size());
  for (const int label : {2, -1, 1000000}) {
    EXPECT_THROW((void)net.loss_and_grad(binary.flat(), x, &label, 1, grad), std::invalid_argument) << label;
  }
  const int one = 1;
  EXPECT_NO_THROW((void)net.loss_and_grad(binary.flat(), x, &one, 1, grad));

  test::TempDir dir;
  atomic_write_file(dir / "train.csv", "0.1,0.2,0.3,0\n0.3,0.2,0.1,2\n0.2,0.2,0.2,1\n");
  agent::AgentConfig cfg;
  cfg.train_data = dir / "train.csv";
  cfg.test_data = dir / "train.csv";
  cfg.state_dir = dir / "state";
  agent::BuiltinTrainer trainer(cfg, agent::load_local_data(cfg));
  wire::TrainingPlan plan;
  plan.set_local_epochs(1);
  plan.set_batch_size(2);
  plan.set_learning_rate(0.1f);
  const agent::TrainTask task{1, "hospital-a", plan};
  Model local = binary;
  for (const bool training : {true, false}) {
    try {
      if (training) {
        (void)trainer.train(binary, task, local);
      } else {
        (void)trainer.evaluate(binary, task);
      }
      ADD_FAILURE() << "label 2 on a binary model was " << (training ? "trained" : "evaluated");
    } catch (const agent::TrainerError& e) {
      EXPECT_EQ(e.reason(), wire::LOCAL_DATA_MISMATCH);
      EXPECT_NE(std::string(e.what()).find("train.csv has label 2 but the federation's model has 2 classes (labels 0 "
                                           "to 1)"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace xsilo
