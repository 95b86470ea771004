// The robust rules, against hand-computed cases and against adversaries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "robust/robust.h"
#include "robust/rule.h"
#include "tools/sim_attack.h"
#include "tests/result_util.h"

namespace xsilo::robust {
namespace {

MatrixView view(const std::vector<float>& v, std::size_t n) { return {v.data(), n, v.size() / n}; }

TEST(Robust, MedianOfAnOddCountIsTheMiddleValue) {
  const std::vector<float> x{1, 5, 2, 6, 3, 100};  // rows [1,5] [2,6] [3,100]
  auto r = median(view(x, 3));
  EXPECT_EQ(r.aggregate, (std::vector<float>{2, 6}));
}

TEST(Robust, MedianOfAnEvenCountIsTheMeanOfTheTwoMiddleValues) {
  const std::vector<float> x{10, 1, 3, 2};
  EXPECT_EQ(median(view(x, 4)).aggregate, (std::vector<float>{2.5f}));
}

TEST(Robust, TrimmedMeanDropsBFromEachEnd) {
  const std::vector<float> x{1, 100, 2, 3, -50, 4};
  // b = 1: drop -50 and 100, mean of 1 2 3 4
  EXPECT_EQ(trimmed_mean(view(x, 6), 1).aggregate, (std::vector<float>{2.5f}));
  EXPECT_EQ(trimmed_mean(view(x, 6), 0).aggregate, (std::vector<float>{10.0f}));
}

TEST(Robust, KrumScoresSumTheNMinusFMinus2NearestAndBreakTiesByValue) {
  // Points 0 1 2 3 10 50 on a line, f = 1: each score sums the 3 nearest squared distances.
  const std::vector<float> x{0, 1, 2, 3, 10, 50};
  auto r = krum(view(x, 6), 1);
  const std::vector<double> want{14, 6, 6, 14, 194, 1600 + 2209 + 2304};
  for (std::size_t i = 0; i < 6; ++i) EXPECT_DOUBLE_EQ(r.decisions[i].score, want[i]) << i;
  EXPECT_EQ(r.aggregate, (std::vector<float>{1}));  // 1 and 2 tie: the smaller norm wins
  EXPECT_TRUE(r.decisions[1].kept);
  EXPECT_FALSE(r.decisions[2].kept);
  EXPECT_EQ(multi_krum(view(x, 6), 1, 2).aggregate, (std::vector<float>{1.5f}));
  // Swapping the tied inputs changes nothing.
  const std::vector<float> swapped{0, 2, 1, 3, 10, 50};
  EXPECT_EQ(krum(view(swapped, 6), 1).aggregate, (std::vector<float>{1}));
}

TEST(Robust, BulyanSelectsByRepeatedKrumThenTrims) {
  // Worked by hand in docs/robust.md: the selection is 2, 1, 3, 0, 50, the trimmed mean of
  // {0, 1, 2, 3, 50} without one value at each end is 2.
  const std::vector<float> x{0, 1, 2, 3, 4, 50, 60};
  auto r = bulyan(view(x, 7), 1);
  EXPECT_EQ(r.aggregate, (std::vector<float>{2}));
  const std::vector<bool> kept{true, true, true, true, false, true, false};
  for (std::size_t i = 0; i < 7; ++i) EXPECT_EQ(r.decisions[i].kept, kept[i]) << i;
}

TEST(Robust, CenteredClippingMovesAtMostTauPerInput) {
  const std::vector<float> x{0, 0, 10};
  auto r = centered_clip(view(x, 3), 1.0, 1);
  EXPECT_NEAR(r.aggregate[0], 1.0 / 3.0, 1e-6);
  EXPECT_FALSE(r.decisions[2].reason.empty());
  EXPECT_TRUE(r.decisions[0].reason.empty());
}

// Karimireddy, He, Jaggi (2021) iterate from the previous round's aggregate: an input at the
// centre moves nothing, wherever the centre is.
TEST(Robust, CenteredClippingStartsFromTheGivenCentre) {
  const std::vector<float> x{5, 5, 5};
  const std::vector<float> centre{5};
  EXPECT_NEAR(centered_clip(view(x, 3), 1.0, 1).aggregate[0], 1.0, 1e-6);  // from 0: one tau
  EXPECT_NEAR(centered_clip(view(x, 3), 1.0, 1, centre).aggregate[0], 5.0, 1e-6);
  const std::vector<float> other_layout{5, 5};
  EXPECT_NEAR(centered_clip(view(x, 3), 1.0, 1, other_layout).aggregate[0], 1.0, 1e-6);  // not d values: zeros
}

// An update far outside the honest spread (here 1000 times an honest one) is out of the mean
// altogether; without the rejection it pulls by a full radius in every iteration.
TEST(Robust, CenteredClippingRejectsAnInputFarOutsideTheHonestSpread) {
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0, 1);
  const std::size_t n = 10, d = 20;
  std::vector<float> x(n * d);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t k = 0; k < d; ++k) x[i * d + k] = i == 9 ? -1000.0f : 1 + 0.3f * g(rng);
  }
  std::vector<float> honest_mean(d, 0.0f);
  for (std::size_t i = 0; i < 9; ++i) {
    for (std::size_t k = 0; k < d; ++k) honest_mean[k] += x[i * d + k] / 9.0f;
  }
  // From the honest mean (the last step, where the honest inputs agree): the rule should stay.
  // (Opposition and lag test off: the far input also points against the honest mean; the
  // rejection alone.)
  const auto with = centered_clip(view(x, n), 0, 10, honest_mean, kDefaultReject, 0, kDefaultOneSided, 0);
  EXPECT_FALSE(with.decisions[9].kept);
  EXPECT_NE(with.decisions[9].reason.find("rejected"), std::string::npos) << with.decisions[9].reason;
  for (std::size_t i = 0; i < 9; ++i) EXPECT_TRUE(with.decisions[i].kept) << i;
  EXPECT_GT(with.rejected_beyond, with.radius);
  EXPECT_LT(with.rejected_beyond, with.decisions[9].score);
  const auto without = centered_clip(view(x, n), 0, 10, honest_mean, 0, 0, kDefaultOneSided, 0);
  EXPECT_TRUE(without.decisions[9].kept);
  EXPECT_EQ(without.rejected_beyond, 0);
  auto towards_it = [&](const std::vector<float>& v) {  // how far v moved from the honest mean towards it
    double p = 0;
    for (std::size_t k = 0; k < d; ++k) p += double(honest_mean[k] - v[k]) / std::sqrt(double(d));
    return p;
  };
  // Without the rejection the far input pulls by a tenth of a radius in every iteration until
  // the honest inputs, clipped too, pull back as hard (about a fifth of a radius in all); with
  // it, nothing beyond the honest inputs' own scatter (about a twentieth).
  EXPECT_GT(towards_it(without.aggregate), 0.1 * without.radius);
  EXPECT_LT(std::abs(towards_it(with.aggregate)), 0.5 * towards_it(without.aggregate));
}

