#include "robust/robust.h"

#include "common/eigen.h"
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <mutex>
#include <limits>
#include <thread>

namespace xsilo::robust {

namespace {

using MatR = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Runs fn(begin, end) over [0, total) split across the machine's cores.
template <class Fn>
void parallel_ranges(std::size_t total, std::size_t grain, Fn fn) {
  const std::size_t threads = std::max<std::size_t>(
      1, std::min<std::size_t>(std::thread::hardware_concurrency(), total / std::max<std::size_t>(grain, 1)));
  if (threads <= 1) {
    fn(std::size_t{0}, total);
    return;
  }
  std::vector<std::thread> pool;
  const std::size_t step = (total + threads - 1) / threads;
  for (std::size_t t = 0; t < threads; ++t) {
    const std::size_t b = t * step, e = std::min(total, b + step);
    if (b < e) pool.emplace_back([&fn, b, e] { fn(b, e); });
  }
  for (auto& th : pool) th.join();
}

double sq_norm(std::span<const float> v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return s;
}

// Distance of every input to the aggregate: what an auditor looks at for coordinate-wise rules.
void score_by_distance(MatrixView x, Result& r) {
  for (std::size_t i = 0; i < x.n; ++i) {
    double s = 0;
    const auto row = x.row(i);
    for (std::size_t k = 0; k < x.d; ++k) {
      const double diff = static_cast<double>(row[k]) - r.aggregate[k];
      s += diff * diff;
    }
    r.decisions[i].score = std::sqrt(s);
  }
}

// Batcher's bitonic sorting network as compare-exchange pairs (min to .first) for p = 2^k
// inputs: p/4 log p (log p + 1) comparators.
std::vector<std::pair<std::uint32_t, std::uint32_t>> bitonic(std::size_t p) {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> net;
  for (std::size_t size = 2; size <= p; size <<= 1) {
    for (std::size_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (std::size_t i = 0; i < p; ++i) {
        const std::size_t j = i ^ stride;
        if (j <= i) continue;
        if ((i & size) == 0) net.emplace_back(static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(j));
        else net.emplace_back(static_cast<std::uint32_t>(j), static_cast<std::uint32_t>(i));
      }
    }
  }
  return net;
}

// Sorts every coordinate of the matrix and calls fn(sorted rows, width, first coordinate)
// per block: sorted[r * width + c] is the r-th smallest value of coordinate first + c. A
// sorting network applied to whole rows of a block is plain min/max over contiguous floats,
// which the compiler turns into SIMD: many coordinates are sorted at once.
template <class Fn>
void sorted_blocks(MatrixView x, Fn fn) {
  std::size_t p = 1;
  while (p < x.n) p <<= 1;
  const auto net = bitonic(p);
  const std::size_t width = std::max<std::size_t>(64, std::min<std::size_t>(1024, (64u << 10) / (p * sizeof(float))));
  parallel_ranges((x.d + width - 1) / width, 16, [&](std::size_t b0, std::size_t b1) {
    std::vector<float> rows(p * width);
    for (std::size_t blk = b0; blk < b1; ++blk) {
      const std::size_t j0 = blk * width, w = std::min(width, x.d - j0);
      for (std::size_t r = 0; r < p; ++r) {
        float* dst = rows.data() + r * width;
        if (r < x.n) std::copy_n(x.data + r * x.d + j0, w, dst);
        else std::fill_n(dst, w, std::numeric_limits<float>::infinity());
      }
      for (const auto& [a, b] : net) {
        float* __restrict ra = rows.data() + a * width;
        float* __restrict rb = rows.data() + b * width;
        for (std::size_t c = 0; c < w; ++c) {
          const float lo = ra[c] < rb[c] ? ra[c] : rb[c];
          const float hi = ra[c] < rb[c] ? rb[c] : ra[c];
          ra[c] = lo;
          rb[c] = hi;
        }
      }
      fn(rows.data(), width, w, j0);
    }
  });
}

// Krum scores over the inputs in `alive` (indices into the distance matrix).
std::vector<double> krum_scores(const std::vector<double>& dist, std::size_t n,
                                const std::vector<std::size_t>& alive, std::size_t f) {
  const std::size_t m = alive.size();
  const std::size_t k = m - f - 2;  // neighbours counted
  std::vector<double> scores(m);
  std::vector<double> row;
  for (std::size_t a = 0; a < m; ++a) {
    row.clear();
    for (std::size_t b = 0; b < m; ++b) {
      if (a != b) row.push_back(dist[alive[a] * n + alive[b]]);
    }
    std::partial_sort(row.begin(), row.begin() + static_cast<long>(k), row.end());
    scores[a] = std::accumulate(row.begin(), row.begin() + static_cast<long>(k), 0.0);
  }
  return scores;
}

// Orders inputs by their values alone, so that ties never depend on the order of the inputs:
// the smaller squared norm first, then the lexicographically smaller row.
bool content_less(MatrixView x, const std::vector<double>& sq_norms, std::size_t a, std::size_t b) {
  if (sq_norms[a] != sq_norms[b]) return sq_norms[a] < sq_norms[b];
  const auto ra = x.row(a), rb = x.row(b);
  return std::lexicographical_compare(ra.begin(), ra.end(), rb.begin(), rb.end());
}

// Positions in `alive` sorted by score; equal scores are ordered by content_less.
std::vector<std::size_t> by_score(const std::vector<double>& scores, const std::vector<std::size_t>& alive,
                                  MatrixView x, const std::vector<double>& sq_norms) {
  std::vector<std::size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (scores[a] != scores[b]) return scores[a] < scores[b];
    return content_less(x, sq_norms, alive[a], alive[b]);
  });
  return order;
}

