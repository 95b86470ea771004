// What `xsilo audit verify` must catch in a silo-level DP log, in either mode
// (server::check_privacy_claims): shared by the central and the distributed DP tests.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/audit.h"

namespace xsilo::test {

// `log` holds committed rounds 1.. at records 1..; round 3 claiming round 1's spend is caught,
// with the mode's words ("central DP", "distributed DP").
inline void expect_understated_epsilon_caught(const std::vector<nlohmann::json>& log, const std::string& mode) {
  auto lie = log;
  lie[3]["privacy"]["epsilon"] = log[1]["privacy"]["epsilon"];
  const auto bad = server::check_privacy_claims(lie);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("record 4 (round 3): " + mode + " claims epsilon"), std::string::npos)
      << bad.error().message();
}

// `xsilo audit verify`'s privacy check fails on `log`, saying `says`.
inline void expect_claims_fail(const std::vector<nlohmann::json>& log, const std::string& says) {
  const auto r = server::check_privacy_claims(log);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find(says), std::string::npos) << r.error().message();
}

}  // namespace xsilo::test
