// A masked input of secure aggregation, or a sum of them: `words` elements of the ring
// Z_{2^bits} (bits 8, 16, 32 or 64), or of the field of p = 2^32 - 5 (LightSecAgg,
// crypto/prime_field.h: 32-bit words), stored as the little-endian bytes they travel as (wire
// dtype U8, U16, U32, U64). Silos mask into one, edges and the server add them up; nobody but
// the unmasking server ever decodes one.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "proto/xsilo.pb.h"

namespace xsilo::protocol {

// The wire dtype of a ring's words, and the bytes of one word of a dtype (0: not a ring's).
wire::DType ring_dtype(std::uint32_t bits);
std::size_t ring_word_bytes(wire::DType dtype);

// f(the bytes as a span of the ring words of `dtype`, const as the bytes are): one call for every
// ring size. The bytes must be whole words aligned for the type (a MaskedVector's, or a receive
// buffer's at a whole-word offset); others throw std::invalid_argument.
template <class Byte, class F>
decltype(auto) visit_ring_words(wire::DType dtype, std::span<Byte> bytes, F&& f) {
  auto as = [&]<class W>(W*) -> decltype(auto) {
    if (bytes.size() % sizeof(W) != 0 || reinterpret_cast<std::uintptr_t>(bytes.data()) % alignof(W) != 0) {
      throw std::invalid_argument("ring words of " + std::to_string(sizeof(W)) +
                                  " bytes over bytes that are not whole, aligned words");
    }
    using Out = std::conditional_t<std::is_const_v<Byte>, const W, W>;
    return f(std::span<Out>(reinterpret_cast<Out*>(bytes.data()), bytes.size() / sizeof(W)));
  };
  switch (dtype) {
    case wire::U8: return as(static_cast<std::uint8_t*>(nullptr));
    case wire::U16: return as(static_cast<std::uint16_t*>(nullptr));
    case wire::U32: return as(static_cast<std::uint32_t*>(nullptr));
    case wire::U64: return as(static_cast<std::uint64_t*>(nullptr));
    default: throw std::invalid_argument("no ring words of dtype " + wire::DType_Name(dtype));
  }
}

class MaskedVector {
 public:
  MaskedVector() = default;
  MaskedVector(std::uint32_t bits, std::size_t words);  // zero: the sum of nothing
  // Words of the field F_p, p = 2^32 - 5, rather than of a ring (bits 32).
  static MaskedVector field(std::size_t words);
  // The vector a secure group's members mask into and its sums are kept in: the setup's ring,
  // or the field where its protocol masks in one.
  static MaskedVector for_setup(const wire::SecAggSetup& setup);
  // Whether for_setup(setup) would give words of this vector's kind: field or ring, word size,
  // length and packed width (nothing is allocated).
  bool same_words(const wire::SecAggSetup& setup) const;
  bool prime() const { return prime_; }
  // A zero vector of the same ring (or field), length and wire.
  MaskedVector zeros_like() const {
    MaskedVector z = prime_ ? field(words_) : MaskedVector(bits_, words_);
    z.wire_bits_ = wire_bits_;
    return z;
  }

  // The packed wire (protocol/packed.h): its words travel reduced mod 2^wire_bits, packed
  // wire_bits bits each; 0: whole words. for_setup() takes it from the signed setup.
  std::uint32_t wire_bits() const { return wire_bits_; }
  void set_wire_bits(std::uint32_t bits);
  // Every word mod 2^wire_bits, in place (nothing without a packed wire): what is hashed and
  // sent, by silos and edges alike, so that every party hashes the same words.
  void reduce_to_wire();

  std::uint32_t bits() const { return bits_; }
  std::size_t words() const { return words_; }
  std::size_t word_bytes() const { return bits_ / 8; }
  wire::DType dtype() const { return ring_dtype(bits_); }

  std::span<std::uint8_t> bytes() { return bytes_; }
  std::span<const std::uint8_t> bytes() const { return bytes_; }
  // The words in place (bits must match).
  std::span<std::uint8_t> u8();
  std::span<std::uint16_t> u16();
  std::span<std::uint32_t> u32();
  std::span<std::uint64_t> u64();
  std::span<const std::uint8_t> u8() const;
  std::span<const std::uint16_t> u16() const;
  std::span<const std::uint32_t> u32() const;
  std::span<const std::uint64_t> u64() const;
  // f(the words as a span of the ring's unsigned type): one call for every ring size, so that
  // code which encodes, masks or unmasks is written once.
  template <class F>
  decltype(auto) visit(F&& f) {
    return visit_words(*this, std::forward<F>(f));
  }
  template <class F>
  decltype(auto) visit(F&& f) const {
    return visit_words(*this, std::forward<F>(f));
  }

  // this += other, word by word mod 2^bits (or mod p); `other` holds as many bytes as this. In
  // the field, a word of `other` at or above p is reduced first: a malformed upload cannot
  // leave the sum outside the field.
  void add(std::span<const std::uint8_t> other);
  void add(const MaskedVector& other) { add(other.bytes()); }

 private:
  template <class Self, class F>
  static decltype(auto) visit_words(Self& self, F&& f) {
    return visit_ring_words(self.dtype(), std::span(self.bytes_), std::forward<F>(f));
  }

  std::uint32_t bits_ = 32;
  bool prime_ = false;
  std::uint32_t wire_bits_ = 0;
  std::size_t words_ = 0;
  std::vector<std::uint8_t> bytes_;  // malloc alignment: fine for 8-byte words
};

}  // namespace xsilo::protocol
