#include "protocol/packed.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace xsilo::protocol {

std::size_t packed_bytes(std::size_t words, std::uint32_t bits) {
  // 8 words make `bits` whole bytes: no overflow while words / 8 * bits fits (every caller
  // bounds the count first, to a tensor's size or kMaxChunkCount).
  const std::size_t whole = words / 8;
  return whole * bits + (static_cast<std::size_t>(words % 8) * bits + 7) / 8;
}

void check_packed_width(std::uint32_t bits, std::size_t word_bytes) {
  if (bits < 1 || bits >= word_bytes * 8) {
    throw std::invalid_argument("packed words of " + std::to_string(bits) + " bits in words of " +
                                std::to_string(word_bytes * 8) + " bits");
  }
}

namespace {

// The bit string is filled through a 64-bit accumulator, at most 32 bits at a time: fewer than
// 8 bits wait in it between pieces, so a piece never overflows it.
template <class W>
void pack(std::span<const W> in, std::uint32_t bits, std::span<std::uint8_t> out) {
  check_packed_width(bits, sizeof(W));
  if (out.size() != packed_bytes(in.size(), bits)) throw std::invalid_argument("packed buffer of the wrong size");
  std::uint64_t acc = 0;
  unsigned have = 0;
  std::size_t at = 0;
  for (const W w : in) {
    std::uint64_t v = static_cast<std::uint64_t>(w);
    for (std::uint32_t left = bits; left > 0;) {
      const unsigned take = std::min<std::uint32_t>(left, 32);
      acc |= (v & ((std::uint64_t{1} << take) - 1)) << have;
      v >>= take;
      have += take;
      left -= take;
      for (; have >= 8; have -= 8, acc >>= 8) out[at++] = static_cast<std::uint8_t>(acc);
    }
  }
  if (have > 0) out[at] = static_cast<std::uint8_t>(acc);
}

template <class W>
Status unpack(std::span<const std::uint8_t> in, std::uint32_t bits, std::span<W> out) {
  check_packed_width(bits, sizeof(W));
  const std::size_t want = packed_bytes(out.size(), bits);
  if (in.size() != want) {
    return Error(std::to_string(in.size()) + " bytes of packed words, not the " + std::to_string(want) + " that " +
                 std::to_string(out.size()) + " words of " + std::to_string(bits) + " bits take");
  }
  std::uint64_t acc = 0;
  unsigned have = 0;
  std::size_t at = 0;
  for (auto& w : out) {
    std::uint64_t v = 0;
    for (std::uint32_t got = 0; got < bits;) {
      const unsigned take = std::min<std::uint32_t>(bits - got, 32);
      for (; have < take; have += 8) acc |= static_cast<std::uint64_t>(in[at++]) << have;
      v |= (acc & ((std::uint64_t{1} << take) - 1)) << got;
      acc >>= take;
      have -= take;
      got += take;
    }
    w = static_cast<W>(v);
  }
  if (acc != 0) return Error("packed words with padding bits that are not zero");
  return {};
}

}  // namespace

void pack_words(std::span<const std::uint8_t> in, std::uint32_t bits, std::span<std::uint8_t> out) { pack(in, bits, out); }
void pack_words(std::span<const std::uint16_t> in, std::uint32_t bits, std::span<std::uint8_t> out) { pack(in, bits, out); }
void pack_words(std::span<const std::uint32_t> in, std::uint32_t bits, std::span<std::uint8_t> out) { pack(in, bits, out); }
void pack_words(std::span<const std::uint64_t> in, std::uint32_t bits, std::span<std::uint8_t> out) { pack(in, bits, out); }

Status unpack_words(std::span<const std::uint8_t> in, std::uint32_t bits, std::span<std::uint8_t> out) {
  return unpack(in, bits, out);
}
Status unpack_words(std::span<const std::uint8_t> in, std::uint32_t bits, std::span<std::uint16_t> out) {
  return unpack(in, bits, out);
}
Status unpack_words(std::span<const std::uint8_t> in, std::uint32_t bits, std::span<std::uint32_t> out) {
  return unpack(in, bits, out);
}
Status unpack_words(std::span<const std::uint8_t> in, std::uint32_t bits, std::span<std::uint64_t> out) {
  return unpack(in, bits, out);
}

}  // namespace xsilo::protocol
