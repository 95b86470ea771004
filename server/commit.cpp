#include "server/commit.h"

#include <algorithm>
#include <cmath>

namespace xsilo::server {

Combined commit_round(const std::function<Combined(std::span<float>)>& combine, std::span<float> next,
                      ServerOptimizer& optimizer, std::span<const float> global) {
  Combined c = combine(next);
  if (c.ok && !std::all_of(next.begin(), next.end(), [](float v) { return std::isfinite(v); })) {
    c.ok = false;
    c.reason = "the aggregate step has NaN or infinite values (the inputs' sum overflows float)";
  }
  if (c.ok) optimizer.step_into(global, next);
  return c;
}

}  // namespace xsilo::server
