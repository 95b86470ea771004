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

namespace {

std::uint64_t derive(std::uint64_t seed, std::uint64_t round, std::string_view purpose, const std::string_view* party) {
  Sha256 h;
  auto u64 = [&h](std::uint64_t v) { h.update(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(&v), 8)); };
  h.update(std::string_view("xsilo-seed"));
  u64(purpose.size());  // the purpose's length first: no two (purpose, seed) pairs hash alike
  h.update(purpose);
  u64(seed);
  u64(round);
  if (party) {
    u64(party->size());
    h.update(*party);
  }
  const Digest d = h.finish();
  std::uint64_t out = 0;
  std::memcpy(&out, d.data(), sizeof out);
  return out;
}

}  // namespace

std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t round, std::string_view purpose) {
  return derive(seed, round, purpose, nullptr);
}

std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t round, std::string_view purpose, std::string_view party) {
  return derive(seed, round, purpose, &party);
}

}  // namespace xsilo::crypto
