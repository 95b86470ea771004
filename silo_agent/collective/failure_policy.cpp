#include "silo_agent/collective/failure_policy.h"

#include <algorithm>
#include <limits>

namespace xsilo::collective {

std::chrono::milliseconds StepDeadline::left(SteadyTime now) const {
  if (now >= due_) return std::chrono::milliseconds(0);
  return std::chrono::duration_cast<std::chrono::milliseconds>(due_ - now);
}

std::optional<Reformation> decide_reformation(const std::vector<WorkerStatus>& workers,
                                              std::optional<SteadyTime> failure_since,
                                              std::chrono::milliseconds grace, SteadyTime now) {
  if (!failure_since) return std::nullopt;
  const bool all_reported = std::all_of(workers.begin(), workers.end(), [](const WorkerStatus& w) {
    return !w.member || w.done || !w.connected || w.failed_op;
  });
  if (!all_reported && now - *failure_since < grace) return std::nullopt;
  Reformation r;
  std::uint64_t resume = std::numeric_limits<std::uint64_t>::max();
  for (const auto& w : workers) {
    if (!w.member) continue;
    if (w.done) {
      r.left.push_back(w.id);
    } else if (!w.connected || !w.failed_op) {
      r.excluded.push_back(w.id);
    } else {
      resume = std::min(resume, *w.failed_op);
    }
  }
  r.resume_op = resume == std::numeric_limits<std::uint64_t>::max() ? 0 : resume;
  return r;
}

}  // namespace xsilo::collective