// The automatic radius and the rejection are measured in the inputs' own units: multiplying
// every input and the centre by 10^k clips and rejects the same inputs and scales the aggregate
// and the radius by 10^k.
TEST(Robust, CenteredClippingWithTheAutomaticRadiusDecidesAlikeAtEveryScale) {
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0, 1);
  const std::size_t n = 10, d = 40;
  std::vector<float> x(n * d), centre(d);
  for (auto& v : centre) v = 0.5f + 0.3f * g(rng);  // the last step, the honest inputs' way
  for (std::size_t i = 0; i < n; ++i) {
    // Input 0 far enough to be rejected, input 1 near enough to be clipped only.
    for (std::size_t k = 0; k < d; ++k) {
      x[i * d + k] = i == 0 ? -20.0f * (1 + g(rng) * 0.1f) : i == 1 ? -0.3f * (1 + g(rng) * 0.1f) : 1 + 0.5f * g(rng);
    }
  }
  // Without opposition input 1 is only clipped; with it (the centre leans the honest way),
  // input 1 points against the last step and is out: both decide alike at every scale.
  for (const double oppose : {0.0, kDefaultOppose}) {
    const double lag = oppose > 0 ? kDefaultLag : 0.0;  // the lag test measures the same alignments
    const auto base = centered_clip(view(x, n), 0, 3, centre, kDefaultReject, oppose, kDefaultOneSided, lag);
    EXPECT_FALSE(base.decisions[0].kept);
    EXPECT_EQ(base.decisions[1].kept, oppose == 0);
    std::size_t clipped = 0;
    for (const auto& dec : base.decisions) clipped += !dec.reason.empty();
    EXPECT_GE(clipped, 2u);  // the two attackers at least
    EXPECT_FALSE(base.decisions[0].reason.empty());
    EXPECT_FALSE(base.decisions[1].reason.empty());
    EXPECT_GT(base.radius, 0);
    EXPECT_EQ(base.decisions[1].alignment.has_value(), oppose > 0);
    for (int k : {-4, -2, 2, 3}) {
      const float s = std::pow(10.0f, static_cast<float>(k));
      std::vector<float> xs = x, cs = centre;
      for (auto& v : xs) v *= s;
      for (auto& v : cs) v *= s;
      const auto r = centered_clip(view(xs, n), 0, 3, cs, kDefaultReject, oppose, kDefaultOneSided, lag);
      for (std::size_t i = 0; i < n; ++i) {
        EXPECT_EQ(r.decisions[i].reason.empty(), base.decisions[i].reason.empty()) << k << " " << i;
        EXPECT_EQ(r.decisions[i].kept, base.decisions[i].kept) << k << " " << i;
        if (oppose > 0) {
          EXPECT_NEAR(*r.decisions[i].alignment, *base.decisions[i].alignment, 1e-5) << k << " " << i;
        }
      }
      EXPECT_NEAR(r.median_alignment, base.median_alignment, 1e-5) << k;
      EXPECT_NEAR(r.lagging_beyond, base.lagging_beyond, 1e-5) << k;
      EXPECT_NEAR(r.rejected_beyond / s, base.rejected_beyond, 1e-4 * base.rejected_beyond) << k;
      EXPECT_NEAR(r.radius / s, base.radius, 1e-4 * base.radius) << k;
      for (std::size_t j = 0; j < d; ++j) EXPECT_NEAR(r.aggregate[j] / s, base.aggregate[j], 1e-4) << k << " " << j;
    }
  }
  const auto base = centered_clip(view(x, n), 0, 3, centre, kDefaultReject);
  // A fixed radius does not scale: at 10^-3 the same tau clips nothing.
  std::vector<float> small = x;
  for (auto& v : small) v *= 1e-3f;
  const auto fixed = centered_clip(view(small, n), base.radius, 3, {}, 0);  // without the (relative) rejection
  for (const auto& dec : fixed.decisions) EXPECT_TRUE(dec.reason.empty());
}

// Skewed honest inputs (far apart) and three attackers at minus half their mean (IPM 0.5):
// inside the radius, so no distance singles them out, but they point against the last step.
struct InlierAttack {
  static constexpr std::size_t n = 10, d = 30, honest = 7;
  std::vector<float> x = std::vector<float>(n * d), mean = std::vector<float>(d, 0.0f),
                     last = std::vector<float>(d);
  InlierAttack() {
    std::mt19937 rng(5);
    std::normal_distribution<float> g(0, 1);
    for (std::size_t k = 0; k < d; ++k) last[k] = 1 + 0.2f * g(rng);
    for (std::size_t i = 0; i < honest; ++i) {
      for (std::size_t k = 0; k < d; ++k) x[i * d + k] = last[k] + 2.5f * g(rng);  // spread over twice the step
      for (std::size_t k = 0; k < d; ++k) mean[k] += x[i * d + k] / float(honest);
    }
    for (std::size_t i = honest; i < n; ++i) {
      for (std::size_t k = 0; k < d; ++k) x[i * d + k] = -0.5f * mean[k];
    }
  }
  double distance_to_mean(const std::vector<float>& v) const {
    double s = 0;
    for (std::size_t k = 0; k < d; ++k) s += double(v[k] - mean[k]) * (v[k] - mean[k]);
    return std::sqrt(s);
  }
};

TEST(Robust, CenteredClippingLeavesOutInputsThatPointAgainstTheLastStep) {
  const InlierAttack a;
  const auto view_x = view(a.x, a.n);
  const auto with = centered_clip(view_x, 0, 10, a.last);
  const auto without = centered_clip(view_x, 0, 10, a.last, kDefaultReject, 0, kDefaultOneSided, 0);
  for (std::size_t i = 0; i < a.n; ++i) {
    const bool attacker = i >= a.honest;
    EXPECT_EQ(with.decisions[i].kept, !attacker) << i << " " << with.decisions[i].reason;
    ASSERT_TRUE(with.decisions[i].alignment) << i;
    EXPECT_EQ(*with.decisions[i].alignment < with.opposed_below, attacker) << i;
    if (attacker) {
      EXPECT_NE(with.decisions[i].reason.find("opposed"), std::string::npos) << with.decisions[i].reason;
      // Inside the rejection distance, and clipped no more than the honest inputs: distance alone keeps them.
      EXPECT_TRUE(without.decisions[i].kept) << i;
    }
  }
  EXPECT_GT(with.median_alignment, 0);
  EXPECT_LT(with.opposed_below, 0);
  // Kept, the attackers drag the aggregate towards them; left out, it lands near the honest mean.
  EXPECT_LT(a.distance_to_mean(with.aggregate), 0.5 * a.distance_to_mean(without.aggregate));
}

