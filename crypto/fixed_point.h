// The fixed-point codec of secure aggregation. A silo clips its delta to L2 norm `clip_norm`,
// multiplies by its weight w (capped at `max_weight`), appends w as one more coordinate, scales
// by 2^fraction_bits and rounds stochastically (unbiased: E[round(v)] = v) into the ring
// Z_{2^bits} (two's complement). The sum over silos decodes to sum(w x) and sum(w), so the
// weighted mean is computed inside the sum.
//
// Rings of 8 and 16 bits are the compact ones (1 or 2 bytes a coordinate on the wire); they
// leave little headroom: check_overflow says how much a configuration needs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"

namespace xsilo::crypto {

struct FixedPointParams {
  std::uint32_t bits = 32;            // 8, 16, 32 or 64
  std::uint32_t fraction_bits = 16;
  double clip_norm = 1.0;
  double max_weight = 1.0;
  // One more coordinate after the weight: 1 when the delta was within clip_norm, else 0. The sum
  // counts the unclipped silos (adaptive clipping without seeing any one norm, and the rounds'
  // secure.clipped).
  bool unclipped_bit = false;
  std::size_t words(std::size_t d) const { return d + 1 + (unclipped_bit ? 1 : 0); }
};

// The ring sizes the codec, the masks and the wire know.
bool ring_bits_supported(std::uint32_t bits);
inline constexpr const char* kRingBits = "8, 16, 32 or 64";

// The largest code one silo can put into any word, in units of 2^-fraction_bits:
// ceil(M * 2^fraction_bits) with M = max_weight * max(clip_norm, 1) (every |w x_i| <= w ||x|| <=
// max_weight clip_norm, and the weight coordinate itself is <= max_weight), or M = 1 for the
// unclipped bit when that is larger. encode() clamps to it, so it holds to the last bit even
// when float rounding puts a clipped coordinate a hair above M.
double largest_code(const FixedPointParams& p);

// Success when n silos cannot overflow the ring, or why they could, with the numbers. The largest
// coordinate of a sum is n * largest_code(p); it must stay at or below 2^(bits-1) - 1 to decode
// with its sign (the most negative, -n * largest_code, then stays above -2^(bits-1) too).
Status check_overflow(const FixedPointParams& p, std::size_t n);

// Encodes w * clip(delta) and w (and the unclipped bit when asked for); returns the clipped norm
// factor applied (1 if none). `seed` drives the stochastic rounding. `out` has
// p.words(delta.size()) words.
double encode(const FixedPointParams& p, std::span<const float> delta, double weight,
              std::uint64_t seed, std::span<std::uint8_t> out);
double encode(const FixedPointParams& p, std::span<const float> delta, double weight,
              std::uint64_t seed, std::span<std::uint16_t> out);
double encode(const FixedPointParams& p, std::span<const float> delta, double weight,
              std::uint64_t seed, std::span<std::uint32_t> out);
double encode(const FixedPointParams& p, std::span<const float> delta, double weight,
              std::uint64_t seed, std::span<std::uint64_t> out);

// Decodes a sum: values[i] = signed(sum[i]) / 2^fraction_bits for every word (the last is the
// summed weight).
std::vector<double> decode(const FixedPointParams& p, std::span<const std::uint8_t> sum);
std::vector<double> decode(const FixedPointParams& p, std::span<const std::uint16_t> sum);
std::vector<double> decode(const FixedPointParams& p, std::span<const std::uint32_t> sum);
std::vector<double> decode(const FixedPointParams& p, std::span<const std::uint64_t> sum);
// The same into `out` (as many values as words), for a sum read a block at a time.
void decode(const FixedPointParams& p, std::span<const std::uint8_t> sum, std::span<double> out);
void decode(const FixedPointParams& p, std::span<const std::uint16_t> sum, std::span<double> out);
void decode(const FixedPointParams& p, std::span<const std::uint32_t> sum, std::span<double> out);
void decode(const FixedPointParams& p, std::span<const std::uint64_t> sum, std::span<double> out);

}  // namespace xsilo::crypto
