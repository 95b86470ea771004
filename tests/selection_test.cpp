// server/selection.h: which silos a round selects, as a pure function.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "server/selection.h"

namespace xsilo::server {
namespace {

std::vector<Candidate> silos(std::size_t n) {
  std::vector<Candidate> out;
  for (std::size_t i = 0; i < n; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "hospital-%02zu", i + 1);
    out.push_back({.silo = name, .route = 100 + i});
  }
  return out;
}

std::vector<std::string> names(const Selection& s) {
  std::vector<std::string> out;
  for (const auto& c : s.chosen) out.push_back(c.first);
  return out;
}

SelectionConfig sample(std::size_t k, double over = 0.0, std::size_t min_silos = 2) {
  return {.min_silos = min_silos, .min_updates = 0, .silos_per_round = k, .over_selection = over};
}

TEST(Selection, EveryEligibleSiloTakesPartWhenNoSampleIsAsked) {
  const auto s = select(silos(7), 3, sample(0), 5);
  EXPECT_EQ(s.chosen.size(), 7u);
  EXPECT_EQ(s.target, 7u);
  EXPECT_TRUE(s.left_out.empty());
  for (std::size_t i = 0; i < 7; ++i) EXPECT_EQ(s.chosen[i].second, 100 + i) << "each silo keeps its route";
}

TEST(Selection, TheSameInputsGiveTheSameListInAnyInputOrder) {
  auto in = silos(12);
  const auto a = select(in, 4, sample(5), 99);
  std::reverse(in.begin(), in.end());
  const auto b = select(in, 4, sample(5), 99);
  EXPECT_EQ(a.chosen, b.chosen);
  EXPECT_EQ(a.left_out, b.left_out);
  EXPECT_TRUE(std::is_sorted(a.chosen.begin(), a.chosen.end()));
  EXPECT_TRUE(std::is_sorted(a.left_out.begin(), a.left_out.end()));
}

// The draw is pinned: a change here changes which silos every sampled federation selects.
TEST(Selection, TheDrawIsTheOneTheSelectionSeedGives) {
  const auto s = select(silos(10), 1, sample(3), 5);
  EXPECT_EQ(names(s), (std::vector<std::string>{"hospital-01", "hospital-05", "hospital-08"}));
}

TEST(Selection, OverSelectionChoosesMoreAndClosesAtK) {
  const auto s = select(silos(10), 2, sample(3, 0.5), 7);
  EXPECT_EQ(s.chosen.size(), 5u);  // ceil(3 x 1.5)
  EXPECT_EQ(s.target, 3u);
  EXPECT_EQ(s.left_out.size(), 5u);
  for (const auto& [silo, why] : s.left_out) EXPECT_EQ(why, LeftOutReason::NotDrawn) << silo;
}

TEST(Selection, ASampleLargerThanTheEligibleTakesThemAllAndClosesAtAll) {
  const auto s = select(silos(4), 2, sample(3, 1.0), 7);  // wants 6 of 4
  EXPECT_EQ(s.chosen.size(), 4u);
  EXPECT_EQ(s.target, 3u);
  const auto t = select(silos(2), 2, sample(5), 7);
  EXPECT_EQ(t.chosen.size(), 2u);
  EXPECT_EQ(t.target, 2u);
}

TEST(Selection, FewerEligibleThanMinSilosChoosesNoOne) {
  auto in = silos(4);
  in[0].leaving = true;
  in[1].budget_spent = true;
  const auto s = select(in, 1, sample(0, 0.0, 3), 5);
  EXPECT_TRUE(s.chosen.empty());
  EXPECT_EQ(s.target, 0u);
  const std::map<std::string, LeftOutReason> why(s.left_out.begin(), s.left_out.end());
  EXPECT_EQ(why.at("hospital-01"), LeftOutReason::Leaving);
  EXPECT_EQ(why.at("hospital-02"), LeftOutReason::BudgetSpent);
  EXPECT_EQ(why.at("hospital-03"), LeftOutReason::TooFewEligible);
  EXPECT_EQ(why.at("hospital-04"), LeftOutReason::TooFewEligible);
  EXPECT_TRUE(select({}, 1, sample(0, 0.0, 1), 5).chosen.empty());
}

TEST(Selection, LeavingDisownedAndSpentSilosAreNeverDrawnAndSaySo) {
  auto in = silos(9);
  in[2].leaving = true;
  in[4].disowned = true;
  in[6].budget_spent = true;
  in[8].leaving = in[8].disowned = true;  // the first reason is the one named
  for (std::uint64_t round = 1; round <= 50; ++round) {
    const auto s = select(in, round, sample(2, 0.5), 11);
    ASSERT_EQ(s.chosen.size(), 3u);
    for (const auto& [silo, route] : s.chosen) {
      EXPECT_TRUE(silo != "hospital-03" && silo != "hospital-05" && silo != "hospital-07" && silo != "hospital-09")
          << silo;
    }
    const std::map<std::string, LeftOutReason> why(s.left_out.begin(), s.left_out.end());
    EXPECT_EQ(why.at("hospital-03"), LeftOutReason::Leaving);
    EXPECT_EQ(why.at("hospital-05"), LeftOutReason::Disowned);
    EXPECT_EQ(why.at("hospital-07"), LeftOutReason::BudgetSpent);
    EXPECT_EQ(why.at("hospital-09"), LeftOutReason::Leaving);
    EXPECT_EQ(s.chosen.size() + s.left_out.size(), in.size()) << "every silo is chosen or left out with a reason";
  }
}

TEST(Selection, RoundsAndSeedsDrawDifferentSamplesAndEverySiloEquallyOften) {
  const auto in = silos(10);
  std::map<std::string, std::size_t> times;
  std::set<std::vector<std::string>> samples;
  const std::size_t rounds = 3000;
  for (std::uint64_t round = 1; round <= rounds; ++round) {
    const auto s = select(in, round, sample(3), 5);
    samples.insert(names(s));
    for (const auto& c : s.chosen) ++times[c.first];
  }
  EXPECT_GT(samples.size(), 100u);  // 120 samples of 3 of 10 exist
  for (const auto& [silo, n] : times) {
    // Expected 900, standard deviation sqrt(3000 x 0.3 x 0.7) = 25: six of them either side.
    EXPECT_NEAR(static_cast<double>(n), 900.0, 150.0) << silo;
  }
  EXPECT_NE(names(select(in, 1, sample(3), 5)), names(select(in, 1, sample(3), 6)));
}

}  // namespace
}  // namespace xsilo::server
