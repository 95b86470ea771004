// The accountant (privacy/) against the reference values of opacus and dp-accounting that
// scripts/privacy_reference.py wrote to tests/data/privacy_reference.json, against the packages
// themselves where the script's venv is there, and on the properties an accountant must have.
//
// Tolerances, and why:
//   dp-accounting, on its own orders (our default_orders()): the same series, the same stopping
//     rule and the same conversion; only libm's lgamma/erfc against scipy's gammaln/log_ndtr and
//     the order of additions differ. Relative 1e-6.
//   opacus, on its own orders (DEFAULT_ALPHAS, passed to our Accountant): integer orders are the
//     same exact sum (agreement to 1e-8). At fractional orders opacus sums the paper's signed
//     series for as long as terms exceed e^-30; we, like dp-accounting, sum absolute values (an
//     upper bound) and give up an order after 1000 terms. Both make our epsilon larger, never
//     smaller, and only where the noise is low for the rate: on the reference grid by at most
//     6e-4 relative where opacus's epsilon is <= 10 (the budgets anyone sets), by 0.4% to 5%
//     between 10 and 40, and by a factor up to 2.8 beyond (q = 0.1, sigma = 0.5, 10000 steps:
//     2231 against 807, both meaningless). The test asserts: never below opacus by more than
//     1e-9, and above it by less than 1e-3 where opacus's epsilon is <= 10.
//   Comparing on each package's own orders removes the one real difference between their
//   defaults: opacus stops at order 63, dp-accounting goes on to 128, 256, 512 and 1024 (at
//   q = 0.001, sigma = 5, one step, that is 0.103 against 0.0195).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "privacy/accountant.h"