// A last step that attackers had already turned around (pointing against the honest inputs):
// the median alignment's sign says where the majority is, so the test turns with it and the
// attackers, now on the step's side, are the ones out.
TEST(Robust, OppositionFollowsTheMajorityWhenTheLastStepPointedBackwards) {
  InlierAttack a;
  for (auto& v : a.last) v = -v;
  const auto r = centered_clip(view(a.x, a.n), 0, 10, a.last);
  EXPECT_LT(r.median_alignment, 0);
  for (std::size_t i = 0; i < a.n; ++i) EXPECT_EQ(r.decisions[i].kept, i < a.honest) << i << " " << r.decisions[i].reason;
}

// With no last step (the first round, a new layout) or a zero one there is nothing to oppose:
// no alignment is reported and distances alone decide.
TEST(Robust, WithoutALastStepNothingIsOpposed) {
  const InlierAttack a;
  const std::vector<float> zero(a.d, 0.0f);
  for (const auto& from : {std::span<const float>(), std::span<const float>(zero)}) {
    const auto r = centered_clip(view(a.x, a.n), 0, 10, from);
    const auto plain = centered_clip(view(a.x, a.n), 0, 10, from, kDefaultReject, 0);
    EXPECT_EQ(r.median_alignment, 0);
    for (std::size_t i = 0; i < a.n; ++i) {
      EXPECT_FALSE(r.decisions[i].alignment) << i;
      EXPECT_EQ(r.decisions[i].kept, plain.decisions[i].kept) << i;
    }
    EXPECT_EQ(r.aggregate, plain.aggregate);
  }
}

// An honest input nearly orthogonal to the last step (a silo whose classes the others lack)
// is not opposed (distance may still reject it): only alignments beyond half the median, on
// the other side, are.
TEST(Robust, AnInputOrthogonalToTheLastStepIsNotOpposed) {
  const std::size_t n = 5;  // of 4 values each
  // Four along the step (alignment about 0.7 to 1), one orthogonal to it with a slight lean back.
  std::vector<float> x = {1, 1, 0, 0, 1, 0.8f, 0.2f, 0, 1, 1.2f, 0, 0.1f, 0.9f, 1, 0.1f, 0, -0.05f, -0.05f, 1, 0};
  const std::vector<float> last = {1, 1, 0, 0};
  const auto r = centered_clip(view(x, n), 0, 10, last);
  ASSERT_TRUE(r.decisions[4].alignment);
  EXPECT_LT(*r.decisions[4].alignment, 0);
  EXPECT_GT(*r.decisions[4].alignment, r.opposed_below);
  for (const auto& dec : r.decisions) EXPECT_EQ(dec.reason.find("opposed"), std::string::npos) << dec.reason;
  EXPECT_NEAR(r.opposed_below, -std::max(kDefaultOppose * r.median_alignment, kOpposeMinCosine), 1e-12);
}

// An opposed input is out of everything, the median distance included: the rule over all the
// inputs decides exactly as the rule without opposition over the inputs that were not opposed.
TEST(Robust, AnOpposedInputIsAsIfItHadNotBeenSent) {
  const InlierAttack a;
  const auto all = centered_clip(view(a.x, a.n), 0, 10, a.last);
  const std::vector<float> honest(a.x.begin(), a.x.begin() + static_cast<long>(a.honest * a.d));
  const auto without_them = centered_clip(view(honest, a.honest), 0, 10, a.last, kDefaultReject, 0);
  EXPECT_NEAR(all.radius, without_them.radius, 1e-9);
  for (std::size_t k = 0; k < a.d; ++k) EXPECT_NEAR(all.aggregate[k], without_them.aggregate[k], 1e-5) << k;
}

// Rows with the given alignments to the step e_0, the rest of each row in its own direction.
std::vector<float> with_alignments(const std::vector<double>& alignments, std::size_t d, std::mt19937& rng) {
  std::normal_distribution<double> g(0, 1);
  std::vector<float> x(alignments.size() * d, 0.0f);
  for (std::size_t i = 0; i < alignments.size(); ++i) {
    std::vector<double> u(d, 0.0);
    double len = 0;
    for (std::size_t k = 1; k < d; ++k) len += (u[k] = g(rng)) * u[k];
    len = std::sqrt(len);
    const double c = alignments[i], rest = std::sqrt(1 - c * c);
    x[i * d] = static_cast<float>(c);
    for (std::size_t k = 1; k < d; ++k) x[i * d + k] = static_cast<float>(rest * u[k] / len);
  }
  return x;
}

// Near convergence the honest updates scatter around the last step (alignments near 0). Four
// attackers of ten just below 0 would tip the median negative and, were its sign taken at its
// word, have the honest majority opposed; a median that close to 0 names no side, and nothing is.
TEST(Robust, AMinorityCannotTipTheMedianToOpposeTheHonestUpdates) {
  std::mt19937 rng(11);
  const std::size_t d = 200;
  const std::vector<double> alignments = {-0.03, 0.02, 0.08, 0.12, 0.18, 0.25, -0.05, -0.05, -0.05, -0.05};
  const auto x = with_alignments(alignments, d, rng);
  std::vector<float> last(d, 0.0f);
  last[0] = 1;
  const auto r = centered_clip(view(x, alignments.size()), 0, 10, last);
  EXPECT_LT(r.median_alignment, 0);
  EXPECT_FALSE(r.opposition_off.empty());
  EXPECT_EQ(r.opposed_below, 0);
  for (const auto& dec : r.decisions) EXPECT_EQ(dec.reason.find("opposed"), std::string::npos) << dec.reason;
  // And the same rows against a clear majority: only the clearly backwards ones go.
  const std::vector<double> clear = {0.3, 0.35, 0.4, 0.45, 0.5, 0.55, -0.1, -0.15, -0.6, -0.7};
  const auto y = with_alignments(clear, d, rng);
  const auto c = centered_clip(view(y, clear.size()), 0, 10, last);
  EXPECT_NEAR(c.opposed_below, -kOpposeMinCosine, 1e-12);  // half the median (0.2125) is less
  for (std::size_t i = 0; i < clear.size(); ++i) EXPECT_EQ(c.decisions[i].reason.rfind("opposed", 0) == 0, i >= 8) << i;
}

// Two inputs have no majority: one input against the other is never opposed.
TEST(Robust, TwoInputsAreNeverOpposed) {
  std::mt19937 rng(2);
  const std::size_t d = 50;
  const auto x = with_alignments({0.3, -0.41}, d, rng);
  std::vector<float> last(d, 0.0f);
  last[0] = 1;
  const auto r = centered_clip(view(x, 2), 0, 10, last);
  EXPECT_EQ(r.opposition_off, "fewer than 3 inputs");
  for (const auto& dec : r.decisions) EXPECT_TRUE(dec.kept) << dec.reason;
}

