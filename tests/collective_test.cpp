// Collectives over real TCP on loopback: every rank a thread with its own sockets.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "silo_agent/collective/group.h"

namespace xsilo::collective {
namespace {

// Runs `fn(group)` on n workers that join one coordinator.
void with_group(int n, const Options& opts, const std::function<void(Group&)>& fn) {
  Coordinator coord(n, std::chrono::milliseconds(3000));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  for (int id = 0; id < n; ++id) {
    threads.emplace_back([&, id] {
      try {
        Group g("127.0.0.1", coord.port(), id, "127.0.0.1", opts);
        fn(g);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(id)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int id = 0; id < n; ++id) EXPECT_EQ(errors[static_cast<std::size_t>(id)], "") << "worker " << id;
}

// Integers in floats add exactly: every rank must end with exactly the expected sum.
void check_exact(int n, std::size_t elements, const std::string& backend) {
  Options opts;
  opts.backend = backend;
  opts.chunk_bytes = 4096;  // several chunks per segment
  with_group(n, opts, [&](Group& g) {
    std::vector<float> v(elements);
    for (std::size_t i = 0; i < elements; ++i) v[i] = static_cast<float>((g.rank() + 1) * 1000 + static_cast<int>(i % 997));
    g.comm().all_reduce(v);
    const float ranks = static_cast<float>(n * (n + 1) / 2);
    for (std::size_t i = 0; i < elements; ++i) {
      const float want = ranks * 1000 + static_cast<float>(n) * static_cast<float>(i % 997);
      ASSERT_EQ(v[i], want) << backend << " n=" << n << " elements=" << elements << " i=" << i;
    }
  });
}

TEST(Collective, RingIsExactForOneToEightRanksAndAwkwardSizes) {
  for (int n = 1; n <= 8; ++n) {
    for (std::size_t elements : {1u, 3u, 7u, 1000u, 10007u}) check_exact(n, elements, "ring");
  }
}

TEST(Collective, HalvingDoublingIsExactIncludingNonPowersOfTwo) {
  for (int n = 1; n <= 8; ++n) {
    for (std::size_t elements : {1u, 5u, 1000u, 10007u}) check_exact(n, elements, "hd");
  }
}

TEST(Collective, BroadcastAndBarrierReachEveryRank) {
  for (int n : {1, 3, 5, 8}) {
    with_group(n, Options{}, [&](Group& g) {
      std::vector<float> v(777, g.rank() == 2 % n ? 42.0f : -1.0f);
      g.comm().broadcast(v, 2 % n);
      for (float x : v) ASSERT_EQ(x, 42.0f);
      g.comm().barrier();
    });
  }
}

}  // namespace
}  // namespace xsilo::collective
