// The privacy accountant: composes the RDP curves of rdp.h over a fixed list of orders and turns
// the total into (epsilon, delta)-DP. One accountant serves the silo's record-level budget (DP-SGD
// steps) and the federation's silo-level noise (Skellam or discrete Gaussian sums).
//
// Composition (Mironov 2017, Proposition 1): running mechanisms with curves eps_1, eps_2, ... in
//   sequence (adaptively) is (alpha, sum_i eps_i(alpha))-RDP at every order alpha; a step run T
//   times contributes T eps(alpha).
// Conversion to (epsilon, delta) (Balle, Barthe, Gaboardi, Hsu, Sato 2020, "Hypothesis testing
//   interpretations and Renyi differential privacy", Theorem 21; Canonne, Kamath, Steinke 2020,
//   Proposition 12): (alpha, r)-RDP implies (epsilon, delta)-DP for
//     epsilon(alpha) = r + log(1 - 1/alpha) - (log(delta) + log(alpha)) / (alpha - 1),
//   and epsilon is the smallest epsilon(alpha) over the orders, its order reported with it. As in
//   dp-accounting: orders at or below 1.01 are not used (the bound is unstable there), an order
//   with delta^2 > 1 - exp(-r) gives epsilon 0 (delta >= sqrt(1 - exp(-KL)) bounds the total
//   variation distance), and epsilon is never below 0. Opacus's get_privacy_spent uses the same
//   formula without those two guards; on its orders (1.1 and up) and at delta 1e-5 they change
//   nothing but epsilons near 0.
// Orders: default_orders() is dp-accounting's default list, 1.1, 1.2, ..., 10.9, 11, 12, ..., 63,
//   128, 256, 512, 1024 (Opacus's DEFAULT_ALPHAS are the same up to 10.9, then 12..63 only). A
//   finer or longer list can only lower epsilon; the result is exact for the list it was given.
//
// Errors: std::invalid_argument, with a sentence naming the parameter and the value, for a sample
// rate outside (0, 1], a noise parameter <= 0, delta outside (0, 1), an epsilon budget <= 0,
// a count of 0, orders not finite, not > 1 or not increasing, and for NaN anywhere.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "privacy/rdp.h"

namespace xsilo::privacy {

// The orders the accountant uses unless given others.
std::span<const double> default_orders();

struct EpsilonAtOrder {
  double epsilon = 0;
  double order = 0;  // the order that gave epsilon (0 when no order gave a finite one)
};

// The conversion above, for RDP values rdp[i] at orders[i].
EpsilonAtOrder epsilon_from_rdp(std::span<const double> orders, std::span<const double> rdp, double delta);

// `count` runs of one mechanism: the unit of composition and of the ledger.
struct Step {
  Mechanism mechanism;
  std::uint64_t count = 1;
  bool operator==(const Step&) const = default;
};

// What was spent, as recorded parameters: enough to rebuild the RDP of every step from
// scratch (Accountant::replay), on any list of orders. Consecutive steps with equal parameters
// are merged, so a run of 10000 identical DP-SGD steps is one entry. A plain value: callers
// store it (JSON, an audit record) field by field, name(mechanism) naming the alternative.
struct Ledger {
  std::vector<Step> steps;
  void add(const Mechanism& m, std::uint64_t count);
  // How many runs the ledger holds, over all its steps.
  [[nodiscard]] std::uint64_t count() const;
  bool operator==(const Ledger&) const = default;
};

class Accountant {
 public:
  // Throws when the orders are empty, not finite, not > 1 or not strictly increasing.
  explicit Accountant(std::span<const double> orders = default_orders());

  // A new accountant holding exactly the steps of `ledger`, composed on `orders`.
  static Accountant replay(const Ledger& ledger, std::span<const double> orders = default_orders());

  // Adds `count` (>= 1) runs of m: rdp[i] += count * eps_m(orders[i]).
  void compose(const Mechanism& m, std::uint64_t count = 1);

  // The (epsilon, delta)-DP of everything composed so far; delta in (0, 1).
  [[nodiscard]] EpsilonAtOrder epsilon(double delta) const;

  // The largest T such that composing T more runs of m keeps epsilon(delta) <= max_epsilon:
  // 0 when even one run would exceed it (or it is already exceeded), at most `limit` (a search
  // that reaches it returns it: "at least this many").
  [[nodiscard]] std::uint64_t steps_within(const Mechanism& m, double max_epsilon, double delta,
                                           std::uint64_t limit = std::uint64_t{1} << 40) const;

  const std::vector<double>& orders() const { return orders_; }
  const std::vector<double>& rdp() const { return rdp_; }
  const Ledger& ledger() const { return ledger_; }

 private:
  std::vector<double> orders_;
  std::vector<double> rdp_;
  // The RDP of every ledger entry but the last: a step merged into the last entry recomputes
  // that entry as count * curve, so rdp_ has the bits replay() computes from the ledger.
  std::vector<double> before_last_;
  Ledger ledger_;
};

// The smallest noise multiplier sigma (to a relative 1e-9, rounded up) for which `steps` steps
// of the subsampled Gaussian at rate q stay within (target_epsilon, delta)-DP: the epsilon of
// the returned sigma is <= target_epsilon. Bisection on log sigma, epsilon falling as sigma
// grows; throws when no sigma in [1e-3, 1e6] reaches the target.
double noise_multiplier_for(double target_epsilon, double delta, double q, std::uint64_t steps,
                            std::span<const double> orders = default_orders());

}  // namespace xsilo::privacy
