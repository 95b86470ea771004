// Which silos take part in a round: a pure function of the silos the server can reach, their
// state, the round and the federation's seed. No clock, no generator of its own, no I/O: the
// same inputs give the same list on every machine, so a test (or an auditor) can replay it.
//
//   1. A silo is left out if it asked to leave its route (Leaving), witnessed another audit log
//      (disowned), or reported its privacy budget spent; the others are eligible.
//   2. Fewer eligible than min_silos: no one is chosen (the round waits for more).
//   3. The eligible silos, sorted by name, are shuffled with a std::mt19937_64 seeded with
//      crypto::derive_seed(seed, round, "selection"); std::shuffle's use of the engine is the
//      library's, so the draw is the same for one standard library, not across all of them.
//   4. silos_per_round = k > 0: the first ceil(k * (1 + over_selection)) of that order are chosen
//      and the round closes at min(k, chosen) updates; k = 0: every eligible silo, closing at all
//      of them. The rest are left out as not drawn.
//   5. The chosen list is sorted by name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xsilo::server {

struct SelectionConfig {
  std::size_t min_silos = 2;        // connected silos needed to start a round
  std::size_t min_updates = 0;      // updates needed to commit (0: min_silos)
  std::size_t silos_per_round = 0;  // k; 0: every connected silo
  double over_selection = 0.0;      // select ceil(k * (1 + s)), close at k
};

// A silo the server holds a route to, with what decides whether it may be selected.
struct Candidate {
  std::string silo;
  std::uint64_t route = 0;  // the session the silo is reached through (its own or its edge's)
  bool leaving = false;     // asked to leave its route between rounds
  bool disowned = false;    // witnessed audit heads of another log
  bool budget_spent = false;  // its record-level privacy budget is spent
};

enum class LeftOutReason { Leaving, Disowned, BudgetSpent, TooFewEligible, NotDrawn };
std::string_view name(LeftOutReason r);

struct Selection {
  std::vector<std::pair<std::string, std::uint64_t>> chosen;  // (silo, route), sorted by silo
  std::size_t target = 0;                                     // the updates the round closes at
  std::vector<std::pair<std::string, LeftOutReason>> left_out;  // sorted by silo
};

// The order of `candidates` does not matter; their names must be distinct.
Selection select(std::vector<Candidate> candidates, std::uint64_t round, const SelectionConfig& cfg,
                 std::uint64_t seed);

}  // namespace xsilo::server
