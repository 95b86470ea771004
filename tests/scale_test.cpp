// Issue 17, part 3: 200 silos in one federation on this machine, as real processes over mutual
// TLS (`xsilo bench round`: the server, the edges and 200 agents with a synthetic update):
// straight to the server, behind 4 edges, and in grouped secure mode behind the edges. Every
// round must commit, and what the server holds must grow with the silos linearly: one socket
// per direct silo (none for silos behind an edge) and a bounded amount of memory per
// connection. The figures with 50, 100 and 200 silos are in docs/benchmarks.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/process.h"
#include "tests/testlib.h"

namespace xsilo {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

// Under AddressSanitizer every process carries its shadow memory and runs several times slower:
// 200 of them on a 2-core CI machine miss the rounds' deadlines and draw the OOM killer. Those
// builds run 50 silos (and say so); a Release build runs the 200.
#if defined(XSILO_ASAN_BUILD)
constexpr std::size_t kSilos = 50;
#else
constexpr std::size_t kSilos = 200;
#endif
constexpr std::uint64_t kParams = 100000;  // frames past 256 KiB: what an idle connection must give back

json bench_round(const test::TempDir& dir, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {test::xsilo_bin(), "bench", "round", "--silos", std::to_string(kSilos),
                                   "--params", std::to_string(kParams), "--rounds", "3", "--json"};
  argv.insert(argv.end(), extra.begin(), extra.end());
#if defined(XSILO_ASAN_BUILD)
  std::cout << "[ NOTE     ] " << kSilos << " silos, not 200: an AddressSanitizer build (200 run in Release builds)\n";
#endif
  const auto log = dir / "bench.log";
  Process bench(argv, log);
  const auto code = bench.wait(600s);
  EXPECT_TRUE(code) << "bench round did not finish:\n" << log_tail(log, 40);
  // Exit code 1 is a missed throughput or memory target (checked here instead); 2 is a round
  // that did not commit or a process that failed.
  EXPECT_TRUE(code && (*code == 0 || *code == 1)) << log_tail(log, 40);
  const auto text = read_file(log);
  if (const auto at = text.find("{\"bench\""); at != std::string::npos) {
    return json::parse(text.substr(at, text.find('\n', at) - at));
  }
  ADD_FAILURE() << "no result from bench round:\n" << log_tail(log, 40);
  return json::object();
}

// The server's memory: the bench's bound for its model buffers (the global model, the sum, one
// upload, and a fixed base), plus half a MiB per connection (TLS buffers; a connection's large buffers are given
// back when it goes idle) and what the mode holds beyond that.
void expect_server_resources(const json& r, std::size_t connections, std::uint64_t extra = 0) {
  ASSERT_TRUE(r.contains("peak_rss_bytes")) << r.dump();
  const std::uint64_t bound =
      r["peak_rss_bound_bytes"].get<std::uint64_t>() + connections * (512u << 10) + extra;
#if defined(XSILO_ASAN_BUILD)
  std::cout << "[ NOTE     ] server memory bound (" << bound << " bytes) not checked: AddressSanitizer's shadow "
            << "memory and quarantine are in the server's RSS (" << r["peak_rss_bytes"] << " bytes)\n";
#else
  EXPECT_LT(r["peak_rss_bytes"].get<std::uint64_t>(), bound) << r.dump();
#endif
  // One socket per connection, and the server's own few (listeners, logs, state files).
  const std::size_t fds = r["server_open_descriptors"];
  EXPECT_GE(fds, connections + 4) << r.dump();
  EXPECT_LE(fds, connections + 32) << r.dump();
}

// Depends on timing: every round must commit, so the agents (200; 50 under AddressSanitizer) must
// meet the bench's deadlines (join_s 60, train_s and upload_s 600) on this machine, which CTest
// leaves to the scale tests alone (scale_serial.cmake); a missed throughput target (exit code 1)
// is accepted. The round logic at this scale is covered deterministically by
// Coordinator.HundredSilosWithRandomDropoutsAtEveryPhaseMatchTheReference. The server's memory and
// descriptors are the real process's, measured here only: no harness without the process has them.
TEST(Scale, TwoHundredSilosStraightToTheServer) {
  test::TempDir dir;
  const auto r = bench_round(dir, {});
  expect_server_resources(r, kSilos);
  // Every silo's idle time, from its timeline in the round records: the wait for an upload slot
  // and for the round to close, within the round.
  ASSERT_TRUE(r.contains("silo_idle_seconds_per_round")) << r.dump();
  EXPECT_EQ(r["silo_idle_seconds_per_round"].size(), kSilos);
  // With 200 silos and a few upload lanes most wait for theirs: someone was idle.
  double most = 0;
  const double round = r["seconds_per_round"].get<double>();
  for (const auto& [silo, idle] : r["silo_idle_seconds_per_round"].items()) {
    EXPECT_GE(idle.get<double>(), 0.0) << silo;
    EXPECT_LE(idle.get<double>(), round + 0.5) << silo;  // the mean of 2 timed rounds, like the median
    most = std::max(most, idle.get<double>());
  }
  EXPECT_GT(most, 0.0);
}

// Depends on timing as the test above does (the bench's deadlines, run alone). Deterministic
// counterpart: Relay.SumsItsSilosOneUploadAtATimeAndSendsOnePartialSum for the edges' sums; the
// server's memory and descriptors are measured on the real processes only.
TEST(Scale, TwoHundredSilosBehindFourEdges) {
  test::TempDir dir;
  const auto r = bench_round(dir, {"--edges", "4"});
  expect_server_resources(r, 4);
}

// Secure groups are drawn from the round's silos across the edges: each edge uploads one masked
// sum per group it has members in, so what the server holds grows with the groups (n / g of
// them), not with n^2.
// Depends on timing as the tests above do, and on the secure phases' default deadlines (keys_s and
// unmask_s 30). Deterministic counterparts: Cores.OneDropoutInEverySecureGroupCostsOnlyThatSilo
// and Relay.SendsOneMaskedPartialSumPerSecureGroupOnePerGrant; the server's memory is the real
// process's, measured here only.
TEST(Scale, TwoHundredSilosInGroupedSecureModeBehindFourEdges) {
  test::TempDir dir;
  const auto r = bench_round(dir, {"--edges", "4", "--secure", "grouped"});
  // The groups' sums are in the bench's bound (one sum of ring words per group, kept as words
  // after unmasking: server/group_sum.h); beyond it, each silo's keys and shares.
  expect_server_resources(r, 4, kSilos * (64u << 10));
}

}  // namespace
}  // namespace xsilo
