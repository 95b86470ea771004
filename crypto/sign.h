// Ed25519 signatures (libsodium). The secret key is wiped when the object goes away.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace xsilo::crypto {

void ensure_sodium();  // sodium_init once; throws if the library cannot start

class SigningKey {
 public:
  static SigningKey generate();
  // Reads a key written by save(); throws with the file name on any problem.
  static SigningKey load(const std::filesystem::path& path);
  SigningKey(const SigningKey&) = delete;
  SigningKey(SigningKey&& o) noexcept;
  ~SigningKey();

  void save(const std::filesystem::path& secret_path, const std::filesystem::path& public_path) const;
  std::string sign(std::string_view message) const;  // 64 raw bytes
  std::string public_key() const;                    // 32 raw bytes

 private:
  SigningKey() = default;
  std::array<std::uint8_t, 64> sk_{};
  std::array<std::uint8_t, 32> pk_{};
};

// Public key as written by SigningKey::save (hex text).
std::string load_public_key(const std::filesystem::path& path);
bool verify_signature(std::string_view public_key, std::string_view message,
                      std::string_view signature);

}  // namespace xsilo::crypto
