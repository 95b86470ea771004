#include "privacy/accountant.h"

#include <array>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "privacy/detail.h"

namespace xsilo::privacy {
namespace {

using detail::fail;
using detail::kInf;

void check_delta(double delta) {
  if (!(delta > 0 && delta < 1)) fail("delta must be in (0, 1)", delta);
}

void check_epsilon(double epsilon) {
  if (!(std::isfinite(epsilon) && epsilon > 0)) fail("an epsilon budget must be a finite number > 0", epsilon);
}

constexpr std::array<double, 156> make_default_orders() {
  std::array<double, 156> o{};
  std::size_t n = 0;
  for (int x = 1; x < 100; ++x) o[n++] = 1 + x / 10.0;  // 1.1 .. 10.9
  for (int a = 11; a < 64; ++a) o[n++] = a;              // 11 .. 63
  for (double a : {128.0, 256.0, 512.0, 1024.0}) o[n++] = a;
  return o;
}
constexpr std::array<double, 156> kDefaultOrders = make_default_orders();

// Per-order epsilon of the conversion (accountant.h); +inf where the order gives nothing.
double epsilon_at(double alpha, double r, double delta) {
  if (std::isnan(r)) return kInf;
  if (r <= 0) return 0;
  if (delta * delta + std::expm1(-r) > 0) return 0;
  if (alpha <= 1.01) return kInf;
  return r + std::log1p(-1 / alpha) - (std::log(delta) + std::log(alpha)) / (alpha - 1);
}

std::vector<double> curve(const Mechanism& m, std::span<const double> orders) {
  validate(m);
  std::vector<double> out(orders.size());
  for (std::size_t i = 0; i < orders.size(); ++i) out[i] = rdp(m, orders[i]);
  return out;
}

// epsilon of base + t * step, order by order.
double epsilon_after(std::span<const double> orders, const std::vector<double>& base,
                     const std::vector<double>& step, double t, double delta) {
  std::vector<double> total(base.size());
  for (std::size_t i = 0; i < base.size(); ++i) total[i] = base[i] + t * step[i];
  return epsilon_from_rdp(orders, total, delta).epsilon;
}

}  // namespace

std::span<const double> default_orders() { return kDefaultOrders; }

EpsilonAtOrder epsilon_from_rdp(std::span<const double> orders, std::span<const double> rdp, double delta) {
  check_delta(delta);
  if (orders.size() != rdp.size()) fail("orders and RDP values must be as many", static_cast<double>(rdp.size()));
  EpsilonAtOrder best{kInf, 0};
  for (std::size_t i = 0; i < orders.size(); ++i) {
    const double e = epsilon_at(orders[i], rdp[i], delta);
    if (e < best.epsilon) best = {e, orders[i]};
  }
  return best;
}

void Ledger::add(const Mechanism& m, std::uint64_t count) {
  if (!steps.empty() && steps.back().mechanism == m) {
    steps.back().count += count;
  } else {
    steps.push_back({m, count});
  }
}

std::uint64_t Ledger::count() const {
  std::uint64_t runs = 0;
  for (const auto& s : steps) runs += s.count;
  return runs;
}

Accountant::Accountant(std::span<const double> orders)
    : orders_(orders.begin(), orders.end()), rdp_(orders.size(), 0), before_last_(orders.size(), 0) {
  if (orders_.empty()) throw std::invalid_argument("privacy: the accountant needs at least one RDP order");
  for (std::size_t i = 0; i < orders_.size(); ++i) {
    if (!(std::isfinite(orders_[i]) && orders_[i] > 1)) fail("an RDP order must be a finite number > 1", orders_[i]);
    if (i > 0 && !(orders_[i] > orders_[i - 1])) fail("RDP orders must be strictly increasing", orders_[i]);
  }
}

Accountant Accountant::replay(const Ledger& ledger, std::span<const double> orders) {
  Accountant a(orders);
  for (const Step& s : ledger.steps) a.compose(s.mechanism, s.count);
  return a;
}

void Accountant::compose(const Mechanism& m, std::uint64_t count) {
  if (count == 0) throw std::invalid_argument("privacy: a step is composed at least once, got a count of 0");
  const std::vector<double> c = curve(m, orders_);
  const bool merged = !ledger_.steps.empty() && ledger_.steps.back().mechanism == m;
  if (!merged) before_last_ = rdp_;
  ledger_.add(m, count);
  const double n = static_cast<double>(ledger_.steps.back().count);
  for (std::size_t i = 0; i < rdp_.size(); ++i) rdp_[i] = before_last_[i] + n * c[i];
}

EpsilonAtOrder Accountant::epsilon(double delta) const { return epsilon_from_rdp(orders_, rdp_, delta); }

std::uint64_t Accountant::steps_within(const Mechanism& m, double max_epsilon, double delta, std::uint64_t limit) const {
  check_epsilon(max_epsilon);
  check_delta(delta);
  const std::vector<double> c = curve(m, orders_);
  const auto fits = [&](std::uint64_t t) {
    return epsilon_after(orders_, rdp_, c, static_cast<double>(t), delta) <= max_epsilon;
  };
  if (limit == 0 || !fits(1)) return 0;
  // Double until a count no longer fits (or the limit does), then bisect: fits(lo), !fits(hi).
  std::uint64_t lo = 1;
  for (;;) {
    if (lo == limit) return limit;
    const std::uint64_t next = lo > limit / 2 ? limit : 2 * lo;
    if (!fits(next)) {
      std::uint64_t hi = next;
      while (hi - lo > 1) {
        const std::uint64_t mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
      }
      return lo;
    }
    lo = next;
  }
}

double noise_multiplier_for(double target_epsilon, double delta, double q, std::uint64_t steps,
                            std::span<const double> orders) {
  check_epsilon(target_epsilon);
  check_delta(delta);
  if (steps == 0) throw std::invalid_argument("privacy: the noise multiplier is chosen for at least one step, got 0");
  validate(SubsampledGaussian{q, 1.0});
  const auto epsilon_of = [&](double sigma) {
    Accountant a(orders);
    a.compose(SubsampledGaussian{q, sigma}, steps);
    return a.epsilon(delta).epsilon;
  };
  double lo = 1e-3, hi = 1e6;
  if (epsilon_of(hi) > target_epsilon) {
    fail("no noise multiplier up to 1e6 reaches the target epsilon at this delta, rate and step count", target_epsilon);
  }
  if (epsilon_of(lo) <= target_epsilon) return lo;
  // epsilon(lo) > target >= epsilon(hi); bisect on log sigma.
  while (hi / lo > 1 + 1e-9) {
    const double mid = std::sqrt(lo * hi);
    (epsilon_of(mid) <= target_epsilon ? hi : lo) = mid;
  }
  return hi;
}

}  // namespace xsilo::privacy
