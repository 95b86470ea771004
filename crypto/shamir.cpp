#include "crypto/shamir.h"

#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <stdexcept>

#include "crypto/sign.h"

namespace xsilo::crypto {

namespace {

__extension__ typedef unsigned __int128 u128;  // GCC and Clang: 64x64 -> 128-bit products
constexpr std::uint64_t P = kShamirPrime;

std::uint64_t add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t s = a + b;
  return s >= P ? s - P : s;
}
std::uint64_t sub(std::uint64_t a, std::uint64_t b) { return a >= b ? a - b : a + P - b; }
std::uint64_t mul(std::uint64_t a, std::uint64_t b) {
  const u128 m = static_cast<u128>(a) * b;
  // 2^61 = 1 mod P: fold the high bits onto the low.
  std::uint64_t lo = static_cast<std::uint64_t>(m & P), hi = static_cast<std::uint64_t>(m >> 61);
  return add(lo, hi % P);
}
std::uint64_t power(std::uint64_t a, std::uint64_t e) {
  std::uint64_t r = 1;
  while (e) {
    if (e & 1) r = mul(r, a);
    a = mul(a, a);
    e >>= 1;
  }
  return r;
}
std::uint64_t inverse(std::uint64_t a) { return power(a, P - 2); }

std::uint64_t random_element() {
  for (;;) {
    std::uint64_t v = 0;
    randombytes_buf(&v, sizeof v);
    v &= P;  // 61 bits
    if (v < P) return v;
  }
}

std::array<std::uint64_t, kShamirLimbs> limbs_of(const Secret& s) {
  std::array<std::uint64_t, kShamirLimbs> out{};
  std::uint8_t buf[kShamirLimbs * 7] = {0};
  std::memcpy(buf, s.bytes().data(), 32);
  for (std::size_t j = 0; j < kShamirLimbs; ++j) {
    std::uint64_t v = 0;
    for (int b = 6; b >= 0; --b) v = (v << 8) | buf[j * 7 + static_cast<std::size_t>(b)];
    out[j] = v;
  }
  sodium_memzero(buf, sizeof buf);
  return out;
}

}  // namespace

std::string Share::encode() const {
  std::string out(4 + 8 * kShamirLimbs, '\0');
  std::memcpy(out.data(), &x, 4);
  std::memcpy(out.data() + 4, y.data(), 8 * kShamirLimbs);
  return out;
}

std::optional<Share> Share::decode(std::string_view bytes) {
  if (bytes.size() != 4 + 8 * kShamirLimbs) return std::nullopt;
  Share s;
  std::memcpy(&s.x, bytes.data(), 4);
  std::memcpy(s.y.data(), bytes.data() + 4, 8 * kShamirLimbs);
  for (auto v : s.y) {
    if (v >= P) return std::nullopt;
  }
  return s;
}

std::vector<Share> shamir_split(const Secret& secret, std::uint32_t t, std::uint32_t n) {
  std::vector<std::uint32_t> xs(n);
  for (std::uint32_t i = 0; i < n; ++i) xs[i] = i + 1;
  return shamir_split(secret, t, xs);
}

std::vector<Share> shamir_split(const Secret& secret, std::uint32_t t, const std::vector<std::uint32_t>& xs) {
  ensure_sodium();
  if (t < 1 || t > xs.size()) throw std::invalid_argument("Shamir needs 1 <= t <= n");
  if (std::set<std::uint32_t>(xs.begin(), xs.end()).size() != xs.size() || std::count(xs.begin(), xs.end(), 0u)) {
    throw std::invalid_argument("Shamir shares need distinct, nonzero x");
  }
  const auto limbs = limbs_of(secret);
  std::vector<Share> shares(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) shares[i].x = xs[i];
  std::vector<std::uint64_t> coeff(t);
  for (std::size_t j = 0; j < kShamirLimbs; ++j) {
    coeff[0] = limbs[j];
    for (std::uint32_t k = 1; k < t; ++k) coeff[k] = random_element();
    for (auto& sh : shares) {
      std::uint64_t acc = 0;  // Horner
      for (std::uint32_t k = t; k-- > 0;) acc = add(mul(acc, sh.x), coeff[k]);
      sh.y[j] = acc;
    }
  }
  sodium_memzero(coeff.data(), coeff.size() * sizeof(std::uint64_t));
  return shares;
}

std::optional<Secret> shamir_combine(const std::vector<Share>& shares) {
  std::set<std::uint32_t> xs;
  for (const auto& s : shares) {
    if (s.x == 0 || !xs.insert(s.x).second) return std::nullopt;
  }
  std::array<std::uint64_t, kShamirLimbs> limbs{};
  for (std::size_t i = 0; i < shares.size(); ++i) {
    // Lagrange basis at 0: prod_{j != i} x_j / (x_j - x_i)
    std::uint64_t num = 1, den = 1;
    for (std::size_t k = 0; k < shares.size(); ++k) {
      if (k == i) continue;
      num = mul(num, shares[k].x);
      den = mul(den, sub(shares[k].x, shares[i].x));
    }
    const std::uint64_t l = mul(num, inverse(den));
    for (std::size_t j = 0; j < kShamirLimbs; ++j) limbs[j] = add(limbs[j], mul(l, shares[i].y[j]));
  }
  std::uint8_t buf[kShamirLimbs * 7] = {0};
  for (std::size_t j = 0; j < kShamirLimbs; ++j) {
    if (limbs[j] >> 56) return std::nullopt;
    for (int b = 0; b < 7; ++b) buf[j * 7 + static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(limbs[j] >> (8 * b));
  }
  // The three bytes past the secret are zero in every honest sharing.
  const bool padded = buf[32] == 0 && buf[33] == 0 && buf[34] == 0;
  Secret out;
  std::memcpy(out.bytes().data(), buf, 32);
  sodium_memzero(buf, sizeof buf);
  if (!padded) return std::nullopt;
  return out;
}

}  // namespace xsilo::crypto
