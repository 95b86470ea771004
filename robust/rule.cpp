#include "robust/rule.h"

#include <array>
#include <utility>

namespace xsilo::robust {

namespace {

constexpr std::array<std::pair<Rule, std::string_view>, 7> kRules{{{Rule::FedAvg, "fedavg"},
                                                                     {Rule::Krum, "krum"},
                                                                     {Rule::MultiKrum, "multi_krum"},
                                                                     {Rule::Median, "median"},
                                                                     {Rule::TrimmedMean, "trimmed_mean"},
                                                                     {Rule::Bulyan, "bulyan"},
                                                                     {Rule::CenteredClip, "centered_clip"}}};
constexpr std::array<std::pair<Fallback, std::string_view>, 3> kFallbacks{
    {{Fallback::Median, "median"}, {Fallback::FedAvg, "fedavg"}, {Fallback::Abort, "abort"}}};

template <class T, std::size_t N>
std::string_view find_name(const std::array<std::pair<T, std::string_view>, N>& table, T v) {
  for (const auto& [k, n] : table) {
    if (k == v) return n;
  }
  return "?";
}

template <class T, std::size_t N>
std::optional<T> find_value(const std::array<std::pair<T, std::string_view>, N>& table, std::string_view s) {
  for (const auto& [k, n] : table) {
    if (n == s) return k;
  }
  return std::nullopt;
}

template <class T, std::size_t N>
std::vector<std::string> all_names(const std::array<std::pair<T, std::string_view>, N>& table) {
  std::vector<std::string> out;
  for (const auto& [k, n] : table) out.emplace_back(n);
  return out;
}

}  // namespace

std::string_view name(Rule r) { return find_name(kRules, r); }
std::string_view name(Fallback f) { return find_name(kFallbacks, f); }
std::optional<Rule> parse_rule(std::string_view s) { return find_value(kRules, s); }
std::optional<Fallback> parse_fallback(std::string_view s) { return find_value(kFallbacks, s); }
std::vector<std::string> rule_names() { return all_names(kRules); }
std::vector<std::string> fallback_names() { return all_names(kFallbacks); }

bool needs_f(Rule r) { return r == Rule::Krum || r == Rule::MultiKrum || r == Rule::Bulyan; }

std::size_t trim_count(const RuleSpec& s, std::size_t n) {
  return s.beta > 0 ? static_cast<std::size_t>(s.beta * static_cast<double>(n)) : s.f;
}

std::size_t krum_average(const RuleSpec& s, std::size_t n) {
  if (s.m) return s.m;
  return n > s.f ? n - s.f : 1;
}

std::size_t rule_inputs(const RuleSpec& s, std::size_t n) { return bucket_count(n, s.bucket); }

namespace {

Status check_rule(const RuleSpec& s, std::size_t n) {
  switch (s.rule) {
    case Rule::Krum: return check_krum(n, s.f);
    case Rule::MultiKrum: return check_multi_krum(n, s.f, krum_average(s, n));
    case Rule::TrimmedMean: return check_trimmed_mean(n, trim_count(s, n));
    case Rule::Bulyan: return check_bulyan(n, s.f);
    case Rule::FedAvg:
    case Rule::Median:
    case Rule::CenteredClip: return n > 0 ? Status() : Error("no inputs");
  }
  return Error("unknown rule");
}

Result apply_rule(const RuleSpec& s, MatrixView x, std::span<const double> weights) {
  switch (s.rule) {
    case Rule::FedAvg: return mean(x, weights);
    case Rule::Krum: return krum(x, s.f);
    case Rule::MultiKrum: return multi_krum(x, s.f, krum_average(s, x.n));
    case Rule::Median: return median(x);
    case Rule::TrimmedMean: return trimmed_mean(x, trim_count(s, x.n));
    case Rule::Bulyan: return bulyan(x, s.f);
    case Rule::CenteredClip: return centered_clip(x, s.tau, s.iterations, s.centre, s.reject, s.oppose, s.one_sided, s.lag);
  }
  return {};
}

}  // namespace

Status check(const RuleSpec& s, std::size_t n) {
  if (s.nnm && n <= s.f) return Error("nearest-neighbour mixing needs more than f = " + std::to_string(s.f) + " inputs");
  const std::size_t k = rule_inputs(s, n);
  if (s.bucket > 1 && k < 2 * s.f + 1) {
    // Fewer buckets than that and the f Byzantine inputs can spoil half of them (one bucket of
    // everything is the plain mean).
    return Error("bucketing makes " + std::to_string(k) + " buckets of " + std::to_string(s.bucket) + " from " +
                 std::to_string(n) + " inputs; it needs at least 2f + 1 = " + std::to_string(2 * s.f + 1));
  }
  auto st = check_rule(s, k);
  if (st || k == n) return st;
  return Error(st.error().message() + " (" + std::to_string(n) + " inputs make " + std::to_string(k) +
               " buckets of " + std::to_string(s.bucket) + ")");
}

Status check_tolerance(const RuleSpec& s, std::size_t n) {
  if (s.f == 0 || (s.rule == Rule::FedAvg && !s.nnm && s.bucket <= 1)) return {};
  const std::size_t k = rule_inputs(s, n), f = s.f;
  std::size_t need = 2 * f + 1;
  std::string rule = "a median", more = "2f";
  switch (s.rule) {
    case Rule::Krum:
    case Rule::MultiKrum: need = 2 * f + 3, more = "2f + 2", rule = std::string(name(s.rule)); break;
    case Rule::Bulyan: need = 4 * f + 3, more = "4f + 2", rule = "bulyan"; break;
    case Rule::TrimmedMean: rule = "a trimmed mean"; break;
    case Rule::CenteredClip: rule = "centered clipping"; break;
    case Rule::FedAvg: rule = s.nnm ? "nearest-neighbour mixing" : "a mean of buckets"; break;
    case Rule::Median: break;
  }
  const bool mixing_named = s.rule == Rule::FedAvg || s.rule == Rule::Krum || s.rule == Rule::MultiKrum ||
                            s.rule == Rule::Bulyan;
  if (s.nnm && !mixing_named) rule += " after mixing";
  if (k >= need) return {};
  return Error(rule + " withstands f = " + std::to_string(f) + " Byzantine inputs only among at least " +
               std::to_string(need) + " (more than " + more + "), not " + std::to_string(k));
}

Status check_protects(const RuleSpec& s, std::size_t n) {
  if (s.rule == Rule::FedAvg && !s.nnm && s.bucket <= 1) return {};
  // A fixed radius still bounds each input's pull, however few the inputs.
  if (s.rule == Rule::CenteredClip && s.tau > 0) return {};
  const std::size_t k = rule_inputs(s, n);
  if (k > 2) return {};
  if (k == 1) return Error(std::string(name(s.rule)) + " over 1 input is that input: no input can be outvoted");
  const std::string what = s.rule == Rule::Krum          ? " inputs picks one of them"
                           : s.rule == Rule::CenteredClip ? " inputs lets the farther one pull without bound (the radius grows with its distance)"
                                                          : " inputs is their mean";
  return Error(std::string(name(s.rule)) + " over 2" + what + ": no input can be outvoted");
}

Result apply(const RuleSpec& s, MatrixView x, std::span<const double> weights) {
  if (!s.nnm && s.bucket <= 1) return apply_rule(s, x, weights);
  // Only FedAvg weighs its inputs; for the robust rules every input counts once, whatever
  // sample count it claims, in the steps before them too.
  const std::span<const double> own = s.rule == Rule::FedAvg ? weights : std::span<const double>();
  std::optional<Mixed> mixed;
  if (s.nnm) {
    mixed = nearest_neighbour_mixing(x, s.f, own);
    // A mixed row stands for its own input: it keeps that input's weight.
    for (std::size_t i = 0; i < x.n; ++i) mixed->weights[i] = own.empty() ? 1.0 : own[i];
  }
  MatrixView cur = mixed ? mixed->view(x.d) : x;
  std::span<const double> w = mixed ? std::span<const double>(mixed->weights) : own;
  if (s.bucket <= 1) return apply_rule(s, cur, w);
  // Mixing is one row per input, so a bucket of mixed rows is a bucket of inputs.
  const Mixed buckets = bucketing(cur, s.bucket, s.seed, w);
  Result r = apply_rule(s, buckets.view(x.d), buckets.weights);
  Result out;
  out.aggregate = std::move(r.aggregate);
  out.radius = r.radius;
  out.rejected_beyond = r.rejected_beyond;
  out.median_alignment = r.median_alignment;
  out.opposed_below = r.opposed_below;
  out.opposition_off = r.opposition_off;
  out.lagging_beyond = r.lagging_beyond;
  out.median_balance = r.median_balance;
  out.one_sided_beyond = r.one_sided_beyond;
  out.one_sided_off = r.one_sided_off;
  out.decisions.resize(x.n);
  for (std::size_t b = 0; b < buckets.sources.size(); ++b) {
    for (auto i : buckets.sources[b]) {
      out.decisions[i] = r.decisions[b];
      out.decisions[i].reason = "bucket " + std::to_string(b + 1) +
                                (r.decisions[b].reason.empty() ? std::string() : ": " + r.decisions[b].reason);
    }
  }
  out.buckets = buckets.sources;
  return out;
}

}  // namespace xsilo::robust
