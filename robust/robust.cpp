#include "robust/robust.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <mutex>
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

// Calls fn(column values, count, coordinate) for every coordinate, with the n values of a
// coordinate contiguous in a scratch buffer (blocked transpose: rows are read sequentially).
template <class Fn>
void for_each_column(MatrixView x, Fn fn) {
  constexpr std::size_t kBlock = 512;
  parallel_ranges((x.d + kBlock - 1) / kBlock, 8, [&](std::size_t b0, std::size_t b1) {
    std::vector<float> cols(kBlock * x.n);
    for (std::size_t blk = b0; blk < b1; ++blk) {
      const std::size_t j0 = blk * kBlock, w = std::min(kBlock, x.d - j0);
      for (std::size_t i = 0; i < x.n; ++i) {
        const float* src = x.data + i * x.d + j0;
        for (std::size_t c = 0; c < w; ++c) cols[c * x.n + i] = src[c];
      }
      for (std::size_t c = 0; c < w; ++c) fn(cols.data() + c * x.n, x.n, j0 + c);
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

// Mean of the values left after dropping the b smallest and b largest (values is scratch).
float trimmed(float* values, std::size_t n, std::size_t b) {
  if (b == 0) {
    double s = 0;
    for (std::size_t i = 0; i < n; ++i) s += values[i];
    return static_cast<float>(s / static_cast<double>(n));
  }
  std::nth_element(values, values + b, values + n);                 // b smallest before b
  std::nth_element(values + b, values + (n - b), values + n);       // b largest after n-b
  double s = 0;
  for (std::size_t i = b; i < n - b; ++i) s += values[i];
  return static_cast<float>(s / static_cast<double>(n - 2 * b));
}

}  // namespace

std::string check_krum(std::size_t n, std::size_t f) {
  if (n > 2 * f + 2) return "";
  return "Krum needs n > 2f + 2: n = " + std::to_string(n) + ", f = " + std::to_string(f);
}

std::string check_multi_krum(std::size_t n, std::size_t f, std::size_t m) {
  if (auto s = check_krum(n, f); !s.empty()) return "Multi-" + s;
  if (m == 0 || m > n) return "Multi-Krum needs 1 <= m <= n: m = " + std::to_string(m) + ", n = " + std::to_string(n);
  return "";
}

std::string check_trimmed_mean(std::size_t n, std::size_t b) {
  if (n > 2 * b) return "";
  return "trimmed mean needs n > 2b: n = " + std::to_string(n) + ", b = " + std::to_string(b);
}

std::string check_bulyan(std::size_t n, std::size_t f) {
  if (n >= 4 * f + 3) return "";
  return "Bulyan needs n >= 4f + 3: n = " + std::to_string(n) + ", f = " + std::to_string(f);
}

std::vector<std::size_t> finite_rows(MatrixView x) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < x.n; ++i) {
    const auto r = x.row(i);
    if (std::all_of(r.begin(), r.end(), [](float v) { return std::isfinite(v); })) out.push_back(i);
  }
  return out;
}

std::vector<Decision> clip_l2(std::span<float> rows, std::size_t n, std::size_t d, double c) {
  std::vector<Decision> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    auto r = rows.subspan(i * d, d);
    const double norm = std::sqrt(sq_norm(r));
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

Result median(MatrixView x) {
  Result r;
  r.decisions.resize(x.n);
  r.aggregate.assign(x.d, 0.0f);
  const std::size_t n = x.n, h = n / 2;
  for_each_column(x, [&](float* v, std::size_t, std::size_t j) {
    std::nth_element(v, v + h, v + n);
    if (n % 2) {
      r.aggregate[j] = v[h];
    } else {
      const float lo = *std::max_element(v, v + h);
      r.aggregate[j] = static_cast<float>((static_cast<double>(lo) + v[h]) / 2.0);
    }
  });
  score_by_distance(x, r);
  return r;
}

Result trimmed_mean(MatrixView x, std::size_t b) {
  Result r;
  r.decisions.resize(x.n);
  r.aggregate.assign(x.d, 0.0f);
  for_each_column(x, [&](float* v, std::size_t n, std::size_t j) { r.aggregate[j] = trimmed(v, n, b); });
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
  const MatrixView sx{sel.data(), selected.size(), x.d};
  r.aggregate.assign(x.d, 0.0f);
  for_each_column(sx, [&](float* v, std::size_t n, std::size_t j) { r.aggregate[j] = trimmed(v, n, f); });
  return r;
}

Result centered_clip(MatrixView x, double tau, std::size_t iterations, std::span<const float> v0) {
  Result r;
  r.decisions.resize(x.n);
  std::vector<double> v(x.d, 0.0);
  if (!v0.empty()) std::copy(v0.begin(), v0.end(), v.begin());
  for (std::size_t it = 0; it < std::max<std::size_t>(1, iterations); ++it) {
    std::vector<double> step(x.d, 0.0);
    for (std::size_t i = 0; i < x.n; ++i) {
      const auto row = x.row(i);
      double s = 0;
      for (std::size_t k = 0; k < x.d; ++k) {
        const double diff = row[k] - v[k];
        s += diff * diff;
      }
      const double norm = std::sqrt(s);
      const double scale = norm > tau ? tau / norm : 1.0;
      if (it == 0) {
        r.decisions[i].score = norm;
        if (scale < 1.0) r.decisions[i].reason = "clipped around the centre from distance " + std::to_string(norm);
      }
      for (std::size_t k = 0; k < x.d; ++k) step[k] += (row[k] - v[k]) * scale;
    }
    for (std::size_t k = 0; k < x.d; ++k) v[k] += step[k] / static_cast<double>(x.n);
  }
  r.aggregate.assign(v.begin(), v.end());
  return r;
}

}  // namespace xsilo::robust