// Label flipping: seven honest inputs lean with the last step (alignments 0.3-0.6), three
// flippers train honestly on flipped labels and sit near orthogonal to it (-0.1 to -0.05). All have
// the same norm, so no distance singles the flippers out, and none points clearly backwards, so
// the opposition keeps them; but they lag behind the median alignment by more than twice the
// spread of the closest half, and the lag test leaves them out.
const std::vector<double> kFlipAlignments = {0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, -0.1, -0.08, -0.05};

// Those ten inputs in d = 300 dimensions, and a last step along the first axis.
struct FlipInputs {
  std::size_t d = 300, n = kFlipAlignments.size();
  std::vector<float> x, last;
  FlipInputs() : last(d, 0.0f) {
    std::mt19937 rng(17);
    x = with_alignments(kFlipAlignments, d, rng);
    last[0] = 1;
  }
};

TEST(Robust, CenteredClippingLeavesOutInputsThatLagFarBehindTheStepTheMajorityLeansWith) {
  const FlipInputs in;
  const auto& [d, n, x, last] = in;
  const auto with = centered_clip(view(x, n), 0, 10, last);
  const auto without = centered_clip(view(x, n), 0, 10, last, kDefaultReject, kDefaultOppose, kDefaultOneSided, 0);
  EXPECT_GE(with.lagging_beyond, kLagFloor);
  EXPECT_EQ(without.lagging_beyond, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const bool flipper = i >= 7;
    EXPECT_TRUE(without.decisions[i].kept) << i << " " << without.decisions[i].reason;
    EXPECT_EQ(without.decisions[i].reason.rfind("opposed", 0), std::string::npos) << without.decisions[i].reason;
    EXPECT_EQ(with.decisions[i].kept, !flipper) << i << " " << with.decisions[i].reason;
    EXPECT_EQ(with.decisions[i].reason.rfind("lagging", 0) == 0, flipper) << i << " " << with.decisions[i].reason;
  }
  // Left out, they are as if they had not been sent.
  const std::vector<float> honest(x.begin(), x.begin() + static_cast<long>(7 * d));
  const auto alone = centered_clip(view(honest, 7), 0, 10, last, kDefaultReject, kDefaultOppose, kDefaultOneSided, 0);
  for (std::size_t k = 0; k < d; ++k) EXPECT_NEAR(with.aggregate[k], alone.aggregate[k], 1e-5) << k;
}

// Each screen alone keeps a majority, but together they could leave out most of the inputs:
// here B (aligned, below the others on every coordinate) is one-sided and C, D (orthogonal to
// the last step) lag, which would leave A and E, a minority, to decide the round. The
// one-sided test stands down instead, the record says so, and three inputs count.
TEST(Robust, TheScreensTogetherNeverLeaveOutHalfTheInputs) {
  const std::size_t d = 256, n = 5;
  std::mt19937 rng(3);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> last(d), x(n * d);
  for (std::size_t k = 0; k < d; ++k) {
    const float s = k % 2 == 0 ? 1.0f : -1.0f;               // the last step
    const float q = k % 4 == 0 || k % 4 == 3 ? 1.0f : -1.0f;  // orthogonal to it
    last[k] = s;
    x[0 * d + k] = s + 0.05f * noise(rng);           // A
    x[1 * d + k] = s - 0.2f;                         // B: aligned, one-sided
    x[2 * d + k] = 0.3f * q + 0.1f * noise(rng);     // C: lags
    x[3 * d + k] = -0.3f * q + 0.1f * noise(rng);    // D: lags
    x[4 * d + k] = s + 0.05f * noise(rng);           // E
  }
  // Without the distance rejection, which is not a screen (B sits 3.3 median distances out).
  const auto one_sided_alone = centered_clip(view(x, n), 0, 10, last, 0, kDefaultOppose, kDefaultOneSided, 0);
  EXPECT_FALSE(one_sided_alone.decisions[1].kept) << "B is one-sided: " << one_sided_alone.decisions[1].reason;
  const auto lag_alone = centered_clip(view(x, n), 0, 10, last, 0, kDefaultOppose, 0);
  EXPECT_FALSE(lag_alone.decisions[2].kept);
  EXPECT_FALSE(lag_alone.decisions[3].kept);
  const auto both = centered_clip(view(x, n), 0, 10, last, 0);
  std::size_t kept = 0;
  for (const auto& dec : both.decisions) kept += dec.kept;
  EXPECT_GE(kept, 3u) << "the screens left a minority to decide";
  for (std::size_t i = 0; i < n; ++i) EXPECT_TRUE(i == 2 || i == 3 || both.decisions[i].kept) << i << ": " << both.decisions[i].reason;
  EXPECT_NE(both.screens_stood_down.find("the one-sided test"), std::string::npos) << both.screens_stood_down;
  EXPECT_TRUE(centered_clip(view(x, n), 0, 10, last, 0, kDefaultOppose, 0).screens_stood_down.empty());
}

// The same alignments on a model of 31 coordinates (breast cancer's logistic regression): two
// unrelated directions there have cosines of standard deviation 1/sqrt(31) = 0.18, so the
// flippers' 0.45 behind the median is within three of those, and the bound says so instead of
// cutting honest silos whose cosine is merely noisy (the table's one missed cell, 2026-12-06).
// With 300 coordinates the noise is 0.17 x 3 < kLagFloor and the bound is the one above.
TEST(Robust, OnAModelWithFewCoordinatesTheLagBoundIsAtLeastTheCosinesNoise) {
  std::mt19937 rng(17);
  const std::size_t d = 31;
  std::vector<float> last(d, 0.0f);
  last[0] = 1;
  const auto x = with_alignments(kFlipAlignments, d, rng);
  const auto r = centered_clip(view(x, kFlipAlignments.size()), 0, 10, last);
  EXPECT_NEAR(r.lagging_beyond, kLagNoise / std::sqrt(31.0), 1e-9);
  for (const auto& dec : r.decisions) EXPECT_EQ(dec.reason.find("lagging"), std::string::npos) << dec.reason;
  const FlipInputs wide;
  EXPECT_LT(kLagNoise / std::sqrt(double(wide.d)), kLagFloor);
  EXPECT_EQ(centered_clip(view(wide.x, wide.n), 0, 10, wide.last).decisions[9].reason.rfind("lagging", 0), 0u);
}

TEST(Robust, TheLagTestDecidesAlikeAtEveryScale) {
  const FlipInputs in;
  const auto& [d, n, x, last] = in;
  const auto base = centered_clip(view(x, n), 0, 10, last);
  for (int k : {-4, -2, 2, 3}) {
    const float s = std::pow(10.0f, static_cast<float>(k));
    std::vector<float> xs = x, ls = last;
    for (auto& v : xs) v *= s;
    for (auto& v : ls) v *= s;
    const auto r = centered_clip(view(xs, n), 0, 10, ls);
    EXPECT_NEAR(r.lagging_beyond, base.lagging_beyond, 1e-6) << k;
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_EQ(r.decisions[i].kept, base.decisions[i].kept) << k << " " << i;
      EXPECT_EQ(r.decisions[i].reason.rfind("lagging", 0), base.decisions[i].reason.rfind("lagging", 0)) << k << " " << i;
    }
  }
}

