#include "silo_agent/trainer_budget.h"

#include <algorithm>
#include <cstdio>

namespace xsilo::agent {

namespace {
std::string seconds_setting(std::chrono::milliseconds d) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g s", std::chrono::duration<double>(d).count());
  return buf;
}
}  // namespace

std::string seconds_text(std::chrono::steady_clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

std::string TrainerWait::timeout_message(const std::string& who, SteadyTime now) const {
  if (starting()) {
    return who + " did not start in time: no hello after " + seconds_text(now - since) + " (" + budget +
           "); it was stopped. A script that imports torch or loads its data before xc.init() may need more: raise "
           "trainer.startup_s";
  }
  return who + " hung: no answer (" + what + ") after " + seconds_text(now - since) + " (" + budget + "); it was stopped";
}

std::chrono::milliseconds TrainerWait::poll_for(SteadyTime now) const {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
  return std::chrono::milliseconds(std::clamp<long long>(left, 1, 200));
}

TrainerWait startup_wait(std::chrono::milliseconds startup, SteadyTime started) {
  return {.what = "its hello",
          .budget = "trainer.startup_s = " + seconds_setting(startup),
          .on_timeout = wire::TRAINER_DID_NOT_START,
          .since = started,
          .deadline = started + startup};
}

TaskBudget task_budget(std::chrono::milliseconds task_timeout, std::uint64_t train_timeout_ms) {
  if (task_timeout.count()) return {task_timeout, "trainer.task_timeout_s"};
  if (train_timeout_ms) {
    return {std::chrono::milliseconds(train_timeout_ms), "the round's training deadline (the server's deadlines.train_s)"};
  }
  return {std::chrono::hours(1), "the default of an hour"};
}

TrainerWait task_wait(const std::string& kind, std::uint64_t round, const TaskBudget& budget, SteadyTime sent) {
  return {.what = "its " + kind + " result for round " + std::to_string(round),
          .budget = budget.key + " = " + seconds_setting(budget.length),
          .on_timeout = wire::TRAINER_HUNG,
          .since = sent,
          .deadline = sent + budget.length};
}

std::chrono::seconds restart_backoff(int failures) {
  if (failures <= 0) return std::chrono::seconds(0);
  return std::chrono::seconds(std::min(60, 1 << std::min(failures - 1, 6)));
}

}  // namespace xsilo::agent
