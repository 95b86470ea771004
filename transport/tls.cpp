#include "transport/tls.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <ctime>
#include <memory>
#include <optional>

#include <openssl/pem.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <stdexcept>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/fs.h"
#include "crypto/keys.h"
#include "proto/frame.h"
#include "transport/pki.h"

namespace xsilo::transport {

TlsFiles TlsFiles::from_kit(const std::filesystem::path& kit) {
  const auto crl = kit / "crl.pem";
  return {.key = kit / "key.pem", .cert = kit / "cert.pem", .ca = kit / "ca.pem", .crl = reachable(crl) ? crl : ""};
}

namespace {

// A kit file that is missing or unreadable (a kit owned by another user): said with the file and
// the reason, which OpenSSL's own errors ("asio.ssl error", a BIO that is null) name neither of.
void require_readable(const std::filesystem::path& p) {
  if (!std::filesystem::exists(p)) throw std::runtime_error("TLS file " + p.string() + " not found");
  if (const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC); fd < 0) {
    throw std::runtime_error("cannot read TLS file " + p.string() + ": " + std::strerror(errno) +
                             " (the kit must be readable by the user the daemon runs as)");
  } else {
    ::close(fd);
  }
}

// Why the peer's certificate failed verification, kept on the connection (a std::string the SSL
// owns) for the handshake's error, which OpenSSL reduces to "certificate verify failed".
int verify_failure_index() {
  static const int index = SSL_get_ex_new_index(
      0, nullptr, nullptr, nullptr,
      [](void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) { delete static_cast<std::string*>(ptr); });
  return index;
}

// OpenSSL's verdict, unchanged; on the first failure it notes whose certificate it was, the
// error, and for the errors people meet (a kit from another federation, a revoked kit) what it means.
int note_verify_failure(int ok, X509_STORE_CTX* store) try {
  if (ok) return ok;
  auto* ssl = static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  const int index = verify_failure_index();
  if (!ssl || index < 0 || SSL_get_ex_data(ssl, index)) return ok;
  const int err = X509_STORE_CTX_get_error(store);
  std::string cn = "?";
  if (X509* leaf = X509_STORE_CTX_get0_cert(store)) {
    char buf[256] = {0};
    // Any client can present any name before it is refused: kept printable for the log.
    if (X509_NAME_get_text_by_NID(X509_get_subject_name(leaf), NID_commonName, buf, sizeof buf) > 0) {
      cn = proto::printable(buf, 64);
    }
  }
  std::string why = "peer certificate CN=" + cn + ": " + X509_verify_cert_error_string(err);
  switch (err) {
    case X509_V_ERR_CERT_REVOKED:
      why += ": the peer's certificate is revoked in crl.pem";
      break;
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:  // a CA of the same name with another key
      why += ": the peer's kit was issued by another CA, not this federation's ca.pem";
      break;
    default:
      break;
  }
  auto note = std::make_unique<std::string>(std::move(why));
  if (SSL_set_ex_data(ssl, index, note.get())) note.release();  // the SSL's now: freed with it
  return ok;
} catch (...) {
  return ok;  // no note (no memory for one); the verdict is OpenSSL's either way
}

}  // namespace

std::string verify_failure(SSL* ssl) {
  const auto* why = static_cast<const std::string*>(SSL_get_ex_data(ssl, verify_failure_index()));
  return why ? *why : std::string();
}

