// Signatures by federation certificates. Every participant holds a certificate from the
// federation CA (common name = its name, organizational unit = its role) and the key it
// certifies; with them it signs protocol statements that must survive relaying by parties it
// does not trust (an edge, or the server's view of a silo), and anyone holding the CA checks
// them. OpenSSL does the work; no file I/O here (transport/identity.h reads the files).
//
// Statements are built with statement(): a tag naming what is signed, then length-prefixed
// fields, so no two different field lists give the same bytes and no signature made for one
// purpose verifies for another.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace xsilo::crypto {

// "xsilo/<tag>" followed by every field as 4-byte little-endian length + bytes.
std::string statement(std::string_view tag, std::initializer_list<std::string_view> fields);
// Appends one field in that encoding.
void append_field(std::string& out, std::string_view field);

// Who a certificate names.
struct CertifiedName {
  std::string name;  // common name
  std::string role;  // organizational unit: "server", "edge" or "silo"
};

// The expiry of a certificate (DER), in seconds since the epoch; nullopt when it does not parse.
// Reads, does not verify: ask a CertVerifier first.
std::optional<std::int64_t> certificate_not_after(std::string_view der);

// A participant's certificate and private key; signs statements. Copies share one key, which
// OpenSSL wipes when the last copy goes away.
class CertSigner {
 public:
  // Throws std::invalid_argument when the PEM texts are not a certificate and its matching key.
  static CertSigner from_pem(std::string_view cert_pem, std::string_view key_pem);

  const std::string& certificate() const;  // DER
  const CertifiedName& who() const;
  std::string sign(std::string_view message) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// Trusts one CA (and honours its revocation list, when one is given): checks certificates and
// the signatures made with the keys they certify. Results are cached by certificate, so a
// certificate seen many times in a round is verified once. Thread-safe; copies share the cache.
class CertVerifier {
 public:
  // Throws std::invalid_argument when the PEM texts do not parse or the CRL is not signed by the CA.
  static CertVerifier from_pem(std::string_view ca_pem, std::string_view crl_pem = {});

  // Success when `certificate` (DER) is valid now, issued by the CA, not revoked, and names
  // `name` in `role`; otherwise why not.
  Status check(std::string_view certificate, const std::string& name, const std::string& role) const;
  // Who a valid certificate of `role` names, or why it is not valid.
  Result<CertifiedName> certified(std::string_view certificate, const std::string& role) const;
  // check(), then success when `signature` is the signature of `message` by the certified key.
  Status verify(std::string_view certificate, const std::string& name, const std::string& role,
                std::string_view message, std::string_view signature) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace xsilo::crypto
