#include "crypto/fixed_point.h"

#include <cmath>
#include <random>
#include <stdexcept>

namespace xsilo::crypto {

namespace {

template <class T>
double encode_impl(const FixedPointParams& p, std::span<const float> delta, double weight,
                   std::uint64_t seed, std::span<T> out) {
  if (out.size() != p.words(delta.size())) {
    throw std::invalid_argument(p.unclipped_bit ? "encode: output must hold d + 2 words" : "encode: output must hold d + 1 words");
  }
  double sq = 0;
  for (float v : delta) sq += static_cast<double>(v) * v;
  const double norm = std::sqrt(sq);
  const double clip = norm > p.clip_norm ? p.clip_norm / norm : 1.0;
  const double w = std::min(weight, p.max_weight);
  const double scale = std::ldexp(1.0, static_cast<int>(p.fraction_bits));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  auto put = [&](double v) {
    const double s = v * scale;
    const double fl = std::floor(s);
    const double r = fl + (u(rng) < s - fl ? 1.0 : 0.0);  // stochastic rounding
    return static_cast<T>(static_cast<std::int64_t>(r));  // two's complement wrap
  };
  for (std::size_t i = 0; i < delta.size(); ++i) out[i] = put(w * clip * delta[i]);
  out[delta.size()] = put(w);
  if (p.unclipped_bit) out[delta.size() + 1] = put(norm <= p.clip_norm ? 1.0 : 0.0);
  return clip;
}

template <class T>
std::vector<double> decode_impl(const FixedPointParams& p, std::span<const T> sum) {
  std::vector<double> out(sum.size());
  const double inv = std::ldexp(1.0, -static_cast<int>(p.fraction_bits));
  for (std::size_t i = 0; i < sum.size(); ++i) {
    using S = std::make_signed_t<T>;
    out[i] = static_cast<double>(static_cast<S>(sum[i])) * inv;
  }
  return out;
}

}  // namespace

std::string check_overflow(const FixedPointParams& p, std::size_t n) {
  if (p.bits != 32 && p.bits != 64) return "modulus bits must be 32 or 64";
  // The unclipped count, when there is one, reaches n.
  const double per_silo = std::max(p.max_weight * std::max(p.clip_norm, 1.0), p.unclipped_bit ? 1.0 : 0.0);
  const double largest = static_cast<double>(n) * per_silo * std::ldexp(1.0, static_cast<int>(p.fraction_bits));
  const double limit = std::ldexp(1.0, static_cast<int>(p.bits) - 1);
  if (largest < limit) return "";
  char buf[400];
  if (per_silo > p.max_weight * std::max(p.clip_norm, 1.0)) {
    std::snprintf(buf, sizeof buf,
                  "the unclipped count of adaptive clipping, %zu silos x 2^%u fraction bits = %.3g, can reach 2^%u "
                  "(%.3g): lower fraction_bits, or use 64 modulus bits",
                  n, p.fraction_bits, largest, p.bits - 1, limit);
    return buf;
  }
  std::snprintf(buf, sizeof buf,
                "%zu silos x max_weight %g x clip_norm %g x 2^%u fraction bits = %.3g can reach 2^%u "
                "(%.3g): lower max_weight, clip_norm or fraction_bits, or use 64 modulus bits",
                n, p.max_weight, std::max(p.clip_norm, 1.0), p.fraction_bits, largest, p.bits - 1, limit);
  return buf;
}

double encode(const FixedPointParams& p, std::span<const float> delta, double weight, std::uint64_t seed,
              std::span<std::uint32_t> out) {
  return encode_impl(p, delta, weight, seed, out);
}
double encode(const FixedPointParams& p, std::span<const float> delta, double weight, std::uint64_t seed,
              std::span<std::uint64_t> out) {
  return encode_impl(p, delta, weight, seed, out);
}
std::vector<double> decode(const FixedPointParams& p, std::span<const std::uint32_t> sum) {
  return decode_impl(p, sum);
}
std::vector<double> decode(const FixedPointParams& p, std::span<const std::uint64_t> sum) {
  return decode_impl(p, sum);
}

}  // namespace xsilo::crypto
