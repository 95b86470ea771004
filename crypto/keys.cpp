#include "crypto/keys.h"

#include <sodium.h>

#include <stdexcept>

#include "crypto/fuzz_memo.h"
#include "crypto/sign.h"

namespace xsilo::crypto {

Secret::~Secret() { sodium_memzero(k_.data(), k_.size()); }

SecretText::~SecretText() {
  text_.resize(text_.capacity());  // the whole buffer, not only the current length
  sodium_memzero(text_.data(), text_.size());
}

Secret Secret::random() {
  ensure_sodium();
  Secret s;
  randombytes_buf(s.k_.data(), s.k_.size());
  return s;
}

X25519KeyPair X25519KeyPair::generate() {
  X25519KeyPair kp;
  kp.secret = Secret::random();
  kp.public_key = public_of(kp.secret);
  return kp;
}

Key32 X25519KeyPair::public_of(const Secret& sk) {
  ensure_sodium();
  return fuzz_memo::remember({fuzz_memo::part(sk.bytes())}, [&] {
    Key32 pk{};
    crypto_scalarmult_base(pk.data(), sk.bytes().data());
    return pk;
  });
}

std::optional<Secret> x25519(const Secret& my_secret, std::span<const std::uint8_t> their_public) {
  ensure_sodium();
  if (their_public.size() != crypto_scalarmult_BYTES) return std::nullopt;
  return fuzz_memo::remember({fuzz_memo::part(my_secret.bytes()), fuzz_memo::part(their_public)},
                             [&]() -> std::optional<Secret> {
                               Secret out;
                               if (crypto_scalarmult(out.bytes().data(), my_secret.bytes().data(),
                                                     their_public.data()) != 0) {
                                 return std::nullopt;
                               }
                               return out;
                             });
}

Secret derive(const Secret& key, std::string_view context) {
  ensure_sodium();
  Secret out;
  crypto_generichash(out.bytes().data(), out.bytes().size(),
                     reinterpret_cast<const unsigned char*>(context.data()), context.size(),
                     key.bytes().data(), key.bytes().size());
  return out;
}

std::string seal(const Secret& key, std::string_view plaintext, std::string_view ad) {
  ensure_sodium();
  std::string out(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES + plaintext.size() +
                      crypto_aead_xchacha20poly1305_ietf_ABYTES,
                  '\0');
  auto* nonce = reinterpret_cast<unsigned char*>(out.data());
  randombytes_buf(nonce, crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
  unsigned long long len = 0;
  crypto_aead_xchacha20poly1305_ietf_encrypt(
      nonce + crypto_aead_xchacha20poly1305_ietf_NPUBBYTES, &len,
      reinterpret_cast<const unsigned char*>(plaintext.data()), plaintext.size(),
      reinterpret_cast<const unsigned char*>(ad.data()), ad.size(), nullptr, nonce, key.bytes().data());
  return out;
}

std::optional<std::string> open(const Secret& key, std::string_view ciphertext, std::string_view ad) {
  ensure_sodium();
  constexpr std::size_t kN = crypto_aead_xchacha20poly1305_ietf_NPUBBYTES;
  constexpr std::size_t kA = crypto_aead_xchacha20poly1305_ietf_ABYTES;
  if (ciphertext.size() < kN + kA) return std::nullopt;
  std::string out(ciphertext.size() - kN - kA, '\0');
  unsigned long long len = 0;
  const auto* c = reinterpret_cast<const unsigned char*>(ciphertext.data());
  if (crypto_aead_xchacha20poly1305_ietf_decrypt(
          reinterpret_cast<unsigned char*>(out.data()), &len, nullptr, c + kN, ciphertext.size() - kN,
          reinterpret_cast<const unsigned char*>(ad.data()), ad.size(), c, key.bytes().data()) != 0) {
    sodium_memzero(out.data(), out.size());
    return std::nullopt;
  }
  return out;
}

std::string seal_to(const Key32& recipient, std::string_view plaintext) {
  ensure_sodium();
  bool sealed = false;
  std::string box = fuzz_memo::remember({fuzz_memo::part(recipient), plaintext}, [&] {
    sealed = true;
    std::string out(plaintext.size() + crypto_box_SEALBYTES, '\0');
    if (crypto_box_seal(reinterpret_cast<unsigned char*>(out.data()),
                        reinterpret_cast<const unsigned char*>(plaintext.data()), plaintext.size(),
                        recipient.data()) != 0) {
      throw std::runtime_error("crypto_box_seal failed");
    }
    return out;
  });
  if (fuzz_memo::kOn && !sealed) {
    // The draw of the box's one-time key that a remembered box skipped, so that every later
    // draw of this input is the one it would have been (fuzz/fuzz_input.h).
    Key32 unused{};
    randombytes_buf(unused.data(), unused.size());
  }
  return box;
}

std::optional<std::string> open_sealed(const X25519KeyPair& recipient, std::string_view box) {
  ensure_sodium();
  if (box.size() < crypto_box_SEALBYTES) return std::nullopt;
  return fuzz_memo::remember(
      {fuzz_memo::part(recipient.secret.bytes()), fuzz_memo::part(recipient.public_key), box},
      [&]() -> std::optional<std::string> {
        std::string out(box.size() - crypto_box_SEALBYTES, '\0');
        if (crypto_box_seal_open(reinterpret_cast<unsigned char*>(out.data()),
                                 reinterpret_cast<const unsigned char*>(box.data()), box.size(),
                                 recipient.public_key.data(), recipient.secret.bytes().data()) != 0) {
          sodium_memzero(out.data(), out.size());
          return std::nullopt;
        }
        return out;
      });
}

bool usable_public_key(const Key32& key) {
  static const Secret probe = Secret::random();
  return x25519(probe, key).has_value();
}

}  // namespace xsilo::crypto
