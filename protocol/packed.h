// The packed wire of masked words (issue 42): word i's low `bits` bits at bit positions
// [i bits, (i + 1) bits) of a little-endian bit string, least significant bit first, padded
// with zero bits to whole bytes. Under distributed DP in the ring 2^m the server decodes the
// sum mod 2^b, b < m, and 2^b divides 2^m: pairwise and self masks cancel mod 2^b as they do
// mod 2^m, and the dropout recovery's mask removal is correct mod 2^b too, so every masked word
// may travel reduced mod 2^b in b bits rather than m (protocol/masked.h: wire_bits).
//
//   bits 20, 5 words -> 100 bits -> 13 bytes (the last 4 bits zero)
//
// A chunk states how many words it holds (TensorChunk.count): for bits < 8 a byte count alone
// would not say. The receiver refuses data of any other length, and padding bits that are not
// zero (so that the bytes of an upload are one function of its words).
#pragma once

#include <cstdint>
#include <span>

#include "common/result.h"

namespace xsilo::protocol {

// ceil(words * bits / 8).
std::size_t packed_bytes(std::size_t words, std::uint32_t bits);

// The one width rule: `bits` packs words of `word_bytes` bytes when 1 <= bits < 8 word_bytes
// (a word as wide as its ring travels whole). Throws std::invalid_argument naming both.
void check_packed_width(std::uint32_t bits, std::size_t word_bytes);

// out (packed_bytes(in.size(), bits) bytes) = the low `bits` bits of each word of `in`, packed;
// 1 <= bits < the word's width.
void pack_words(std::span<const std::uint8_t> in, std::uint32_t bits, std::span<std::uint8_t> out);
void pack_words(std::span<const std::uint16_t> in, std::uint32_t bits, std::span<std::uint8_t> out);
void pack_words(std::span<const std::uint32_t> in, std::uint32_t bits, std::span<std::uint8_t> out);
void pack_words(std::span<const std::uint64_t> in, std::uint32_t bits, std::span<std::uint8_t> out);

// out = the words `in` packs (each in [0, 2^bits)), when `in` holds exactly
// packed_bytes(out.size(), bits) bytes and its padding bits are zero; else why not.
[[nodiscard]] Status unpack_words(std::span<const std::uint8_t> in, std::uint32_t bits, std::span<std::uint8_t> out);
[[nodiscard]] Status unpack_words(std::span<const std::uint8_t> in, std::uint32_t bits, std::span<std::uint16_t> out);
[[nodiscard]] Status unpack_words(std::span<const std::uint8_t> in, std::uint32_t bits, std::span<std::uint32_t> out);
[[nodiscard]] Status unpack_words(std::span<const std::uint8_t> in, std::uint32_t bits, std::span<std::uint64_t> out);

}  // namespace xsilo::protocol
