#include "crypto/secagg_graph.h"

#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "crypto/hash.h"
#include "crypto/sign.h"

namespace xsilo::crypto::secagg {

Graph::Graph(std::size_t n, std::uint32_t degree, std::string_view seed) : n_(n) {
  half_ = (degree == 0 || std::size_t{degree} + 1 >= n) ? 0 : degree / 2;
  if (complete()) return;
  // The ring's order: a Fisher-Yates shuffle driven by a keystream from the seed (libsodium's
  // ChaCha20 generator), so every party that knows the seed draws the same graph.
  ensure_sodium();
  const Digest key = sha256("xsilo-secagg-graph/" + std::string(seed));
  std::vector<std::uint64_t> draws(n);
  randombytes_buf_deterministic(draws.data(), draws.size() * sizeof(std::uint64_t), key.data());
  member_.resize(n);
  for (std::size_t i = 0; i < n; ++i) member_[i] = static_cast<std::uint32_t>(i + 1);
  for (std::size_t i = n - 1; i > 0; --i) std::swap(member_[i], member_[draws[i] % (i + 1)]);
  place_.resize(n);
  for (std::size_t pos = 0; pos < n; ++pos) place_[member_[pos] - 1] = static_cast<std::uint32_t>(pos);
}

bool Graph::adjacent(std::uint32_t a, std::uint32_t b) const {
  if (a == b || a == 0 || b == 0 || a > n_ || b > n_) return false;
  if (complete()) return true;
  const std::size_t pa = place_[a - 1], pb = place_[b - 1];
  const std::size_t d = pa > pb ? pa - pb : pb - pa;
  return std::min(d, n_ - d) <= half_;
}

std::vector<std::uint32_t> Graph::neighbours(std::uint32_t a) const {
  std::vector<std::uint32_t> out;
  if (a == 0 || a > n_) return out;
  if (complete()) {
    for (std::uint32_t m = 1; m <= n_; ++m) {
      if (m != a) out.push_back(m);
    }
    return out;
  }
  const std::size_t p = place_[a - 1];
  for (std::size_t d = 1; d <= half_; ++d) {
    out.push_back(member_[(p + d) % n_]);
    out.push_back(member_[(p + n_ - d) % n_]);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool Graph::connected(const std::vector<std::uint32_t>& members) const {
  if (complete() || members.size() <= 1) return true;
  std::vector<char> present(n_, 0), seen(n_, 0);
  for (auto m : members) {
    if (m == 0 || m > n_) return false;
    present[place_[m - 1]] = 1;
  }
  std::vector<std::size_t> todo{place_[members.front() - 1]};
  seen[todo.front()] = 1;
  std::size_t reached = 1;
  while (!todo.empty()) {
    const std::size_t p = todo.back();
    todo.pop_back();
    for (std::size_t d = 1; d <= half_; ++d) {
      for (const std::size_t q : {(p + d) % n_, (p + n_ - d) % n_}) {
        if (present[q] && !seen[q]) {
          seen[q] = 1;
          ++reached;
          todo.push_back(q);
        }
      }
    }
  }
  return reached == members.size();
}

double binomial_tail(std::uint32_t trials, double p, std::uint32_t k) {
  if (k == 0) return 1;
  if (k > trials || p <= 0) return 0;
  if (p >= 1) return 1;
  double sum = 0;
  const double log_n = std::lgamma(trials + 1.0), lp = std::log(p), lq = std::log1p(-p);
  for (std::uint32_t i = k; i <= trials; ++i) {
    sum += std::exp(log_n - std::lgamma(i + 1.0) - std::lgamma(trials - i + 1.0) + i * lp + (trials - i) * lq);
  }
  return std::min(1.0, sum);
}

std::uint32_t corrupt_count(std::size_t n, double corrupt) {
  return corrupt <= 0 ? 0 : static_cast<std::uint32_t>(std::ceil(corrupt * static_cast<double>(n) - 1e-9));
}

std::uint32_t split_safe_threshold(std::uint32_t k, std::uint32_t corrupt) { return (k + 1 + corrupt) / 2 + 1; }

GraphPlan plan_graph(std::size_t n, double dropout, double corrupt, double eta_bits) {
  const double max_unavailable = std::exp2(-eta_bits);
  const double nn = static_cast<double>(n);
  const std::uint32_t c = corrupt_count(n, corrupt);
  for (std::uint32_t k = 2; std::size_t{k} + 1 < n; k += 2) {
    // Whatever graph a deviating server draws: t > (k + 1 + c) / 2, so that no two survivor
    // sets, with the c colluders among a secret's holders answering both, gather t shares of it
    // each (crypto/secagg.h). k > c follows from t <= k + 1.
    const std::uint32_t t_min = split_safe_threshold(k, c);
    if (t_min > k + 1) continue;
    const double run = k / 2.0;
    // The survivors split into pieces only when two disjoint windows of k / 2 ring positions are
    // all dropped (n^2 pairs of windows at most); members refuse to unmask then.
    const double split_dropped = nn * nn * std::pow(dropout, 2 * run);
    // The largest t that every secret still finds among its live holders: a dropped member's
    // k neighbours, each live with probability 1 - dropout (a survivor also holds its own).
    std::uint32_t t = 0;
    double lacking = 1;
    for (std::uint32_t cand = k + 1; cand >= t_min; --cand) {
      lacking = nn * binomial_tail(k, dropout, k - cand + 1);  // P[live < cand] = P[dropped > k - cand]
      if (lacking + split_dropped <= max_unavailable) {
        t = cand;
        break;
      }
    }
    if (t == 0) continue;
    // Privacy does not rest on the draw: with at most c corrupt members, t and the members'
    // checks hold for every graph a server could choose (docs/security.md, "Neighbour graphs").
    return {k, t, c, std::min(1.0, lacking + split_dropped)};
  }
  return {};
}

}  // namespace xsilo::crypto::secagg