ssl::context make_tls_context(const TlsFiles& f) {
  for (const auto& p : {f.key, f.cert, f.ca}) require_readable(p);
  // A key others can read is said, not refused: the daemon still works, and the fix is one command.
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::perms mode = fs::status(f.key, ec).permissions();
  if (!ec && (mode & (fs::perms::group_read | fs::perms::others_read)) != fs::perms::none) {
    char octal[8];
    std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(mode) & 07777u);
    spdlog::warn("private key {} has mode {}: its group or others can read it; chmod 600 {}", f.key.string(), octal,
                 f.key.string());
  }
  ssl::context ctx(ssl::context::tls);
  SSL_CTX* native = ctx.native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(native, TLS1_3_VERSION);
  ctx.set_options(ssl::context::default_workarounds | ssl::context::no_compression);
  // One file at a time, so that the error names the one that failed.
  const auto load = [](const std::filesystem::path& file, const char* what, auto&& step) {
    try {
      step();
    } catch (const boost::system::system_error& e) {
      throw std::runtime_error("cannot load " + file.string() + " as " + what + ": " + e.code().message());
    }
  };
  load(f.ca, "the federation CA's certificate (PEM)", [&] { ctx.load_verify_file(f.ca.string()); });
  load(f.cert, "this participant's certificate (PEM)", [&] { ctx.use_certificate_chain_file(f.cert.string()); });
  load(f.key, "this participant's private key (PEM)", [&] { ctx.use_private_key_file(f.key.string(), ssl::context::pem); });
  if (SSL_CTX_check_private_key(native) != 1) {
    throw std::runtime_error("key " + f.key.string() + " does not belong to the certificate " + f.cert.string() +
                             " (the two come from different kits)");
  }
  if (!f.crl.empty()) {
    const std::string pem = read_file(f.crl);
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
    std::unique_ptr<X509_CRL, decltype(&X509_CRL_free)> crl(PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr),
                                                             &X509_CRL_free);
    if (!crl) throw std::runtime_error("revocation list " + f.crl.string() + " is not a PEM CRL");
    // An expired list makes every handshake fail ("CRL has expired"): said at start, with the
    // way out, instead of a daemon that runs and connects to no one (review N7).
    const ASN1_TIME* next = X509_CRL_get0_nextUpdate(crl.get());
    if (next && X509_cmp_current_time(next) < 0) {
      std::tm tm{};
      char day[16] = "?";
      if (ASN1_TIME_to_tm(next, &tm) == 1) std::strftime(day, sizeof day, "%Y-%m-%d", &tm);
      throw std::runtime_error("revocation list " + f.crl.string() + " expired on " + day +
                               ": every handshake would fail with it. Refresh it (xsilo pki revoke --refresh) and "
                               "give the new crl.pem to every participant");
    }
    if (next) {
      std::time_t soon = std::time(nullptr) + 7 * 86400;
      if (X509_cmp_time(next, &soon) < 0) {
        std::tm tm{};
        char day[16] = "?";
        if (ASN1_TIME_to_tm(next, &tm) == 1) std::strftime(day, sizeof day, "%Y-%m-%d", &tm);
        spdlog::warn("revocation list {} expires on {}: refresh it (xsilo pki revoke --refresh) before then, or every "
                     "handshake fails",
                     f.crl.string(), day);
      }
    }
    X509_STORE* store = SSL_CTX_get_cert_store(native);
    X509_STORE_add_crl(store, crl.get());
    X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK);
  }
  verify_failure_index();  // made here, not inside the first handshake that fails
  SSL_CTX_set_verify(native, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, note_verify_failure);
  return ctx;
}

crypto::CertSigner load_signer(const TlsFiles& f) {
  try {
    const crypto::SecretText key(read_file(f.key));
    return crypto::CertSigner::from_pem(read_file(f.cert), key.str());
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error("cannot sign with " + f.cert.string() + " and " + f.key.string() + ": " + e.what());
  }
}

crypto::CertVerifier load_verifier(const TlsFiles& f) {
  try {
    return crypto::CertVerifier::from_pem(read_file(f.ca), f.crl.empty() ? std::string() : read_file(f.crl));
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error("cannot trust " + f.ca.string() + (f.crl.empty() ? "" : " with " + f.crl.string()) +
                             ": " + e.what());
  }
}

std::string PeerIdentity::str() const { return role_name(role) + " " + name; }

std::string utc_day(std::chrono::system_clock::time_point t) {
  const std::time_t s = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&s, &tm);
  char day[32];
  std::strftime(day, sizeof day, "%Y-%m-%d", &tm);
  return day;
}

long long days_left(std::chrono::system_clock::time_point not_after, std::chrono::system_clock::time_point now) {
  // To the nearest day: a certificate issued for 10 days has 10 left, not 9 (hours floored).
  const auto minutes = std::chrono::duration_cast<std::chrono::minutes>(not_after - now).count();
  constexpr long long kDay = 24 * 60;
  return minutes >= 0 ? (minutes + kDay / 2) / kDay : -((-minutes + kDay / 2) / kDay);
}

