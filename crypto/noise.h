// Random numbers whose secrecy a privacy guarantee rests on: differential privacy's noise and
// its Poisson samples. A ChaCha20 keystream (libsodium) under a 32-byte key, read as 64-bit
// words; the key comes from the system's random source, so nobody else (the server, which
// chooses the rounds' seeds, least of all) can know or replay the noise. Tests fix the key.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace xsilo::crypto {

class NoiseSource {
 public:
  using Key = std::array<std::uint8_t, 32>;
  using result_type = std::uint64_t;  // a UniformRandomBitGenerator

  // No key: a fresh one from the system's random source.
  explicit NoiseSource(std::optional<Key> key = std::nullopt);
  NoiseSource(const NoiseSource&) = delete;
  NoiseSource& operator=(const NoiseSource&) = delete;
  ~NoiseSource();  // wipes the key and what is left of the keystream

  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return std::numeric_limits<result_type>::max(); }
  result_type operator()();

  // Uniform in [0, 1), 53 random bits.
  double uniform();
  // Standard normal (mean 0, variance 1): the polar method on uniform().
  double gaussian();

 private:
  void refill();
  Key key_;
  std::uint64_t block_ = 0;  // the nonce of the next keystream block
  std::vector<std::uint64_t> words_;
  std::size_t next_ = 0;
  std::optional<double> spare_;  // the polar method makes two normals at a time
};

}  // namespace xsilo::crypto
