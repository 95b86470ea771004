// Fuzz builds only (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION, which the XSILO_FUZZ build
// defines): the public-key operations remember their results, so that the fuzzers spend their
// time in our handlers rather than in OpenSSL's and libsodium's arithmetic. Every other build
// calls straight through.
//
// What a handler sees does not change. Each remembered operation is a function of the bytes it is
// keyed by: a signature check, an X25519 product, opening a sealed box. Signing and sealing are
// randomized, and a remembered one gives back the first signature (box) it made for the same key
// and message, which is as valid as a fresh one; a remembered box still takes the draw of its
// one-time key from libsodium, so the draws after it stay what they would have been (OpenSSL's
// signatures draw from OpenSSL, which the harnesses leave alone). The fuzz harnesses make
// libsodium's randomness start over for each input (fuzz/fuzz_input.h), so the keys of an honest
// round are the same in every input and the protocol's steps up to the first byte an input alters
// are remembered; what the input alters is computed afresh. The checked-in corpora are replayed in
// the test suite by the ordinary build, with every operation computed (docs/benchmarks.md,
// "Fuzzing").
#pragma once

#include <initializer_list>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "crypto/certs.h"

namespace xsilo::crypto::fuzz_memo {

#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
inline constexpr bool kOn = true;
#else
inline constexpr bool kOn = false;
#endif

// Enough for the honest steps of many rounds and what the inputs alter of them; past it the
// table starts over (an entry holds its key: a certificate and a statement, or 32-byte keys).
inline constexpr std::size_t kMaxEntries = 1 << 14;

// compute(), or what it returned before for the same parts (each length-prefixed, so that no two
// lists of parts make the same key). One table per call site (each passes its own lambda).
template <class Compute>
auto remember(std::initializer_list<std::string_view> parts, Compute&& compute) -> decltype(compute()) {
  if constexpr (!kOn) {
    return compute();
  } else {
    using Result = decltype(compute());
    static std::mutex mu;
    static std::unordered_map<std::string, Result> table;
    std::string key;
    for (const auto part : parts) append_field(key, part);
    {
      std::lock_guard lock(mu);
      if (auto it = table.find(key); it != table.end()) return it->second;
    }
    Result result = compute();
    std::lock_guard lock(mu);
    if (table.size() >= kMaxEntries) table.clear();
    table.emplace(std::move(key), result);
    return result;
  }
}

// The bytes of a fixed-size key, as a part.
template <class Bytes>
std::string_view part(const Bytes& bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

}  // namespace xsilo::crypto::fuzz_memo
