// The worker-thread rule, checked: methods that a class says run on one thread, one at a time
// (an aggregator's fold(), prepare() and combine() on the daemon's worker thread, the edge's and
// the silo's jobs) write their state without a lock, so a call from a second thread is a race.
//
//   ThreadCheck worker_;
//   FoldResult fold(...) { worker_.check("Aggregator::fold"); ... }
//
// The first check() binds the object to its caller's thread; a check() on any other thread
// prints `what` and aborts. Active in debug builds and wherever XSILO_THREAD_CHECKS is defined
// (cmake -DXSILO_THREAD_CHECKS=ON, on in the sanitizer build: scripts/build.sh), where
// RelWithDebInfo's NDEBUG would otherwise leave it out; elsewhere check() compiles to nothing.
// The switch changes the object's size, so it must be the same for the whole build (the cmake
// option defines it for every target). Header-only and free of every other header of ours, so
// that the protocol cores may use it (tests/layering_check.py).
#pragma once

#if !defined(NDEBUG) || defined(XSILO_THREAD_CHECKS)
#define XSILO_THREAD_CHECKS_ACTIVE 1
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>
#else
#define XSILO_THREAD_CHECKS_ACTIVE 0
#endif

namespace xsilo {

class ThreadCheck {
 public:
  static constexpr bool kActive = XSILO_THREAD_CHECKS_ACTIVE;

#if XSILO_THREAD_CHECKS_ACTIVE
  void check(const char* what) {
    const std::thread::id me = std::this_thread::get_id();
    std::thread::id bound{};  // no thread yet: this call binds it
    if (bound_.compare_exchange_strong(bound, me) || bound == me) return;
    std::fprintf(stderr, "xsilo: %s runs on one thread, one at a time, but was called on a second thread\n", what);
    std::abort();
  }

 private:
  std::atomic<std::thread::id> bound_{};
#else
  void check(const char*) {}
#endif
};

}  // namespace xsilo