// Honest alignments spread from 0 to 0.9 (strong skew: each silo moves its own classes): the
// bound widens with the spread, and nothing lags. Nor does anything without a clear side.
TEST(Robust, AWideSpreadOfAlignmentsWidensTheLagBoundInsteadOfCuttingHonestInputs) {
  std::mt19937 rng(19);
  const std::size_t d = 300;
  std::vector<float> last(d, 0.0f);
  last[0] = 1;
  const std::vector<double> wide = {0.0, 0.15, 0.2, 0.3, 0.45, 0.5, 0.6, 0.75, 0.8, 0.9};
  const auto x = with_alignments(wide, d, rng);
  const auto r = centered_clip(view(x, wide.size()), 0, 10, last);
  EXPECT_GT(r.lagging_beyond, kLagFloor);
  for (const auto& dec : r.decisions) EXPECT_EQ(dec.reason.find("lagging"), std::string::npos) << dec.reason;
  const std::vector<double> unclear = {-0.3, -0.2, -0.1, -0.05, 0.0, 0.05, 0.1, 0.2, 0.3, 0.4};
  const auto y = with_alignments(unclear, d, rng);
  const auto u = centered_clip(view(y, unclear.size()), 0, 10, last);
  EXPECT_FALSE(u.opposition_off.empty());
  EXPECT_EQ(u.lagging_beyond, 0);
  for (const auto& dec : u.decisions) EXPECT_EQ(dec.reason.find("lagging"), std::string::npos) << dec.reason;
}

// Seven honest inputs scattered around a common mean, and three at "a little is enough" (ALIE:
// the honest mean minus one standard deviation on every coordinate). They stay nearer the
// centre than most honest inputs and lean neither way on the last step, so neither distance nor
// direction singles them out; but they are below the inputs' median on every coordinate.
struct LittleIsEnough {
  static constexpr std::size_t n = 10, d = 1000, honest = 7;
  std::vector<float> x = std::vector<float>(n * d), last = std::vector<float>(d);
  explicit LittleIsEnough(float scale = 1) {
    std::mt19937 rng(3);
    std::normal_distribution<float> g(0, 1);
    for (std::size_t k = 0; k < d; ++k) last[k] = scale * (1.0f + 0.2f * g(rng));
    for (std::size_t i = 0; i < honest; ++i) {
      for (std::size_t k = 0; k < d; ++k) x[i * d + k] = last[k] + 0.8f * scale * g(rng);
    }
    for (std::size_t k = 0; k < d; ++k) {
      double mean = 0, sq = 0;
      for (std::size_t i = 0; i < honest; ++i) mean += x[i * d + k] / double(honest);
      for (std::size_t i = 0; i < honest; ++i) sq += (x[i * d + k] - mean) * (x[i * d + k] - mean) / double(honest);
      for (std::size_t i = honest; i < n; ++i) x[i * d + k] = static_cast<float>(mean - std::sqrt(sq));
    }
  }
};

TEST(Robust, CenteredClippingLeavesOutInputsBelowTheMedianOnEveryCoordinate) {
  const LittleIsEnough a;
  const auto without = centered_clip(view(a.x, a.n), 0, 10, a.last, kDefaultReject, kDefaultOppose, 0);
  for (std::size_t i = a.honest; i < a.n; ++i) EXPECT_TRUE(without.decisions[i].kept) << i;  // distance alone keeps them
  const auto with = centered_clip(view(a.x, a.n), 0, 10, a.last);
  EXPECT_TRUE(with.one_sided_off.empty()) << with.one_sided_off;
  EXPECT_GE(with.one_sided_beyond, kOneSidedFloor);
  for (std::size_t i = 0; i < a.n; ++i) {
    ASSERT_TRUE(with.decisions[i].balance.has_value()) << i;
    if (i < a.honest) {
      EXPECT_TRUE(with.decisions[i].kept) << i << " " << with.decisions[i].reason;
      // Above the median more often than not: the three below it everywhere pull it down.
      EXPECT_GT(*with.decisions[i].balance, 0.5) << i;
      EXPECT_LT(*with.decisions[i].balance, 0.85) << i;
    } else {
      EXPECT_FALSE(with.decisions[i].kept) << i;
      EXPECT_LT(*with.decisions[i].balance, 0.05) << i;
      EXPECT_EQ(with.decisions[i].reason.rfind("one-sided:", 0), 0u) << with.decisions[i].reason;
    }
  }
  // Left out as if never sent: the rule over the honest inputs alone, without the test.
  const std::vector<float> honest(a.x.begin(), a.x.begin() + static_cast<long>(a.honest * a.d));
  const auto alone = centered_clip(view(honest, a.honest), 0, 10, a.last, kDefaultReject, kDefaultOppose, 0);
  for (std::size_t k = 0; k < a.d; ++k) EXPECT_NEAR(with.aggregate[k], alone.aggregate[k], 1e-5) << k;
}

TEST(Robust, TheOneSidedTestDecidesAlikeAtEveryScale) {
  const LittleIsEnough base;
  const auto b = centered_clip(view(base.x, base.n), 0, 10, base.last);
  for (const float scale : {1e-4f, 1e-2f, 1e3f}) {
    const LittleIsEnough a(scale);
    const auto r = centered_clip(view(a.x, a.n), 0, 10, a.last);
    EXPECT_NEAR(r.median_balance, b.median_balance, 1e-3) << scale;
    for (std::size_t i = 0; i < a.n; ++i) EXPECT_EQ(r.decisions[i].kept, b.decisions[i].kept) << scale << " " << i;
  }
}

// A small model whose coordinates move together (a logistic regression on correlated
// features): honest inputs lie above the median on 10 % to 90 % of their coordinates. The
// spread of the balances widens the bound instead of cutting the honest inputs at its ends.
TEST(Robust, AWideSpreadOfBalancesWidensTheBoundInsteadOfCuttingHonestInputs) {
  std::mt19937 rng(9);
  std::normal_distribution<float> g(0, 1);
  const std::size_t n = 10, d = 400;
  std::vector<float> x(n * d);
  for (std::size_t i = 0; i < n; ++i) {
    const float shift = 1.4f * (static_cast<float>(i) / float(n - 1) - 0.5f);  // -0.7 .. 0.7
    for (std::size_t k = 0; k < d; ++k) x[i * d + k] = shift + 0.5f * g(rng);
  }
  const auto r = centered_clip(view(x, n), 0, 10, {});
  EXPECT_TRUE(r.one_sided_off.empty());
  EXPECT_LT(*r.decisions.front().balance, 0.15);
  EXPECT_GT(*r.decisions.back().balance, 0.85);
  EXPECT_GT(r.one_sided_beyond, kOneSidedFloor);
  for (const auto& dec : r.decisions) EXPECT_EQ(dec.reason.find("one-sided"), std::string::npos) << dec.reason;
}

