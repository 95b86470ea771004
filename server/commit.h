// The arithmetic of committing a round, once, for the coordinator's commit job and for
// `xsilo sim --in-process` (which must commit the same models as the real processes). Pure: no
// store, no record written, no clock.
#pragma once

#include <functional>
#include <span>

#include "server/aggregator.h"
#include "server/optimizer.h"

namespace xsilo::server {

// Worker. `combine` writes the round's aggregate step into `next` (the mean delta, or the robust
// rule's output); a step that is not finite is refused (every input was finite, but their sum
// can overflow float), and such a step never reaches the optimizer. Otherwise the optimizer
// steps: on return `next` holds the new model, `global` still the old one.
CombineResult commit_round(const std::function<CombineResult(std::span<float>)>& combine, std::span<float> next,
                           ServerOptimizer& optimizer, std::span<const float> global);

}  // namespace xsilo::server
