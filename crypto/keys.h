// Key agreement, key derivation and authenticated encryption for secure aggregation, all from
// libsodium: X25519, BLAKE2b as a keyed KDF, XChaCha20-Poly1305. Secrets are wiped on
// destruction and never printed.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace xsilo::crypto {

using Key32 = std::array<std::uint8_t, 32>;

// A 32-byte secret that wipes itself.
class Secret {
 public:
  Secret() = default;
  explicit Secret(const Key32& k) : k_(k) {}
  Secret(const Secret& o) : k_(o.k_) {}
  Secret& operator=(const Secret& o) {
    k_ = o.k_;
    return *this;
  }
  ~Secret();
  const Key32& bytes() const { return k_; }
  Key32& bytes() { return k_; }
  static Secret random();

 private:
  Key32 k_{};
};

// Text that holds a secret (a private key's PEM, a key in hex): zeroed when it goes away.
class SecretText {
 public:
  explicit SecretText(std::string text) : text_(std::move(text)) {}
  SecretText(const SecretText&) = delete;
  SecretText& operator=(const SecretText&) = delete;
  ~SecretText();
  const std::string& str() const { return text_; }

 private:
  std::string text_;
};

struct X25519KeyPair {
  Secret secret;
  Key32 public_key{};
  static X25519KeyPair generate();
  static Key32 public_of(const Secret& sk);
};

// The raw X25519 shared point, or nullopt for a low-order (malicious) public key.
std::optional<Secret> x25519(const Secret& my_secret, std::span<const std::uint8_t> their_public);

// BLAKE2b-256 keyed with `key` over `context`: a fresh key for one purpose.
Secret derive(const Secret& key, std::string_view context);

// XChaCha20-Poly1305 with a random nonce (prepended to the ciphertext). `ad` is
// authenticated, not encrypted. open() returns nullopt when anything was tampered with.
std::string seal(const Secret& key, std::string_view plaintext, std::string_view ad);
std::optional<std::string> open(const Secret& key, std::string_view ciphertext, std::string_view ad);

// libsodium sealed boxes: anyone can encrypt to an X25519 public key; only its secret key
// opens (nullopt when tampered with or not for it). The sender stays anonymous: sign the box
// when who sent it matters.
std::string seal_to(const Key32& recipient, std::string_view plaintext);
std::optional<std::string> open_sealed(const X25519KeyPair& recipient, std::string_view box);

// False for a point X25519 must refuse as a peer's key (a low-order point).
bool usable_public_key(const Key32& key);

}  // namespace xsilo::crypto