// Whatever the balances, the closest half of the inputs (and one more) always stays: a
// minority can be left out, never the majority.
TEST(Robust, AMajorityIsNeverOneSided) {
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> u(-1, 1);
  const std::size_t d = 300;
  for (std::size_t n : {3u, 4u, 7u, 10u}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(n * d);
      for (std::size_t i = 0; i < n; ++i) {
        const float lean = u(rng);
        for (std::size_t k = 0; k < d; ++k) x[i * d + k] = lean + 0.3f * u(rng);
      }
      const auto r = centered_clip(view(x, n), 0, 5, {});
      const auto out = std::count_if(r.decisions.begin(), r.decisions.end(), [](const Decision& dec) {
        return dec.reason.rfind("one-sided", 0) == 0;
      });
      EXPECT_LE(static_cast<std::size_t>(out), n - (n / 2 + 1)) << n << " " << trial;
    }
  }
}

TEST(Robust, TheOneSidedTestNeedsThreeInputsAndEnoughCoordinates) {
  const LittleIsEnough a;
  // The first kOneSidedMinCoordinates - 1 coordinates of each input only.
  const std::size_t d = kOneSidedMinCoordinates - 1;
  std::vector<float> few(a.n * d);
  for (std::size_t i = 0; i < a.n; ++i) std::copy_n(a.x.begin() + static_cast<long>(i * a.d), d, few.begin() + static_cast<long>(i * d));
  const auto narrow = centered_clip(view(few, a.n), 0, 10, {});
  EXPECT_NE(narrow.one_sided_off.find("coordinates"), std::string::npos) << narrow.one_sided_off;
  for (const auto& dec : narrow.decisions) EXPECT_FALSE(dec.balance.has_value());
  const std::vector<float> two(a.x.begin() + static_cast<long>(6 * a.d), a.x.begin() + static_cast<long>(8 * a.d));
  const auto pair = centered_clip(view(two, 2), 0, 10, {});
  EXPECT_EQ(pair.one_sided_off, "fewer than 3 inputs");
  for (const auto& dec : pair.decisions) EXPECT_TRUE(dec.kept);
  const auto off = centered_clip(view(a.x, a.n), 0, 10, a.last, kDefaultReject, kDefaultOppose, 0);
  EXPECT_TRUE(off.one_sided_off.empty());
  EXPECT_EQ(off.one_sided_beyond, 0);
  for (const auto& dec : off.decisions) EXPECT_FALSE(dec.balance.has_value());
}

TEST(Robust, L2ClipScalesOnlyLongRows) {
  std::vector<float> x{3, 4, 0.3f, 0.4f};
  auto d = clip_l2(x, 2, 2, 1.0);
  EXPECT_NEAR(x[0], 0.6f, 1e-6);
  EXPECT_NEAR(x[1], 0.8f, 1e-6);
  EXPECT_EQ(x[2], 0.3f);
  EXPECT_DOUBLE_EQ(d[0].score, 5.0);
  EXPECT_TRUE(d[1].reason.empty());
}

TEST(Robust, NonFiniteRowsAreFound) {
  const std::vector<float> x{1, 2, NAN, 3, 4, INFINITY, 5, 6};
  EXPECT_EQ(finite_rows(view(x, 4)), (std::vector<std::size_t>{0, 3}));
}

TEST(Robust, PreconditionsAreExplained) {
  EXPECT_EQ(error_text(check_krum(5, 1)), "");
  EXPECT_EQ(error_text(check_krum(4, 1)), "Krum needs n > 2f + 2: n = 4, f = 1");
  EXPECT_EQ(error_text(check_bulyan(6, 1)), "Bulyan needs n >= 4f + 3: n = 6, f = 1");
  EXPECT_EQ(error_text(check_bulyan(7, 1)), "");
  EXPECT_EQ(error_text(check_trimmed_mean(4, 2)), "trimmed mean needs n > 2b: n = 4, b = 2");
  EXPECT_NE(error_text(check_multi_krum(9, 2, 0)), "");
}

TEST(Robust, GramDistancesMatchDirectSubtraction) {
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0, 1);
  const std::size_t n = 7, d = 70000;  // spans several coordinate blocks
  std::vector<float> x(n * d);
  for (auto& v : x) v = g(rng) + 3;
  const auto dist = pairwise_sq_distances(view(x, n));
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::size_t k = 0; k < d; ++k) s += std::pow(double(x[i * d + k]) - x[j * d + k], 2);
      EXPECT_NEAR(dist[i * n + j], s, 1e-3 * s + 1e-6);
    }
  }
}

// Every rule gives the same aggregate whatever the order of its inputs.
TEST(Robust, RulesArePermutationInvariant) {
  std::mt19937 rng(2);
  std::normal_distribution<float> g(0, 1);
  const std::size_t n = 11, d = 37;
  std::vector<float> x(n * d);
  for (auto& v : x) v = g(rng);
  std::vector<std::size_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<float> y(n * d);
  for (std::size_t i = 0; i < n; ++i) std::copy_n(&x[perm[i] * d], d, &y[i * d]);
  auto same = [&](const char* rule, const Result& a, const Result& b) {
    for (std::size_t k = 0; k < d; ++k) EXPECT_NEAR(a.aggregate[k], b.aggregate[k], 1e-5) << rule;
  };
  same("median", median(view(x, n)), median(view(y, n)));
  same("trimmed", trimmed_mean(view(x, n), 2), trimmed_mean(view(y, n), 2));
  same("krum", krum(view(x, n), 2), krum(view(y, n), 2));
  same("multi_krum", multi_krum(view(x, n), 2, 4), multi_krum(view(y, n), 2, 4));
  same("bulyan", bulyan(view(x, n), 2), bulyan(view(y, n), 2));
  same("centered_clip", centered_clip(view(x, n), 0.5, 3), centered_clip(view(y, n), 0.5, 3));
}

