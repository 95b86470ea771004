#include "server/commit.h"

#include <algorithm>
#include <cmath>

namespace xsilo::server {

CombineResult commit_round(const std::function<CombineResult(std::span<float>)>& combine, std::span<float> next,
                           ServerOptimizer& optimizer, std::span<const float> global) {
  CombineResult c = combine(next);
  if (!c) return c;
  if (!std::all_of(next.begin(), next.end(), [](float v) { return std::isfinite(v); })) {
    return CombineFailure{.reason = "the aggregate step has NaN or infinite values (the inputs' sum overflows float)",
                          .record = std::move(c->record)};
  }
  optimizer.step_into(global, next);
  return c;
}

}  // namespace xsilo::server
