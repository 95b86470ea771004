// Buffered asynchronous rounds (server/schedule.h): the staleness functions and the admission
// rule, whole federations on the sim's simulated clock (`xsilo sim --in-process`), where two
// silos train ten times as long as the others, and the same in the real processes (the server
// daemon, its agents, mutual TLS on loopback), a server restart included.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>

#include "common/config.h"
#include "common/fs.h"
#include "common/process.h"
#include "server/schedule.h"
#include "testlib.h"
#include "tools/sim.h"

namespace xsilo {
namespace {

TEST(Schedule, StalenessFunctionsStartAtOneAndNeverGrow) {
  server::ScheduleConfig c;
  c.mode = server::ScheduleMode::Buffered;
  EXPECT_DOUBLE_EQ(server::staleness_weight(c, 0), 1.0);
  EXPECT_DOUBLE_EQ(server::staleness_weight(c, 3), 0.5);  // FedBuff's 1/sqrt(1 + tau)
  c.a = 1.0;
  EXPECT_DOUBLE_EQ(server::staleness_weight(c, 4), 0.2);
  c.staleness = server::Staleness::Constant;
  EXPECT_DOUBLE_EQ(server::staleness_weight(c, 100), 1.0);
  c.staleness = server::Staleness::Hinge;
  c.a = 10;
  c.b = 2;
  EXPECT_DOUBLE_EQ(server::staleness_weight(c, 2), 1.0);
  EXPECT_DOUBLE_EQ(server::staleness_weight(c, 3), 1.0 / 11);
  for (auto kind : {server::Staleness::Polynomial, server::Staleness::Constant, server::Staleness::Hinge}) {
    c.staleness = kind;
    for (std::uint64_t t = 0; t < 50; ++t) {
      EXPECT_LE(server::staleness_weight(c, t + 1), server::staleness_weight(c, t));
      EXPECT_GT(server::staleness_weight(c, t), 0.0);
    }
  }
}

TEST(Schedule, AnUpdateOlderThanMaxStalenessOrFromTheFutureIsRefusedWithTheReason) {
  server::ScheduleConfig c;
  c.mode = server::ScheduleMode::Buffered;
  c.max_staleness = 2;
  EXPECT_TRUE(server::admit(c, 5, 5).admitted);
  const auto two = server::admit(c, 3, 5);
  EXPECT_TRUE(two.admitted);
  EXPECT_EQ(two.staleness, 2u);
  const auto old = server::admit(c, 2, 5);
  EXPECT_FALSE(old.admitted);
  EXPECT_EQ(old.staleness, 3u);
  EXPECT_NE(old.reason.find("too stale: trained on version 2, 3 versions behind"), std::string::npos) << old.reason;
  EXPECT_NE(old.reason.find("max_staleness is 2"), std::string::npos) << old.reason;
  EXPECT_FALSE(server::admit(c, 6, 5).admitted);
}

// Ten silos of digits, the last two ten times as slow (100 ms against 1000 ms a training).
tools::SimConfig straggling(const nlohmann::json& extra, const test::TempDir& dir) {
  nlohmann::json j = {{"name", "stragglers"}, {"silos", 10}, {"rounds", 12}, {"seed", 3}, {"baseline", false},
                      {"data", {{"dataset", "digits"}, {"standardize", true}}},
                      {"model", {{"kind", "mlp"}, {"hidden", {16}}}},
                      {"training", {{"local_epochs", 1}, {"batch_size", 32}, {"learning_rate", 0.05}}},
                      {"selection", {{"min_silos", 10}, {"min_updates", 8}}},
                      {"train_ms", {100, 100}},
                      {"stragglers", {{"silos", 2}, {"factor", 10}}}};
  j.update(extra);
  atomic_write_file(dir / "sim.json", j.dump());
  return tools::load_sim_config(dir / "sim.json");
}

std::vector<nlohmann::json> rounds_of(const std::filesystem::path& out) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(out / "rounds.jsonl");
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(Buffered, CommitsEveryKUpdatesNamingEachBaseVersionAndTheModelLearns) {
  test::TempDir dir;
  const auto cfg =
      straggling({{"schedule", {{"mode", "buffered"}, {"k", 4}, {"max_staleness", 20}}}, {"rounds", 30}}, dir);
  const auto r = tools::run_sim_in_process(cfg, dir / "out");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.rounds_committed, 30u);
  const auto lines = rounds_of(dir / "out");
  ASSERT_EQ(lines.size(), 30u);
  bool slow_counted = false, stale_seen = false;
  std::int64_t last_ms = 0;
  for (std::size_t v = 0; v < lines.size(); ++v) {
    const auto& l = lines[v];
    EXPECT_EQ(l["round"], v + 1);
    EXPECT_EQ(l["status"], "committed");
    EXPECT_EQ(l["schedule"]["staleness"]["kind"], "polynomial");
    ASSERT_EQ(l["updates"].size(), 4u) << l.dump();
    EXPECT_GE(l["sim_ms"].get<std::int64_t>(), last_ms);
    last_ms = l["sim_ms"];
    for (const auto& u : l["updates"]) {
      const auto base = u["base_version"].get<std::uint64_t>(), tau = u["staleness"].get<std::uint64_t>();
      EXPECT_LE(base, v);            // trained on a committed version before this one
      EXPECT_EQ(base + tau, v);      // staleness against the newest when it arrived
      EXPECT_NEAR(u["staleness_weight"].get<double>(), 1 / std::sqrt(1.0 + double(tau)), 1e-12);
      stale_seen |= tau > 0;
      slow_counted |= u["silo"] == "hospital-10";
    }
  }
  EXPECT_TRUE(stale_seen);
  EXPECT_TRUE(slow_counted);  // the slow silos' updates count, weighted down
  // The fast silos never wait for the slow ones: 30 commits of 4 in 1.5 slow trainings.
  EXPECT_EQ(r.sim_ms, 1500);
  EXPECT_GT(r.final_accuracy, lines.front()["accuracy"].get<double>() + 0.2) << lines.front()["accuracy"];
  EXPECT_GT(r.final_accuracy, 0.7);
}

TEST(Buffered, AnUpdateBeyondMaxStalenessIsRefusedAndRecordedInTheNextCommit) {
  test::TempDir dir;
  const auto cfg =
      straggling({{"schedule", {{"mode", "buffered"}, {"k", 4}, {"max_staleness", 1}}}, {"rounds", 30}}, dir);
  const auto r = tools::run_sim_in_process(cfg, dir / "out");
  EXPECT_EQ(r.rounds_committed, 30u);
  std::size_t refused = 0;
  bool slow_refused = false;
  for (const auto& l : rounds_of(dir / "out")) {
    for (const auto& u : l["updates"]) EXPECT_LE(u["staleness"].get<std::uint64_t>(), 1u);
    for (const auto& x : l["refused"]) {
      ++refused;
      EXPECT_GT(x["staleness"].get<std::uint64_t>(), 1u);
      EXPECT_NE(x["reason"].get<std::string>().find("too stale"), std::string::npos) << x.dump();
      slow_refused |= x["silo"] == "hospital-10" && x["base_version"] == 0;
    }
  }
  EXPECT_GT(refused, 0u);
  // A slow silo's first update arrives 20 versions late; the fast silos' arrive at most a few late
  // (eight at once fill two buffers of four, so some trained two versions back).
  EXPECT_TRUE(slow_refused);
}

// The three schedules of docs/benchmarks.md on the simulated clock: synchronous rounds wait for
// the slow silos, over-selection closes at the eight fast ones, buffered never waits.
TEST(Buffered, SynchronousRoundsWaitForTheSlowestAndOverSelectionDoesNot) {
  test::TempDir dir;
  const auto sync = tools::run_sim_in_process(straggling(nlohmann::json::object(), dir), dir / "sync");
  EXPECT_EQ(sync.sim_ms, 12 * 1000);
  for (const auto& l : rounds_of(dir / "sync")) EXPECT_EQ(l["updates"], 10);
  const auto over = tools::run_sim_in_process(
      straggling({{"selection", {{"min_silos", 10}, {"min_updates", 8}, {"silos_per_round", 8}, {"over_selection", 0.25}}}},
                 dir),
      dir / "over");
  EXPECT_EQ(over.sim_ms, 12 * 100);
  for (const auto& l : rounds_of(dir / "over")) EXPECT_EQ(l["updates"], 8);
}

// The real processes (`xsilo sim` without --in-process): a server daemon and six agents on
// loopback over mutual TLS, two of them eight times as slow (1200 ms a training against 150).
// `faults` kill and restart processes (tools/sim.h).
struct RealRun {
  int exit_code = -1;
  std::vector<nlohmann::json> records;  // the audit log's round records, in order
  std::string verify_log;
  int verify_code = -1;
};

RealRun run_real(const nlohmann::json& extra, const test::TempDir& dir) {
  using namespace std::chrono_literals;
  nlohmann::json j = {{"name", "buffered"}, {"silos", 6}, {"rounds", 12}, {"seed", 5}, {"baseline", false},
                      {"data", {{"dataset", "digits"}, {"standardize", true}}},
                      {"model", {{"kind", "mlp"}, {"hidden", {16}}}},
                      {"training", {{"local_epochs", 1}, {"batch_size", 32}, {"learning_rate", 0.05}}},
                      {"selection", {{"min_silos", 6}}},
                      {"train_ms", {150, 150}},
                      {"stragglers", {{"silos", 2}, {"factor", 8}}},
                      {"schedule", {{"mode", "buffered"}, {"k", 3}, {"max_staleness", 20}}}};
  j.update(extra);
  atomic_write_file(dir / "sim.json", j.dump());
  const auto out = dir / "out";
  RealRun r;
  Process sim({test::xsilo_bin(), "sim", "--config", (dir / "sim.json").string(), "--out", out.string()},
              dir / "sim.log");
  r.exit_code = sim.wait(240s).value_or(-1);
  std::ifstream in(out / "audit.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto rec = nlohmann::json::parse(line, nullptr, false);
    if (rec.is_object() && rec.value("event", "") == "round") r.records.push_back(std::move(rec));
  }
  Process verify({test::xsilo_bin(), "audit", "verify", (out / "audit.jsonl").string(), "--key",
                  (out / "audit.pub").string()},
                 dir / "verify.log");
  r.verify_code = verify.wait(30s).value_or(-1);
  r.verify_log = log_tail(dir / "verify.log") + "\nsim:\n" + log_tail(dir / "sim.log", 30) + "\nserver:\n" +
                 log_tail(out / "logs" / "server.log", 40);
  return r;
}

// Each committed record of a buffered run: at most k updates, each naming its base version and
// its staleness against the version before the commit, scaled by s(staleness); the schedule.
// Returns the largest staleness seen and whether a slow silo's update counted.
std::pair<std::uint64_t, bool> check_buffered_records(const std::vector<nlohmann::json>& records) {
  std::uint64_t most_stale = 0;
  bool slow_counted = false;
  // Version v is the model of the v-th commit (aborted rounds commit nothing): each version's
  // SHA-256, version 0 the first record's model before.
  std::vector<std::string> versions;
  if (!records.empty()) versions.push_back(records.front().value("model_sha256_before", ""));
  for (const auto& rec : records) {
    SCOPED_TRACE(rec.dump());
    EXPECT_EQ(rec["schedule"]["mode"], "buffered");
    EXPECT_EQ(rec["schedule"]["k"], 3);
    EXPECT_TRUE(rec.contains("refused"));
    if (rec["status"] != "committed") continue;
    EXPECT_GE(rec["participants"].size(), 1u);
    EXPECT_LE(rec["participants"].size(), 3u);
    std::set<std::string> silos;
    for (const auto& p : rec["participants"]) {
      const auto base = p["base_version"].get<std::uint64_t>(), tau = p["staleness"].get<std::uint64_t>();
      EXPECT_EQ(base + tau, versions.size() - 1);  // against the newest version when its upload was granted
      if (base < versions.size()) {
        EXPECT_EQ(p.value("base_model_sha256", ""), versions[base]);
      }
      EXPECT_LE(tau, 20u);
      EXPECT_NEAR(p["staleness_weight"].get<double>(), 1 / std::sqrt(1.0 + double(tau)), 1e-12);
      EXPECT_TRUE(silos.insert(p["silo"].get<std::string>()).second);  // one update per silo a commit
      most_stale = std::max(most_stale, tau);
      slow_counted |= p["silo"] == "hospital-05" || p["silo"] == "hospital-06";
    }
    versions.push_back(rec.value("model_sha256_after", ""));
  }
  return {most_stale, slow_counted};
}

TEST(Buffered, TheServerDaemonRunsItOverMutualTlsAndAuditsEveryCommitWithItsBaseVersions) {
  test::TempDir dir;
  const auto r = run_real(nlohmann::json::object(), dir);
  EXPECT_EQ(r.exit_code, 0) << r.verify_log;
  ASSERT_EQ(r.records.size(), 12u) << r.verify_log;
  for (std::size_t i = 0; i < r.records.size(); ++i) {
    EXPECT_EQ(r.records[i]["round"], i + 1);
    EXPECT_EQ(r.records[i]["status"], "committed") << r.records[i].dump();
  }
  const auto [most_stale, slow_counted] = check_buffered_records(r.records);
  // The fast silos commit without waiting for the slow ones, whose updates land versions late.
  EXPECT_GT(most_stale, 0u) << r.verify_log;
  EXPECT_TRUE(slow_counted) << r.verify_log;
  EXPECT_EQ(r.verify_code, 0) << r.verify_log;
}

// SIGKILLed while round 4's uploads come in, the server comes back from its last committed
// version: the updates in its buffer at the kill are lost (the silos retrain on the newest
// version), and the federation finishes with every round committed once.
TEST(Buffered, AServerKilledMidBufferResumesFromTheLastCommitAndFinishes) {
  test::TempDir dir;
  const auto r = run_real({{"rounds", 8},
                           {"faults", {{{"process", "server"}, {"action", "restart"}, {"round", 4}, {"phase", "upload"}}}}},
                          dir);
  EXPECT_EQ(r.exit_code, 0) << r.verify_log;
  std::vector<std::uint64_t> committed;
  for (const auto& rec : r.records) {
    if (rec["status"] == "committed") committed.push_back(rec["round"]);
  }
  EXPECT_EQ(committed, (std::vector<std::uint64_t>{1, 2, 3, 4, 5, 6, 7, 8})) << r.verify_log;
  check_buffered_records(r.records);
  std::ifstream in(dir / "out" / "logs" / "server.log");
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(log.find("resuming after committed round "), std::string::npos) << r.verify_log;  // it did restart
  EXPECT_EQ(r.verify_code, 0) << r.verify_log;
}

}  // namespace
}  // namespace xsilo