// f attackers, huge or placed to pull the aggregate, cannot move the robust rules outside the
// honest inputs' range, coordinate by coordinate.
TEST(Robust, AggregatesStayWithinTheHonestRangeUnderAttack) {
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0, 1);
  const std::size_t honest = 12, f = 3, n = honest + f, d = 50;
  for (int attack = 0; attack < 3; ++attack) {
    std::vector<float> x(n * d);
    for (std::size_t i = 0; i < honest * d; ++i) x[i] = g(rng);
    for (std::size_t i = honest; i < n; ++i) {
      for (std::size_t k = 0; k < d; ++k) {
        x[i * d + k] = attack == 0 ? 1e30f : attack == 1 ? -1e6f * static_cast<float>(i) : 4.0f;
      }
    }
    std::vector<float> lo(d, INFINITY), hi(d, -INFINITY);
    for (std::size_t i = 0; i < honest; ++i) {
      for (std::size_t k = 0; k < d; ++k) {
        lo[k] = std::min(lo[k], x[i * d + k]);
        hi[k] = std::max(hi[k], x[i * d + k]);
      }
    }
    const auto m = view(x, n);
    for (const auto& [name, r] : std::vector<std::pair<std::string, Result>>{
             {"median", median(m)},
             {"trimmed", trimmed_mean(m, f)},
             {"krum", krum(m, f)},
             {"multi_krum", multi_krum(m, f, honest - f)},
             {"bulyan", bulyan(view(x, n), f)}}) {
      for (std::size_t k = 0; k < d; ++k) {
        EXPECT_GE(r.aggregate[k], lo[k] - 1e-5) << name << " attack " << attack;
        EXPECT_LE(r.aggregate[k], hi[k] + 1e-5) << name << " attack " << attack;
      }
    }
    // The plain mean is what the attack moves.
    if (attack == 0) {
      EXPECT_GT(mean(m).aggregate[0], 1e20);
    }
  }
}

// Nearest-neighbour mixing, by hand: on the line {0, 1, 10} with f = 1 each input becomes the
// mean of itself and its nearest other input.
TEST(Robust, NearestNeighbourMixingAveragesEachInputWithItsNMinusFNearest) {
  const std::vector<float> x = {0, 1, 10};
  const auto m = nearest_neighbour_mixing(view(x, 3), 1);
  ASSERT_EQ(m.sources.size(), 3u);
  EXPECT_EQ(m.sources[0], (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(m.sources[1], (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(m.sources[2], (std::vector<std::size_t>{1, 2}));
  EXPECT_FLOAT_EQ(m.rows[0], 0.5f);
  EXPECT_FLOAT_EQ(m.rows[1], 0.5f);
  EXPECT_FLOAT_EQ(m.rows[2], 5.5f);
  // Weighted: the mean of each input's neighbours, by their weights.
  const std::vector<double> w = {1, 3, 1};
  EXPECT_FLOAT_EQ(nearest_neighbour_mixing(view(x, 3), 1, w).rows[0], 0.75f);
}

// Bucketing: ceil(n / s) buckets whose sizes differ by at most one, each input in exactly one,
// the permutation drawn from the seed; with weights, FedAvg over buckets is FedAvg over inputs.
TEST(Robust, BucketingPartitionsTheInputsBySeedAndKeepsTheWeightedMean) {
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0, 1);
  for (std::size_t n : {1u, 2u, 7u, 10u, 31u}) {
    for (std::size_t s : {2u, 3u, 4u}) {
      std::vector<float> x(n * 6);
      for (auto& v : x) v = g(rng);
      std::vector<double> w(n);
      for (std::size_t i = 0; i < n; ++i) w[i] = 1.0 + static_cast<double>(i % 4);
      const auto b = bucketing(view(x, n), s, 42, w);
      ASSERT_EQ(b.sources.size(), bucket_count(n, s)) << n << " " << s;
      std::vector<int> seen(n, 0);
      std::size_t lo = n, hi = 0;
      for (const auto& src : b.sources) {
        lo = std::min(lo, src.size());
        hi = std::max(hi, src.size());
        for (auto i : src) ++seen[i];
      }
      EXPECT_LE(hi - lo, 1u);
      EXPECT_LE(hi, s);
      for (int c : seen) EXPECT_EQ(c, 1);
      const auto direct = mean(view(x, n), w).aggregate;
      const auto via = mean(b.view(6), b.weights).aggregate;
      for (std::size_t k = 0; k < 6; ++k) EXPECT_NEAR(via[k], direct[k], 1e-5) << n << " " << s;
      EXPECT_EQ(bucketing(view(x, n), s, 42, w).sources, b.sources);  // the same seed, the same buckets
    }
  }
  std::vector<float> x(40 * 2, 1.0f);
  EXPECT_NE(bucketing(view(x, 40), 2, 1).sources, bucketing(view(x, 40), 2, 2).sources);
}

// f Byzantine inputs need an honest majority the rule can find: more than 2f inputs for the
// coordinate-wise rules, clipping and mixing, 2f + 2 for Krum, 4f + 2 for Bulyan; two inputs
// (a median of two secure groups) leave nothing to outvote.
TEST(Robust, ToleranceOfFIsCheckedAndVoidRobustnessNamed) {
  RuleSpec spec;
  spec.rule = Rule::Median;
  spec.f = 2;
  EXPECT_EQ(error_text(check_tolerance(spec, 5)), "");
  EXPECT_EQ(error_text(check_tolerance(spec, 4)), "a median withstands f = 2 Byzantine inputs only among at least 5 (more than 2f), not 4");
  spec.nnm = true;
  spec.rule = Rule::CenteredClip;
  EXPECT_NE(error_text(check_tolerance(spec, 3)).find("centered clipping after mixing"), std::string::npos) << error_text(check_tolerance(spec, 3));
  spec.nnm = false;
  spec.rule = Rule::MultiKrum;
  EXPECT_NE(error_text(check_tolerance(spec, 6)).find("at least 7 (more than 2f + 2)"), std::string::npos) << error_text(check_tolerance(spec, 6));
  EXPECT_EQ(error_text(check_tolerance(spec, 7)), "");
  spec.rule = Rule::Bulyan;
  EXPECT_NE(error_text(check_tolerance(spec, 10)), "");
  EXPECT_EQ(error_text(check_tolerance(spec, 11)), "");
  spec.f = 0;  // nothing declared, nothing to check
  EXPECT_EQ(error_text(check_tolerance(spec, 1)), "");

  RuleSpec median;
  median.rule = Rule::Median;
  EXPECT_EQ(void_robustness(median, 2), "median over 2 inputs is their mean: no input can be outvoted");
  EXPECT_EQ(void_robustness(median, 3), "");
  RuleSpec fedavg;
  EXPECT_EQ(void_robustness(fedavg, 2), "");  // nothing was promised
  RuleSpec clip;
  clip.rule = Rule::CenteredClip;
  EXPECT_NE(void_robustness(clip, 2).find("the farther one pull without bound"), std::string::npos);
  clip.tau = 0.5;  // a fixed radius still bounds each input's pull
  EXPECT_EQ(void_robustness(clip, 2), "");
  RuleSpec buckets;  // FedAvg over buckets is named as such, not as mixing
  buckets.f = 2;
  buckets.bucket = 2;
  EXPECT_NE(error_text(check_tolerance(buckets, 8)).find("a mean of buckets withstands"), std::string::npos)
      << error_text(check_tolerance(buckets, 8));
}

// With bucketing, the rule's result is rebuilt per input; the radius of centered clipping
// (which the audit record states) comes with it.
TEST(Robust, TheCentredClippingRadiusAndRejectionSurviveBucketing) {
  std::vector<float> x(8 * 3);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
  for (std::size_t k = 21; k < 24; ++k) x[k] = 1000.0f;  // input 7, far out: its bucket is rejected
  RuleSpec spec;
  spec.rule = Rule::CenteredClip;
  spec.bucket = 2;
  spec.seed = 4;
  const auto r = apply(spec, view(x, 8), {});
  EXPECT_GT(r.radius, 0);
  EXPECT_GT(r.rejected_beyond, r.radius);
  EXPECT_EQ(r.buckets.size(), 4u);
  EXPECT_FALSE(r.decisions[7].kept);
  for (const auto& bucket : r.buckets) {
    const bool far = std::find(bucket.begin(), bucket.end(), 7u) != bucket.end();
    for (auto i : bucket) EXPECT_EQ(r.decisions[i].kept, !far) << i;
  }
}

// Composed with a rule: the rule sees the buckets (check() counts them), every input gets its
// bucket's decision, and the buckets are reported. With 2 of 10 inputs attacking, bucketing
// and mixing in front of the median keep the aggregate inside the honest range.
TEST(Robust, PreAggregationStepsComposeWithEveryRule) {
  RuleSpec spec;
  spec.rule = Rule::Krum;
  spec.f = 1;
  spec.bucket = 2;
  EXPECT_EQ(rule_inputs(spec, 9), 5u);
  EXPECT_EQ(error_text(check(spec, 9)), "");  // krum on 5 buckets: 5 > 2f + 2
  EXPECT_NE(error_text(check(spec, 7)), "");  // 4 buckets are too few
  EXPECT_NE(error_text(check(spec, 7)).find("4 buckets of 2"), std::string::npos) << error_text(check(spec, 7));
  spec.rule = Rule::Median;
  spec.f = 2;
  EXPECT_NE(error_text(check(spec, 8)).find("at least 2f + 1 = 5"), std::string::npos) << error_text(check(spec, 8));  // 4 buckets
  EXPECT_EQ(error_text(check(spec, 9)), "");
  spec.nnm = true;
  spec.f = 3;
  EXPECT_NE(error_text(check(spec, 3)).find("more than f"), std::string::npos);

  // Robust rules count every input once, in the steps before them too: a huge claimed sample
  // count does not pull the mixed rows (FedAvg alone weighs its inputs).
  {
    const std::vector<float> line = {0, 1, 2, 3, 100};
    const std::vector<double> claimed = {1, 1, 1, 1, 1e9};
    RuleSpec med;
    med.rule = Rule::Median;
    med.f = 1;
    med.nnm = true;
    const auto r = apply(med, view(line, 5), claimed);
    EXPECT_LT(r.aggregate[0], 3.0f);
    RuleSpec avg = med;
    avg.rule = Rule::FedAvg;
    const auto a = apply(avg, view(line, 5), claimed);
    EXPECT_GT(a.aggregate[0], 99.0f);  // FedAvg believes the weights, as documented
  }

  std::mt19937 rng(9);
  std::normal_distribution<float> g(0, 1);
  const std::size_t n = 10, d = 20;
  std::vector<float> x(n * d);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t k = 0; k < d; ++k) x[i * d + k] = i >= 8 ? 1e6f : g(rng);
  }
  std::vector<float> lo(d, INFINITY), hi(d, -INFINITY);
  for (std::size_t i = 0; i < 8; ++i) {
    for (std::size_t k = 0; k < d; ++k) {
      lo[k] = std::min(lo[k], x[i * d + k]);
      hi[k] = std::max(hi[k], x[i * d + k]);
    }
  }
  for (Rule rule : {Rule::Median, Rule::TrimmedMean, Rule::Krum, Rule::MultiKrum, Rule::CenteredClip}) {
    for (bool nnm : {false, true}) {
      RuleSpec s;
      s.rule = rule;
      s.f = 2;
      s.tau = 0.5;
      s.iterations = 3;
      s.nnm = nnm;
      s.bucket = rule == Rule::Krum || rule == Rule::MultiKrum ? 1 : 2;  // krum needs n > 2f + 2 rows
      s.seed = 7;
      ASSERT_EQ(error_text(check(s, n)), "") << name(rule);
      const auto r = apply(s, view(x, n), {});
      ASSERT_EQ(r.decisions.size(), n);
      if (s.bucket > 1) {
        ASSERT_EQ(r.buckets.size(), 5u);
        EXPECT_NE(r.decisions[0].reason.find("bucket"), std::string::npos);
      }
      for (std::size_t k = 0; k < d; ++k) {
        EXPECT_GE(r.aggregate[k], lo[k] - 1e-4) << name(rule) << " nnm " << nnm;
        EXPECT_LE(r.aggregate[k], hi[k] + 1e-4) << name(rule) << " nnm " << nnm;
      }
    }
  }
}

}  // namespace
}  // namespace xsilo::robust