std::vector<double> row_sq_norms(MatrixView x) {
  std::vector<double> out(x.n);
  for (std::size_t i = 0; i < x.n; ++i) out[i] = sq_norm(x.row(i));
  return out;
}

void mean_of_rows(MatrixView x, const std::vector<std::size_t>& rows, std::vector<float>& out) {
  out.assign(x.d, 0.0f);
  if (rows.empty()) return;
  parallel_ranges(x.d, 1 << 16, [&](std::size_t b, std::size_t e) {
    std::vector<double> acc(e - b, 0.0);
    for (auto i : rows) {
      const float* r = x.data + i * x.d;
      for (std::size_t k = b; k < e; ++k) acc[k - b] += r[k];
    }
    const double inv = 1.0 / static_cast<double>(rows.size());
    for (std::size_t k = b; k < e; ++k) out[k] = static_cast<float>(acc[k - b] * inv);
  });
}

}  // namespace

Status check_krum(std::size_t n, std::size_t f) {
  if (n > 2 * f + 2) return {};
  return Error("Krum needs n > 2f + 2: n = " + std::to_string(n) + ", f = " + std::to_string(f));
}

Status check_multi_krum(std::size_t n, std::size_t f, std::size_t m) {
  if (auto s = check_krum(n, f); !s) return Error("Multi-" + s.error().message());
  if (m == 0 || m > n) return Error("Multi-Krum needs 1 <= m <= n: m = " + std::to_string(m) + ", n = " + std::to_string(n));
  return {};
}

Status check_trimmed_mean(std::size_t n, std::size_t b) {
  if (n > 2 * b) return {};
  return Error("trimmed mean needs n > 2b: n = " + std::to_string(n) + ", b = " + std::to_string(b));
}

Status check_bulyan(std::size_t n, std::size_t f) {
  if (n >= 4 * f + 3) return {};
  return Error("Bulyan needs n >= 4f + 3: n = " + std::to_string(n) + ", f = " + std::to_string(f));
}

std::vector<std::size_t> finite_rows(MatrixView x) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < x.n; ++i) {
    const auto r = x.row(i);
    if (std::all_of(r.begin(), r.end(), [](float v) { return std::isfinite(v); })) out.push_back(i);
  }
  return out;
}

double l2_norm(std::span<const float> row) { return std::sqrt(sq_norm(row)); }

std::vector<Decision> clip_l2(std::span<float> rows, std::size_t n, std::size_t d, double c) {
  std::vector<Decision> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    auto r = rows.subspan(i * d, d);
    const double norm = l2_norm(r);
    out[i].score = norm;
    if (norm > c) {
      const auto s = static_cast<float>(c / norm);
      for (auto& v : r) v *= s;
      out[i].reason = "clipped from norm " + std::to_string(norm) + " to " + std::to_string(c);
    }
  }
  return out;
}

