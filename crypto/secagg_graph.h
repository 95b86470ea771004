// SecAgg+ neighbour graphs (Bell et al., CCS 2020). In the complete graph every member of a
// secure group shares keys and pairwise masks with every other, so a member masks with n - 1
// seeds and the server's unmasking needs (dropped x survivors) of them. In SecAgg+ each member
// deals its secrets only to its k neighbours in a k-regular graph drawn from a seed, and masks
// only with them: both costs grow with k, not n.
//
// The graph is a Harary graph H(n, k), k even: the members stand on a ring in an order drawn
// from the seed, and each is joined to the k / 2 nearest on either side. It is k-connected;
// removing members splits it only where k / 2 consecutive ones on the ring are gone, twice.
//
// plan_graph() chooses k and the threshold t (shares of k + 1 holders, the owner's included)
// for a group of n with a dropout rate and a fraction of silos that may collude with a server
// that deviates from the protocol (c = ceil(corrupt x n) of them), so that
//   - privacy holds for EVERY graph, whichever seed a server draws or grinds: t > (k + 1 + c) / 2,
//     so two survivor sets shown to two sides of a member (a split view), with the c colluders
//     answering both, cannot each gather t shares of one of its secrets (crypto/secagg.h says
//     why this also keeps a member whose honest neighbours are claimed dropped safe);
//   - a round fails (a secret with fewer than t live holders, or the survivors' graph split,
//     which members refuse to unmask) with probability at most 2^-eta_bits, a union bound over
//     the members with dropouts independent per member.
// More than half of every secret's holders must then survive a round: a graph smaller than the
// complete one exists only where the dropout rate leaves room for that (docs/security.md,
// "Neighbour graphs", has the table).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace xsilo::crypto::secagg {

class Graph {
 public:
  Graph() = default;
  // Members are 1..n (Params::index_of). degree 0, or n - 1 and more: the complete graph.
  // Otherwise degree must be even (check_params says so; the constructor rounds it down).
  Graph(std::size_t n, std::uint32_t degree, std::string_view seed);

  bool complete() const { return half_ == 0; }
  std::size_t size() const { return n_; }
  std::uint32_t degree() const { return complete() ? static_cast<std::uint32_t>(n_ ? n_ - 1 : 0) : 2 * half_; }
  bool adjacent(std::uint32_t a, std::uint32_t b) const;  // two different members
  std::vector<std::uint32_t> neighbours(std::uint32_t a) const;  // sorted, a itself excluded
  // Whether these members (no duplicates) form one connected piece of the graph.
  bool connected(const std::vector<std::uint32_t>& members) const;

 private:
  std::size_t n_ = 0;
  std::uint32_t half_ = 0;             // k / 2; 0 for the complete graph
  std::vector<std::uint32_t> place_;   // member - 1 -> position on the ring
  std::vector<std::uint32_t> member_;  // position -> member (1-based)
};

struct GraphPlan {
  std::uint32_t degree = 0;     // 0: no graph smaller than the complete one meets the bounds
  std::uint32_t threshold = 0;  // of the k + 1 holders of each secret
  std::uint32_t corrupt = 0;    // c: the colluders it is safe against, whatever the graph
  double p_unavailable = 0;     // the bound on a round failing
};

// Per group and round: a round of G groups has G times this, and a run adds them up over its
// rounds (docs/security.md, "Neighbour graphs").
inline constexpr double kGraphEtaBits = 20;  // availability: 2^-20

// c = ceil(corrupt x n), the colluders assumed among n (0 for corrupt 0).
std::uint32_t corrupt_count(std::size_t n, double corrupt);
// The smallest threshold for which no split view of k + 1 holders with c colluders gathers t
// shares on both sides: floor((k + 1 + c) / 2) + 1.
std::uint32_t split_safe_threshold(std::uint32_t k, std::uint32_t corrupt);

// The smallest even k (and, for it, the largest t) meeting both conditions; degree 0 when none
// below n - 1 does. dropout and corrupt are fractions in [0, 1).
GraphPlan plan_graph(std::size_t n, double dropout, double corrupt, double eta_bits = kGraphEtaBits);

// P[Binomial(trials, p) >= k] (for the bounds above and their tests).
double binomial_tail(std::uint32_t trials, double p, std::uint32_t k);

}  // namespace xsilo::crypto::secagg
