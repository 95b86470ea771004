// The external trainer's budgets, with time passed in: what the agent waits for, until when, what
// running out of it is called, and how long it pauses before starting a failed trainer again. No
// process, socket or clock is read here; ExternalTrainer applies these, and trainer_budget_test
// moves time by hand where trainer_test's ExternalTrainer.* and TrainerMisbehaviour.* wait on a
// real script.
//
// Start-up and each task have separate budgets: start-up runs from the copies' start to every
// copy's hello (trainer.startup_s); a task from the moment it is sent, after start-up
// (trainer.task_timeout_s, else the round's training deadline, else an hour). So a slow
// `import torch` never counts against the first task.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "proto/xsilo.pb.h"

namespace xsilo::agent {

using SteadyTime = std::chrono::steady_clock::time_point;

// One wait of the agent on the trainer's copies.
struct TrainerWait {
  std::string what;                 // "its hello", "its train result for round 7"
  std::string budget;               // "trainer.startup_s = 5 s"
  wire::FailureReason on_timeout;   // TRAINER_DID_NOT_START or TRAINER_HUNG
  SteadyTime since, deadline;

  bool starting() const { return on_timeout == wire::TRAINER_DID_NOT_START; }
  bool expired(SteadyTime now) const { return now >= deadline; }
  // What the silo's log says when `who` ("rank 0") ran out of it at `now`.
  std::string timeout_message(const std::string& who, SteadyTime now) const;
  // How long one poll may wait at `now`: what is left, between 1 ms and 200 ms, so that a copy's
  // exit and the agent's stop are noticed between polls.
  std::chrono::milliseconds poll_for(SteadyTime now) const;
};

// The hello wait of copies started at `started`.
TrainerWait startup_wait(std::chrono::milliseconds startup, SteadyTime started);

// The budget of one task: its length and the setting it comes from.
struct TaskBudget {
  std::chrono::milliseconds length;
  std::string key;  // "trainer.task_timeout_s", ...
};
// `task_timeout`: trainer.task_timeout_s (0: unset); `train_timeout_ms`: the round's training
// deadline as the server sent it (0: none).
TaskBudget task_budget(std::chrono::milliseconds task_timeout, std::uint64_t train_timeout_ms);
// The wait for the answers to a `kind` task ("train", "evaluate", "init") of `round`, sent at `sent`.
TrainerWait task_wait(const std::string& kind, std::uint64_t round, const TaskBudget& budget, SteadyTime sent);

// The pause before starting the copies again after `failures` failed rounds in a row (0: none):
// 1 s, 2 s, 4 s, ... at most a minute.
std::chrono::seconds restart_backoff(int failures);

// "2.0 s": how the trainer's messages write a duration.
std::string seconds_text(std::chrono::steady_clock::duration d);

}  // namespace xsilo::agent