std::vector<double> pairwise_sq_distances(MatrixView x) {
  const std::size_t n = x.n;
  Eigen::MatrixXd gram = Eigen::MatrixXd::Zero(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(n));
  // Blocks of coordinates: float products at GEMM speed, accumulated in double across blocks.
  constexpr std::size_t kBlock = 1 << 15;
  const std::size_t blocks = (x.d + kBlock - 1) / kBlock;
  std::vector<Eigen::MatrixXd> partial;
  std::mutex mu;
  parallel_ranges(blocks, 4, [&](std::size_t b0, std::size_t b1) {
    Eigen::MatrixXd local = Eigen::MatrixXd::Zero(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(n));
    for (std::size_t blk = b0; blk < b1; ++blk) {
      const std::size_t j0 = blk * kBlock, w = std::min(kBlock, x.d - j0);
      Eigen::Map<const MatR, 0, Eigen::OuterStride<>> xb(x.data + j0, static_cast<Eigen::Index>(n),
                                                         static_cast<Eigen::Index>(w),
                                                         Eigen::OuterStride<>(static_cast<Eigen::Index>(x.d)));
      Eigen::MatrixXf g = xb * xb.transpose();
      local += g.cast<double>();
    }
    std::lock_guard<std::mutex> lock(mu);
    gram += local;
  });
  // Exactly symmetric, so that mutual nearest neighbours get exactly equal scores.
  std::vector<double> dist(n * n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = i + 1; j < n; ++j) {
      const auto ii = static_cast<Eigen::Index>(i), jj = static_cast<Eigen::Index>(j);
      const double g = 0.5 * (gram(ii, jj) + gram(jj, ii));
      dist[i * n + j] = dist[j * n + i] = std::max(0.0, gram(ii, ii) + gram(jj, jj) - 2 * g);
    }
  }
  return dist;
}

namespace {

// Row r of the result: the weighted mean of x's rows sources[r], as one matrix product
// (k x n mixing weights) x (n x d), in blocks of coordinates: GEMM speed, one pass over x.
Mixed mix(MatrixView x, std::vector<std::vector<std::size_t>> sources, std::span<const double> weights) {
  Mixed m;
  m.sources = std::move(sources);
  const std::size_t k = m.sources.size();
  m.rows.assign(k * x.d, 0.0f);
  m.weights.assign(k, 0.0);
  Eigen::MatrixXf w = Eigen::MatrixXf::Zero(static_cast<Eigen::Index>(k), static_cast<Eigen::Index>(x.n));
  for (std::size_t r = 0; r < k; ++r) {
    for (auto i : m.sources[r]) m.weights[r] += weights.empty() ? 1.0 : weights[i];
    for (auto i : m.sources[r]) {
      w(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(i)) =
          static_cast<float>((weights.empty() ? 1.0 : weights[i]) / m.weights[r]);
    }
  }
  constexpr std::size_t kBlock = 1 << 14;
  std::size_t terms = 0;
  for (const auto& src : m.sources) terms += src.size();
  if (terms <= 4 * k) {
    // Few inputs per row (buckets): a weighted sum of those rows, in place; GEMM would multiply
    // mostly zeros.
    parallel_ranges(x.d, kBlock, [&](std::size_t b, std::size_t e) {
      for (std::size_t r = 0; r < k; ++r) {
        float* out = m.rows.data() + r * x.d;
        for (auto i : m.sources[r]) {
          const float c = w(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(i));
          const float* row = x.data + i * x.d;
          for (std::size_t j = b; j < e; ++j) out[j] += c * row[j];
        }
      }
    });
    return m;
  }
  parallel_ranges((x.d + kBlock - 1) / kBlock, 4, [&](std::size_t b0, std::size_t b1) {
    for (std::size_t blk = b0; blk < b1; ++blk) {
      const std::size_t j0 = blk * kBlock, width = std::min(kBlock, x.d - j0);
      Eigen::Map<const MatR, 0, Eigen::OuterStride<>> in(x.data + j0, static_cast<Eigen::Index>(x.n),
                                                         static_cast<Eigen::Index>(width),
                                                         Eigen::OuterStride<>(static_cast<Eigen::Index>(x.d)));
      Eigen::Map<MatR, 0, Eigen::OuterStride<>> out(m.rows.data() + j0, static_cast<Eigen::Index>(k),
                                                    static_cast<Eigen::Index>(width),
                                                    Eigen::OuterStride<>(static_cast<Eigen::Index>(x.d)));
      out.noalias() = w * in;
    }
  });
  return m;
}

}  // namespace

