// Shamir t-of-n secret sharing of 32-byte secrets over the prime field GF(2^61 - 1). A secret
// is cut into five 56-bit limbs, each shared with its own random polynomial of degree t - 1;
// a share is the five evaluations at x = the participant's index (1..n).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "crypto/keys.h"

namespace xsilo::crypto {

inline constexpr std::uint64_t kShamirPrime = (std::uint64_t{1} << 61) - 1;
inline constexpr std::size_t kShamirLimbs = 5;

struct Share {
  std::uint32_t x = 0;                              // 1..n
  std::array<std::uint64_t, kShamirLimbs> y{};      // field elements
  std::string encode() const;                       // 4 + 40 bytes
  static std::optional<Share> decode(std::string_view bytes);
};

// n shares, any t of which rebuild the secret. Throws std::invalid_argument unless 1 <= t <= n.
std::vector<Share> shamir_split(const Secret& secret, std::uint32_t t, std::uint32_t n);
// The shares at the given x only (distinct, nonzero): a member that deals to its neighbours in
// a graph pays for them, not for the whole group. Throws unless 1 <= t <= xs.size().
std::vector<Share> shamir_split(const Secret& secret, std::uint32_t t, const std::vector<std::uint32_t>& xs);
// Lagrange interpolation at 0 from exactly the given shares (distinct x, at least t of them:
// the caller passes t). nullopt for duplicate or zero x or a limb that overflows 56 bits.
std::optional<Secret> shamir_combine(const std::vector<Share>& shares);

}  // namespace xsilo::crypto