namespace xsilo::tools {
namespace {

// The simulated attacks that collude: each computed from the honest deltas as docs/robust.md
// defines it.
TEST(Attacks, MimicCopiesTheHonestSiloFarthestAlongTheDirectionOfLargestSpread) {
  // Four honest deltas spread along the first axis, a little along the second; silo 2 is the
  // farthest out along the first.
  const std::vector<std::vector<float>> honest = {{1.0f, 0.1f}, {-1.0f, -0.1f}, {3.0f, 0.0f}, {0.5f, 0.2f}};
  AttackConfig a;
  a.kind = "mimic";
  std::vector<float> delta = {9.0f, 9.0f};
  apply_attack(a, delta, 1, [&] { return honest; });
  EXPECT_EQ(delta, honest[2]);
  // Along the second axis instead, silo 1 (the farthest below the mean) is copied.
  const std::vector<std::vector<float>> turned = {{0.1f, 1.0f}, {0.0f, -4.0f}, {-0.1f, 2.0f}, {0.2f, 0.5f}};
  apply_attack(a, delta, 2, [&] { return turned; });
  EXPECT_EQ(delta, turned[1]);
}

TEST(Attacks, ModelReplacementOpposesTheHonestMeanAtTheLargestHonestNorm) {
  const std::vector<std::vector<float>> honest = {{3.0f, 0.0f}, {1.0f, 0.0f}, {0.0f, 2.0f}};
  AttackConfig a;
  a.kind = "model_replacement";
  std::vector<float> delta(2);
  apply_attack(a, delta, 1, [&] { return honest; });
  // The honest mean is (4/3, 2/3); the largest honest norm is 3.
  const double len = std::sqrt(16.0 / 9 + 4.0 / 9);
  EXPECT_NEAR(delta[0], -3.0 * (4.0 / 3) / len, 1e-5);
  EXPECT_NEAR(delta[1], -3.0 * (2.0 / 3) / len, 1e-5);
  a.boost = 2;
  apply_attack(a, delta, 1, [&] { return honest; });
  EXPECT_NEAR(std::hypot(delta[0], delta[1]), 6.0, 1e-5);
}

}  // namespace
}  // namespace xsilo::tools
