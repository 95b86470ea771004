#include "crypto/prime_field.h"

#include <sodium.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "crypto/mask.h"

namespace xsilo::crypto::field {

namespace {

constexpr std::size_t kPieceWords = 1024;  // 8 KiB of 64-bit accumulators: one output's piece in L1

// acc[i] += c x[i], folded once (2^32 = 5): each term is below 6 2^32, so 2^29 terms fit in
// the 64-bit accumulator; combine() reduces it once per output word.
template <int>
[[gnu::always_inline]] inline void mul_acc_body(std::uint64_t* __restrict acc, const std::uint32_t* __restrict x,
                                                std::uint32_t c, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t v = std::uint64_t{c} * x[i];
    acc[i] += (v >> 32) * 5 + (v & 0xffffffffu);
  }
}

void mul_acc_baseline(std::uint64_t* __restrict acc, const std::uint32_t* __restrict x, std::uint32_t c,
                      std::size_t n) {
  mul_acc_body<0>(acc, x, c, n);
}

#if defined(__x86_64__) || defined(__i386__)
// The same loop with AVX2 (four 32 x 32 -> 64 products an instruction), chosen at run time so
// the default build runs everywhere, as crypto/mask.cpp does.
[[gnu::target("avx2")]] void mul_acc_avx2(std::uint64_t* __restrict acc, const std::uint32_t* __restrict x,
                                          std::uint32_t c, std::size_t n) {
  mul_acc_body<1>(acc, x, c, n);
}
using MulAcc = void (*)(std::uint64_t*, const std::uint32_t*, std::uint32_t, std::size_t);
MulAcc mul_acc_kernel() {
  static const MulAcc k = __builtin_cpu_supports("avx2") ? &mul_acc_avx2 : &mul_acc_baseline;
  return k;
}
#else
using MulAcc = void (*)(std::uint64_t*, const std::uint32_t*, std::uint32_t, std::size_t);
MulAcc mul_acc_kernel() { return &mul_acc_baseline; }
#endif

}  // namespace

std::uint32_t pow(std::uint32_t a, std::uint64_t e) {
  std::uint32_t r = 1;
  while (e) {
    if (e & 1) r = mul(r, a);
    a = mul(a, a);
    e >>= 1;
  }
  return r;
}

std::uint32_t inv(std::uint32_t a) { return pow(a, kPrime - 2); }

void to_field(std::span<std::uint32_t> words) {
  for (auto& w : words) w = w < 0x80000000u ? w : w - 5;
}

void from_field(std::span<std::uint32_t> words) {
  for (auto& s : words) s = s > kHalf ? s + 5 : s;
}

Status check_overflow_field(const FixedPointParams& p, std::size_t n) {
  if (p.bits != 32) {
    return Error("LightSecAgg's field holds 32-bit codes; the codec has " + std::to_string(p.bits) + "-bit words");
  }
  const double largest = static_cast<double>(n) * largest_code(p);
  if (largest <= static_cast<double>(kHalf)) return {};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", largest);
  return Error(std::to_string(n) + " silos x largest code " +
               std::to_string(static_cast<std::uint64_t>(largest_code(p))) + " = " + buf +
               " exceeds (p - 1) / 2 = 2147483645 of the field p = 2^32 - 5: lower fraction_bits, "
               "max_weight or clip_norm");
}

void field_add(std::span<std::uint32_t> acc, std::span<const std::uint32_t> x) {
  if (acc.size() != x.size()) throw std::invalid_argument("field_add: vectors of different lengths");
  std::uint32_t* __restrict a = acc.data();
  const std::uint32_t* __restrict b = x.data();
  for (std::size_t i = 0; i < acc.size(); ++i) {
    const std::uint64_t y = b[i] >= kPrime ? b[i] - kPrime : b[i];
    const std::uint64_t s = a[i] + y;
    a[i] = static_cast<std::uint32_t>(s >= kPrime ? s - kPrime : s);
  }
}

void field_sub(std::span<std::uint32_t> acc, std::span<const std::uint32_t> x) {
  if (acc.size() != x.size()) throw std::invalid_argument("field_sub: vectors of different lengths");
  std::uint32_t* __restrict a = acc.data();
  const std::uint32_t* __restrict b = x.data();
  for (std::size_t i = 0; i < acc.size(); ++i) {
    const std::uint64_t s = std::uint64_t{a[i]} + (kPrime - b[i]);
    a[i] = static_cast<std::uint32_t>(s >= kPrime ? s - kPrime : s);
  }
}

