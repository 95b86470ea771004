// The federation's certificate authority. `xsilo pki init` makes the CA; `xsilo pki issue`
// makes one kit folder per participant (key.pem, cert.pem, ca.pem): a hospital receives
// exactly its folder. A participant's identity is its certificate's common name, its role the
// certificate's organizational unit ("server", "edge" or "silo").
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "proto/xsilo.pb.h"

namespace xsilo::transport {

enum class KeyType { P256, Ed25519 };

struct IssueRequest {
  wire::Role role = wire::SILO;
  std::string name;
  int days = 365;
  std::int64_t not_before_offset_s = 0;  // negative: valid from the past (tests make expired certs)
  KeyType key = KeyType::P256;
};

// Creates DIR/ca/ca.key (mode 0600) and DIR/ca/ca.pem. Refuses to overwrite an existing CA.
void pki_init(const std::filesystem::path& dir, const std::string& federation, int days = 3650,
              KeyType key = KeyType::P256);

// Issues a key and certificate signed by the CA in DIR/ca and writes DIR/kits/NAME/; records it
// in the CA's index (DIR/ca/index.jsonl: serial, name, role, not_after, one line each), so that
// any certificate the CA issued can be revoked later, not only the one a kit holds now.
// Returns the kit folder. Refuses names that are not [A-Za-z0-9._-]{1,64}.
std::filesystem::path pki_issue(const std::filesystem::path& dir, const IssueRequest& req);

// One line of the CA's index.
struct IssuedCertificate {
  std::string serial;  // hex, as `openssl x509 -serial` prints it
  std::string name, role, not_after;
  bool revoked = false;  // named by the CA's revocation list (DIR/ca/crl.pem)
};
// Throws std::runtime_error when DIR/ca/crl.pem exists and is not a CRL.
std::vector<IssuedCertificate> pki_index(const std::filesystem::path& dir);

// Renews the kit DIR/kits/NAME: a fresh key and a certificate for the same name and role (the
// role its current certificate names), valid `days` from now, replace the kit's files; the old
// certificate is revoked (it may have been the reason to renew: a leaked key) unless `keep_old`.
// The participant switches by restarting with the new kit, and keeps its place (identity is the
// name); peers refuse the old certificate once they load the new revocation list. Returns the
// kit. Throws std::invalid_argument when there is no such kit.
std::filesystem::path pki_renew(const std::filesystem::path& dir, const std::string& name, int days = 365,
                                std::optional<KeyType> key = std::nullopt,  // default: the current key's type
                                bool keep_old = false);

// Revokes a certificate: the one kit DIR/kits/NAME holds now (`name`), or any the CA issued by
// its serial from the index (`serial`, hex). Adds it to the CA's revocation list, re-signs
// DIR/ca/crl.pem (valid `days`; an expired list makes every check fail, so re-run it, e.g.
// `xsilo pki revoke --refresh`, before then) and copies it into every kit folder under DIR/kits.
// Returns how many certificates the list now names. Both empty: only refreshes the list.
std::size_t pki_revoke(const std::filesystem::path& dir, const std::string& name, int days = 365,
                       const std::string& serial = "");

// The federation a CA certificate (PEM file, a kit's ca.pem) was made for: its organization.
// Throws std::runtime_error naming the file when it is not a certificate.
std::string federation_of_ca(const std::filesystem::path& ca_pem);

std::string role_name(wire::Role role);
wire::Role parse_role(const std::string& s);  // throws std::invalid_argument

}  // namespace xsilo::transport
