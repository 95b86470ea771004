// The external trainer's budgets (silo_agent/trainer_budget.h) with time moved by hand: the
// deterministic counterparts of trainer_test's ExternalTrainer.StartUpDoesNotCountAgainstTheTaskBudget
// and the timeouts of TrainerMisbehaviour.* (docs/testing.md, "Tests that depend on timing").
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "silo_agent/trainer_budget.h"

namespace xsilo::agent {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

const SteadyTime t0{};  // the tests' own epoch: no clock is read

// The scenario of ExternalTrainer.StartUpDoesNotCountAgainstTheTaskBudget: startup_s 5 and
// task_timeout_s 2; the script needs 2 s to say hello and 1.5 s for its task. The hello is in
// time; the task's budget runs from when the task is sent, so 3.5 s after the start is still in
// time, where one budget from the start would have run out at 2 s.
TEST(TrainerBudget, StartUpHasItsOwnBudgetAndATasksBudgetRunsFromWhenItIsSent) {
  const TrainerWait hello = startup_wait(5000ms, t0);
  EXPECT_EQ(hello.on_timeout, wire::TRAINER_DID_NOT_START);
  EXPECT_EQ(hello.budget, "trainer.startup_s = 5 s");
  const SteadyTime hello_at = t0 + 2000ms;
  EXPECT_FALSE(hello.expired(hello_at));

  const TrainerWait train = task_wait("train", 1, task_budget(2000ms, 120000), hello_at);
  EXPECT_EQ(train.on_timeout, wire::TRAINER_HUNG);
  EXPECT_EQ(train.since, hello_at);
  EXPECT_EQ(train.deadline, t0 + 4000ms);
  EXPECT_FALSE(train.expired(t0 + 3500ms)) << "the task's 1.5 s against its own 2 s";
  EXPECT_FALSE(train.expired(t0 + 3999ms));
  EXPECT_TRUE(train.expired(t0 + 4000ms));
}

// The `silent` mode of TrainerMisbehaviour: no hello within startup_s 5 runs out at exactly 5 s,
// as a start-up failure whose message names the setting to raise.
TEST(TrainerBudget, NoHelloWithinTheStartUpBudgetIsAFailureToStartThatNamesTheSetting) {
  const TrainerWait hello = startup_wait(5000ms, t0);
  EXPECT_FALSE(hello.expired(t0 + 4999ms));
  ASSERT_TRUE(hello.expired(t0 + 5000ms));
  const std::string m = hello.timeout_message("rank 0", t0 + 5000ms);
  EXPECT_EQ(m.rfind("rank 0 did not start in time: no hello after 5.0 s (trainer.startup_s = 5 s); it was stopped.", 0), 0u)
      << m;
  EXPECT_NE(m.find("raise trainer.startup_s"), std::string::npos) << m;
}

// The `hang` mode of TrainerMisbehaviour: no answer within task_timeout_s 3 runs out at exactly
// 3 s after the task was sent, with the message that test looks for.
TEST(TrainerBudget, NoAnswerWithinTheTaskBudgetIsAHangNamedWithTheTaskAndTheSetting) {
  const SteadyTime sent = t0 + 1234ms;  // whenever start-up ended
  const TrainerWait w = task_wait("train", 1, task_budget(3000ms, 0), sent);
  EXPECT_FALSE(w.expired(sent + 2999ms));
  ASSERT_TRUE(w.expired(sent + 3000ms));
  EXPECT_EQ(w.timeout_message("rank 0", sent + 3000ms),
            "rank 0 hung: no answer (its train result for round 1) after 3.0 s (trainer.task_timeout_s = 3 s); it was "
            "stopped");
}

// Which setting a task's budget comes from: the trainer's own timeout, else the round's training
// deadline, else an hour.
TEST(TrainerBudget, ATasksBudgetIsTheTrainersTimeoutElseTheRoundsTrainingDeadlineElseAnHour) {
  const auto own = task_budget(2000ms, 120000);
  EXPECT_EQ(own.length, 2000ms);
  EXPECT_EQ(own.key, "trainer.task_timeout_s");
  const auto round = task_budget(0ms, 120000);
  EXPECT_EQ(round.length, 120000ms);
  EXPECT_EQ(round.key, "the round's training deadline (the server's deadlines.train_s)");
  const auto neither = task_budget(0ms, 0);
  EXPECT_EQ(neither.length, milliseconds(3600000));
  EXPECT_EQ(task_wait("evaluate", 7, round, t0).budget,
            "the round's training deadline (the server's deadlines.train_s) = 120 s");
  EXPECT_EQ(task_wait("evaluate", 7, round, t0).what, "its evaluate result for round 7");
}

// A wait polls for what is left, but at most 200 ms (a copy's exit and the agent's stop are
// checked between polls) and at least 1 ms.
TEST(TrainerBudget, APollWaitsForWhatIsLeftBetweenOneAnd200Milliseconds) {
  const TrainerWait w = task_wait("train", 1, task_budget(3000ms, 0), t0);
  EXPECT_EQ(w.poll_for(t0), 200ms);
  EXPECT_EQ(w.poll_for(t0 + 2900ms), 100ms);
  EXPECT_EQ(w.poll_for(t0 + 2999ms), 1ms);
  EXPECT_EQ(w.poll_for(t0 + 3000ms), 1ms);
  EXPECT_EQ(w.poll_for(t0 + 5000ms), 1ms);
}

// TrainerMisbehaviour's modes that stop the trainer restart it for round 2 after the backoff of
// one failure (1 s); each further failure in a row doubles it, up to a minute.
TEST(TrainerBudget, AFailedTrainerRestartsAfterOneTwoFourSecondsUpToAMinute) {
  std::vector<std::chrono::seconds> pauses;
  for (int failures = 0; failures <= 9; ++failures) pauses.push_back(restart_backoff(failures));
  EXPECT_EQ(pauses, (std::vector<std::chrono::seconds>{0s, 1s, 2s, 4s, 8s, 16s, 32s, 60s, 60s, 60s}));
}

}  // namespace
}  // namespace xsilo::agent
