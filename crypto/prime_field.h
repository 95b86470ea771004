// The prime field F_p, p = 2^32 - 5, of LightSecAgg (crypto/lightsecagg.h): its arithmetic, the
// exact mappings between it and the fixed-point codec's ring Z_{2^32}, uniform field words from
// the mask PRG, and the one kernel Lagrange coding runs (a matrix times a set of vectors).
//
// Words are std::uint32_t in [0, p). Products are reduced with 2^32 = 5 (mod p): a 64-bit value
// hi 2^32 + lo is congruent to 5 hi + lo, folded twice and corrected once, so no division and no
// 128-bit product is ever needed; sums of folded products are kept in 64-bit accumulators and
// reduced once per output word.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "crypto/fixed_point.h"
#include "crypto/keys.h"

namespace xsilo::crypto::field {

inline constexpr std::uint32_t kPrime = 4294967291u;            // 2^32 - 5
inline constexpr std::uint32_t kHalf = (kPrime - 1) / 2;          // 2147483645: the largest |sum| that decodes

// x mod p for any 64-bit x.
inline std::uint32_t reduce(std::uint64_t x) {
  x = (x >> 32) * 5 + (x & 0xffffffffu);  // < 6 * 2^32
  x = (x >> 32) * 5 + (x & 0xffffffffu);  // < 2^32 + 25 = p + 30
  return static_cast<std::uint32_t>(x >= kPrime ? x - kPrime : x);
}
inline std::uint32_t add(std::uint32_t a, std::uint32_t b) {
  const std::uint64_t s = std::uint64_t{a} + b;
  return static_cast<std::uint32_t>(s >= kPrime ? s - kPrime : s);
}
inline std::uint32_t sub(std::uint32_t a, std::uint32_t b) { return a >= b ? a - b : a + (kPrime - b); }
inline std::uint32_t mul(std::uint32_t a, std::uint32_t b) { return reduce(std::uint64_t{a} * b); }
std::uint32_t pow(std::uint32_t a, std::uint64_t e);
// a^(p - 2): the inverse of a nonzero a (0 for 0).
std::uint32_t inv(std::uint32_t a);

// ---- the codec's ring and the field -------------------------------------------------------
//
// The codec writes a signed code v as the word v mod 2^32. to_field() maps it to v mod p:
// w < 2^31 is v itself; w >= 2^31 is v + 2^32 with v < 0, and v + p = w - 5. from_field() maps
// a field sum s back: s <= (p - 1) / 2 is a non-negative sum, s above it is s - p < 0, whose
// ring word is s - p + 2^32 = s + 5. Both are exact while every code and every partial sum
// lies within +-(p - 1) / 2, which check_overflow_field() checks for a configuration.

// In place: ring words (two's complement) to field words.
void to_field(std::span<std::uint32_t> words);
// In place: field words (a sum within +-(p - 1) / 2) to ring words the codec decodes.
void from_field(std::span<std::uint32_t> words);
// What the field costs the codec: success when n silos' sum stays within +-(p - 1) / 2, or why not,
// with the numbers. Only 32-bit codecs map to this field. The ring's own limit is 2^31 - 1, so
// the field gives up two codes of headroom (largest sum 2147483645 instead of 2147483647): in
// practice check_overflow() and this agree on every configuration but the last two codes.
Status check_overflow_field(const FixedPointParams& p, std::size_t n);

// acc[i] = acc[i] + x[i] (mod p). acc's words must be field words; x's may be any 32-bit words
// (a word >= p counts as itself mod p), so a malformed upload cannot break acc's invariant
// (refuse it with in_field() where that matters). Sizes must match.
void field_add(std::span<std::uint32_t> acc, std::span<const std::uint32_t> x);
// acc[i] = acc[i] - x[i] (mod p), both field words.
void field_sub(std::span<std::uint32_t> acc, std::span<const std::uint32_t> x);
// Whether every word is below p.
bool in_field(std::span<const std::uint32_t> words);

// Uniform field words from the mask PRG (crypto/mask.h: AES-128-CTR keyed by `seed`): the
// keystream read as little-endian 32-bit words, a word >= p rejected and the next one taken.
// Exactly uniform (no modular bias); a rejection happens with probability 5 / 2^32 per word,
// so a 10M-word vector sees one about once in 86 draws.
void uniform(const Secret& seed, std::span<std::uint32_t> out);

// ---- Lagrange coding ----------------------------------------------------------------------

// A rows x cols matrix of field words, row-major.
struct Matrix {
  std::size_t rows = 0, cols = 0;
  std::vector<std::uint32_t> w;
  std::uint32_t at(std::size_t r, std::size_t c) const { return w[r * cols + c]; }
};

// m(r, c) = l_c(points[r]): the Lagrange basis on `nodes` (distinct) evaluated at the points,
// so that for a polynomial f of degree < nodes.size(), f(points[r]) = sum_c m(r, c) f(nodes[c]).
// O(rows cols + cols^2) products and cols inversions. Throws std::invalid_argument for equal
// nodes.
Matrix lagrange(std::span<const std::uint32_t> nodes, std::span<const std::uint32_t> points);

// out[r][i] = sum_c m(r, c) in[c][i] (mod p) for i < length: encoding (m = segments to shares)
// and decoding (answers to segments) are this one loop, m.rows m.cols length multiply-adds. It
// walks the vectors in pieces of a few KiB, so that every input's piece is read while the
// output's accumulators sit in L1; inputs are field words.
void combine(const Matrix& m, std::span<const std::uint32_t* const> in, std::size_t length,
             std::span<std::uint32_t* const> out);

}  // namespace xsilo::crypto::field
