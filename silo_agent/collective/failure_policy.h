// How a group of local workers notices a failed step and what it does then, with time passed in:
// no socket, thread or clock is read here. A worker's exchange gives up on a peer once no byte has
// moved for the step timeout (StepDeadline, applied by tcp_mesh.cpp); the coordinator then
// re-forms the group (decide_reformation, applied by Coordinator in group.cpp). collective_test's
// StepDeadline.* and Reformation.* drive both by hand, where CollectiveProcesses.* can only kill
// or stall a real worker and wait.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <stdexcept>
#include <vector>

namespace xsilo::collective {

using SteadyTime = std::chrono::steady_clock::time_point;

// One exchange's deadline: the step timeout after the last byte that moved either way, so a
// large step that keeps moving never times out and a peer that stops answering does.
class StepDeadline {
 public:
  StepDeadline(std::chrono::milliseconds timeout, SteadyTime now) : timeout_(timeout), due_(now + timeout) {}
  void moved(SteadyTime now) { due_ = now + timeout_; }
  bool expired(SteadyTime now) const { return now >= due_; }
  // How long a poll may wait at `now` (zero once expired).
  std::chrono::milliseconds left(SteadyTime now) const;

 private:
  std::chrono::milliseconds timeout_;
  SteadyTime due_;
};

// What the coordinator knows of one worker when a step has failed.
struct WorkerStatus {
  int id = -1;
  bool member = false;     // in the current table
  bool done = false;       // finished its work (DONE): leaving is not a failure
  bool connected = false;  // its control connection is open
  std::optional<std::uint64_t> failed_op;  // the operation it reported failing in this epoch
};

struct Reformation {
  std::vector<int> excluded;  // dead, or alive but silent: killed by the owner
  std::vector<int> left;      // finished before the failure: out of the group, not killed
  std::uint64_t resume_op = 0;  // the earliest operation a survivor was in
};

// After a failure first seen at `failure_since`: nullopt while some live member has not reported
// and the grace period is not over; then the group re-forms without the members that did not
// report (a stalled worker is excluded at failure_since + grace, not before), resuming from the
// earliest reported operation (0 when none reported).
std::optional<Reformation> decide_reformation(const std::vector<WorkerStatus>& workers,
                                              std::optional<SteadyTime> failure_since,
                                              std::chrono::milliseconds grace, SteadyTime now);

// A worker's state before each of its last two steps (the parameters, the int8 error feedback):
// the group resumes from the earliest step any survivor was in, which is the step this worker
// failed in or, when it had finished that one, the one before. Rolling back further is
// impossible, and said so rather than done from the wrong copy.
template <class State>
class StepSnapshots {
 public:
  // Before step `op` runs: the copy to fill (its storage is the one of two steps before).
  State& keep(std::uint64_t op) {
    op_[op % 2] = op;
    return kept_[op % 2];
  }
  // The state before step `resume`.
  const State& before(std::uint64_t resume) const {
    if (op_[resume % 2] != resume) {
      throw std::logic_error("the group resumes from step " + std::to_string(resume) +
                             ", which this worker has no copy of (it keeps the last two steps)");
    }
    return kept_[resume % 2];
  }

 private:
  State kept_[2];
  std::uint64_t op_[2] = {~std::uint64_t{0}, ~std::uint64_t{0}};
};

}  // namespace xsilo::collective
