// Byzantine-robust aggregation rules and clipping, as pure functions on an n x d matrix of
// updates (row i is input i, row-major, float32). Each rule returns the aggregate and, for
// every input, what it decided (score, kept or rejected, why) for the audit log.
//
// Definitions (the literature disagrees on details; these are ours, docs/robust.md):
//   clip_l2(C):          x * min(1, C / ||x||)
//   krum(f):             score(i) = sum of squared L2 distances from i to its n - f - 2 nearest
//                        other inputs; the aggregate is the input with the lowest score. Equal
//                        scores are ordered by the inputs' values (smaller squared norm, then
//                        lexicographically smaller), never by position. Needs n > 2f + 2.
//   multi_krum(f, m):    the mean of the m inputs with the lowest Krum scores.
//   median:              coordinate-wise; the mean of the two middle values when n is even.
//   trimmed_mean(b):     per coordinate, drop the b largest and b smallest values and average
//                        the rest. Needs n > 2b.
//   bulyan(f):           select theta = n - 2f inputs by repeated Krum (each round picks the
//                        lowest score among those left, scores recomputed over those left), then
//                        per coordinate drop the f largest and f smallest selected values and
//                        average the remaining theta - 2f. Needs n >= 4f + 3.
//   centered_clip(tau, L, v0, r, o): v <- v + mean_i (x_i - v) * min(1, tau / ||x_i - v||), L
//                        times, from v0 (Karimireddy, He, Jaggi 2021: v0 is the previous round's
//                        aggregate). tau <= 0: each iteration's radius is half the median of
//                        the distances ||x_i - v||, in the inputs' own units. r > 0: an input
//                        farther from v than r times that median distance is out of the
//                        iteration (the mean runs over the others), so an update far outside
//                        the honest spread pulls nothing instead of a full radius; r <= 0: none
//                        (r is at least 1; a median distance of 0 rejects nothing). An input is
//                        left out (kept = false) when it was rejected in every iteration.
//                        o > 0 and v0 not zero: an input's alignment is the cosine between it
//                        and v0; with m the median alignment (its sign is the majority's side),
//                        an input with sign(m) * alignment < -max(o |m|, 0.2) points against
//                        the majority's side of the last step and is out of every iteration
//                        and of the median distance. Only with 3 inputs or more and |m| >= 0.1
//                        (a clear side); o <= 0: none.
//                        g > 0, on the same clear side: an input whose alignment lies behind the
//                        median's, sign(m) * (alignment - m) < -max(g s, 0.4), s the distance
//                        from m within which the closest half of the alignments and one more
//                        lie, lags (near orthogonal where the majority leans with the step, as
//                        label flipping's do) and is out the same way; g <= 0: none.
// Pre-aggregation steps, composable with every rule (rule.h runs nnm, then bucketing, then the
// rule):
//   nnm(f):              nearest-neighbour mixing (Allouah et al., AISTATS 2023): input i is
//                        replaced by the (weighted) mean of the n - f inputs nearest to it, itself
//                        included (squared L2 distances from the Gram matrix; equal distances
//                        ordered by index). n rows in, n rows out. Needs n > f.
//   bucketing(s, seed):  (Karimireddy, He, Jaggi, ICLR 2022) a permutation of the inputs drawn
//                        from `seed` (mt19937_64, std::shuffle of 0..n-1), cut into
//                        k = ceil(n / s) buckets of consecutive inputs: bucket j holds positions
//                        [floor(j n / k), floor((j + 1) n / k)), so sizes differ by at most one.
//                        Each bucket's (weighted) mean is one row for the rule, its weight the
//                        sum of its inputs' weights.
// Non-finite inputs must be removed first (finite_rows); every rule assumes finite input.
// Distances come from one Gram matrix X X^T (one pass of dot products), never n^2 subtractions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"

