// A masked input of secure aggregation, or a sum of them: `words` elements of the ring
// Z_{2^bits} (bits 32 or 64), stored as the little-endian bytes they travel as. Silos mask into
// one, edges and the server add them up; nobody but the unmasking server ever decodes one.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "proto/xsilo.pb.h"

namespace xsilo::protocol {

class MaskedVector {
 public:
  MaskedVector() = default;
  MaskedVector(std::uint32_t bits, std::size_t words);  // zero: the sum of nothing

  std::uint32_t bits() const { return bits_; }
  std::size_t words() const { return words_; }
  std::size_t word_bytes() const { return bits_ / 8; }
  wire::DType dtype() const { return bits_ == 64 ? wire::U64 : wire::U32; }

  std::span<std::uint8_t> bytes() { return bytes_; }
  std::span<const std::uint8_t> bytes() const { return bytes_; }
  // The words in place (bits must match).
  std::span<std::uint32_t> u32();
  std::span<std::uint64_t> u64();
  std::span<const std::uint32_t> u32() const;
  std::span<const std::uint64_t> u64() const;

  // this += other, word by word mod 2^bits; `other` holds as many bytes as this.
  void add(std::span<const std::uint8_t> other);
  void add(const MaskedVector& other) { add(other.bytes()); }

 private:
  std::uint32_t bits_ = 32;
  std::size_t words_ = 0;
  std::vector<std::uint8_t> bytes_;  // malloc alignment: fine for 8-byte words
};

}  // namespace xsilo::protocol
