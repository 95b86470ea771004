// Rényi differential privacy (RDP) of the mechanisms xsilo runs, one curve per mechanism: the
// function alpha -> eps(alpha) such that the mechanism is (alpha, eps(alpha))-RDP (Mironov 2017:
// the Rényi divergence of order alpha between the outputs on neighbouring inputs is at most
// eps(alpha)). RDP composes by addition at each order; accountant.h does the composition and the
// conversion to (epsilon, delta).
//
// Neighbouring datasets differ by adding or removing one record (record level) or one silo's
// update (silo level); sensitivities below are for that relation.
//
// SubsampledGaussian{q, sigma}: each record joins a step's batch independently with probability
//   q (Poisson sampling), the clipped sum (L2 sensitivity 1) gets N(0, sigma^2 I).
//   Mironov, Talwar, Zhang 2019, "Rényi Differential Privacy of the Sampled Gaussian Mechanism"
//   (arXiv:1908.10530), Section 3.3: eps(alpha) = log(A_alpha) / (alpha - 1), where
//     integer alpha:    A_alpha = sum_{k=0..alpha} C(alpha, k) (1 - q)^(alpha - k) q^k
//                                   exp((k^2 - k) / (2 sigma^2))
//                       (exact; summed in log space, every term positive);
//     fractional alpha: A_alpha = A0 + A1 with z0 = sigma^2 log(1/q - 1) + 1/2 and, over i >= 0,
//                         A0 = sum_i |C(alpha, i)| q^i (1 - q)^(alpha - i)
//                                  exp((i^2 - i) / (2 sigma^2)) erfc((i - z0) / (sqrt(2) sigma)) / 2
//                         A1 = sum_i |C(alpha, i)| q^(alpha - i) (1 - q)^i
//                                  exp((j^2 - j) / (2 sigma^2)) erfc((z0 - j) / (sqrt(2) sigma)) / 2,
//                         j = alpha - i.
//                       The paper's series has signed coefficients C(alpha, i) (negative in turn
//                       for i > alpha); the sum of their absolute values is an upper bound
//                       without cancellation, which is what dp-accounting (0.4.4 and later) sums.
//                       The series stops when both parts' terms are decreasing and below
//                       e^-30 of the total; a series that has not stopped after 1000 terms
//                       gives +infinity (the order is left out of the conversion), as in
//                       dp-accounting. Opacus subtracts the negative terms instead and sums
//                       on until a term is below e^-30: at fractional orders its value can be
//                       lower than ours, never higher (docs/privacy.md says by how much).
//     q = 1:            the Gaussian mechanism, eps(alpha) = alpha / (2 sigma^2).
// SkellamSum{l1, l2, variance}: each silo adds symmetric Skellam noise to its update scaled and
//   rounded to integers; the sum carries Skellam noise of total variance mu = `variance`.
//   Sensitivities l1 (Delta_1) and l2 (Delta_2) are of the sum in the same integer units.
//   Agarwal, Kairouz, Liu 2021, "The Skellam Mechanism for Differentially Private Federated
//   Learning" (NeurIPS, arXiv:2110.04995), the RDP bound of the multidimensional Skellam
//   mechanism (Section 3):
//     eps(alpha) = alpha Delta_2^2 / (2 mu)
//                  + min(((2 alpha - 1) Delta_2^2 + 6 Delta_1) / (4 mu^2), 3 Delta_1 / (2 mu)).
//   The authors' accounting code (google-research/federated, distributed_dp/accounting_utils.py,
//   _skellam_rdp, there in unscaled units) evaluates it at integer orders only; at a fractional
//   order we take the value at ceil(alpha): Rényi divergence does not decrease with the order,
//   so that is an upper bound however the theorem's orders are read.
// DiscreteGaussianSum{l1, l2, sigma, silos, dim}: each of n = `silos` silos adds discrete
//   Gaussian noise N_Z(0, sigma^2) to each of the dim integer coordinates of its update; the sum
//   carries the sum of n discrete Gaussians, close to but not exactly N_Z(0, n sigma^2).
//   Kairouz, Liu, Steinke 2021, "The Distributed Discrete Gaussian Mechanism for Federated
//   Learning with Secure Aggregation" (ICML, arXiv:2102.06387), Theorem 1 and Proposition 14:
//   with tau = 10 sum_{k=1..n-1} exp(-2 pi^2 sigma^2 k / (k + 1)) (0 for one silo: then this is
//   the discrete Gaussian of Canonne, Kamath, Steinke 2020, Proposition 5),
//     eps(alpha) = min( alpha Delta_2^2 / (2 n sigma^2) + tau dim,
//                       alpha/2 (Delta_2^2 / (n sigma^2) + 2 Delta_1 tau / (sqrt(n) sigma)
//                                + tau^2 dim),
//                       alpha/2 (Delta_2 / (sqrt(n) sigma) + tau sqrt(dim))^2 ).
//   The authors' accounting code (google-research/federated, distributed_dp/accounting_utils.py)
//   computes the same three terms, at integer orders; at a fractional order we take the value
//   at ceil(alpha), as for Skellam. With one silo the three terms are all alpha Delta_2^2 /
//   (2 sigma^2), the discrete Gaussian's concentrated DP, which holds at every real order (CKS
//   2020, Proposition 5: rho = Delta_2^2 / (2 sigma^2)); that case is not rounded.
// Skellam and discrete Gaussian sums are curves for a step in which every silo takes part
// (xsilo's silo level: no subsampling amplification is claimed for them).
//
// Every function throws std::invalid_argument, with a sentence naming the parameter, on a
// parameter out of range or NaN: q outside (0, 1], sigma, variance or a sensitivity <= 0 or not
// finite, silos or dim 0, alpha <= 1 or not finite.
#pragma once