namespace xsilo::robust {

struct MatrixView {
  const float* data = nullptr;
  std::size_t n = 0, d = 0;
  std::span<const float> row(std::size_t i) const { return {data + i * d, d}; }
};

struct Decision {
  bool kept = true;
  double score = 0;     // rule-specific (Krum score, norm before clipping, ...)
  std::string reason;   // why it was rejected or changed, empty otherwise
  // centered_clip with a last step to compare with: the cosine between the input and that step.
  std::optional<double> alignment;
  // centered_clip with the one-sided test on: the share of the input's coordinates above the
  // coordinate-wise median of the inputs, of those that differ from it.
  std::optional<double> balance;
};

struct Result {
  std::vector<float> aggregate;   // d values
  std::vector<Decision> decisions;  // n entries
  std::vector<std::vector<std::size_t>> buckets;  // after bucketing: the inputs of each bucket
  // centered_clip, in its last iteration (the one that fixed the aggregate; its decisions are
  // that iteration's too): the radius (tau, or half the median distance) and the distance
  // beyond which inputs were rejected (0: no rejection).
  double radius = 0;
  double rejected_beyond = 0;
  // centered_clip with a last step to compare with: the median alignment, and the alignment
  // (on the majority's side: times the median's sign) below which inputs were opposed, or 0
  // with the reason in `opposition_off` when the test did not run.
  double median_alignment = 0;
  double opposed_below = 0;
  std::string opposition_off;
  // centered_clip's lag test, on the same side: how far behind the median alignment an input's
  // alignment had to be to be left out (0: the test did not run; `opposition_off` says why).
  double lagging_beyond = 0;
  // centered_clip's one-sided test: the median balance, and how far from it (either way) an
  // input's balance had to be to be left out, or 0 with the reason in `one_sided_off` when the
  // test did not run.
  double median_balance = 0;
  double one_sided_beyond = 0;
  std::string one_sided_off;
  // centered_clip: each screen alone keeps more than half of the inputs, their union may not;
  // then the one-sided and, if still needed, the lag screen stand down for the round, and this
  // says which and why ("" when none did).
  std::string screens_stood_down;
};

// Whether a rule can run on n inputs, or why not.
Status check_krum(std::size_t n, std::size_t f);
Status check_multi_krum(std::size_t n, std::size_t f, std::size_t m);
Status check_trimmed_mean(std::size_t n, std::size_t b);
Status check_bulyan(std::size_t n, std::size_t f);

// Indices of rows whose every value is finite.
std::vector<std::size_t> finite_rows(MatrixView x);

// The L2 norm of a row (summed in double).
double l2_norm(std::span<const float> row);

// Scales rows in place to L2 norm at most `c`; decision score = the original norm.
std::vector<Decision> clip_l2(std::span<float> rows, std::size_t n, std::size_t d, double c);

// Squared L2 distances between all rows from the Gram matrix (n x n, row-major).
std::vector<double> pairwise_sq_distances(MatrixView x);

// Rows made of inputs: row r is the (weighted) mean of inputs sources[r]; weights[r] their sum.
struct Mixed {
  std::vector<float> rows;  // sources.size() x d
  std::vector<double> weights;
  std::vector<std::vector<std::size_t>> sources;
  MatrixView view(std::size_t d) const { return {rows.data(), sources.size(), d}; }
};
Mixed nearest_neighbour_mixing(MatrixView x, std::size_t f, std::span<const double> weights = {});
std::size_t bucket_count(std::size_t n, std::size_t s);
Mixed bucketing(MatrixView x, std::size_t s, std::uint64_t seed, std::span<const double> weights = {});

Result mean(MatrixView x, std::span<const double> weights = {});
Result krum(MatrixView x, std::size_t f);
Result multi_krum(MatrixView x, std::size_t f, std::size_t m);
Result median(MatrixView x);
Result trimmed_mean(MatrixView x, std::size_t b);
Result bulyan(MatrixView x, std::size_t f);
// centered_clip's default rejection, in median distances to the centre, and its default
// opposition, in median alignments with the last step (rule.h says why).
inline constexpr double kDefaultReject = 3.5;
inline constexpr double kDefaultOppose = 0.5;
// The opposition's fixed floors, both cosines (scale-free): the median alignment must be this
// far from 0 for its side to count, and an opposed input at least this far backwards on it.
inline constexpr double kOpposeClearMedian = 0.1;
inline constexpr double kOpposeMinCosine = 0.2;
// centered_clip's default one-sided test, in spreads of the inputs' balances (rule.h says why),
// and its fixed parts: the least distance from the median balance that counts whatever the
// spread, and the fewest coordinates for a balance to say anything.
inline constexpr double kDefaultOneSided = 2.0;
inline constexpr double kOneSidedFloor = 0.25;
inline constexpr std::size_t kOneSidedMinCoordinates = 256;
// centered_clip's default lag test, in spreads of the alignments with the last step (rule.h
// says why), and its fixed parts: the least distance behind the median alignment that counts
// whatever the spread (a cosine, so scale-free), and the same in the cosine's own noise: two
// unrelated directions in d coordinates have a cosine of standard deviation 1/sqrt(d), so a gap
// within kLagNoise of those says nothing on a model with few coordinates.
inline constexpr double kDefaultLag = 2.0;
inline constexpr double kLagFloor = 0.4;
inline constexpr double kLagNoise = 3.0;
Result centered_clip(MatrixView x, double tau, std::size_t iterations, std::span<const float> v0 = {},
                     double reject = kDefaultReject, double oppose = kDefaultOppose,
                     double one_sided = kDefaultOneSided, double lag = kDefaultLag);

}  // namespace xsilo::robust
