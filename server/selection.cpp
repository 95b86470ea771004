#include "server/selection.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "crypto/sources.h"

namespace xsilo::server {

std::string_view name(LeftOutReason r) {
  switch (r) {
    case LeftOutReason::Leaving: return "leaving";
    case LeftOutReason::Disowned: return "disowned";
    case LeftOutReason::BudgetSpent: return "budget_spent";
    case LeftOutReason::TooFewEligible: return "too_few_eligible";
    case LeftOutReason::NotDrawn: return "not_drawn";
  }
  return "?";
}

Selection select(std::vector<Candidate> candidates, std::uint64_t round, const SelectionConfig& cfg,
                 std::uint64_t seed) {
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) { return a.silo < b.silo; });
  Selection out;
  std::vector<std::pair<std::string, std::uint64_t>> eligible;
  for (const auto& c : candidates) {
    if (c.leaving) out.left_out.emplace_back(c.silo, LeftOutReason::Leaving);
    else if (c.disowned) out.left_out.emplace_back(c.silo, LeftOutReason::Disowned);
    else if (c.budget_spent) out.left_out.emplace_back(c.silo, LeftOutReason::BudgetSpent);
    else eligible.emplace_back(c.silo, c.route);
  }
  if (eligible.size() < cfg.min_silos) {
    for (const auto& e : eligible) out.left_out.emplace_back(e.first, LeftOutReason::TooFewEligible);
    std::sort(out.left_out.begin(), out.left_out.end());
    return out;
  }
  std::mt19937_64 rng(crypto::derive_seed(seed, round, "selection"));
  std::shuffle(eligible.begin(), eligible.end(), rng);
  std::size_t n_select = eligible.size();
  out.target = n_select;
  if (cfg.silos_per_round > 0) {
    const auto want = static_cast<std::size_t>(
        std::ceil(static_cast<double>(cfg.silos_per_round) * (1.0 + cfg.over_selection)));
    n_select = std::min(n_select, want);
    out.target = std::min(cfg.silos_per_round, n_select);
  }
  for (std::size_t i = n_select; i < eligible.size(); ++i) out.left_out.emplace_back(eligible[i].first, LeftOutReason::NotDrawn);
  eligible.resize(n_select);
  std::sort(eligible.begin(), eligible.end());
  out.chosen = std::move(eligible);
  std::sort(out.left_out.begin(), out.left_out.end());
  return out;
}

}  // namespace xsilo::server
