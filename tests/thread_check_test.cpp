// The worker-thread rule's check (common/thread_check.h): calls on the thread that made the
// first one pass; a call from any other thread aborts, naming the method, where the checks are
// compiled in (debug builds, or XSILO_THREAD_CHECKS: the sanitizer build).
#include "common/thread_check.h"

#include <thread>

#include <gtest/gtest.h>

namespace xsilo {
namespace {

TEST(ThreadCheck, CallsOnTheFirstCallersThreadPass) {
  ThreadCheck worker;
  for (int i = 0; i < 3; ++i) worker.check("fold");
}

TEST(ThreadCheck, TheFirstCallBindsWhicheverThreadMakesIt) {
  ThreadCheck worker;  // made on this thread, first checked on another: that one is the worker
  std::thread([&] {
    worker.check("fold");
    worker.check("combine");
  }).join();
}

TEST(ThreadCheck, ACallFromASecondThreadAborts) {
  if (!ThreadCheck::kActive) GTEST_SKIP() << "this build defines NDEBUG without XSILO_THREAD_CHECKS: check() is empty";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the dying call is on a thread of its own
  ThreadCheck worker;
  worker.check("Aggregator::fold");
  EXPECT_DEATH(std::thread([&] { worker.check("Aggregator::combine"); }).join(),
               "Aggregator::combine runs on one thread, one at a time, but was called on a second thread");
}

}  // namespace
}  // namespace xsilo