Mixed nearest_neighbour_mixing(MatrixView x, std::size_t f, std::span<const double> weights) {
  const std::size_t n = x.n, keep = n > f ? n - f : 1;
  const auto dist = pairwise_sq_distances(x);
  std::vector<std::vector<std::size_t>> sources(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const double da = a == i ? -1.0 : dist[i * n + a], db = b == i ? -1.0 : dist[i * n + b];
      return da < db;  // itself first, then by distance; stable: equal distances by index
    });
    order.resize(keep);
    std::sort(order.begin(), order.end());
    sources[i] = std::move(order);
  }
  return mix(x, std::move(sources), weights);
}

std::size_t bucket_count(std::size_t n, std::size_t s) { return s <= 1 ? n : (n + s - 1) / s; }

Mixed bucketing(MatrixView x, std::size_t s, std::uint64_t seed, std::span<const double> weights) {
  const std::size_t n = x.n, k = bucket_count(n, s);
  std::vector<std::size_t> perm(n);
  std::iota(perm.begin(), perm.end(), std::size_t{0});
  std::mt19937_64 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::vector<std::size_t>> sources(k);
  for (std::size_t j = 0; j < k; ++j) {
    sources[j].assign(perm.begin() + static_cast<std::ptrdiff_t>(j * n / k),
                      perm.begin() + static_cast<std::ptrdiff_t>((j + 1) * n / k));
    std::sort(sources[j].begin(), sources[j].end());
  }
  return mix(x, std::move(sources), weights);
}

Result mean(MatrixView x, std::span<const double> weights) {
  Result r;
  r.decisions.resize(x.n);
  r.aggregate.assign(x.d, 0.0f);
  if (x.n == 0) return r;
  double total = 0;
  for (std::size_t i = 0; i < x.n; ++i) total += weights.empty() ? 1.0 : weights[i];
  parallel_ranges(x.d, 1 << 16, [&](std::size_t b, std::size_t e) {
    std::vector<double> acc(e - b, 0.0);
    for (std::size_t i = 0; i < x.n; ++i) {
      const double w = weights.empty() ? 1.0 : weights[i];
      const float* row = x.data + i * x.d;
      for (std::size_t k = b; k < e; ++k) acc[k - b] += w * row[k];
    }
    for (std::size_t k = b; k < e; ++k) r.aggregate[k] = static_cast<float>(acc[k - b] / total);
  });
  for (std::size_t i = 0; i < x.n; ++i) r.decisions[i].score = weights.empty() ? 1.0 : weights[i];
  return r;
}

Result multi_krum(MatrixView x, std::size_t f, std::size_t m) {
  Result r;
  r.decisions.resize(x.n);
  const auto dist = pairwise_sq_distances(x);
  std::vector<std::size_t> all(x.n);
  std::iota(all.begin(), all.end(), 0);
  const auto scores = krum_scores(dist, x.n, all, f);
  const auto order = by_score(scores, all, x, row_sq_norms(x));
  std::vector<std::size_t> chosen(order.begin(), order.begin() + static_cast<long>(m));
  for (std::size_t i = 0; i < x.n; ++i) {
    r.decisions[i].score = scores[i];
    r.decisions[i].kept = std::find(chosen.begin(), chosen.end(), i) != chosen.end();
    if (!r.decisions[i].kept) r.decisions[i].reason = "Krum score not among the " + std::to_string(m) + " lowest";
  }
  std::sort(chosen.begin(), chosen.end());
  mean_of_rows(x, chosen, r.aggregate);
  return r;
}

Result krum(MatrixView x, std::size_t f) { return multi_krum(x, f, 1); }

namespace {
// The coordinate-wise median alone, for the rules that need it without the scores.
void median_into(MatrixView x, std::vector<float>& out) {
  out.assign(x.d, 0.0f);
  const std::size_t n = x.n;
  sorted_blocks(x, [&](const float* sorted, std::size_t width, std::size_t w, std::size_t j0) {
    const float* hi = sorted + (n / 2) * width;
    const float* lo = sorted + ((n - 1) / 2) * width;
    for (std::size_t c = 0; c < w; ++c) {
      out[j0 + c] = static_cast<float>((static_cast<double>(lo[c]) + hi[c]) / 2.0);
    }
  });
}
}  // namespace

Result median(MatrixView x) {
  Result r;
  r.decisions.resize(x.n);
  median_into(x, r.aggregate);
  score_by_distance(x, r);
  return r;
}

