// External trainers: the agent's side of the trainer protocol against real Python processes
// (tests/fake_trainer.py, numpy only, and the PyTorch example), in-process and as whole
// federations over mutual TLS.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <thread>

#include "common/fs.h"
#include "common/safetensors.h"
#include "common/feature_stats.h"
#include "server/audit.h"
#include "server/metrics.h"
#include "silo_agent/external_trainer.h"
#include "silo_agent/trainer_protocol.h"
#include "tests/federation_util.h"
#include "tests/result_util.h"

namespace xsilo {
namespace {

using namespace std::chrono_literals;

const std::filesystem::path kSource = XSILO_SOURCE_DIR;

std::string python() { return std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3"; }

// Whether `python()` can import `module`; the tests that need it skip, saying so, when not.
bool python_has(const std::string& module) {
  test::TempDir dir;
  Process p({python(), "-c", "import " + module}, dir / "probe.log");
  return p.wait(60s).value_or(-1) == 0;
}

#define REQUIRE_PYTHON_MODULE(m)                                                                   \
  do {                                                                                             \
    if (!python_has(m)) {                                                                          \
      GTEST_SKIP() << "skipped: " << python() << " cannot import " << m                           \
                   << " (install python3-numpy / python3-torch from Debian)";                      \
    }                                                                                              \
  } while (0)

Model logistic() {
  Model m;
  m.add("layers.0.weight", {1, 30});
  m.add("layers.0.bias", {1});
  for (std::size_t i = 0; i < m.size(); ++i) m.flat()[i] = 0.01f * static_cast<float>(i);
  return m;
}

agent::AgentConfig fake(const test::TempDir& dir, const std::string& mode, int workers = 1) {
  agent::AgentConfig c;
  c.trainer = agent::TrainerKind::External;
  c.external.command = {python(), (kSource / "tests" / "fake_trainer.py").string()};
  c.external.env = {{"FAKE_MODE", mode}};
  c.external.startup = 30s;
  c.external.task_timeout = 30s;
  c.state_dir = dir / "state";
  c.local.workers = workers;
  return c;
}

agent::TrainTask task(std::uint64_t round) {
  agent::TrainTask t;
  t.round = round;
  t.silo = "hospital-01";
  t.plan.set_train(true);
  t.plan.set_learning_rate(0.1f);
  t.plan.set_config_json(R"({"learning_rate": 0.1, "schedule": "cosine"})");
  return t;
}

// The framing and checks without a trainer process: bytes cut anywhere, and what a broken or
// hostile trainer could send.
TEST(TrainerProtocol, FramesAcrossPiecesAndRefusesWhatCannotBeAMessage) {
  namespace tp = agent::trainer_protocol;
  using json = nlohmann::json;
  const std::string two = tp::frame({{"type", "hello"}, {"protocol", 1}}) + tp::frame({{"type", "result"}, {"id", 3}});
  tp::Reader r;
  std::string error;
  std::vector<json> got;
  for (char c : two) {  // one byte at a time
    r.feed(std::string_view(&c, 1));
    while (auto m = r.next(error)) got.push_back(*m);
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(error, "");
  std::int64_t protocol = 0;
  EXPECT_EQ(error_text(tp::check_hello(got[0], protocol)), "");
  EXPECT_EQ(error_text(tp::check_result(got[1], 3)), "");
  EXPECT_NE(error_text(tp::check_result(got[1], 4)).find("answered task 4"), std::string::npos);

  auto refused = [](const std::string& bytes) {
    tp::Reader bad;
    bad.feed(bytes);
    std::string why, again;
    EXPECT_FALSE(bad.next(why));
    EXPECT_FALSE(bad.next(again));  // it stays failed
    EXPECT_EQ(again, why);
    return why;
  };
  std::string deep(100000, '[');
  deep += std::string(100000, ']');
  const std::string nested = "{\"a\":" + deep + "}";
  auto framed = [](const std::string& body) {
    const std::uint32_t n = htonl(static_cast<std::uint32_t>(body.size()));
    return std::string(reinterpret_cast<const char*>(&n), 4) + body;
  };
  EXPECT_NE(refused(framed(nested)).find("nested deeper than 64"), std::string::npos);
  EXPECT_NE(refused(framed("[1, 2]")).find("not a JSON object"), std::string::npos);
  EXPECT_NE(refused(framed("{\"a\": ")).find("not JSON"), std::string::npos);
  EXPECT_NE(refused(std::string("\x00\x20\x00\x00{}", 6)).find("2097152 bytes; the limit is 1 MiB"), std::string::npos);

  // A protocol number that only truncates to 1 is not protocol 1.
  EXPECT_NE(error_text(tp::check_hello({{"type", "hello"}, {"protocol", 4294967297LL}}, protocol))
                .find("protocol 4294967297"),
            std::string::npos);
  tp::TrainAnswer answer;
  EXPECT_NE(error_text(tp::parse_train_answer({{"weights", "/x/../etc/passwd"}}, "/x", answer))
                .find("not a file of the exchange"),
            std::string::npos);
  EXPECT_NE(error_text(tp::parse_train_answer({{"weights", "/x/.hidden"}}, "/x", answer)).find("not a file of the exchange"),
            std::string::npos);
  EXPECT_EQ(error_text(tp::parse_train_answer(
                {{"weights", "/x/w.safetensors"}, {"num_samples", 5}, {"metrics", {{"loss", 0.25}}}}, "/x", answer)),
            "");
  EXPECT_EQ(answer.num_samples, 5u);
  EXPECT_EQ(answer.loss, 0.25);
}

TEST(ExternalTrainer, TrainsThroughTheSdkAndReturnsTheWeights) {
  REQUIRE_PYTHON_MODULE("numpy");
  test::TempDir dir;
  auto cfg = fake(dir, "ok");
  cfg.external.evaluate = true;
  agent::ExternalTrainer t(cfg);
  const Model g = logistic();
  for (std::uint64_t round = 1; round <= 2; ++round) {
    Model local = g.zeros_like();
    const auto r = t.train(g, task(round), local);
    EXPECT_EQ(r.num_samples, 10u);
    EXPECT_DOUBLE_EQ(r.metrics.train_loss(), 0.25);
    for (std::size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(local.flat()[i], g.flat()[i] + 0.01f, 1e-6) << i;
  }
  const auto ev = t.evaluate(g, task(3));
  EXPECT_DOUBLE_EQ(ev.eval_accuracy(), 0.75);
  EXPECT_EQ(ev.eval_samples(), 4u);
  // Tensors travel through a private folder in memory; nothing is left in it.
  EXPECT_EQ(t.exchange_dir().string().rfind("/dev/shm/", 0), 0u) << t.exchange_dir();
  EXPECT_TRUE(std::filesystem::is_empty(t.exchange_dir()));
  EXPECT_EQ(std::filesystem::status(t.exchange_dir()).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
}

TEST(ExternalTrainer, TwoWorkersAnswerEveryTaskAndRankZeroCarriesTheWeights) {
  REQUIRE_PYTHON_MODULE("numpy");
  test::TempDir dir;
  auto cfg = fake(dir, "ok", 2);
  cfg.external.env.emplace_back("FAKE_GROUP", "joined");  // as torch.distributed.init_process_group would
  agent::ExternalTrainer t(cfg);
  const Model g = logistic();
  Model local = g.zeros_like();
  const auto r = t.train(g, task(1), local);
  EXPECT_EQ(r.num_samples, 10u);  // rank 0's count (rank 1 would say 11)
  EXPECT_NEAR(local.flat()[5], g.flat()[5] + 0.01f, 1e-6);
  EXPECT_TRUE(std::filesystem::exists(dir / "state" / "trainer" / "rank-1.log"));
}

struct Misbehaviour {
  std::string mode;
  std::string expect;     // in the error message (the silo's log)
  wire::FailureReason reason;  // what the server is told
  bool kept = false;      // the trainer answered (its result was refused): its process is kept
  bool recovers = true;   // the misbehaviour is limited to round 1 (not one of the start-up ones)
};
void PrintTo(const Misbehaviour& m, std::ostream* os) { *os << m.mode; }

class TrainerMisbehaviour : public ::testing::TestWithParam<Misbehaviour> {};

std::size_t lines_of(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// Every way a trainer can go wrong ends the round with an error that names the cause and a
// reason code for the server. A trainer out of step with the agent (hung, exited) is started
// afresh for the next round; one whose answer was refused keeps running, its state kept (here
// it behaves from round 2 on).
// Depends on timing: the "hang" and "silent" modes wait out trainer.task_timeout_s 3 and
// trainer.startup_s 5 on purpose, and every other mode needs Python with numpy to start within
// 5 s and answer within 3 s (on a machine loaded enough to miss that, the error names the
// timeout). Deterministic counterpart of what the session does with each failure:
// Session.ATrainerFailureIsReportedAndAFatalOneStopsTheAgent; of the trainer's timeouts and
// restart backoff: TrainerBudget.* (trainer_budget_test.cpp).
TEST_P(TrainerMisbehaviour, IsAClearErrorAndTheNextRoundStartsAfresh) {
  REQUIRE_PYTHON_MODULE("numpy");
  const auto& m = GetParam();
  test::TempDir dir;
  auto cfg = fake(dir, m.mode);
  cfg.external.env.emplace_back("FAKE_ROUNDS", "1");
  cfg.external.env.emplace_back("FAKE_PIDS", (dir / "pids").string());
  cfg.external.startup = 5s;
  cfg.external.task_timeout = 3s;
  if (m.mode == "nostart") cfg.external.command = {(dir / "no-such-trainer").string()};
  agent::ExternalTrainer t(cfg);
  const Model g = logistic();
  Model local = g.zeros_like();
  try {
    t.train(g, task(1), local);
    ADD_FAILURE() << m.mode << ": no error";
  } catch (const agent::TrainerError& e) {
    EXPECT_NE(std::string(e.what()).find(m.expect), std::string::npos) << e.what();
    EXPECT_EQ(e.reason(), m.reason) << e.what();
    EXPECT_FALSE(e.fatal());
    const std::string next = m.kept ? "the trainer keeps running" : "started again for the next round";
    EXPECT_NE(std::string(e.what()).find(next), std::string::npos) << e.what();
  }
  if (!m.recovers) return;
  const auto r = t.train(g, task(2), local);  // kept, or restarted after a backoff of 1 s
  EXPECT_EQ(r.num_samples, 10u);
  EXPECT_EQ(lines_of(dir / "pids"), m.kept ? 1u : 2u) << "processes started";
}

INSTANTIATE_TEST_SUITE_P(
    Modes, TrainerMisbehaviour,
    ::testing::Values(
        Misbehaviour{"exit", "exited with code 3", wire::TRAINER_EXITED},
        Misbehaviour{"hang", "rank 0 hung: no answer (its train result for round 1) after 3.0 s (trainer.task_timeout_s = 3 s); it was stopped",
                     wire::TRAINER_HUNG},
        Misbehaviour{"error", "CUDA out of memory (simulated)", wire::TRAINER_REPORTED_ERROR, true},
        Misbehaviour{"names", "renamed.layers.0", wire::TRAINER_BAD_WEIGHTS, true},
        Misbehaviour{"shape", "[3, 3]", wire::TRAINER_BAD_WEIGHTS, true},
        Misbehaviour{"dtype", "I32", wire::TRAINER_BAD_WEIGHTS, true},
        Misbehaviour{"nan", "NaN or infinite values in tensor", wire::TRAINER_NON_FINITE, true},
        Misbehaviour{"fifo", "not a regular file", wire::TRAINER_BAD_WEIGHTS, true},
        Misbehaviour{"outside", "not a file of the exchange folder", wire::TRAINER_PROTOCOL_ERROR, true},
        Misbehaviour{"bigger", "extra.weight", wire::TRAINER_BAD_WEIGHTS, true},
        Misbehaviour{"zero", "num_samples", wire::TRAINER_NO_SAMPLES, true},
        Misbehaviour{"version", "speaks protocol 2", wire::TRAINER_DID_NOT_START, false, false},
        Misbehaviour{"silent", "did not start in time: no hello after 5.0 s (trainer.startup_s = 5 s)",
                     wire::TRAINER_DID_NOT_START, false, false},
        Misbehaviour{"nostart", "the command could not be started (exit code 127): ", wire::TRAINER_DID_NOT_START,
                     false, false}),
    [](const auto& info) { return info.param.mode; });

// A wrong interpreter in trainer.command (exit code 127) is not blamed on the script: the message
// says the command could not be started, names the program and why (no such file, not found on
// PATH), points at a venv's python, and says "started again" only where it will be.
TEST(ExternalTrainer, ACommandThatCannotBeStartedIsNamedNotBlamedOnTheScript) {
  test::TempDir dir;
  const std::string missing = (dir / "venv" / "bin" / "python").string();
  for (const std::string& program : {missing, std::string("no-such-python-for-xsilo")}) {
    for (const bool one_shot : {false, true}) {
      auto cfg = fake(dir, "ok");
      cfg.external.command = {program, "train.py"};
      cfg.external.startup = 10s;
      agent::ExternalTrainer t(cfg);
      if (one_shot) t.set_one_shot();
      try {
        t.initial_model(task(0));
        ADD_FAILURE() << "no error";
      } catch (const agent::TrainerError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("the command could not be started (exit code 127): " + program), std::string::npos) << what;
        EXPECT_NE(what.find(program == missing ? ": No such file or directory" : ": not found on PATH"), std::string::npos)
            << what;
        EXPECT_NE(what.find("a venv's python"), std::string::npos) << what;
        EXPECT_EQ(what.find("initial weights"), std::string::npos) << what;
        EXPECT_EQ(what.find("started again") != std::string::npos, !one_shot) << what;
        EXPECT_EQ(e.reason(), wire::TRAINER_DID_NOT_START);
      }
    }
  }
}

// The trainer inherits its channel and stdio, nothing else of the agent's (no TLS socket).
TEST(ExternalTrainer, InheritsNoDescriptorButItsChannel) {
  REQUIRE_PYTHON_MODULE("numpy");
  test::TempDir dir;
  const int leaked = ::open("/dev/null", O_RDONLY);  // a descriptor without close-on-exec, as Asio's sockets are
  ASSERT_GE(leaked, 0);
  agent::ExternalTrainer t(fake(dir, "fds"));
  const Model g = logistic();
  Model local = g.zeros_like();
  const auto r = t.train(g, task(1), local);
  ::close(leaked);
  EXPECT_EQ(r.metrics.train_loss(), 0.0);  // descriptors inherited beyond 0-2 and the channel
}

// local.workers 2 with a script whose copies never join a process group: each would train on all
// rows and rank 1's work would be thrown away. Refused at once (no later round can do better),
// with the fix.
TEST(ExternalTrainer, WorkersThatNeverJoinAProcessGroupAreRefusedWithTheFix) {
  REQUIRE_PYTHON_MODULE("numpy");
  test::TempDir dir;
  agent::ExternalTrainer t(fake(dir, "ok", 2));
  const Model g = logistic();
  Model local = g.zeros_like();
  try {
    t.train(g, task(1), local);
    ADD_FAILURE() << "no error";
  } catch (const agent::TrainerError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(e.fatal());
    EXPECT_EQ(e.reason(), wire::TRAINER_MISCONFIGURED);
    EXPECT_NE(what.find("local.workers is 2 but the script's copies never joined a process group"), std::string::npos)
        << what;
    EXPECT_NE(what.find("torch.distributed.init_process_group"), std::string::npos) << what;
    EXPECT_NE(what.find("or set local.workers to 1"), std::string::npos) << what;
  }
}

// Start-up has its own budget: a trainer that needs 2 s to start (an `import torch`) and 1.5 s
// for a task passes with trainer.startup_s 5 and trainer.task_timeout_s 2 (one budget would have
// counted 3.5 s against 2).
// Depends on timing: the 2 s sleep and Python's own start must fit in startup_s 5, and the task in
// task_timeout_s 2; a machine loaded enough to stretch either fails it with the timeout's
// message. Deterministic counterpart: TrainerBudget.StartUpHasItsOwnBudgetAndATasksBudgetRunsFromWhenItIsSent.
TEST(ExternalTrainer, StartUpDoesNotCountAgainstTheTaskBudget) {
  REQUIRE_PYTHON_MODULE("numpy");
  test::TempDir dir;
  auto cfg = fake(dir, "ok");
  cfg.external.command = {python(), "-c",
                          "import time, runpy, sys; time.sleep(2); sys.argv = ['fake']; "
                          "runpy.run_path('" + (kSource / "tests" / "fake_trainer.py").string() + "', run_name='__main__')"};
  cfg.external.startup = 5s;
  cfg.external.task_timeout = 2s;
  agent::ExternalTrainer t(cfg);
  const Model g = logistic();
  Model local = g.zeros_like();
  EXPECT_EQ(t.train(g, task(1), local).num_samples, 10u);
}

// The agent asks the script for its initial weights through the protocol (xc.tasks(model) /
// xc.run answer it): the server's initial model without an --init mode.
TEST(ExternalTrainer, TheInitialModelIsAskedOfTheScriptThroughTheProtocol) {
  REQUIRE_PYTHON_MODULE("torch");
  test::TempDir dir;
  auto cfg = fake(dir, "ok");
  const auto script = dir / "init_trainer.py";
  std::ofstream(script) << "import sys; sys.path.insert(0, '" << (kSource / "python").string() << "')\n"
                        << "import torch, xsilo_client as xc\n"
                        << "torch.manual_seed(3)\n"
                        << "model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.BatchNorm1d(2))\n"
                        << "for task in xc.tasks(model):\n"
                        << "    xc.send(model, num_samples=1)\n";
  cfg.external.command = {python(), script.string()};
  agent::ExternalTrainer t(cfg);
  const Model m = t.initial_model(task(0));
  std::vector<std::string> names;
  for (const auto& ti : m.tensors()) names.push_back(ti.name);
  // Floating-point tensors only: BatchNorm's integer counter stays with the silo.
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"0.bias", "0.weight", "1.bias", "1.running_mean", "1.running_var",
                                             "1.weight"}));
  EXPECT_EQ(m.find("0.weight")->shape, (std::vector<std::uint64_t>{2, 4}));
  EXPECT_FLOAT_EQ(m.tensor("1.running_var")[0], 1.0f);
  // And the round goes on with the same process.
  Model local = m.zeros_like();
  EXPECT_EQ(t.train(m, task(1), local).num_samples, 1u);
}

TEST(ExternalTrainer, AWorkerThatDiesEndsTheRoundNamingIt) {
  REQUIRE_PYTHON_MODULE("numpy");
  test::TempDir dir;
  auto cfg = fake(dir, "exit", 2);
  cfg.external.env.emplace_back("FAKE_RANK", "1");
  agent::ExternalTrainer t(cfg);
  const Model g = logistic();
  Model local = g.zeros_like();
  try {
    t.train(g, task(1), local);
    ADD_FAILURE() << "no error";
  } catch (const agent::TrainerError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
}

TEST(ExternalTrainer, TooManyFailedRoundsInARowAreFatal) {
  REQUIRE_PYTHON_MODULE("numpy");
  test::TempDir dir;
  auto cfg = fake(dir, "error");
  cfg.external.max_failures = 2;
  agent::ExternalTrainer t(cfg);
  const Model g = logistic();
  Model local = g.zeros_like();
  bool fatal[2] = {false, false};
  for (int k = 0; k < 2; ++k) {
    try {
      t.train(g, task(static_cast<std::uint64_t>(k + 1)), local);
    } catch (const agent::TrainerError& e) {
      fatal[k] = e.fatal();
      if (k == 1) {
        EXPECT_NE(std::string(e.what()).find("max_failures"), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_FALSE(fatal[0]);
  EXPECT_TRUE(fatal[1]);
}

}  // namespace

namespace tools {
namespace {

using json = nlohmann::json;

json run_sim_config(const test::TempDir& dir, const json& cfg, std::chrono::seconds limit, std::string* log = nullptr,
                    int expect_code = 0) {
  const auto file = dir / "sim.json";
  std::ofstream(file) << cfg.dump(2);
  Process sim({test::xsilo_bin(), "sim", "--config", file.string(), "--out", (dir / "out").string()}, dir / "sim.log");
  const auto code = sim.wait(limit);
  if (!code) sim.stop(std::chrono::milliseconds(2000));
  if (log) *log = log_tail(dir / "sim.log", 60) + "server:\n" + log_tail(dir / "out" / "logs" / "server.log", 40);
  EXPECT_EQ(code.value_or(-1), expect_code) << log_tail(dir / "sim.log", 60);
  return json::parse(read_file(dir / "out" / "summary.json"));
}

json fake_sim(const test::TempDir& dir, std::size_t silos, std::uint64_t rounds, const json& env) {
  const std::string fake = (kSource / "tests" / "fake_trainer.py").string();
  return {{"silos", silos},
          {"rounds", rounds},
          {"baseline", false},
          {"data", {{"dataset", "breast_cancer"}}},
          {"model", {{"kind", "file"}, {"path", (dir / "init.safetensors").string()}}},
          {"trainer", {{"command", {python(), fake}}, {"init", {python(), fake, "--init", "{path}"}}, {"env", env},
                       {"evaluate", false}}},
          {"selection", {{"min_silos", 2}, {"min_updates", 2}}},
          {"training", {{"learning_rate", 0.1}}}};
}

// What leaves a silo (docs/security.md): a script whose exception quotes a data row fails its
// round. The row is in the silo's own logs; the server's log, the edge's log and the signed audit
// log get only the reason code's fixed text.
TEST(ExternalTrainers, ATrainersOutputStaysInTheSiloOnlyAReasonCodeReachesTheServer) {
  REQUIRE_PYTHON_MODULE("numpy");
  test::TempDir dir;
  const std::string secret = "Jane Roe 1961-04-02 MRN 0048121";
  auto cfg = fake_sim(dir, 3, 3, {{"FAKE_MODE", "secret"}, {"FAKE_SILO", "hospital-02"}, {"FAKE_ROUNDS", "2"},
                                  {"FAKE_SECRET", secret}});
  cfg["edges"] = 1;
  std::string log;
  const auto summary = run_sim_config(dir, cfg, 240s, &log);
  EXPECT_EQ(summary["rounds_committed"], 3) << log;
  const auto out = dir / "out";
  // The silo has the whole story: its agent's log and its trainer's.
  EXPECT_NE(read_file(out / "logs" / "hospital-02.log").find(secret), std::string::npos);
  EXPECT_NE(read_file(out / "silos" / "hospital-02" / "state" / "trainer" / "rank-0.log").find(secret),
            std::string::npos);
  // The server, the edge and the audit log: not a byte of it.
  for (const auto& p : {out / "logs" / "server.log", out / "logs" / "edge-01.log", out / "audit.jsonl",
                        out / "server" / "audit.jsonl", out / "server" / "metrics.csv"}) {
    ASSERT_TRUE(std::filesystem::exists(p)) << p;
    const std::string text = read_file(p);
    EXPECT_EQ(text.find("Jane Roe"), std::string::npos) << p;
    EXPECT_EQ(text.find("0048121"), std::string::npos) << p;
  }
  std::vector<json> rounds;
  for (auto& r : server::read_audit_log(out / "audit.jsonl")) {
    if (r["event"] == "round") rounds.push_back(r);
  }
  ASSERT_EQ(rounds.size(), 3u) << log;
  ASSERT_EQ(rounds[1]["dropouts"].size(), 1u) << rounds[1].dump(2);
  EXPECT_EQ(rounds[1]["dropouts"][0]["silo"], "hospital-02");
  EXPECT_EQ(rounds[1]["dropouts"][0]["reason"], "its training failed: the trainer reported an error");
  EXPECT_EQ(rounds[2]["participants"].size(), 3u) << rounds[2].dump(2);  // back in round 3
}

// xsilo sim names an exited agent's last error above the lines of its log it shows (the agent's
// shutdown lines, a trainer given its grace period, come after the reason it stopped).
TEST(LogTail, TheLastErrorAboveTheTailIsFoundInTextAndJsonLogs) {
  test::TempDir dir;
  const auto text = dir / "agent.log";
  atomic_write_file(text, "a [agent] [error] first\nb [agent] [critical] stopping: the reason\nc [agent] [info] one\n"
                          "d [agent] [warning] two\n");
  EXPECT_EQ(last_error_above_tail(text, 2), "b [agent] [critical] stopping: the reason");
  EXPECT_EQ(last_error_above_tail(text, 3), "");  // log_tail(text, 3) shows it already
  const auto lines = dir / "agent.jsonl";
  atomic_write_file(lines, "{\"level\":\"error\",\"msg\":\"stopping\"}\n{\"level\":\"info\",\"msg\":\"bye\"}\n");
  EXPECT_EQ(last_error_above_tail(lines, 1), "{\"level\":\"error\",\"msg\":\"stopping\"}");
  const auto quiet = dir / "quiet.log";
  atomic_write_file(quiet, "a [agent] [info] connected\nb [agent] [info] round 1\n");
  EXPECT_EQ(last_error_above_tail(quiet, 1), "");
  EXPECT_EQ(last_error_above_tail(dir / "absent.log", 1), "");
}

// The sim never waits for ever: when every agent has exited (here each trainer fails its first
// round and trainer.max_failures is 1), it stops the server, says why (and why round 1
// aborted), names each agent's exit and the end of its log, and exits non-zero.
// Depends on timing: it measures that the sim gives up within 120 s of real time, where it waits
// 5 s once no agent runs; the rest is the agents' start and one failed round each, a wide margin
// under load. Deterministic counterparts: SimStall.TheSimGivesUpFiveSecondsAfterTheLastAgentAndTwentyAfterTooFewRemain
// for the sim's stall watch, Session.ATrainerFailureIsReportedAndAFatalOneStopsTheAgent for the agent's fatal stop.
TEST(ExternalTrainers, TheSimEndsWithTheReasonWhenEveryAgentHasExited) {
  REQUIRE_PYTHON_MODULE("numpy");
  test::TempDir dir;
  auto cfg = fake_sim(dir, 3, 5, {{"FAKE_MODE", "exit"}});
  cfg["trainer"]["max_failures"] = 1;
  const auto t0 = std::chrono::steady_clock::now();
  const auto summary = run_sim_config(dir, cfg, 180s, nullptr, 1);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 120s);
  EXPECT_EQ(summary["rounds_committed"], 0);
  EXPECT_EQ(summary["stalled"], "every agent has exited");
  const std::string log = read_file(dir / "sim.log");
  EXPECT_NE(log.find("the federation cannot go on: every agent has exited; stopping the server"), std::string::npos)
      << log;
  EXPECT_NE(log.find("hospital-01 exited with code 1"), std::string::npos) << log;
  EXPECT_NE(log.find("| ABORTED |"), std::string::npos) << log;
  EXPECT_NE(log.find("why: only 0 updates arrived, 2 needed"), std::string::npos) << log;  // its audit record's reason
  EXPECT_NE(log.find("trainer.max_failures"), std::string::npos) << log;
  EXPECT_NE(log.find("FAILED: 0/5 rounds committed"), std::string::npos) << log;
}

// Code after a script's federated loop runs in every silo (a final save, a print): when the
// federation finishes, each agent sends its trainer the shutdown task and waits for it to exit,
// and the sim waits for its agents, rather than killing them.
TEST(ExternalTrainers, EachSilosScriptRunsItsCodeAfterTheLoopWhenTheFederationFinishes) {
  REQUIRE_PYTHON_MODULE("numpy");
  test::TempDir dir;
  const auto done = dir / "done";
  std::filesystem::create_directories(done);
  auto cfg = fake_sim(dir, 3, 2, {{"FAKE_DONE", done.string()}, {"PYTHONPATH", (kSource / "python").string()}});
  std::string log;
  const auto summary = run_sim_config(dir, cfg, 240s, &log);
  EXPECT_EQ(summary["rounds_committed"], 2) << log;
  for (const char* silo : {"hospital-01", "hospital-02", "hospital-03"}) {
    const auto file = done / (std::string(silo) + "-0");
    EXPECT_TRUE(std::filesystem::exists(file))
        << file << "\n" << read_file(dir / "out" / "logs" / (std::string(silo) + ".log")) << "\ntrainer:\n"
        << log_tail(dir / "out" / "silos" / silo / "state" / "trainer" / "rank-0.log", 20) << "\nsim:\n" << log;
  }
}

// xsilo sim asks the script for its initial weights: a command that cannot be started says so
// (and that nothing starts it again), with xc.epochs among the calls only where the script is to blame.
TEST(ExternalTrainers, TheSimSaysWhenTheTrainerCommandCannotBeStarted) {
  test::TempDir dir;
  const json cfg = {{"silos", 2},
                    {"rounds", 1},
                    {"baseline", false},
                    {"data", {{"dataset", "breast_cancer"}}},
                    {"model", {{"kind", "file"}}},
                    {"trainer", {{"command", {"/no/such/venv/bin/python", "train.py"}}}}};
  std::ofstream(dir / "sim.json") << cfg.dump(2);
  Process sim({test::xsilo_bin(), "sim", "--config", (dir / "sim.json").string(), "--out", (dir / "out").string()},
              dir / "sim.log");
  EXPECT_NE(sim.wait(120s).value_or(-1), 0);
  const std::string log = read_file(dir / "sim.log");
  EXPECT_NE(log.find("sim: cannot ask the training script for its initial weights: external trainer: the command could "
                     "not be started (exit code 127): /no/such/venv/bin/python: No such file or directory"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("did not give its initial weights"), std::string::npos) << log;
  EXPECT_EQ(log.find("started again"), std::string::npos) << log;
}

// A silo whose trainer dies in round 2 is a dropout of round 2 with the reason in its log; its
// trainer starts afresh and the silo is back in round 3.
TEST(ExternalTrainers, ATrainerThatDiesMakesItsSiloADropoutForOneRound) {  // and is restarted
  REQUIRE_PYTHON_MODULE("numpy");
  test::TempDir dir;
  const std::string fake = (kSource / "tests" / "fake_trainer.py").string();
  const json cfg = {{"silos", 3},
                    {"rounds", 4},
                    {"baseline", false},
                    {"data", {{"dataset", "breast_cancer"}}},
                    {"model", {{"kind", "file"}, {"path", (dir / "init.safetensors").string()}}},
                    {"trainer",
                     {{"command", {python(), fake}},
                      {"init", {python(), fake, "--init", "{path}"}},
                      {"env", {{"FAKE_MODE", "exit"}, {"FAKE_SILO", "hospital-02"}, {"FAKE_ROUNDS", "2"}}},
                      {"evaluate", false}}},
                    {"selection", {{"min_silos", 2}, {"min_updates", 2}}},
                    {"training", {{"learning_rate", 0.1}}}};
  std::string log;
  const auto summary = run_sim_config(dir, cfg, 240s, &log);
  EXPECT_EQ(summary["rounds_committed"], 4) << log;
  std::vector<json> rounds;
  for (auto& r : server::read_audit_log(dir / "out" / "audit.jsonl")) {
    if (r["event"] == "round") rounds.push_back(r);
  }
  ASSERT_EQ(rounds.size(), 4u) << log;
  ASSERT_EQ(rounds[1]["dropouts"].size(), 1u) << rounds[1].dump(2);
  EXPECT_EQ(rounds[1]["dropouts"][0]["silo"], "hospital-02");
  EXPECT_EQ(rounds[2]["participants"].size(), 3u) << rounds[2].dump(2);
  const std::string agent_log = read_file(dir / "out" / "logs" / "hospital-02.log");
  EXPECT_NE(agent_log.find("exited with code 3"), std::string::npos) << agent_log;
  EXPECT_NE(agent_log.find("started again for the next round"), std::string::npos) << agent_log;
}

// Per-silo data files of the user's own (trainer.silo_data) instead of the sim's split: each
// silo's trainer is told its own files, and the central baseline pools them.
TEST(ExternalTrainers, EachSiloGetsTheDataFilesTheSimConfigNames) {
  REQUIRE_PYTHON_MODULE("numpy");
  test::TempDir dir;
  const auto all = load_csv(data_dir() / "breast_cancer.csv");
  json silo_data = json::array();
  for (std::size_t i = 0; i < 3; ++i) {
    std::vector<std::size_t> train, test;
    for (std::size_t r = i; r < all.rows; r += 3) (r % 5 ? train : test).push_back(r);
    const auto t = dir / ("silo" + std::to_string(i) + "-train.csv"), v = dir / ("silo" + std::to_string(i) + "-test.csv");
    save_csv(t, subset(all, train));
    save_csv(v, subset(all, test));
    silo_data.push_back({{"train", t.string()}, {"test", v.string()}});
  }
  const std::string fake = (kSource / "tests" / "fake_trainer.py").string();
  const json cfg = {{"silos", 3},
                    {"rounds", 2},
                    {"baseline", false},
                    {"model", {{"kind", "file"}, {"path", (dir / "init.safetensors").string()}}},
                    {"trainer",
                     {{"command", {python(), fake}}, {"init", {python(), fake, "--init", "{path}"}}, {"silo_data", silo_data}}},
                    {"selection", {{"min_silos", 3}}}};
  const auto summary = run_sim_config(dir, cfg, 240s);
  EXPECT_EQ(summary["rounds_committed"], 2);
  for (std::size_t i = 0; i < 3; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "hospital-%02zu.json", i + 1);
    const auto agent = json::parse(read_file(dir / "out" / "configs" / name));
    EXPECT_EQ(agent["data"]["train"], silo_data[i]["train"]);
    EXPECT_EQ(agent["data"]["test"], silo_data[i]["test"]);
  }
  EXPECT_EQ(load_csv(dir / "out" / "central" / "train.csv").rows + load_csv(dir / "out" / "central" / "test.csv").rows,
            all.rows);
}

// The PyTorch example as `xsilo sim` runs it: 5 silos federating the user's own CNN, within two
// points of the same script trained centrally; the final checkpoint loads into the module.
void run_example(const std::string& config, double max_gap, const json& changes = json::object()) {
  REQUIRE_PYTHON_MODULE("torch");
  test::TempDir dir;
  auto cfg = json::parse(read_file(kSource / "examples" / "pytorch" / config));
  cfg.merge_patch(changes);
  cfg["trainer"]["cwd"] = (kSource / "examples" / "pytorch").string();
  // No model file: the sim asks the script for its initial weights (an init task) and writes
  // OUT/init.safetensors.
  std::string log;
  const auto summary = run_sim_config(dir, cfg, 600s, &log);
  EXPECT_EQ(summary["rounds_committed"], cfg["rounds"]) << log;
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "init.safetensors")) << log;
  const double fed = summary["final_accuracy"], central = summary["centralized_accuracy"];
  EXPECT_GT(fed, central - max_gap) << "federated " << fed << ", central " << central << "\n" << log;
  // The checkpoint is a safetensors file that PyTorch loads into the user's module (the
  // integer BatchNorm counter is not federated: it stays with each silo).
  const auto script = dir / "load.py";
  std::ofstream(script) << "import sys\n"
                        << "sys.path[:0] = ['" << (kSource / "python").string() << "', '"
                        << (kSource / "examples" / "pytorch").string() << "']\n"
                        << "import torch\nfrom xsilo_client import safetensors\nfrom model import DigitsCNN\n"
                        << "m = DigitsCNN()\n"
                        << "sd = {k: torch.from_numpy(v.copy()) for k, v in safetensors.load_file(sys.argv[1]).items()}\n"
                        << "missing, unexpected = m.load_state_dict(sd, strict=False)\n"
                        << "assert not unexpected, unexpected\n"
                        << "assert set(missing) <= {'bn1.num_batches_tracked'}, missing\n"
                        << "print('loaded', len(sd), 'tensors')\n";
  Process load({python(), script.string(), (dir / "out" / "model.safetensors").string()}, dir / "load.log");
  EXPECT_EQ(load.wait(120s).value_or(-1), 0) << log_tail(dir / "load.log");
  if (cfg.contains("broadcast")) {  // the model went out as deltas after the first round
    std::size_t deltas = 0;
    for (const auto& r : server::read_audit_log(dir / "out" / "audit.jsonl")) {
      if (r.value("event", "") == "round") deltas += r["broadcast"]["deltas"].get<std::size_t>();
    }
    EXPECT_GE(deltas, cfg["rounds"].get<std::size_t>() - 1) << log;
  }
}

TEST(PytorchExample, FiveSilosReachTheCentralAccuracyWithinTwoPoints) { run_example("sim.json", 0.02); }

// The Python that has the optional packages (tensorboard's reader, mlflow): XSILO_EXTRAS_PYTHON,
// else the venv scripts/python-extras.sh makes; empty when neither can import `module`.
std::string extras_python(const std::string& module) {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("XSILO_EXTRAS_PYTHON")) candidates.push_back(p);
  candidates.push_back((kSource / ".venv-extras" / "bin" / "python").string());
  candidates.push_back(python());
  for (const auto& p : candidates) {
    if (!std::filesystem::exists(p) && p != python()) continue;
    test::TempDir dir;
    Process probe({p, "-c", "import " + module}, dir / "probe.log");
    if (probe.wait(120s).value_or(-1) == 0) return p;
  }
  return "";
}

// examples/tabular: a plain central script federated by seven lines (docs/bring-your-own-model.md),
// its initial model asked through the protocol, the federation's feature statistics used in every
// silo; over three seeds, on average within three points of the same script trained centrally.
// With report.tensorboard the rounds are TensorBoard event files that tensorboard's own reader
// reads back.
TEST(TabularExample, FiveSilosWithTheFederationsStatisticsReachCentralWithinThreePoints) {
  REQUIRE_PYTHON_MODULE("torch");
  test::TempDir dir;
  auto cfg = json::parse(read_file(kSource / "examples" / "tabular" / "sim.json"));
  cfg["trainer"]["cwd"] = (kSource / "examples" / "tabular").string();
  cfg["trainer"]["env"]["PYTHONPATH"] = (kSource / "python").string();
  cfg["report"] = {{"tensorboard", (dir / "tb").string()}};
  std::string log;
  const auto summary = run_sim_config(dir, cfg, 300s, &log);
  EXPECT_EQ(summary["rounds_committed"], cfg["rounds"]) << log;
  const double fed = summary["final_accuracy"], central = summary["centralized_accuracy"];
  // The claim is over deals of the rows, not one: 113 test rows make one row 0.9 points, and a
  // deal can leave a silo with nearly one class. The example's seed and the next two (their
  // splits independent: the sim derives each purpose's seed), the mean gap within three points.
  double gaps = central - fed;
  std::string each = "seed " + cfg["seed"].dump() + ": federated " + std::to_string(fed) + ", central " + std::to_string(central);
  for (int next : {1, 2}) {
    test::TempDir other;
    auto again = cfg;
    again["seed"] = cfg["seed"].get<int>() + next;
    again.erase("report");
    const auto s = run_sim_config(other, again, 300s);
    gaps += s["centralized_accuracy"].get<double>() - s["final_accuracy"].get<double>();
    each += "; seed " + again["seed"].dump() + ": federated " + s["final_accuracy"].dump() + ", central " +
            s["centralized_accuracy"].dump();
  }
  EXPECT_LT(gaps / 3, 0.03) << each << "\n" << log;
  // The statistics every silo got: the pooled training rows' mean and population variance.
  const auto stats = load_feature_stats(dir / "out" / "feature_stats.json");
  const Dataset pooled = load_csv(dir / "out" / "central" / "train.csv");
  ASSERT_EQ(stats.mean.size(), pooled.features);
  EXPECT_EQ(stats.count, pooled.rows);
  double m0 = 0, v0 = 0;
  for (std::size_t i = 0; i < pooled.rows; ++i) m0 += pooled.row(i)[0];
  m0 /= static_cast<double>(pooled.rows);
  for (std::size_t i = 0; i < pooled.rows; ++i) v0 += (pooled.row(i)[0] - m0) * (pooled.row(i)[0] - m0);
  v0 /= static_cast<double>(pooled.rows);
  EXPECT_NEAR(stats.mean[0], m0, 1e-6 * std::abs(m0));
  EXPECT_NEAR(stats.var[0], v0, 1e-6 * v0);
  // Each silo's files: CSV with a header, and the same rows as .npz.
  const auto silo = dir / "out" / "silos" / "hospital-01";
  EXPECT_EQ(read_file(silo / "train.csv").substr(0, 9), "x0,x1,x2,");
  const std::string tb_python = extras_python("tensorboard.backend.event_processing.event_accumulator");
  const std::string np_check = "import numpy, sys; d = numpy.load(sys.argv[1]); "
                               "assert d['x'].dtype == numpy.float32 and d['y'].dtype == numpy.int64, d; "
                               "print(d['x'].shape[0], d['x'].shape[1])";
  Process npz({python(), "-c", np_check, (silo / "train.npz").string()}, dir / "npz.log");
  EXPECT_EQ(npz.wait(60s).value_or(-1), 0) << log_tail(dir / "npz.log");
  const Dataset own = load_csv(silo / "train.csv");
  EXPECT_NE(read_file(dir / "npz.log").find(std::to_string(own.rows) + " " + std::to_string(own.features)),
            std::string::npos);
  if (tb_python.empty()) {
    GTEST_SKIP() << "skipped the read-back: no Python here imports tensorboard (scripts/python-extras.sh installs it)";
  }
  const std::string read = "import sys, json\n"
                           "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
                           "acc = EventAccumulator(sys.argv[1]); acc.Reload()\n"
                           "print(json.dumps({t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()['scalars']}))\n";
  Process reader({tb_python, "-c", read, (dir / "tb").string()}, dir / "tb.log");
  ASSERT_EQ(reader.wait(120s).value_or(-1), 0) << log_tail(dir / "tb.log");
  const auto text = read_file(dir / "tb.log");
  const auto scalars = json::parse(text.substr(text.find('{')));
  ASSERT_TRUE(scalars.contains("test/accuracy")) << text;
  ASSERT_EQ(scalars["test/accuracy"].size(), cfg["rounds"].get<std::size_t>());
  const auto metrics = server::read_metrics(dir / "out" / "server" / "metrics.csv");
  for (std::size_t r = 0; r < metrics.size(); ++r) {
    EXPECT_EQ(scalars["train/loss"][r][0], metrics[r].round);
    EXPECT_NEAR(scalars["train/loss"][r][1].get<double>(), metrics[r].train_loss, 1e-5 + 1e-6 * metrics[r].train_loss);
    EXPECT_EQ(scalars["round/upload_bytes"][r][1].get<double>(), static_cast<double>(metrics[r].upload_bytes));
  }
  EXPECT_NEAR(scalars["test/accuracy"].back()[1].get<double>(), fed, 1e-6);
  // A server's metrics.csv outside the sim: `xsilo report tensorboard` writes the same scalars.
  Process convert({test::xsilo_bin(), "report", "tensorboard", (dir / "out" / "server" / "metrics.csv").string(),
                   (dir / "tb-server").string()},
                  dir / "convert.log");
  ASSERT_EQ(convert.wait(60s).value_or(-1), 0) << log_tail(dir / "convert.log");
  Process reader2({tb_python, "-c", read, (dir / "tb-server").string()}, dir / "tb2.log");
  ASSERT_EQ(reader2.wait(120s).value_or(-1), 0) << log_tail(dir / "tb2.log");
  const auto text2 = read_file(dir / "tb2.log");
  const auto server_scalars = json::parse(text2.substr(text2.find('{')));
  EXPECT_EQ(server_scalars["train/loss"], scalars["train/loss"]);
  EXPECT_EQ(server_scalars["round/upload_bytes"], scalars["round/upload_bytes"]);
  EXPECT_FALSE(server_scalars.contains("test/accuracy"));  // the server has no test rows
}

// In a secure federation the feature statistics are computed before round 1 by a federation of
// the silos' agents under the same secure aggregation (silo_agent/stats_trainer.h): the server
// learns the totals only, and they equal the pooled rows' mean and variance to float precision.
TEST(FeatureStats, ASecureFederationComputesThemUnderItsOwnSecureAggregation) {
  test::TempDir dir;
  const json cfg = {{"silos", 4},
                    {"rounds", 2},
                    {"baseline", false},
                    {"data", {{"dataset", "breast_cancer"}}},
                    {"secure", {{"mode", "global"}, {"modulus_bits", 64}, {"clip_norm", 10}, {"max_weight", 1000}}}};
  std::string log;
  const auto summary = run_sim_config(dir, cfg, 240s, &log);
  EXPECT_EQ(summary["rounds_committed"], 2) << log;
  const auto stats = load_feature_stats(dir / "out" / "feature_stats.json");
  const Dataset pooled = load_csv(dir / "out" / "central" / "train.csv");
  ASSERT_EQ(stats.mean.size(), pooled.features);
  EXPECT_EQ(stats.count, pooled.rows);
  for (std::size_t j = 0; j < pooled.features; ++j) {
    double m = 0, v = 0;
    for (std::size_t i = 0; i < pooled.rows; ++i) m += pooled.row(i)[j];
    m /= static_cast<double>(pooled.rows);
    for (std::size_t i = 0; i < pooled.rows; ++i) v += (pooled.row(i)[j] - m) * (pooled.row(i)[j] - m);
    v /= static_cast<double>(pooled.rows);
    EXPECT_NEAR(stats.mean[j], m, 1e-5 * std::abs(m) + 1e-9) << j;
    EXPECT_NEAR(stats.var[j], v, 1e-4 * v + 1e-12) << j;
  }
  // The statistics' server ran two secure rounds of all four silos: it saw masked vectors only.
  std::size_t rounds = 0;
  for (const auto& r : server::read_audit_log(dir / "out" / "feature_stats" / "server" / "audit.jsonl")) {
    if (r.value("event", "") != "round") continue;
    ++rounds;
    EXPECT_EQ(r["status"], "committed");
    EXPECT_EQ(r["secure"]["mode"], "global");
    EXPECT_EQ(r["secure"]["groups"][0]["masked_inputs"], 4);
  }
  EXPECT_EQ(rounds, 2u);
  // Every silo's built-in trainer standardized with them.
  const auto agent = json::parse(read_file(dir / "out" / "configs" / "hospital-01.json"));
  EXPECT_EQ(agent["data"]["standardize"], "federated");
  EXPECT_EQ(agent["data"]["feature_stats"], (dir / "out" / "feature_stats.json").string());
}

// examples/lora: only the adapters and the head are federated (federate=), under secure
// aggregation over 5 silos: the server's model holds just them, and each round uploads their
// masked words, not the model's.
TEST(LoraExample, OnlyTheAdaptersAreFederatedUnderSecureAggregation) {
  REQUIRE_PYTHON_MODULE("torch");
  test::TempDir dir;
  auto cfg = json::parse(read_file(kSource / "examples" / "lora" / "sim.json"));
  cfg["trainer"]["cwd"] = (kSource / "examples" / "lora").string();
  cfg["data"]["path"] = (kSource / "examples" / "lora" / "reviews.csv").string();
  cfg["rounds"] = 8;
  cfg["trainer"]["env"] = {{"HOME", dir.path().string()}};  // the pretrained base: written once, here
  std::string log;
  const auto summary = run_sim_config(dir, cfg, 600s, &log);
  EXPECT_EQ(summary["rounds_committed"], 8) << log;
  const Model m = load_safetensors(dir / "out" / "model.safetensors");
  std::size_t params = 0;
  for (const auto& t : m.tensors()) {
    EXPECT_TRUE(t.name.find("lora_") != std::string::npos || t.name.rfind("head.", 0) == 0) << t.name;
    params += t.size();
  }
  EXPECT_EQ(params, 2178u);
  for (const auto& row : server::read_metrics(dir / "out" / "server" / "metrics.csv")) {
    EXPECT_EQ(row.upload_bytes, 5u * (params + 2) * 8)
        << "5 silos, a 64-bit word per parameter, the weight and the unclipped bit (secure.clipped)";
  }
  // It learns: chance is 0.5, and 600 test rows put 0.6 five standard deviations above it. How
  // fast depends on the deal of the rows (examples/lora/README.md: 64-91 % after 8 rounds over
  // four seeds), so the bound is chance's, not one deal's.
  EXPECT_GT(summary["final_accuracy"].get<double>(), 0.6) << log;
}

// 9 silos in 3 groups of 3: the median across the group means outvotes one (over 2 groups it
// would be their mean, which validation warns about).
TEST(PytorchExample, SecureGroupedMedianTwoEdgesTwoWorkersPerSiloWithinTwoPoints) {
  run_example("sim-secure.json", 0.02);
}

// The user's own model with compressed uploads and broadcasts (docs/compression.md): 8-bit codes
// through an edge that decodes them, the silos' error feedback in their state folders, and the
// model sent as 8-bit deltas that the edge and the silos add to the model they hold (the
// BatchNorm statistics as their values).
TEST(PytorchExample, EightBitUploadsAndBroadcastDeltasThroughAnEdgeWithinTwoPoints) {
  run_example("sim.json", 0.02,
              {{"edges", 1},
               {"compression", {{"scheme", "quantize"}, {"bits", 8}}},
               {"broadcast", {{"scheme", "quantize"}, {"bits", 8}}}});
}

}  // namespace
}  // namespace tools
}  // namespace xsilo
