// The fixed-point codec of secure aggregation. A silo clips its delta to L2 norm `clip_norm`,
// multiplies by its weight w (capped at `max_weight`), appends w as one more coordinate, scales
// by 2^fraction_bits and rounds stochastically (unbiased: E[round(v)] = v) into the ring
// Z_{2^bits} (two's complement). The sum over silos decodes to sum(w x) and sum(w), so the
// weighted mean is computed inside the sum.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace xsilo::crypto {

struct FixedPointParams {
  std::uint32_t bits = 32;            // 32 or 64
  std::uint32_t fraction_bits = 16;
  double clip_norm = 1.0;
  double max_weight = 1.0;
  // One more coordinate after the weight: 1 when the delta was within clip_norm, else 0. The sum
  // counts the unclipped silos (adaptive clipping without seeing any one norm).
  bool unclipped_bit = false;
  std::size_t words(std::size_t d) const { return d + 1 + (unclipped_bit ? 1 : 0); }
};

// Why n silos could overflow the ring, with the numbers, or "" when they cannot. The largest
// coordinate of a sum is n * max_weight * max(clip_norm, 1) * 2^fraction_bits (every |w x_i| <=
// w ||x|| <= max_weight clip_norm, and the weight coordinate itself is <= max_weight), or
// n * 2^fraction_bits for the unclipped count when that is larger; it must stay below
// 2^(bits-1) to decode with its sign.
std::string check_overflow(const FixedPointParams& p, std::size_t n);

// Encodes w * clip(delta) and w (and the unclipped bit when asked for); returns the clipped norm
// factor applied (1 if none). `seed` drives the stochastic rounding. `out` has
// p.words(delta.size()) words.
double encode(const FixedPointParams& p, std::span<const float> delta, double weight,
              std::uint64_t seed, std::span<std::uint32_t> out);
double encode(const FixedPointParams& p, std::span<const float> delta, double weight,
              std::uint64_t seed, std::span<std::uint64_t> out);

// Decodes a sum: values[i] = signed(sum[i]) / 2^fraction_bits for every word (the last is the
// summed weight).
std::vector<double> decode(const FixedPointParams& p, std::span<const std::uint32_t> sum);
std::vector<double> decode(const FixedPointParams& p, std::span<const std::uint64_t> sum);

}  // namespace xsilo::crypto
