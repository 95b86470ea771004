#include "protocol/masked.h"

#include "crypto/fixed_point.h"
#include "crypto/prime_field.h"
#include "protocol/packed.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace xsilo::protocol {

wire::DType ring_dtype(std::uint32_t bits) {
  switch (bits) {
    case 8: return wire::U8;
    case 16: return wire::U16;
    case 32: return wire::U32;
    case 64: return wire::U64;
    default: throw std::invalid_argument("no ring of " + std::to_string(bits) + " bits");
  }
}

std::size_t ring_word_bytes(wire::DType dtype) {
  switch (dtype) {
    case wire::U8: return 1;
    case wire::U16: return 2;
    case wire::U32: return 4;
    case wire::U64: return 8;
    default: return 0;
  }
}

MaskedVector::MaskedVector(std::uint32_t bits, std::size_t words) : bits_(bits), words_(words) {
  if (!crypto::ring_bits_supported(bits)) {
    throw std::invalid_argument(std::string("masked vectors have words of ") + crypto::kRingBits + " bits");
  }
  bytes_.assign(words * (bits / 8), 0);
}

MaskedVector MaskedVector::field(std::size_t words) {
  MaskedVector v(32, words);
  v.prime_ = true;
  return v;
}

MaskedVector MaskedVector::for_setup(const wire::SecAggSetup& setup) {
  if (setup.protocol() == wire::LIGHTSECAGG) {
    if (setup.modulus_bits() != 32) throw std::invalid_argument("LightSecAgg masks in 32-bit field words");
    if (setup.wire_bits() != 0) throw std::invalid_argument("LightSecAgg's field words cannot travel packed");
    return field(setup.vector_length());
  }
  MaskedVector v(setup.modulus_bits(), setup.vector_length());
  v.set_wire_bits(setup.wire_bits());
  return v;
}

bool MaskedVector::same_words(const wire::SecAggSetup& setup) const {
  return (setup.protocol() == wire::LIGHTSECAGG) == prime_ && setup.modulus_bits() == bits_ &&
         setup.vector_length() == words_ && setup.wire_bits() == wire_bits_;
}

void MaskedVector::set_wire_bits(std::uint32_t bits) {
  if (bits != 0) {
    // The field of p = 2^32 - 5 has no subring mod 2^b: its masks do not cancel there.
    if (prime_) throw std::invalid_argument("a packed wire of " + std::to_string(bits) + " bits for field words");
    check_packed_width(bits, word_bytes());
  }
  wire_bits_ = bits;
}

void MaskedVector::reduce_to_wire() {
  if (wire_bits_ == 0) return;
  visit([&](auto words) {
    using W = typename decltype(words)::value_type;
    const W mask = static_cast<W>((W{1} << wire_bits_) - 1);
    for (auto& w : words) w = static_cast<W>(w & mask);
  });
}

std::span<std::uint8_t> MaskedVector::u8() {
  if (bits_ != 8) throw std::logic_error("not a vector of 8-bit words");
  return {bytes_.data(), words_};
}
std::span<std::uint16_t> MaskedVector::u16() {
  if (bits_ != 16) throw std::logic_error("not a vector of 16-bit words");
  return {reinterpret_cast<std::uint16_t*>(bytes_.data()), words_};
}

std::span<std::uint32_t> MaskedVector::u32() {
  if (bits_ != 32) throw std::logic_error("not a vector of 32-bit words");
  return {reinterpret_cast<std::uint32_t*>(bytes_.data()), words_};
}
std::span<std::uint64_t> MaskedVector::u64() {
  if (bits_ != 64) throw std::logic_error("not a vector of 64-bit words");
  return {reinterpret_cast<std::uint64_t*>(bytes_.data()), words_};
}
std::span<const std::uint8_t> MaskedVector::u8() const { return const_cast<MaskedVector*>(this)->u8(); }
std::span<const std::uint16_t> MaskedVector::u16() const { return const_cast<MaskedVector*>(this)->u16(); }
std::span<const std::uint32_t> MaskedVector::u32() const { return const_cast<MaskedVector*>(this)->u32(); }
std::span<const std::uint64_t> MaskedVector::u64() const { return const_cast<MaskedVector*>(this)->u64(); }

namespace {
// Unaligned-safe loads: `other` may be any byte buffer (a received chunk area).
template <class W>
void add_words(std::uint8_t* acc, const std::uint8_t* other, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    W a, b;
    std::memcpy(&a, acc + i * sizeof(W), sizeof(W));
    std::memcpy(&b, other + i * sizeof(W), sizeof(W));
    a = static_cast<W>(a + b);  // unsigned: wraps mod 2^bits (after promotion for 8 and 16)
    std::memcpy(acc + i * sizeof(W), &a, sizeof(W));
  }
}

void add_field_words(std::uint8_t* acc, const std::uint8_t* other, std::size_t n) {
  namespace field = crypto::field;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t a, b;
    std::memcpy(&a, acc + i * 4, 4);
    std::memcpy(&b, other + i * 4, 4);
    a = field::add(a, b >= field::kPrime ? b - field::kPrime : b);
    std::memcpy(acc + i * 4, &a, 4);
  }
}
}  // namespace

void MaskedVector::add(std::span<const std::uint8_t> other) {
  if (other.size() != bytes_.size()) {
    throw std::invalid_argument("masked vectors of " + std::to_string(bytes_.size()) + " and " +
                                std::to_string(other.size()) + " bytes cannot be added");
  }
  if (prime_) return add_field_words(bytes_.data(), other.data(), words_);
  switch (bits_) {
    case 8: add_words<std::uint8_t>(bytes_.data(), other.data(), words_); break;
    case 16: add_words<std::uint16_t>(bytes_.data(), other.data(), words_); break;
    case 32: add_words<std::uint32_t>(bytes_.data(), other.data(), words_); break;
    default: add_words<std::uint64_t>(bytes_.data(), other.data(), words_);
  }
}

}  // namespace xsilo::protocol
