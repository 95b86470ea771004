#include "crypto/noise.h"

#include <sodium.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace xsilo::crypto {

namespace {
constexpr std::size_t kBlockWords = 512;  // 4 KiB of keystream per refill
}

NoiseSource::NoiseSource(std::optional<Key> key) : words_(kBlockWords), next_(kBlockWords) {
  if (sodium_init() < 0) throw std::runtime_error("libsodium could not be initialised");
  if (key) {
    key_ = *key;
  } else {
    randombytes_buf(key_.data(), key_.size());
  }
}

NoiseSource::~NoiseSource() {
  sodium_memzero(key_.data(), key_.size());
  sodium_memzero(words_.data(), words_.size() * sizeof(std::uint64_t));
}

void NoiseSource::refill() {
  // One nonce per block: a 64-bit counter in the first 8 bytes of the IETF nonce, never reused
  // under one key.
  std::array<std::uint8_t, crypto_stream_chacha20_ietf_NONCEBYTES> nonce{};
  std::memcpy(nonce.data(), &block_, sizeof block_);
  ++block_;
  crypto_stream_chacha20_ietf(reinterpret_cast<unsigned char*>(words_.data()), words_.size() * sizeof(std::uint64_t),
                              nonce.data(), key_.data());
  next_ = 0;
}

NoiseSource::result_type NoiseSource::operator()() {
  if (next_ == words_.size()) refill();
  return words_[next_++];
}

double NoiseSource::uniform() { return static_cast<double>((*this)() >> 11) * 0x1.0p-53; }

double NoiseSource::gaussian() {
  if (spare_) return *std::exchange(spare_, std::nullopt);
  double u, v, s;
  do {
    u = 2.0 * uniform() - 1.0;
    v = 2.0 * uniform() - 1.0;
    s = u * u + v * v;
  } while (s >= 1.0 || s == 0.0);
  const double f = std::sqrt(-2.0 * std::log(s) / s);
  spare_ = v * f;
  return u * f;
}

}  // namespace xsilo::crypto
