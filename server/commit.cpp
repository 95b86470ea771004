#include "server/commit.h"

#include "common/finite.h"

namespace xsilo::server {

CombineResult commit_round(const std::function<CombineResult(std::span<float>)>& combine, std::span<float> next,
                           ServerOptimizer& optimizer, std::span<const float> global) {
  CombineResult c = combine(next);
  if (!c) return c;
  if (!all_finite(next)) {
    return CombineFailure{.reason = "the aggregate step has NaN or infinite values (the inputs' sum overflows float)",
                          .record = std::move(c->record)};
  }
  optimizer.step_into(global, next);
  return c;
}

}  // namespace xsilo::server