namespace {
void trimmed_into(MatrixView x, std::size_t b, std::vector<float>& out) {
  out.assign(x.d, 0.0f);
  const double inv = 1.0 / static_cast<double>(x.n - 2 * b);
  sorted_blocks(x, [&](const float* sorted, std::size_t width, std::size_t w, std::size_t j0) {
    std::vector<double> acc(w, 0.0);
    for (std::size_t r = b; r < x.n - b; ++r) {
      const float* row = sorted + r * width;
      for (std::size_t c = 0; c < w; ++c) acc[c] += row[c];
    }
    for (std::size_t c = 0; c < w; ++c) out[j0 + c] = static_cast<float>(acc[c] * inv);
  });
}
}  // namespace

Result trimmed_mean(MatrixView x, std::size_t b) {
  Result r;
  r.decisions.resize(x.n);
  trimmed_into(x, b, r.aggregate);
  score_by_distance(x, r);
  return r;
}

Result bulyan(MatrixView x, std::size_t f) {
  Result r;
  r.decisions.resize(x.n);
  const auto dist = pairwise_sq_distances(x);
  const std::size_t theta = x.n - 2 * f;
  std::vector<std::size_t> alive(x.n), selected;
  std::iota(alive.begin(), alive.end(), 0);
  std::vector<double> first_scores;
  const auto norms = row_sq_norms(x);
  while (selected.size() < theta) {
    // Krum over those left; with fewer than 2f + 3 left, the neighbour count is what is left.
    const std::size_t ff = std::min(f, alive.size() >= 3 ? alive.size() - 3 : 0);
    auto scores = krum_scores(dist, x.n, alive, ff);
    if (first_scores.empty()) first_scores = scores;
    const auto best = by_score(scores, alive, x, norms).front();
    selected.push_back(alive[best]);
    alive.erase(alive.begin() + static_cast<long>(best));
  }
  for (std::size_t i = 0; i < x.n; ++i) {
    r.decisions[i].score = first_scores[i];
    r.decisions[i].kept = std::find(selected.begin(), selected.end(), i) != selected.end();
    if (!r.decisions[i].kept) r.decisions[i].reason = "not selected by repeated Krum";
  }
  std::sort(selected.begin(), selected.end());
  // Coordinate-wise trimmed mean over the selected rows.
  std::vector<float> sel(selected.size() * x.d);
  for (std::size_t k = 0; k < selected.size(); ++k) {
    std::copy_n(x.data + selected[k] * x.d, x.d, sel.begin() + static_cast<long>(k * x.d));
  }
  trimmed_into({sel.data(), selected.size(), x.d}, f, r.aggregate);
  return r;
}

namespace {

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  const std::size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double hi = v[mid];
  if (v.size() % 2) return hi;
  return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)));
}

// The automatic radius is this fraction of the median distance. Measured (docs/robust.md,
// `xsilo bench attacks`): at 1, 4 attackers of 10 pull the centre away on breast cancer
// (sign flip x20: 20.6 %), and with the rejection in front, 4 updates as far out as the
// farthest honest one (model replacement: not rejected) take digits at Dirichlet 1.0 from 56
// to 0.7 %; at 0.5 with 10 iterations the rule holds them and loses nothing clean; smaller
// fractions only need more iterations to get as far.
constexpr double kAutoRadius = 0.5;

// Each input's alignment with the last committed step (the cosine of the angle between them),
// and which inputs point against the majority's side of it. The median's sign says which side
// the majority is on, so a step that attackers pulled backwards turns the test instead of
// turning it on the honest inputs; but only a clear median (at least kOpposeClearMedian away
// from 0) says so: when honest updates scatter around 0 (near convergence) a minority at -0.01
// could otherwise tip the median below 0 and have the honest majority opposed. An input is
// opposed when its alignment on the majority's side is below -max(oppose |m|,
// kOpposeMinCosine): clearly backwards, never merely orthogonal. Fewer than 3 inputs have no
// majority to speak of. Alignments are reported whenever a step was there to compare with.
// On the same clear side, an input lags when its alignment is behind the median's by more than
// max(lag x spread, kLagFloor, kLagNoise / sqrt(d)), the spread measured like the balances'
// (the closest half and one more): label flippers are near orthogonal to a step the honest
// majority leans with, not backwards, so only their distance behind the majority gives them
// away.
struct Opposition {
  std::vector<double> alignment;
  std::vector<bool> opposed;  // empty: the test did not run (see `off`)
  std::vector<bool> lagging;  // empty: the lag test did not run (off, or see `off`)
  double median = 0, below = 0, lag_beyond = 0;
  std::string off;  // why nothing was opposed, when alignments were measured
};

