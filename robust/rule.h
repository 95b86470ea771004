// The one source of truth for robust rules: their names, their parameters, how many inputs
// each one needs, and how it runs. Config validation and the coordinator both call these, so
// what was checked is what runs (the definitions themselves are in robust.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "robust/robust.h"

namespace xsilo::robust {

enum class Rule { FedAvg, Krum, MultiKrum, Median, TrimmedMean, Bulyan, CenteredClip };

// What a round does when dropouts left too few inputs for the rule.
enum class Fallback { Median, FedAvg, Abort };

std::string_view name(Rule r);
std::string_view name(Fallback f);
std::optional<Rule> parse_rule(std::string_view s);
std::optional<Fallback> parse_fallback(std::string_view s);
std::vector<std::string> rule_names();
std::vector<std::string> fallback_names();

struct RuleSpec {
  Rule rule = Rule::FedAvg;
  std::size_t f = 0;            // Byzantine inputs tolerated (krum, multi_krum, bulyan, trimmed_mean)
  std::size_t m = 0;            // multi_krum: inputs averaged; 0: n - f
  double beta = 0;              // trimmed_mean: b = floor(beta * n) when > 0, else b = f
  double tau = 0;               // centered_clip radius; 0: half the median distance to the centre, per iteration
  std::size_t iterations = 10;  // centered_clip iterations
  // centered_clip: inputs farther from the centre than this many times the median distance are
  // out of the iteration (0: none). Measured (docs/robust.md): far enough that clean runs of the
  // tables' tasks rejected 5 honest decisions in 3,600 and kept their accuracy, near enough that
  // sign flipping x20 and IPM 10 are rejected.
  double reject = kDefaultReject;
  // centered_clip: inputs pointing against the last committed step, beyond this many times the
  // median alignment on the other side, are out (0: none). Measured (docs/robust.md): inlier
  // attacks (IPM 0.5, model replacement) sit inside the radius, where no distance can single
  // them out, but point backwards; honest updates of strongly skewed silos lie near orthogonal.
  double oppose = kDefaultOppose;
  // centered_clip: inputs whose balance (the share of their coordinates above the inputs'
  // coordinate-wise median) is farther from the median balance than this many spreads are out
  // (0: none). Measured (docs/robust.md): ALIE sits inside the radius and points forwards, but
  // below the median on almost every coordinate.
  double one_sided = kDefaultOneSided;
  // centered_clip: inputs whose alignment with the last committed step lies behind the median
  // alignment by more than this many spreads (and 0.4, and 3 / sqrt(d)) are out (0: none). Measured
  // (docs/robust.md): label flippers train honestly on flipped labels; they stay inside the
  // rejection and lean neither way, but sit near orthogonal to the step the majority leans with.
  double lag = kDefaultLag;
  // Pre-aggregation steps (robust.h), before the rule: nearest-neighbour mixing with this f,
  // then buckets of `bucket` inputs (0 or 1: none) shuffled with `seed` (the caller's, per round).
  bool nnm = false;
  std::size_t bucket = 0;
  std::uint64_t seed = 0;
  // centered_clip's starting centre: the previous round's aggregate (the caller's, per round);
  // empty: zeros (the first round, or a layout that changed).
  std::span<const float> centre;
};

// How many rows the rule itself sees for n inputs (buckets, after bucketing).
std::size_t rule_inputs(const RuleSpec& s, std::size_t n);

// True for the rules that are meaningless without f >= 1.
bool needs_f(Rule r);
// trimmed_mean's b for n inputs.
std::size_t trim_count(const RuleSpec& s, std::size_t n);
// multi_krum's m for n inputs (at least 1).
std::size_t krum_average(const RuleSpec& s, std::size_t n);
// Whether the rule can run on n inputs, or why not.
Status check(const RuleSpec& s, std::size_t n);
// Whether n inputs (silos' updates, or secure groups' means) withstand the spec's f Byzantine
// ones, or why not: the coordinate-wise rules, centered clipping and mixing need n > 2f, Krum and
// Multi-Krum n > 2f + 2, Bulyan n >= 4f + 3. With f = 0 (not declared) there is nothing to check.
Status check_tolerance(const RuleSpec& s, std::size_t n);
// Why the rule protects nothing on n inputs (n <= 2: a median of two inputs is their mean, Krum
// picks one of them, centered clipping with the automatic radius lets the farther one pull
// without bound; a fixed radius still bounds each input's pull), or "".
std::string void_robustness(const RuleSpec& s, std::size_t n);
// Runs the pre-aggregation steps and the rule on the n rows of x (weights: fedavg's, one per
// row; others ignore them). Decisions are per input: an input in a bucket gets its bucket's.
// The caller has checked it; non-finite rows must have been removed.
Result apply(const RuleSpec& s, MatrixView x, std::span<const double> weights);

}  // namespace xsilo::robust
