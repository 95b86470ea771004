#include "crypto/sources.h"

#include <sodium.h>

#include <chrono>
#include <cstring>

#include "crypto/hash.h"
#include "crypto/sign.h"

namespace xsilo::crypto {

std::int64_t system_unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void system_random_bytes(std::span<std::uint8_t> out) {
  ensure_sodium();
  randombytes_buf(out.data(), out.size());
}

std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t round, std::string_view purpose) {
  Sha256 h;
  auto u64 = [&h](std::uint64_t v) { h.update(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(&v), 8)); };
  h.update(std::string_view("xsilo-seed"));
  u64(purpose.size());  // the purpose's length first: no two (purpose, seed) pairs hash alike
  h.update(purpose);
  u64(seed);
  u64(round);
  const Digest d = h.finish();
  std::uint64_t out = 0;
  std::memcpy(&out, d.data(), sizeof out);
  return out;
}

}  // namespace xsilo::crypto
