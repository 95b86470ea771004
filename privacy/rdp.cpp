#include "privacy/rdp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <sstream>
#include <stdexcept>
#include <string>

#include "privacy/detail.h"

namespace xsilo::privacy {
namespace {

using detail::fail;
using detail::kInf;

void check_positive(const char* what, double v) {
  if (!(std::isfinite(v) && v > 0)) fail(std::string(what) + " must be a finite number > 0", v);
}

void check_order(double alpha) {
  if (!(std::isfinite(alpha) && alpha > 1)) fail("an RDP order alpha must be a finite number > 1", alpha);
}

void check_gaussian(double q, double sigma) {
  if (!(q > 0 && q <= 1)) fail("the sample rate q must be in (0, 1]", q);
  check_positive("the noise multiplier sigma", sigma);
}

// log(exp(a) + exp(b)) without overflow; -inf stands for 0.
double log_add(double a, double b) {
  if (a < b) std::swap(a, b);
  if (b == -kInf) return a;
  return a + std::log1p(std::exp(b - a));
}

// log(erfc(x)), accurate where erfc(x) underflows: past x = 25 the asymptotic series
// erfc(x) = exp(-x^2) / (x sqrt(pi)) (1 - 1/(2x^2) + 3/(4x^4) - 15/(8x^6) + 105/(16x^8) - ...),
// whose next term is below 1e-12 there.
double log_erfc(double x) {
  if (x < 25) return std::log(std::erfc(x));
  const double z = 1 / (x * x);
  return -x * x - std::log(x) - 0.5 * std::log(std::numbers::pi) +
         std::log1p(z * (-0.5 + z * (0.75 + z * (-1.875 + z * 6.5625))));
}

// log |C(alpha, k)| for real alpha (lgamma of a negative non-integer is log |Gamma|).
double log_binomial(double alpha, double k) {
  return std::lgamma(alpha + 1) - std::lgamma(k + 1) - std::lgamma(alpha - k + 1);
}

// log A_alpha for an integer order: every term of the binomial sum is positive.
double log_a_integer(double q, double sigma, std::uint64_t alpha) {
  const double log_q = std::log(q), log_1mq = std::log1p(-q), two_s2 = 2 * sigma * sigma;
  double log_a = -kInf;
  for (std::uint64_t k = 0; k <= alpha; ++k) {
    const double kd = static_cast<double>(k);
    const double term = log_binomial(static_cast<double>(alpha), kd) + kd * log_q +
                        static_cast<double>(alpha - k) * log_1mq + (kd * kd - kd) / two_s2;
    log_a = log_add(log_a, term);
  }
  return log_a;
}

// log A_alpha for a fractional order: the two parts of the paper's series (the integrals below
// and above z0), summed over |C(alpha, i)| until both parts' terms decrease and fall below
// e^-30 of the total. +inf when 1000 terms did not get there.
double log_a_fractional(double q, double sigma, double alpha) {
  constexpr int kMaxTerms = 1000;
  const double log_q = std::log(q), log_1mq = std::log1p(-q), two_s2 = 2 * sigma * sigma;
  const double z0 = sigma * sigma * std::log(1 / q - 1) + 0.5;
  const double scale = std::sqrt(2.0) * sigma, log_half = std::log(0.5);
  double log_a0 = -kInf, log_a1 = -kInf, last_s0 = -kInf, last_s1 = -kInf;
  for (int n = 0; n < kMaxTerms; ++n) {
    const double i = n, j = alpha - i, log_coef = log_binomial(alpha, i);
    const double s0 = log_coef + i * log_q + j * log_1mq + (i * i - i) / two_s2 + log_half +
                      log_erfc((i - z0) / scale);
    const double s1 = log_coef + j * log_q + i * log_1mq + (j * j - j) / two_s2 + log_half +
                      log_erfc((z0 - j) / scale);
    log_a0 = log_add(log_a0, s0);
    log_a1 = log_add(log_a1, s1);
    const double total = log_add(log_a0, log_a1);
    if (s0 < last_s0 && s1 < last_s1 && std::max(s0, s1) < total - 30) return total;
    last_s0 = s0;
    last_s1 = s1;
  }
  return kInf;
}

// The Skellam and discrete Gaussian bounds are stated at integer orders.
double integer_order(double alpha) { return std::ceil(alpha); }

}  // namespace

std::string_view name(const Mechanism& m) {
  switch (m.index()) {
    case 0: return "subsampled_gaussian";
    case 1: return "skellam_sum";
    default: return "discrete_gaussian_sum";
  }
}

void validate(const Mechanism& m) {
  if (const auto* g = std::get_if<SubsampledGaussian>(&m)) {
    check_gaussian(g->q, g->sigma);
  } else if (const auto* s = std::get_if<SkellamSum>(&m)) {
    check_positive("the Skellam sum's L1 sensitivity", s->l1);
    check_positive("the Skellam sum's L2 sensitivity", s->l2);
    check_positive("the Skellam sum's variance", s->variance);
  } else {
    const auto& d = std::get<DiscreteGaussianSum>(m);
    check_positive("the discrete Gaussian sum's L1 sensitivity", d.l1);
    check_positive("the discrete Gaussian sum's L2 sensitivity", d.l2);
    check_positive("the discrete Gaussian sum's sigma", d.sigma);
    if (d.silos == 0) fail("the discrete Gaussian sum needs at least one silo", 0);
    if (d.dim == 0) fail("the discrete Gaussian sum needs at least one coordinate", 0);
  }
}

double rdp_subsampled_gaussian(double q, double sigma, double alpha) {
  check_gaussian(q, sigma);
  check_order(alpha);
  if (q == 1) return alpha / (2 * sigma * sigma);
  const double log_a = std::floor(alpha) == alpha
                           ? log_a_integer(q, sigma, static_cast<std::uint64_t>(alpha))
                           : log_a_fractional(q, sigma, alpha);
  // A_alpha >= 1; a rounding error below that is no privacy loss of its own.
  return std::max(0.0, log_a / (alpha - 1));
}

double rdp_skellam_sum(const SkellamSum& m, double alpha) {
  validate(m);
  check_order(alpha);
  const double a = integer_order(alpha), d1 = m.l1, d2sq = m.l2 * m.l2, mu = m.variance;
  return a * d2sq / (2 * mu) + std::min(((2 * a - 1) * d2sq + 6 * d1) / (4 * mu * mu), 3 * d1 / (2 * mu));
}

double discrete_gaussian_tau(double sigma, std::uint64_t silos) {
  check_positive("the discrete Gaussian sum's sigma", sigma);
  const double c = 2 * std::numbers::pi * std::numbers::pi * sigma * sigma;
  double tau = 0;
  for (std::uint64_t k = 1; k < silos; ++k) {
    const double kd = static_cast<double>(k);
    tau += std::exp(-c * kd / (kd + 1));
  }
  return 10 * tau;
}

double rdp_discrete_gaussian_sum(const DiscreteGaussianSum& m, double alpha) {
  validate(m);
  check_order(alpha);
  // One silo: the discrete Gaussian's concentrated DP, valid at every real order.
  const double a = m.silos == 1 ? alpha : integer_order(alpha);
  const double tau = discrete_gaussian_tau(m.sigma, m.silos);
  const double n = static_cast<double>(m.silos), dim = static_cast<double>(m.dim);
  const double scale = std::sqrt(n) * m.sigma;  // the standard deviation of the summed noise
  const double l2s = m.l2 / scale, l1s = m.l1 / scale;
  const double t1 = a / 2 * l2s * l2s + tau * dim;
  const double t2 = a / 2 * (l2s * l2s + 2 * l1s * tau + tau * tau * dim);
  const double t3 = a / 2 * std::pow(l2s + tau * std::sqrt(dim), 2);
  return std::min({t1, t2, t3});
}

double rdp(const Mechanism& m, double alpha) {
  if (const auto* g = std::get_if<SubsampledGaussian>(&m)) return rdp_subsampled_gaussian(g->q, g->sigma, alpha);
  if (const auto* s = std::get_if<SkellamSum>(&m)) return rdp_skellam_sum(*s, alpha);
  return rdp_discrete_gaussian_sum(std::get<DiscreteGaussianSum>(m), alpha);
}

}  // namespace xsilo::privacy