bool in_field(std::span<const std::uint32_t> words) {
  std::uint32_t bad = 0;
  for (auto w : words) bad |= w >= kPrime;
  return bad == 0;
}

void uniform(const Secret& seed, std::span<std::uint32_t> out) {
  keystream(seed, std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(out.data()), out.size() * 4));
  std::size_t rejected = 0;
  for (auto w : out) rejected += w >= kPrime;
  if (rejected == 0) return;  // the usual case: the keystream words are the field words
  // Rare: take the words below p in order from a longer stream (the same stream continued).
  for (std::size_t extra = 64;; extra *= 2) {
    std::vector<std::uint32_t> longer(out.size() + extra);
    keystream(seed, std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(longer.data()), longer.size() * 4));
    std::size_t k = 0;
    for (auto w : longer) {
      if (k == out.size()) break;
      if (w < kPrime) out[k++] = w;
    }
    sodium_memzero(longer.data(), longer.size() * 4);
    if (k == out.size()) return;
  }
}

Matrix lagrange(std::span<const std::uint32_t> nodes, std::span<const std::uint32_t> points) {
  const std::size_t c = nodes.size();
  Matrix m{points.size(), c, std::vector<std::uint32_t>(points.size() * c)};
  // Barycentric weights: 1 / prod_{k != j} (nodes[j] - nodes[k]), one inversion each.
  std::vector<std::uint32_t> weight(c);
  for (std::size_t j = 0; j < c; ++j) {
    std::uint32_t den = 1;
    for (std::size_t k = 0; k < c; ++k) {
      if (k != j) den = mul(den, sub(nodes[j], nodes[k]));
    }
    if (den == 0) throw std::invalid_argument("lagrange: two nodes are equal");
    weight[j] = inv(den);
  }
  // l_j(x) = weight_j prod_{k != j} (x - nodes[k]): the products without one factor come from
  // prefix and suffix products, so no division by x - nodes[j] (which may be 0) is needed.
  std::vector<std::uint32_t> prefix(c + 1), suffix(c + 1);
  for (std::size_t r = 0; r < points.size(); ++r) {
    const std::uint32_t x = points[r];
    prefix[0] = 1;
    for (std::size_t k = 0; k < c; ++k) prefix[k + 1] = mul(prefix[k], sub(x, nodes[k]));
    suffix[c] = 1;
    for (std::size_t k = c; k-- > 0;) suffix[k] = mul(suffix[k + 1], sub(x, nodes[k]));
    for (std::size_t j = 0; j < c; ++j) m.w[r * c + j] = mul(weight[j], mul(prefix[j], suffix[j + 1]));
  }
  return m;
}

void combine(const Matrix& m, std::span<const std::uint32_t* const> in, std::size_t length,
             std::span<std::uint32_t* const> out) {
  if (in.size() != m.cols || out.size() != m.rows) throw std::invalid_argument("combine: matrix and vectors differ");
  if (m.cols >= (std::size_t{1} << 29)) throw std::invalid_argument("combine: too many inputs for 64-bit accumulators");
  const MulAcc mul_acc = mul_acc_kernel();
  alignas(64) std::uint64_t acc[kPieceWords];
  // Piece by piece: the inputs' pieces (cols x 4 KiB) stay in L2 while every output row is
  // made from them, so each input crosses memory once, not once per output.
  for (std::size_t off = 0; off < length; off += kPieceWords) {
    const std::size_t n = std::min(kPieceWords, length - off);
    for (std::size_t r = 0; r < m.rows; ++r) {
      std::memset(acc, 0, n * sizeof(std::uint64_t));
      const std::uint32_t* row = m.w.data() + r * m.cols;
      for (std::size_t c = 0; c < m.cols; ++c) {
        if (row[c] != 0) mul_acc(acc, in[c] + off, row[c], n);
      }
      std::uint32_t* o = out[r] + off;
      for (std::size_t i = 0; i < n; ++i) o[i] = reduce(acc[i]);
    }
  }
}

}  // namespace xsilo::crypto::field
