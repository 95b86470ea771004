#include "crypto/sign.h"

#include <sodium.h>

#include <stdexcept>

#include "crypto/hash.h"

namespace xsilo::crypto {

void ensure_sodium() {
  static const int rc = sodium_init();
  if (rc < 0) throw std::runtime_error("libsodium failed to initialise");
}

SigningKey SigningKey::generate() {
  ensure_sodium();
  SigningKey k;
  crypto_sign_keypair(k.pk_.data(), k.sk_.data());
  return k;
}

SigningKey::SigningKey(SigningKey&& o) noexcept : sk_(o.sk_), pk_(o.pk_) {
  sodium_memzero(o.sk_.data(), o.sk_.size());
}

SigningKey& SigningKey::operator=(SigningKey&& o) noexcept {
  if (this != &o) {
    sk_ = o.sk_;
    pk_ = o.pk_;
    sodium_memzero(o.sk_.data(), o.sk_.size());
  }
  return *this;
}

SigningKey::~SigningKey() { sodium_memzero(sk_.data(), sk_.size()); }

SigningKey SigningKey::from_hex(std::string text, const std::string& what) {
  ensure_sodium();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  std::string raw;
  try {
    raw = crypto::from_hex(text);
  } catch (const std::exception&) {
    sodium_memzero(text.data(), text.size());
    throw std::runtime_error("signing key " + what + " is not hex");
  }
  sodium_memzero(text.data(), text.size());
  if (raw.size() != crypto_sign_SECRETKEYBYTES) {
    sodium_memzero(raw.data(), raw.size());
    throw std::runtime_error("signing key " + what + " has the wrong length");
  }
  SigningKey k;
  std::copy(raw.begin(), raw.end(), k.sk_.begin());
  sodium_memzero(raw.data(), raw.size());
  crypto_sign_ed25519_sk_to_pk(k.pk_.data(), k.sk_.data());
  return k;
}

std::string SigningKey::secret_hex() const { return to_hex(sk_); }
std::string SigningKey::public_hex() const { return to_hex(pk_); }

std::string SigningKey::sign(std::string_view message) const {
  std::string sig(crypto_sign_BYTES, '\0');
  crypto_sign_detached(reinterpret_cast<unsigned char*>(sig.data()), nullptr,
                       reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                       sk_.data());
  return sig;
}

std::string SigningKey::public_key() const { return std::string(pk_.begin(), pk_.end()); }

std::string public_key_from_hex(std::string text, const std::string& what) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  std::string raw;
  try {
    raw = from_hex(text);
  } catch (const std::exception&) {
    throw std::runtime_error("public key " + what + " is not hex");
  }
  if (raw.size() != crypto_sign_PUBLICKEYBYTES) throw std::runtime_error("public key " + what + " has the wrong length");
  return raw;
}

bool verify_signature(std::string_view pk, std::string_view message, std::string_view sig) {
  ensure_sodium();
  if (pk.size() != crypto_sign_PUBLICKEYBYTES || sig.size() != crypto_sign_BYTES) return false;
  return crypto_sign_verify_detached(reinterpret_cast<const unsigned char*>(sig.data()),
                                     reinterpret_cast<const unsigned char*>(message.data()),
                                     message.size(),
                                     reinterpret_cast<const unsigned char*>(pk.data())) == 0;
}

}  // namespace xsilo::crypto