namespace {

using namespace xsilo::privacy;
using nlohmann::json;

constexpr double kDelta = 1e-5;

json load_reference() {
  std::ifstream in(std::string(XSILO_SOURCE_DIR) + "/tests/data/privacy_reference.json");
  return json::parse(in);
}

double epsilon_of(const Mechanism& m, std::uint64_t steps, std::span<const double> orders = default_orders()) {
  Accountant a(orders);
  a.compose(m, steps);
  return a.epsilon(kDelta).epsilon;
}

double rel(double ours, double theirs) { return std::abs(ours - theirs) / std::abs(theirs); }

// Every subsampled Gaussian case of a reference document, against both packages; returns the
// largest relative differences (dp-accounting; opacus where its epsilon is <= 10).
std::pair<double, double> check_gaussian_cases(const json& ref) {
  const auto opacus_orders = ref["orders"]["opacus"].get<std::vector<double>>();
  EXPECT_EQ(ref["orders"]["dp_accounting"].get<std::vector<double>>(),
            std::vector<double>(default_orders().begin(), default_orders().end()));
  double worst_dp = 0, worst_opacus = 0;
  for (const json& c : ref["subsampled_gaussian"]) {
    const SubsampledGaussian m{c["q"].get<double>(), c["sigma"].get<double>()};
    const auto steps = c["steps"].get<std::uint64_t>();
    const std::string where = "q=" + std::to_string(m.q) + " sigma=" + std::to_string(m.sigma) +
                              " steps=" + std::to_string(steps);
    const double dp = c["dp_accounting"]["epsilon"].get<double>();
    const double op = c["opacus"]["epsilon"].get<double>();
    const double ours = epsilon_of(m, steps);
    EXPECT_LT(rel(ours, dp), 1e-6) << where << ": ours " << ours << ", dp-accounting " << dp;
    worst_dp = std::max(worst_dp, rel(ours, dp));
    const double ours_op = epsilon_of(m, steps, opacus_orders);
    EXPECT_GE(ours_op, op * (1 - 1e-9)) << where << ": ours " << ours_op << " below opacus " << op;
    // Above: never below opacus. Below: how far above, by the size of epsilon (see the top).
    const double above = rel(ours_op, op);
    if (op <= 10) {
      EXPECT_LT(above, 1e-3) << where << ": ours " << ours_op << ", opacus " << op;
      worst_opacus = std::max(worst_opacus, above);
    }
  }
  return {worst_dp, worst_opacus};
}

TEST(PrivacyAccountant, AgreesWithOpacusAndDpAccountingOnTheReferenceGrid) {
  const json ref = load_reference();
  ASSERT_EQ(ref["subsampled_gaussian"].size(), 60u);
  ASSERT_EQ(ref["delta"].get<double>(), kDelta);
  const auto [dp, opacus] = check_gaussian_cases(ref);
  std::printf("largest relative difference: dp-accounting %.2e, opacus (epsilon <= 10) %.2e\n", dp, opacus);
}

TEST(PrivacyAccountant, DiscreteGaussianAgreesWithDpAccounting) {
  const json ref = load_reference();  // held: a range over a temporary's member dangles
  for (const json& c : ref["discrete_gaussian"]) {
    const DiscreteGaussianSum m{1, c["l2"].get<double>(), c["sigma"].get<double>(), 1, 1};
    const double theirs = c["dp_accounting"]["epsilon"].get<double>();
    EXPECT_LT(rel(epsilon_of(m, c["steps"].get<std::uint64_t>()), theirs), 1e-9) << c.dump();
  }
}

TEST(PrivacyAccountant, SkellamAndDistributedDiscreteGaussianMatchThePapersFormulas) {
  const json ref = load_reference();  // held: a range over a temporary's member dangles
  for (const json& c : ref["formula"]) {
    Mechanism m;
    if (c["mechanism"] == "skellam_sum") {
      m = SkellamSum{c["l1"].get<double>(), c["l2"].get<double>(), c["variance"].get<double>()};
    } else {
      m = DiscreteGaussianSum{c["l1"].get<double>(), c["l2"].get<double>(), c["sigma"].get<double>(),
                              c["silos"].get<std::uint64_t>(), c["dim"].get<std::uint64_t>()};
    }
    EXPECT_EQ(name(m), c["mechanism"].get<std::string>());
    const double theirs = c["dp_accounting_conversion"]["epsilon"].get<double>();
    EXPECT_LT(rel(epsilon_of(m, c["steps"].get<std::uint64_t>()), theirs), 1e-9) << c.dump();
  }
}

std::string venv_python() {
  if (const char* p = std::getenv("XSILO_PRIVACY_PYTHON")) return p;
  const char* cache = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string base = cache ? cache : std::string(home ? home : "") + "/.cache";
  return base + "/xsilo/privacy-venv/bin/python";
}

TEST(PrivacyAccountant, AgreesWithOpacusAndDpAccountingCalledNow) {
  const std::string py = venv_python();
  if (std::system(("'" + py + "' -c 'import opacus, dp_accounting' >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << py << " cannot import opacus and dp_accounting (scripts/privacy_reference.py makes that venv; "
                 << "XSILO_PRIVACY_PYTHON names another interpreter)";
  }
  const std::string cmd = "'" + py + "' '" XSILO_SOURCE_DIR "/scripts/privacy_reference.py' --here --small --out - 2>/dev/null";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) text.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << cmd;
  const json ref = json::parse(text);
  ASSERT_EQ(ref["subsampled_gaussian"].size(), 3u);
  check_gaussian_cases(ref);
}

TEST(PrivacyAccountant, FullBatchIsThePlainGaussian) {
  for (double alpha : {1.5, 2.0, 7.3, 64.0}) {
    EXPECT_DOUBLE_EQ(rdp_subsampled_gaussian(1.0, 2.0, alpha), alpha / 8);
  }
}

// Rényi divergence does not fall as the order grows. The integer sum is exact, so integer orders
// are increasing; the fractional series (absolute values: an upper bound) is never below the
// integer order under it.
TEST(PrivacyAccountant, RdpDoesNotFallAsTheOrderGrows) {
  for (double q : {0.001, 0.01, 0.1}) {
    for (double sigma : {0.8, 1.0, 2.0, 5.0}) {
      double last = 0;
      for (double alpha : {2.0, 3.0, 4.0, 10.0, 11.0, 63.0, 256.0}) {
        const double r = rdp_subsampled_gaussian(q, sigma, alpha);
        EXPECT_GT(r, last) << "q=" << q << " sigma=" << sigma << " alpha=" << alpha;
        last = r;
      }
      for (double alpha : {2.1, 2.9, 3.1, 9.9, 10.1}) {
        const double r = rdp_subsampled_gaussian(q, sigma, alpha);
        EXPECT_GE(r, rdp_subsampled_gaussian(q, sigma, std::floor(alpha)))
            << "q=" << q << " sigma=" << sigma << " alpha=" << alpha;
      }
    }
  }
}

TEST(PrivacyAccountant, EpsilonGrowsWithStepsAndSampleRateAndFallsWithNoise) {
  for (double sigma : {0.8, 1.0, 2.0}) {
    double last = 0;
    for (std::uint64_t steps : {1, 10, 100, 1000}) {
      const double e = epsilon_of(SubsampledGaussian{0.01, sigma}, steps);
      EXPECT_GT(e, last) << "sigma=" << sigma << " steps=" << steps;
      last = e;
    }
    last = 0;
    for (double q : {0.001, 0.01, 0.1, 1.0}) {
      const double e = epsilon_of(SubsampledGaussian{q, sigma}, 100);
      EXPECT_GT(e, last) << "sigma=" << sigma << " q=" << q;
      last = e;
    }
  }
  double last = std::numeric_limits<double>::infinity();
  for (double sigma : {0.5, 0.8, 1.0, 2.0, 5.0, 10.0}) {
    const double e = epsilon_of(SubsampledGaussian{0.01, sigma}, 1000);
    EXPECT_LT(e, last) << "sigma=" << sigma;
    last = e;
  }
  // The same for the sums: more variance, less epsilon.
  EXPECT_LT(epsilon_of(SkellamSum{100, 10, 1e4}, 10), epsilon_of(SkellamSum{100, 10, 1e3}, 10));
  EXPECT_LT(epsilon_of(DiscreteGaussianSum{100, 10, 5, 20, 100}, 10), epsilon_of(DiscreteGaussianSum{100, 10, 2, 20, 100}, 10));
}

TEST(PrivacyAccountant, StepsWithinIsTheLastCountInsideTheBudget) {
  const SubsampledGaussian m{0.01, 1.1};
  Accountant spent;
  spent.compose(m, 50);
  const std::uint64_t t = spent.steps_within(m, 3.0, kDelta);
  ASSERT_GT(t, 0u);
  Accountant at = spent, past = spent;
  at.compose(m, t);
  past.compose(m, t + 1);
  EXPECT_LE(at.epsilon(kDelta).epsilon, 3.0);
  EXPECT_GT(past.epsilon(kDelta).epsilon, 3.0);
  // A budget already spent leaves no step; a tiny step leaves the limit.
  EXPECT_EQ(spent.steps_within(m, spent.epsilon(kDelta).epsilon * 0.99, kDelta), 0u);
  EXPECT_EQ(Accountant().steps_within(SubsampledGaussian{1e-6, 50}, 10, kDelta, 1000), 1000u);
}

TEST(PrivacyAccountant, NoiseMultiplierForReachesTheTargetAndNoMore) {
  for (double target : {1.0, 3.0, 8.0}) {
    const double q = 0.01;
    const std::uint64_t steps = 2000;
    const double sigma = noise_multiplier_for(target, kDelta, q, steps);
    EXPECT_LE(epsilon_of(SubsampledGaussian{q, sigma}, steps), target);
    EXPECT_GT(epsilon_of(SubsampledGaussian{q, sigma * (1 - 1e-6)}, steps), target);
    // Round trip: with that sigma, the budget admits at least those steps and not many more.
    const std::uint64_t t = Accountant().steps_within(SubsampledGaussian{q, sigma}, target, kDelta);
    EXPECT_GE(t, steps);
    EXPECT_LE(t, steps + steps / 100);
  }
}

TEST(PrivacyAccountant, LedgerReplayRebuildsTheSpentEpsilon) {
  Accountant a;
  a.compose(SubsampledGaussian{0.01, 1.0}, 100);
  a.compose(SubsampledGaussian{0.01, 1.0}, 20);  // merged with the step before
  a.compose(SkellamSum{1000, 100, 1e6});
  a.compose(DiscreteGaussianSum{1000, 100, 60, 10, 1000}, 3);
  ASSERT_EQ(a.ledger().steps.size(), 3u);
  EXPECT_EQ(a.ledger().steps[0].count, 120u);
  EXPECT_EQ(a.ledger().count(), 124u);  // every run, over all the steps
  const Accountant b = Accountant::replay(a.ledger());
  EXPECT_EQ(b.ledger(), a.ledger());
  EXPECT_EQ(b.rdp(), a.rdp());
  EXPECT_EQ(b.epsilon(kDelta).epsilon, a.epsilon(kDelta).epsilon);
  EXPECT_EQ(b.epsilon(kDelta).order, a.epsilon(kDelta).order);
  // The ledger stands for the steps one at a time too.
  Accountant c;
  for (int i = 0; i < 120; ++i) c.compose(SubsampledGaussian{0.01, 1.0});
  EXPECT_EQ(c.ledger().steps.size(), 1u);
  EXPECT_NEAR(c.epsilon(kDelta).epsilon, epsilon_of(SubsampledGaussian{0.01, 1.0}, 120), 1e-9);
}

template <typename F>
void expect_invalid(F f, const std::string& says) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one saying '" << says << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(PrivacyAccountant, RefusesParametersOutOfRangeWithASentence) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Accountant a;
  for (double q : {0.0, -0.1, 1.5, nan}) expect_invalid([&] { a.compose(SubsampledGaussian{q, 1}); }, "sample rate q");
  for (double s : {0.0, -1.0, nan, std::numeric_limits<double>::infinity()}) {
    expect_invalid([&] { a.compose(SubsampledGaussian{0.1, s}); }, "noise multiplier");
  }
  for (double d : {0.0, 1.0, -1e-5, nan}) expect_invalid([&] { (void)a.epsilon(d); }, "delta");
  expect_invalid([&] { a.compose(SubsampledGaussian{0.1, 1}, 0); }, "count of 0");
  expect_invalid([&] { (void)rdp_subsampled_gaussian(0.1, 1, 1.0); }, "order");
  expect_invalid([&] { (void)rdp_subsampled_gaussian(0.1, 1, nan); }, "order");
  expect_invalid([&] { a.compose(SkellamSum{1, 1, 0}); }, "variance");
  expect_invalid([&] { a.compose(DiscreteGaussianSum{1, 1, 1, 0, 1}); }, "silo");
  expect_invalid([&] { a.compose(DiscreteGaussianSum{1, nan, 1, 2, 1}); }, "L2 sensitivity");
  const std::vector<double> bad_orders{2, 1.5};
  expect_invalid([&] { Accountant b(bad_orders); }, "increasing");
  expect_invalid([&] { (void)a.steps_within(SubsampledGaussian{0.1, 1}, 0, kDelta); }, "epsilon");
  expect_invalid([&] { (void)noise_multiplier_for(nan, kDelta, 0.1, 10); }, "epsilon");
  expect_invalid([&] { (void)noise_multiplier_for(1, kDelta, 2, 10); }, "sample rate q");
  expect_invalid([&] { (void)noise_multiplier_for(1e-9, kDelta, 1, 1000000); }, "no noise multiplier");
  // Nothing was composed by the refused calls.
  EXPECT_TRUE(a.ledger().steps.empty());
}

// Two Gaussian releases of one round (central DP's step at multiplier z, and adaptive clipping's
// count of sensitivity 1/2 and noise sigma_b, multiplier 2 sigma_b) compose to the one Gaussian at
// z_round = (z^-2 + (2 sigma_b)^-2)^-1/2 that server/central_dp.h records (Andrew et al. 2021,
// Theorem 1): the RDP is the same at every order, and exceeds the step's alone by
// alpha / (2 (2 sigma_b)^2) a round, which epsilon then shows.
TEST(PrivacyAccountant, AStepAndItsCountComposeToOneGaussianOfTheCombinedMultiplier) {
  const double z = 1.2, sigma_b = 1.5, rounds = 10;
  const double z_round = 1 / std::sqrt(1 / (z * z) + 1 / (4 * sigma_b * sigma_b));
  Accountant pair, one, step_only;
  for (int r = 0; r < rounds; ++r) {
    pair.compose(SubsampledGaussian{1.0, z});
    pair.compose(SubsampledGaussian{1.0, 2 * sigma_b});
    step_only.compose(SubsampledGaussian{1.0, z});
  }
  one.compose(SubsampledGaussian{1.0, z_round}, static_cast<std::uint64_t>(rounds));
  for (std::size_t i = 0; i < one.orders().size(); ++i) {
    const double alpha = one.orders()[i];
    EXPECT_NEAR(pair.rdp()[i], one.rdp()[i], 1e-12 * one.rdp()[i]) << alpha;
    EXPECT_NEAR(one.rdp()[i] - step_only.rdp()[i], rounds * alpha / (2 * 4 * sigma_b * sigma_b), 1e-9 * one.rdp()[i])
        << alpha;
  }
  EXPECT_NEAR(pair.epsilon(1e-5).epsilon, one.epsilon(1e-5).epsilon, 1e-9);
  EXPECT_GT(one.epsilon(1e-5).epsilon, step_only.epsilon(1e-5).epsilon);
}

}  // namespace