std::string expiry_warning(const PeerIdentity& id, int warn_days, std::chrono::system_clock::time_point now) {
  if (warn_days <= 0 || id.not_after == std::chrono::system_clock::time_point{}) return "";
  const auto left = std::chrono::duration_cast<std::chrono::hours>(id.not_after - now).count();
  if (left >= static_cast<long long>(warn_days) * 24) return "";
  const long long days = days_left(id.not_after, now);
  const bool past = id.not_after <= now;
  std::string when = std::string(past ? "expired on " : "expires on ") + utc_day(id.not_after);
  if (!past && days < 1) when += " (less than a day left)";
  if (!past && days >= 1) when += " (" + std::to_string(days) + (days == 1 ? " day left)" : " days left)");
  return "certificate of " + id.str() + " " + when + ": renew it with `xsilo pki renew --name " + id.name +
         "` and restart it with the new kit (docs/deployment.md)";
}

namespace {

// The identity a certificate names: CN is the name, OU the role. On failure, `why` says what is
// missing, to be finished by the caller with whose certificate it was.
std::optional<PeerIdentity> identity_in(X509* cert, std::string& why) {
  char cn[256] = {0}, ou[64] = {0};
  X509_NAME* subject = X509_get_subject_name(cert);
  if (X509_NAME_get_text_by_NID(subject, NID_commonName, cn, sizeof cn) <= 0) {
    why = "has no common name";
    return std::nullopt;
  }
  X509_NAME_get_text_by_NID(subject, NID_organizationalUnitName, ou, sizeof ou);
  PeerIdentity id;
  id.name = cn;
  std::tm tm{};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert), &tm) == 1) {
    id.not_after = std::chrono::system_clock::from_time_t(timegm(&tm));
  }
  try {
    id.role = parse_role(ou);
  } catch (const std::invalid_argument&) {
    why = "for " + id.name + " names no xsilo role (OU=" + ou + ")";
    return std::nullopt;
  }
  return id;
}

}  // namespace

proto::Result<PeerIdentity> peer_identity(SSL* ssl) {
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (!cert) return proto::error(wire::NOT_ALLOWED, "peer presented no certificate");
  if (SSL_get_verify_result(ssl) != X509_V_OK) {
    return proto::error(wire::NOT_ALLOWED, "peer certificate did not verify");
  }
  std::string why;
  auto id = identity_in(cert, why);
  if (!id) return proto::error(wire::NOT_ALLOWED, "peer certificate " + why);
  return *id;
}

PeerIdentity own_identity(const TlsFiles& files) {
  // The daemons read their certificate here first (the role check), before make_tls_context.
  require_readable(files.cert);
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_file(files.cert.c_str(), "r"), &BIO_free);
  if (!bio) throw std::runtime_error("cannot read certificate " + files.cert.string());
  std::unique_ptr<X509, decltype(&X509_free)> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), &X509_free);
  if (!cert) throw std::runtime_error("certificate " + files.cert.string() + " is not PEM");
  std::string why;
  auto id = identity_in(cert.get(), why);
  if (!id) throw std::runtime_error("certificate " + files.cert.string() + " " + why);
  return *id;
}

PeerIdentity own_identity_as(const TlsFiles& files, wire::Role role) {
  auto id = own_identity(files);
  if (id.role != role) {
    const std::string want = role_name(role);
    const char* article = want == "edge" || want == "admin" ? "an " : "a ";
    throw std::runtime_error("certificate " + files.cert.string() + " is for " + id.str() + "; " + article + want +
                             " needs a kit issued with `xsilo pki issue --role " + want + " --name ...`");
  }
  return id;
}

proto::Status AllowList::check(const PeerIdentity& id) const {
  auto it = names_.find(id.role);
  if (it == names_.end()) {
    return proto::error(wire::NOT_ALLOWED, "role " + role_name(id.role) + " may not connect here (" +
                                               id.str() + ")");
  }
  if (it->second.count("*") || it->second.count(id.name)) return proto::Status();
  return proto::error(wire::NOT_ALLOWED, id.str() + " is not on the allow-list");
}

}  // namespace xsilo::transport