Opposition opposition(MatrixView x, std::span<const float> step, double oppose, double lag) {
  Opposition o;
  if ((oppose <= 0 && lag <= 0) || step.size() != x.d || x.n == 0) return o;
  const double step_norm = l2_norm(step);
  if (!(step_norm > 0) || !std::isfinite(step_norm)) return o;
  o.alignment.resize(x.n);
  for (std::size_t i = 0; i < x.n; ++i) {
    const auto row = x.row(i);
    double dot = 0;
    for (std::size_t k = 0; k < x.d; ++k) dot += double(row[k]) * step[k];
    const double norm = l2_norm(row);
    o.alignment[i] = norm > 0 ? dot / (norm * step_norm) : 0.0;
  }
  o.median = median_of(o.alignment);
  if (x.n < 3) {
    o.off = "fewer than 3 inputs";
    return o;
  }
  if (std::abs(o.median) < kOpposeClearMedian) {
    o.off = "the median alignment is within " + std::to_string(kOpposeClearMedian) + " of 0: no side is clear";
    return o;
  }
  const double side = o.median < 0 ? -1.0 : 1.0;
  if (oppose > 0) {
    o.below = -std::max(oppose * std::abs(o.median), kOpposeMinCosine);
    o.opposed.resize(x.n);
    for (std::size_t i = 0; i < x.n; ++i) o.opposed[i] = side * o.alignment[i] < o.below;
  }
  if (lag > 0) {
    // The spread of the alignments: the distance from the median within which the closest half
    // of the inputs, and one more, lie; so the bound never reaches into that majority.
    std::vector<double> gap(x.n);
    for (std::size_t i = 0; i < x.n; ++i) gap[i] = std::abs(o.alignment[i] - o.median);
    const std::size_t half = x.n / 2;  // the (n/2 + 1)-th closest
    std::nth_element(gap.begin(), gap.begin() + static_cast<std::ptrdiff_t>(half), gap.end());
    const double noise = kLagNoise / std::sqrt(static_cast<double>(x.d));
    o.lag_beyond = std::max({lag * gap[half], kLagFloor, noise});
    o.lagging.resize(x.n);
    for (std::size_t i = 0; i < x.n; ++i) o.lagging[i] = side * (o.alignment[i] - o.median) < -o.lag_beyond;
  }
  return o;
}

// Each input's balance: the share of its coordinates above the coordinate-wise median of the
// inputs, of those where it differs from it. An honest update of a model with many
// coordinates lies above the median about as often as below it (measured: 0.44-0.56 on the
// digits MLP, 0.45-0.55 on digits' logistic regression, clean, Dirichlet 0.3); an update
// shifted against the same side on every coordinate, as "a little is enough" (ALIE: the honest
// mean minus a multiple of each coordinate's spread) is, lies below it almost everywhere
// (balance 0.00 there), however small the shift and however close it stays to the centre. An
// input is one-sided when its balance is farther from the median balance than max(factor x
// the spread, kOneSidedFloor), the spread being the distance from the median within which
// the closest half of the inputs (and one more) lie: so a majority is never left out, and a
// wide honest spread (a small model whose coordinates move together, such as a logistic
// regression on correlated features) widens the bound instead of cutting honest inputs.
// The test does not run on fewer than 3 inputs or fewer than kOneSidedMinCoordinates
// coordinates, where a share of signs is noise.
struct Balance {
  std::vector<double> balance;
  std::vector<bool> one_sided;  // empty: the test did not run (see `off`)
  double median = 0, beyond = 0;
  std::string off;
};

