// Helpers for tests of functions that return xsilo::Result or xsilo::Status (common/result.h).
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "common/result.h"

namespace xsilo {

// EXPECT_TRUE(succeeded(step)): on failure, gtest prints the step's error sentence.
template <class R>
::testing::AssertionResult succeeded(const R& r) {
  if (r) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << r.error().message();
}

// The sentence of a step that failed, for tests that check what it says; "" when it succeeded.
template <class R>
std::string error_text(const R& r) {
  return r ? std::string() : r.error().message();
}

}  // namespace xsilo
