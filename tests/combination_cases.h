// The cases of tests/combination_test.cpp: small federations, each a meeting of features (secure
// mode, edges, faults, robust rules, local workers, compression, hostile processes) run through
// `xsilo sim`, one row each.
#pragma once

#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace xsilo::tools::combination {

struct Case {
  std::string name;
  nlohmann::json sim;  // the sim config (silos, rounds, edges, secure, aggregation, local, faults, ...)
  double tolerance;    // max |checkpoint - reference| relative to the model's largest value
  std::size_t min_committed;  // rounds that must commit (faults may cost a round its groups)
  // Hostile cases: silos that must never be a participant, and those every round's record
  // must name as excluded from their secure group, with evidence.
  std::vector<std::string> never = {}, excluded = {};
  double quantum = 0;  // plus this absolute slack: the rounding of a compact secure ring
};

inline std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

// The table, in the order the test runs it (its names are the test names' last part).
std::vector<Case> cases();

}  // namespace xsilo::tools::combination