Balance balance(MatrixView x, double factor) {
  Balance b;
  if (factor <= 0 || x.n == 0) return b;
  if (x.n < 3) {
    b.off = "fewer than 3 inputs";
    return b;
  }
  if (x.d < kOneSidedMinCoordinates) {
    b.off = "fewer than " + std::to_string(kOneSidedMinCoordinates) + " coordinates";
    return b;
  }
  std::vector<float> med;
  median_into(x, med);
  std::vector<std::size_t> above(x.n, 0), below(x.n, 0);
  for (std::size_t i = 0; i < x.n; ++i) {
    const auto row = x.row(i);
    for (std::size_t k = 0; k < x.d; ++k) {
      above[i] += row[k] > med[k];
      below[i] += row[k] < med[k];
    }
  }
  b.balance.resize(x.n);
  for (std::size_t i = 0; i < x.n; ++i) {
    const auto differ = above[i] + below[i];
    b.balance[i] = differ ? static_cast<double>(above[i]) / static_cast<double>(differ) : 0.5;
  }
  b.median = median_of(b.balance);
  std::vector<double> gap(x.n);
  for (std::size_t i = 0; i < x.n; ++i) gap[i] = std::abs(b.balance[i] - b.median);
  std::vector<double> sorted_gap = gap;
  const std::size_t half = x.n / 2;  // the (n/2 + 1)-th closest
  std::nth_element(sorted_gap.begin(), sorted_gap.begin() + static_cast<std::ptrdiff_t>(half), sorted_gap.end());
  b.beyond = std::max(factor * sorted_gap[half], kOneSidedFloor);
  b.one_sided.resize(x.n);
  for (std::size_t i = 0; i < x.n; ++i) b.one_sided[i] = gap[i] > b.beyond;
  return b;
}

// The screens ahead of the iterations, recorded in the result: an input against the last step
// or one-sided is out of every iteration, and out of the median distance.
struct Screens {
  Opposition against;
  Balance lean;
  bool lopsided(std::size_t i) const { return !lean.one_sided.empty() && lean.one_sided[i]; }
  bool lags(std::size_t i) const { return !against.lagging.empty() && against.lagging[i]; }
  bool opposed(std::size_t i) const {
    return (!against.opposed.empty() && against.opposed[i]) || lags(i) || lopsided(i);
  }

  // Why input i is out of the last iteration, or bent in it ("": it counted as it was).
  std::string reason(std::size_t i, bool rejected, double scale, double dist, double reject, double median) const {
    if (lopsided(i)) {
      return "one-sided: " + std::to_string(lean.balance[i]) + " of its coordinates above the inputs' median, " +
             "against the median balance " + std::to_string(lean.median) + " (bound +-" + std::to_string(lean.beyond) + ")";
    }
    if (!against.opposed.empty() && against.opposed[i]) {
      return "opposed: alignment " + std::to_string(against.alignment[i]) +
             " with the last committed step, against the median " + std::to_string(against.median);
    }
    if (lags(i)) {
      return "lagging: alignment " + std::to_string(against.alignment[i]) + " with the last committed step, more than " +
             std::to_string(against.lag_beyond) + " behind the median " + std::to_string(against.median);
    }
    if (rejected) {
      return "rejected: " + std::to_string(dist) + " from the centre, more than " + std::to_string(reject) +
             " times the median distance " + std::to_string(median);
    }
    return scale < 1.0 ? "clipped around the centre from distance " + std::to_string(dist) : std::string();
  }
};

Screens screens(MatrixView x, std::span<const float> v0, double oppose, double one_sided, double lag, Result& r) {
  Screens s{opposition(x, v0, oppose, lag), balance(x, one_sided)};
  // Each screen alone keeps a strict majority, but the lag test may cut some inputs and the
  // one-sided test others: the union must keep more than half too, or a minority that sits at
  // both medians decides the round. The later screens stand down until it does.
  const auto left_out = [&] {
    std::size_t k = 0;
    for (std::size_t i = 0; i < x.n; ++i) k += s.opposed(i);
    return k;
  };
  for (auto* screen : {&s.lean.one_sided, &s.against.lagging}) {
    const std::size_t out = left_out();
    if (2 * out < x.n || screen->empty()) continue;
    const char* name = screen == &s.lean.one_sided ? "one-sided" : "lag";
    if (!r.screens_stood_down.empty()) r.screens_stood_down += "; ";
    r.screens_stood_down += std::string("the ") + name + " test: the screens together left out " + std::to_string(out) +
                            " of " + std::to_string(x.n) + " inputs";
    screen->clear();
  }
  if (!s.lean.balance.empty() || !s.lean.off.empty()) {
    r.median_balance = s.lean.median;
    r.one_sided_beyond = s.lean.beyond;
    r.one_sided_off = s.lean.off;
    for (std::size_t i = 0; i < s.lean.balance.size(); ++i) r.decisions[i].balance = s.lean.balance[i];
  }
  if (!s.against.alignment.empty()) {
    r.median_alignment = s.against.median;
    r.opposed_below = s.against.below;
    r.opposition_off = s.against.off;
    r.lagging_beyond = s.against.lag_beyond;
    for (std::size_t i = 0; i < x.n; ++i) r.decisions[i].alignment = s.against.alignment[i];
  }
  return s;
}

}  // namespace

