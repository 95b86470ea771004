#include "protocol/masked.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace xsilo::protocol {

MaskedVector::MaskedVector(std::uint32_t bits, std::size_t words) : bits_(bits), words_(words) {
  if (bits != 32 && bits != 64) throw std::invalid_argument("masked vectors have 32- or 64-bit words");
  bytes_.assign(words * (bits / 8), 0);
}

std::span<std::uint32_t> MaskedVector::u32() {
  if (bits_ != 32) throw std::logic_error("not a vector of 32-bit words");
  return {reinterpret_cast<std::uint32_t*>(bytes_.data()), words_};
}
std::span<std::uint64_t> MaskedVector::u64() {
  if (bits_ != 64) throw std::logic_error("not a vector of 64-bit words");
  return {reinterpret_cast<std::uint64_t*>(bytes_.data()), words_};
}
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
    a += b;  // unsigned: wraps mod 2^bits
    std::memcpy(acc + i * sizeof(W), &a, sizeof(W));
  }
}
}  // namespace

void MaskedVector::add(std::span<const std::uint8_t> other) {
  if (other.size() != bytes_.size()) {
    throw std::invalid_argument("masked vectors of " + std::to_string(bytes_.size()) + " and " +
                                std::to_string(other.size()) + " bytes cannot be added");
  }
  if (bits_ == 32) add_words<std::uint32_t>(bytes_.data(), other.data(), words_);
  else add_words<std::uint64_t>(bytes_.data(), other.data(), words_);
}

}  // namespace xsilo::protocol
