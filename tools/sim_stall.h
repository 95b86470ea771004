// When `xsilo sim` gives up on a federation whose server still runs: every agent has exited, or
// fewer run than a round needs (selection.min_silos) for longer than a restart takes. The server
// would wait for them for ever ("0 of the 3 silos needed are connected; waiting"). Time comes in
// as an argument, so the decision is tested without a clock.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "common/result.h"

namespace xsilo::tools {

class StallWatch {
 public:
  using Clock = std::chrono::steady_clock;
  // A restart fault brings a process back within a second; an agent that exits does not.
  static constexpr std::chrono::seconds kNoneGrace{5}, kFewGrace{20};

  explicit StallWatch(std::size_t needed) : needed_(needed) {}
  // `alive` of `total` agents run at `now`: success while the federation can go on, else why not.
  Status check(std::size_t alive, std::size_t total, Clock::time_point now) {
    if (alive >= needed_) {
      short_since_.reset();
      return {};
    }
    if (!short_since_) short_since_ = now;
    if (now - *short_since_ < (alive == 0 ? kNoneGrace : kFewGrace)) return {};
    if (alive == 0) return Error("every agent has exited");
    return Error("only " + std::to_string(alive) + " of the " + std::to_string(total) + " agents run, and a round needs " +
                 std::to_string(needed_) + " (selection.min_silos)");
  }

 private:
  std::size_t needed_;
  std::optional<Clock::time_point> short_since_;
};

}  // namespace xsilo::tools
