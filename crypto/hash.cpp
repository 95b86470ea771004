#include "crypto/hash.h"

#include <openssl/evp.h>

#include <stdexcept>

namespace xsilo::crypto {

struct Sha256::Ctx {
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  ~Ctx() { EVP_MD_CTX_free(md); }
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
  if (!ctx_->md || EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("SHA-256 initialisation failed");
  }
}

Sha256::~Sha256() = default;

Sha256& Sha256::update(std::span<const std::uint8_t> bytes) {
  EVP_DigestUpdate(ctx_->md, bytes.data(), bytes.size());
  return *this;
}

Sha256& Sha256::update(std::string_view s) {
  EVP_DigestUpdate(ctx_->md, s.data(), s.size());
  return *this;
}

Digest Sha256::finish() {
  Digest d{};
  unsigned n = 0;
  EVP_DigestFinal_ex(ctx_->md, d.data(), &n);
  return d;
}

Digest sha256(std::span<const std::uint8_t> bytes) { return Sha256().update(bytes).finish(); }
Digest sha256(std::string_view s) { return Sha256().update(s).finish(); }

std::string to_hex(std::span<const std::uint8_t> bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (auto b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

std::string sha256_hex(std::string_view s) { return to_hex(sha256(s)); }

std::string sha256_hex(std::span<const float> values) {
  return to_hex(sha256(std::span<const std::uint8_t>(
      reinterpret_cast<const std::uint8_t*>(values.data()), values.size() * sizeof(float))));
}

std::string from_hex(std::string_view hex) {
  if (hex.size() % 2) throw std::invalid_argument("hex string of odd length");
  auto val = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw std::invalid_argument(std::string("not a hex digit: ") + c);
  };
  std::string out(hex.size() / 2, '\0');
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<char>(val(hex[2 * i]) * 16 + val(hex[2 * i + 1]));
  }
  return out;
}

}  // namespace xsilo::crypto
