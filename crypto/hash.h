// SHA-256 through OpenSSL EVP, one-shot and incremental.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace xsilo::crypto {

using Digest = std::array<std::uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  Sha256& update(std::span<const std::uint8_t> bytes);
  Sha256& update(std::string_view s);
  Digest finish();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

Digest sha256(std::span<const std::uint8_t> bytes);
Digest sha256(std::string_view s);
std::string to_hex(std::span<const std::uint8_t> bytes);
std::string sha256_hex(std::string_view s);
// SHA-256 (hex) of float32 values as little-endian bytes: the "model hash" of the audit log,
// reproducible with numpy as hashlib.sha256(a.astype("<f4").tobytes()).hexdigest().
std::string sha256_hex(std::span<const float> values);
// Throws std::invalid_argument on odd length or a non-hex character.
std::string from_hex(std::string_view hex);

}  // namespace xsilo::crypto
