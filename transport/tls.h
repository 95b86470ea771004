// TLS 1.3 contexts with mutual authentication against the federation CA, and the identity a
// peer proves with its certificate. A name a peer claims in a message is never trusted.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include <boost/asio/ssl/context.hpp>

#include "crypto/certs.h"
#include "proto/status.h"

namespace xsilo::transport {

namespace ssl = boost::asio::ssl;

struct TlsFiles {
  std::filesystem::path key, cert, ca;
  // Optional: the CA's revocation list (`xsilo pki revoke` writes it). When given, certificates
  // it lists are refused in TLS handshakes and in signed protocol statements alike.
  std::filesystem::path crl;
  // A kit folder made by `xsilo pki issue`: key.pem, cert.pem, ca.pem, and crl.pem when the
  // folder has one.
  static TlsFiles from_kit(const std::filesystem::path& kit);
};

// Throws std::runtime_error naming the file when a key, certificate, CA or revocation list
// cannot be loaded or the key does not match the certificate.
ssl::context make_tls_context(const TlsFiles& files);

// This participant's certificate key, to sign protocol statements (crypto/certs.h), and a
// verifier trusting the federation CA and its revocation list. Throw std::runtime_error naming
// the file.
crypto::CertSigner load_signer(const TlsFiles& files);
crypto::CertVerifier load_verifier(const TlsFiles& files);

struct PeerIdentity {
  std::string name;               // the certificate's common name
  wire::Role role = wire::ROLE_UNSPECIFIED;  // from the certificate's organizational unit
  std::chrono::system_clock::time_point not_after{};  // the certificate's expiry
  std::string str() const;
};

// A certificate date as people read it: "2026-12-20" (UTC).
std::string utc_day(std::chrono::system_clock::time_point t);

// Whole days from `now` to `not_after`, to the nearest day (negative once past).
long long days_left(std::chrono::system_clock::time_point not_after,
                    std::chrono::system_clock::time_point now = std::chrono::system_clock::now());

// "certificate of silo hospital-01 expires on 2026-12-20 (20 days left): renew it with `xsilo
// pki renew --name hospital-01` ..." when `id` expires within `warn_days` of `now`, else "".
std::string expiry_warning(const PeerIdentity& id, int warn_days,
                           std::chrono::system_clock::time_point now = std::chrono::system_clock::now());

// Why the peer's certificate failed verification in a handshake on a context of
// make_tls_context, or "" if it did not: "peer certificate CN=hospital-b: certificate revoked: the
// peer's certificate is revoked in crl.pem" (a kit of another CA is said so likewise).
std::string verify_failure(SSL* ssl);

// Reads the verified peer certificate of an established TLS connection.
proto::Result<PeerIdentity> peer_identity(SSL* ssl);
// This process's own identity, read from its certificate (not from what a peer says it is).
// Throws std::runtime_error naming the file.
PeerIdentity own_identity(const TlsFiles& files);
// The identity of `files`, refused (std::runtime_error naming the certificate, its role and the
// `xsilo pki issue` that makes the right one) unless its role is `role`: a daemon given another
// participant's kit says so at start, before it touches its state, rather than running and
// having every peer's handshake fail.
PeerIdentity own_identity_as(const TlsFiles& files, wire::Role role);

// Which identities may connect, per role. A role absent from the map is refused; the name
// "*" admits every certificate of that role signed by the federation CA.
class AllowList {
 public:
  AllowList() = default;
  // Every certificate of these roles ("*" for each).
  AllowList(std::initializer_list<wire::Role> roles) {
    for (auto r : roles) names_[r] = {"*"};
  }
  void allow(wire::Role role, std::set<std::string> names) { names_[role] = std::move(names); }
  proto::Status check(const PeerIdentity& id) const;
  bool allows_role(wire::Role role) const { return names_.count(role) > 0; }
  const std::map<wire::Role, std::set<std::string>>& names() const { return names_; }

 private:
  std::map<wire::Role, std::set<std::string>> names_;
};

}  // namespace xsilo::transport
