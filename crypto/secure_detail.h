// Shared by the secure protocols' files only (secagg.cpp, lightsecagg.cpp,
// secure_settlement.cpp): the byte and name-list helpers they had each written for themselves.
#pragma once

#include <sodium.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "crypto/certs.h"

namespace xsilo::crypto::detail {

template <class Array>
std::string as_bytes(const Array& a) {
  return std::string(reinterpret_cast<const char*>(a.data()), a.size());
}

inline void wipe(std::string& s) {
  if (!s.empty()) sodium_memzero(s.data(), s.size());
  s.clear();
}

// Length-prefixed fields (the encoding of crypto::statement without its tag), the plaintext
// format of what is sealed. unpack() wants exactly `count` fields (any number when 0) and
// nothing after them.
inline std::string pack(std::initializer_list<std::string_view> fields) {
  std::string out;
  for (auto f : fields) append_field(out, f);
  return out;
}
inline std::optional<std::vector<std::string>> unpack(std::string_view bytes, std::size_t count) {
  std::vector<std::string> out;
  while (count ? out.size() < count : !bytes.empty()) {
    if (bytes.size() < 4) return std::nullopt;
    std::uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
    bytes.remove_prefix(4);
    if (bytes.size() < n) return std::nullopt;
    out.emplace_back(bytes.substr(0, n));
    bytes.remove_prefix(n);
  }
  if (!bytes.empty()) return std::nullopt;
  return out;
}

// A list of names as one field of a statement: each name length-prefixed.
inline std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) append_field(out, n);
  return out;
}

// Sorted, each name once.
inline std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

}  // namespace xsilo::crypto::detail
