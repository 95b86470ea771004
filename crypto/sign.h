// Ed25519 signatures (libsodium). The secret key is wiped when the object goes away.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace xsilo::crypto {

void ensure_sodium();  // sodium_init once; throws if the library cannot start

class SigningKey {
 public:
  static SigningKey generate();
  // From the hex text secret_hex() gives; throws naming `what` (a file) on any problem. The
  // text is wiped.
  static SigningKey from_hex(std::string text, const std::string& what);
  SigningKey(const SigningKey&) = delete;
  SigningKey(SigningKey&& o) noexcept;
  SigningKey& operator=(SigningKey&& o) noexcept;
  ~SigningKey();

  // The secret key as hex text (the caller wipes it: sodium_memzero) and the public key.
  std::string secret_hex() const;
  std::string public_hex() const;
  std::string sign(std::string_view message) const;  // 64 raw bytes
  std::string public_key() const;                    // 32 raw bytes

 private:
  SigningKey() = default;
  std::array<std::uint8_t, 64> sk_{};
  std::array<std::uint8_t, 32> pk_{};
};

// A public key from the hex text public_hex() gives (32 raw bytes); throws naming `what`.
std::string public_key_from_hex(std::string text, const std::string& what);
bool verify_signature(std::string_view public_key, std::string_view message,
                      std::string_view signature);

}  // namespace xsilo::crypto