#include <cstdint>
#include <string_view>
#include <variant>

namespace xsilo::privacy {

// A step of DP-SGD (or of any Poisson-subsampled clipped sum with Gaussian noise): sample rate
// q in (0, 1], noise multiplier sigma (noise standard deviation over the L2 clip norm).
struct SubsampledGaussian {
  double q = 1;
  double sigma = 1;
  bool operator==(const SubsampledGaussian&) const = default;
};

// A secure sum with Skellam noise, in the integer units of the ring: L1 and L2 sensitivity of
// the sum, the total Skellam variance of the sum's noise.
struct SkellamSum {
  double l1 = 1;
  double l2 = 1;
  double variance = 1;
  bool operator==(const SkellamSum&) const = default;
};

// A secure sum with discrete Gaussian noise, in integer units: L1 and L2 sensitivity of the sum,
// each silo's noise scale sigma, the number of silos whose noise the sum carries (the minimum
// survivors), the number of coordinates.
struct DiscreteGaussianSum {
  double l1 = 1;
  double l2 = 1;
  double sigma = 1;
  std::uint64_t silos = 1;
  std::uint64_t dim = 1;
  bool operator==(const DiscreteGaussianSum&) const = default;
};

using Mechanism = std::variant<SubsampledGaussian, SkellamSum, DiscreteGaussianSum>;

// "subsampled_gaussian", "skellam_sum", "discrete_gaussian_sum": the names callers store.
std::string_view name(const Mechanism& m);

// Throws std::invalid_argument when a parameter is out of range (see the top of this file).
void validate(const Mechanism& m);

// eps(alpha) of one step, as defined above; may be +infinity (see the fractional series).
double rdp_subsampled_gaussian(double q, double sigma, double alpha);
double rdp_skellam_sum(const SkellamSum& m, double alpha);
double rdp_discrete_gaussian_sum(const DiscreteGaussianSum& m, double alpha);
double rdp(const Mechanism& m, double alpha);

// The tau of Kairouz, Liu, Steinke (Theorem 1) for n silos with noise scale sigma each.
double discrete_gaussian_tau(double sigma, std::uint64_t silos);

}  // namespace xsilo::privacy
