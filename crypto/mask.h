// The mask PRG: AES-128-CTR keystream (OpenSSL EVP, AES-NI) from a 32-byte seed (key = first
// 16 bytes, initial counter block = last 16), read as little-endian words of the ring
// Z_{2^8}, Z_{2^16}, Z_{2^32} or Z_{2^64} and added to or subtracted from a vector in place.
// Word i of a ring of b bits is keystream bytes [i b/8, (i+1) b/8): a narrower ring takes the
// same stream in smaller pieces. Never a non-cryptographic generator.
#pragma once

#include <cstdint>
#include <span>

#include "crypto/keys.h"

namespace xsilo::crypto {

// One mask to add (sign +1) or to subtract (-1).
struct MaskTerm {
  Secret seed;
  int sign = +1;
};

// vec[i] += sum_j terms[j].sign * PRG(terms[j].seed)[i], in one pass over vec per 64 terms: each
// piece of it (a few KiB) takes every term's keystream while it is in the L1 cache, so a vector
// larger than the caches crosses memory once per 64 masks, not once per mask. Within the piece
// the masks go in two at a time (one load and store of the piece per two keystreams), with AVX2
// where the CPU has it.
void add_masks(std::span<const MaskTerm> terms, std::span<std::uint32_t> vec);
void add_masks(std::span<const MaskTerm> terms, std::span<std::uint64_t> vec);
void add_masks(std::span<const MaskTerm> terms, std::span<std::uint16_t> vec);
void add_masks(std::span<const MaskTerm> terms, std::span<std::uint8_t> vec);

// vec[i] += sign * PRG(seed)[i]  (mod 2^8)
void add_mask(const Secret& seed, std::span<std::uint8_t> vec, int sign);
// vec[i] += sign * PRG(seed)[i]  (mod 2^16)
void add_mask(const Secret& seed, std::span<std::uint16_t> vec, int sign);
// vec[i] += sign * PRG(seed)[i]  (mod 2^32)
void add_mask(const Secret& seed, std::span<std::uint32_t> vec, int sign);
// vec[i] += sign * PRG(seed)[i]  (mod 2^64)
void add_mask(const Secret& seed, std::span<std::uint64_t> vec, int sign);
// Which loop add_masks() adds with: AVX2 where the CPU has it (Auto, the default), or the
// portable one everywhere (Portable: for tests, which run both on the same machine).
enum class MaskKernel { Auto, Portable };
void set_mask_kernel(MaskKernel k);

// Raw keystream, for benchmarks and tests.
void keystream(const Secret& seed, std::span<std::uint8_t> out);

}  // namespace xsilo::crypto
