// Shared by the secure protocols' files only (secagg.cpp, lightsecagg.cpp,
// secure_settlement.cpp): the byte and name-list helpers they had each written for themselves.
#pragma once

#include <sodium.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <set>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "crypto/certs.h"
#include "crypto/keys.h"
#include "crypto/secagg.h"

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

// A judge's first checks of an accusation, alike in both protocols: the box shown is one the
// accused signed (`signed_box`: the statement its signature is over), and the inbox secret shown
// is the one the accuser advertised for the accused. The key pair that opens the box, or what
// the accuser is blamed for.
template <class KeyList>
Result<X25519KeyPair> accusation_key(const CertVerifier& ca, const KeyList& keys, const std::string& accuser,
                                     const secagg::Accusation& a, const std::string& signed_box) {
  const std::string& accused = a.accused;
  if (!ca.verify(keys.at(accused).certificate, accused, secagg::kSiloRole, signed_box, a.evidence.signature)) {
    return Error("accused " + accused + " with a box " + accused + " did not sign");
  }
  X25519KeyPair inbox{a.inbox_secret, X25519KeyPair::public_of(a.inbox_secret)};
  if (inbox.public_key != keys.at(accuser).inbox_keys.at(accused)) {
    return Error("accused " + accused + " with a key that is not the one it advertised");
  }
  return inbox;
}

// A member's part of round 1b, alike in the protocols. What it reads and keeps: references into
// the member's state (use at once).
template <class KeyList, class Held>
struct Delivery {
  const std::string& session;
  const std::string& me;
  const CertVerifier& ca;
  const CertSigner& signer;
  const KeyList& u1;                                   // the members it may hold something from
  const std::map<std::string, X25519KeyPair>& inbox;   // per other member
  std::map<std::string, Held>& held;                   // sender -> what its box opened to
  std::set<std::string>& accused;
};
// The protocol's words for a box (the shares of SecAgg, the share of LightSecAgg).
struct DeliveryWords {
  std::string from;     // before the sender: "shares from "
  std::string the;      // before the sender: "the shares from "
  std::string carries;  // after the sender: " do not carry"
};

// Opens what the others dealt this member: each box comes from another member of U1 and carries
// that member's signature over box_statement() (otherwise the delivery was altered on the way:
// an error, nobody is blamed). `open(keys, sender, box, held)` opens one box to what its dealer
// signed for this member; a box that does not becomes an accusation, with the inbox secret
// that opens it. The receipt, signed.
template <class KeyList, class Held, class BoxStatement, class Open>
Result<secagg::Receipt> receive(const secagg::Inbox& from, const Delivery<KeyList, Held>& d, const DeliveryWords& words,
                                BoxStatement box_statement, Open open) {
  secagg::Receipt r;
  for (const auto& [sender, sealed] : from) {
    auto keys = d.u1.find(sender);
    if (keys == d.u1.end() || sender == d.me) return Error(words.from + sender + ", who advertised no keys");
    if (!d.ca.verify(keys->second.certificate, sender, secagg::kSiloRole,
                     box_statement(d.session, sender, d.me, sealed.box), sealed.signature)) {
      return Error(words.the + sender + words.carries + " its signature: altered on the way");
    }
    Held got;
    if (auto why = open(keys->second, sender, sealed.box, got); !why) {
      r.accusations.push_back({sender, sealed, d.inbox.at(sender).secret});
      d.accused.insert(sender);
      continue;
    }
    d.held[sender] = std::move(got);
  }
  r.signature = d.signer.sign(secagg::receipt_statement(d.session, d.me, r));
  return r;
}

// How many members signed `survivors` (sorted) in `signatures`: survivors whose keys are in
// `u1` and that `counts` admits, each signature checked.
template <class KeyList, class Counts>
std::size_t confirmations(const CertVerifier& ca, const std::string& session, const KeyList& u1,
                          const std::vector<std::string>& survivors,
                          const std::map<std::string, std::string>& signatures, Counts counts) {
  std::size_t valid = 0;
  const std::string agreed = secagg::survivors_statement(session, survivors);
  for (const auto& [who, sig] : signatures) {
    auto keys = u1.find(who);
    if (keys != u1.end() && counts(who) && std::binary_search(survivors.begin(), survivors.end(), who) &&
        ca.verify(keys->second.certificate, who, secagg::kSiloRole, agreed, sig)) {
      ++valid;
    }
  }
  return valid;
}

}  // namespace xsilo::crypto::detail