Result centered_clip(MatrixView x, double tau, std::size_t iterations, std::span<const float> v0, double reject,
                     double oppose, double one_sided, double lag) {
  Result r;
  r.decisions.resize(x.n);
  std::vector<double> v(x.d, 0.0);
  if (v0.size() == x.d) std::copy(v0.begin(), v0.end(), v.begin());
  // At 1 or more the input at the median distance always counts, so no iteration is empty.
  if (reject > 0) reject = std::max(reject, 1.0);
  // Inputs against the last step are out of every iteration, and out of the median distance:
  // the rule runs on the others. The majority's side is never opposed, so some always remain.
  const Screens screen = screens(x, v0, oppose, one_sided, lag, r);
  const auto opposed = [&](std::size_t i) { return screen.opposed(i); };
  std::vector<double> dist(x.n), counted_dist;
  std::vector<std::size_t> rejections(x.n, 0);
  const std::size_t rounds = std::max<std::size_t>(1, iterations);
  for (std::size_t it = 0; it < rounds; ++it) {
    counted_dist.clear();
    for (std::size_t i = 0; i < x.n; ++i) {
      const auto row = x.row(i);
      double s = 0;
      for (std::size_t k = 0; k < x.d; ++k) {
        const double diff = row[k] - v[k];
        s += diff * diff;
      }
      dist[i] = std::sqrt(s);
      if (!opposed(i)) counted_dist.push_back(dist[i]);
    }
    // Both thresholds in the units of this round's inputs: while more than half of the inputs
    // are honest, the median distance to the centre is an honest input's however far the others
    // are, and scaling every input (and the centre) scales it alike. A median distance of 0
    // (most inputs at the centre) gives no scale to reject by.
    const double median_distance = median_of(counted_dist);
    const double radius = tau > 0 ? tau : kAutoRadius * median_distance;
    const double far = reject > 0 && median_distance > 0 ? reject * median_distance
                                                         : std::numeric_limits<double>::infinity();
    const bool last = it + 1 == rounds;
    if (last) {
      r.radius = radius;
      r.rejected_beyond = std::isfinite(far) ? far : 0;
    }
    std::vector<double> step(x.d, 0.0);
    std::size_t counted = 0;
    for (std::size_t i = 0; i < x.n; ++i) {
      const bool rejected = opposed(i) || dist[i] > far;
      const double scale = rejected ? 0.0 : dist[i] > radius ? radius / dist[i] : 1.0;
      if (rejected) ++rejections[i];
      if (last) {
        r.decisions[i].score = dist[i];
        r.decisions[i].reason = screen.reason(i, rejected, scale, dist[i], reject, median_distance);
      }
      if (rejected) continue;
      ++counted;
      const auto row = x.row(i);
      for (std::size_t k = 0; k < x.d; ++k) step[k] += (row[k] - v[k]) * scale;
    }
    // The mean over the inputs that count: a rejected input is out of this iteration, not a zero.
    if (counted == 0) break;  // no inputs (check() refuses that before)
    for (std::size_t k = 0; k < x.d; ++k) v[k] += step[k] / static_cast<double>(counted);
  }
  // Left out only if it counted in no iteration; an input that pulled in some iterations and
  // was rejected in others is kept, and its reason says how often it was out.
  for (std::size_t i = 0; i < x.n; ++i) {
    auto& dec = r.decisions[i];
    dec.kept = rejections[i] < rounds;
    if (rejections[i] > 0 && rejections[i] < rounds) {  // never an opposed input: out of all of them
      const std::string last = dec.reason.empty() ? "within the radius in the last" : dec.reason + " in the last";
      dec.reason = "rejected in " + std::to_string(rejections[i]) + " of " + std::to_string(rounds) +
                   " iterations (beyond " + std::to_string(reject) + " median distances); " + last;
    }
  }
  r.aggregate.assign(v.begin(), v.end());
  return r;
}

}  // namespace xsilo::robust
