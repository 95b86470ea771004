#include "crypto/fixed_point.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>

namespace xsilo::crypto {

namespace {

// M of largest_code(): a silo's largest value in any word before scaling.
double per_silo(const FixedPointParams& p) {
  return std::max(p.max_weight * std::max(p.clip_norm, 1.0), p.unclipped_bit ? 1.0 : 0.0);
}

template <class T>
double encode_impl(const FixedPointParams& p, std::span<const float> delta, double weight,
                   std::uint64_t seed, std::span<T> out) {
  if (sizeof(T) * 8 != p.bits) throw std::invalid_argument("encode: output words do not match the ring");
  if (out.size() != p.words(delta.size())) {
    throw std::invalid_argument(p.unclipped_bit ? "encode: output must hold d + 2 words" : "encode: output must hold d + 1 words");
  }
  double sq = 0;
  for (float v : delta) sq += static_cast<double>(v) * v;
  const double norm = std::sqrt(sq);
  const double clip = norm > p.clip_norm ? p.clip_norm / norm : 1.0;
  const double w = std::min(weight, p.max_weight);
  const double scale = std::ldexp(1.0, static_cast<int>(p.fraction_bits));
  // Before rounding no code exceeds M 2^f in magnitude but for float rounding in the clip;
  // clamped there, the rounded code stays within largest_code(p), as check_overflow assumes.
  const double cap = per_silo(p) * scale;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  auto put = [&](double v) {
    const double s = std::clamp(v * scale, -cap, cap);
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
void decode_impl(const FixedPointParams& p, std::span<const T> sum, std::span<double> out) {
  if (sizeof(T) * 8 != p.bits) throw std::invalid_argument("decode: words do not match the ring");
  if (out.size() != sum.size()) throw std::invalid_argument("decode: as many values as words");
  const double inv = std::ldexp(1.0, -static_cast<int>(p.fraction_bits));
  for (std::size_t i = 0; i < sum.size(); ++i) {
    using S = std::make_signed_t<T>;
    out[i] = static_cast<double>(static_cast<S>(sum[i])) * inv;  // modular conversion (C++20)
  }
}

template <class T>
std::vector<double> decode_impl(const FixedPointParams& p, std::span<const T> sum) {
  std::vector<double> out(sum.size());
  decode_impl(p, sum, std::span<double>(out));
  return out;
}

// n silos' largest sum against the largest positive word of the ring.
bool fits(const FixedPointParams& p, std::size_t n) {
  return static_cast<double>(n) * largest_code(p) < std::ldexp(1.0, static_cast<int>(p.bits) - 1);
}

}  // namespace

bool ring_bits_supported(std::uint32_t bits) { return bits == 8 || bits == 16 || bits == 32 || bits == 64; }

double largest_code(const FixedPointParams& p) {
  return std::ceil(per_silo(p) * std::ldexp(1.0, static_cast<int>(p.fraction_bits)));
}

Status check_overflow(const FixedPointParams& p, std::size_t n) {
  if (!ring_bits_supported(p.bits)) return Error(std::string("modulus bits must be ") + kRingBits);
  if (fits(p, n)) return {};
  const double largest = static_cast<double>(n) * largest_code(p);
  const double limit = std::ldexp(1.0, static_cast<int>(p.bits) - 1);
  // What would fit instead: the most fraction bits this ring allows, or a wider ring.
  std::string instead;
  FixedPointParams q = p;
  for (q.fraction_bits = p.fraction_bits; q.fraction_bits > 1 && !fits(q, n);) --q.fraction_bits;
  if (fits(q, n)) instead = "lower fraction_bits to " + std::to_string(q.fraction_bits) + " or less";
  else instead = "lower max_weight, clip_norm or fraction_bits";
  if (p.bits < 64) instead += ", or use more modulus bits";
  char buf[400];
  if (per_silo(p) > p.max_weight * std::max(p.clip_norm, 1.0)) {
    std::snprintf(buf, sizeof buf,
                  "the unclipped count of adaptive clipping, %zu silos x 2^%u fraction bits = %.6g, can reach 2^%u "
                  "(%.6g): %s",
                  n, p.fraction_bits, largest, p.bits - 1, limit, instead.c_str());
    return Error(buf);
  }
  std::snprintf(buf, sizeof buf,
                "%zu silos x max_weight %g x clip_norm %g x 2^%u fraction bits = %.6g can reach 2^%u (%.6g) in a "
                "%u-bit ring: %s",
                n, p.max_weight, std::max(p.clip_norm, 1.0), p.fraction_bits, largest, p.bits - 1, limit, p.bits,
                instead.c_str());
  return Error(buf);
}

double encode(const FixedPointParams& p, std::span<const float> delta, double weight, std::uint64_t seed,
              std::span<std::uint8_t> out) {
  return encode_impl(p, delta, weight, seed, out);
}
double encode(const FixedPointParams& p, std::span<const float> delta, double weight, std::uint64_t seed,
              std::span<std::uint16_t> out) {
  return encode_impl(p, delta, weight, seed, out);
}
double encode(const FixedPointParams& p, std::span<const float> delta, double weight, std::uint64_t seed,
              std::span<std::uint32_t> out) {
  return encode_impl(p, delta, weight, seed, out);
}
double encode(const FixedPointParams& p, std::span<const float> delta, double weight, std::uint64_t seed,
              std::span<std::uint64_t> out) {
  return encode_impl(p, delta, weight, seed, out);
}
std::vector<double> decode(const FixedPointParams& p, std::span<const std::uint8_t> sum) {
  return decode_impl(p, sum);
}
std::vector<double> decode(const FixedPointParams& p, std::span<const std::uint16_t> sum) {
  return decode_impl(p, sum);
}
std::vector<double> decode(const FixedPointParams& p, std::span<const std::uint32_t> sum) {
  return decode_impl(p, sum);
}
std::vector<double> decode(const FixedPointParams& p, std::span<const std::uint64_t> sum) {
  return decode_impl(p, sum);
}

void decode(const FixedPointParams& p, std::span<const std::uint8_t> sum, std::span<double> out) {
  decode_impl(p, sum, out);
}
void decode(const FixedPointParams& p, std::span<const std::uint16_t> sum, std::span<double> out) {
  decode_impl(p, sum, out);
}
void decode(const FixedPointParams& p, std::span<const std::uint32_t> sum, std::span<double> out) {
  decode_impl(p, sum, out);
}
void decode(const FixedPointParams& p, std::span<const std::uint64_t> sum, std::span<double> out) {
  decode_impl(p, sum, out);
}

}  // namespace xsilo::crypto
