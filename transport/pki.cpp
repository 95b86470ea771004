#include "transport/pki.h"

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <memory>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include <spdlog/spdlog.h>

#include "common/fs.h"
#include "crypto/keys.h"
#include "crypto/openssl_ptr.h"
#include "transport/tls.h"

namespace xsilo::transport {

namespace {

using crypto::BioPtr;
using crypto::CrlPtr;
using crypto::PkeyPtr;
using crypto::X509Ptr;

[[noreturn]] void ossl_fail(const std::string& what) {
  char buf[256];
  ERR_error_string_n(ERR_get_error(), buf, sizeof buf);
  throw std::runtime_error(what + ": " + buf);
}

PkeyPtr generate_key(KeyType type) {
  EVP_PKEY* k = type == KeyType::P256 ? EVP_EC_gen("P-256")
                                      : EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
  if (!k) ossl_fail("key generation failed");
  return PkeyPtr(k);
}

std::string to_pem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_secmem()));  // cleared when freed
  if (!PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr)) {
    ossl_fail("cannot encode the private key");
  }
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(n));
}

std::string to_pem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_X509(bio.get(), cert)) ossl_fail("cannot encode the certificate");
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(n));
}

PkeyPtr read_key(const std::filesystem::path& p) {
  const crypto::SecretText pem(read_file(p));
  BioPtr bio(BIO_new_mem_buf(pem.str().data(), static_cast<int>(pem.str().size())));
  EVP_PKEY* k = PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr);
  if (!k) ossl_fail("cannot read the key " + p.string());
  return PkeyPtr(k);
}

X509Ptr read_cert(const std::filesystem::path& p) {
  const std::string pem = read_file(p);
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  X509* c = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
  if (!c) ossl_fail("cannot read the certificate " + p.string());
  return X509Ptr(c);
}

void add_ext(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (!ext) ossl_fail(std::string("cannot build extension ") + value);
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

X509Ptr make_cert(EVP_PKEY* subject_key, const std::string& cn, const std::string& ou,
                  const std::string& org, X509* issuer, EVP_PKEY* issuer_key,
                  std::int64_t not_before_offset_s, int days, bool is_ca) {
  X509Ptr cert(X509_new());
  X509_set_version(cert.get(), 2);
  std::unique_ptr<BIGNUM, crypto::OpenSslDeleter<BIGNUM, BN_free>> serial(BN_new());
  BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY);
  BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get()));
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), static_cast<long>(not_before_offset_s));
  X509_gmtime_adj(X509_getm_notAfter(cert.get()),
                  static_cast<long>(not_before_offset_s + std::int64_t{days} * 86400));
  X509_set_pubkey(cert.get(), subject_key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  auto add = [&](const char* field, const std::string& v) {
    X509_NAME_add_entry_by_txt(name, field, MBSTRING_UTF8,
                               reinterpret_cast<const unsigned char*>(v.c_str()), -1, -1, 0);
  };
  add("O", org);
  add("OU", ou);
  add("CN", cn);
  X509* iss = issuer ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(iss));
  if (is_ca) {
    add_ext(cert.get(), iss, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
    add_ext(cert.get(), iss, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_ext(cert.get(), iss, NID_basic_constraints, "critical,CA:FALSE");
    add_ext(cert.get(), iss, NID_key_usage, "critical,digitalSignature,keyAgreement");
    add_ext(cert.get(), iss, NID_ext_key_usage, "serverAuth,clientAuth");
    add_ext(cert.get(), iss, NID_subject_alt_name, ("DNS:" + cn).c_str());
  }
  add_ext(cert.get(), iss, NID_subject_key_identifier, "hash");
  const EVP_MD* md = EVP_PKEY_get_id(issuer_key) == EVP_PKEY_ED25519 ? nullptr : EVP_sha256();
  if (!X509_sign(cert.get(), issuer_key, md)) ossl_fail("cannot sign the certificate");
  return cert;
}

std::string federation_of(X509* ca) {
  char buf[256] = {0};
  X509_NAME_get_text_by_NID(X509_get_subject_name(ca), NID_organizationName, buf, sizeof buf);
  return buf;
}

}  // namespace

std::string federation_of_ca(const std::filesystem::path& ca_pem) {
  const std::string pem = read_file(ca_pem);
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  X509Ptr ca(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (!ca) throw std::runtime_error(ca_pem.string() + ": not a PEM certificate");
  return federation_of(ca.get());
}

std::string role_name(wire::Role role) {
  switch (role) {
    case wire::SERVER: return "server";
    case wire::EDGE: return "edge";
    case wire::SILO: return "silo";
    case wire::ADMIN: return "admin";
    default: return "unknown";
  }
}

wire::Role parse_role(const std::string& s) {
  if (s == "server") return wire::SERVER;
  if (s == "edge") return wire::EDGE;
  if (s == "silo") return wire::SILO;
  if (s == "admin") return wire::ADMIN;
  throw std::invalid_argument("role must be server, edge, silo or admin, got \"" + s + "\"");
}

void pki_init(const std::filesystem::path& dir, const std::string& federation, int days,
              KeyType type) {
  const auto ca_dir = dir / "ca";
  if (std::filesystem::exists(ca_dir / "ca.key")) {
    throw std::runtime_error("a CA already exists in " + ca_dir.string() +
                             "; refusing to overwrite it");
  }
  std::filesystem::create_directories(ca_dir);
  auto key = generate_key(type);
  auto cert = make_cert(key.get(), federation + " federation CA", "ca", federation, nullptr,
                        key.get(), 0, days, true);
  atomic_write_file(ca_dir / "ca.key", crypto::SecretText(to_pem(key.get())).str(), 0600);
  atomic_write_file(ca_dir / "ca.pem", to_pem(cert.get()), 0644);
}

namespace {

std::string serial_hex(X509* cert) {
  std::unique_ptr<BIGNUM, decltype(&BN_free)> bn(ASN1_INTEGER_to_BN(X509_get_serialNumber(cert), nullptr), &BN_free);
  if (!bn) ossl_fail("cannot read a certificate's serial");
  char* hex = BN_bn2hex(bn.get());
  std::string out(hex);
  OPENSSL_free(hex);
  return out;
}

std::string asn1_time_text(const ASN1_TIME* t) {
  std::tm tm{};
  if (ASN1_TIME_to_tm(t, &tm) != 1) return "";
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void append_index(const std::filesystem::path& dir, X509* cert, const std::string& name, const std::string& role) {
  const nlohmann::json line = {{"serial", serial_hex(cert)},
                               {"name", name},
                               {"role", role},
                               {"not_after", asn1_time_text(X509_get0_notAfter(cert))}};
  cut_torn_tail(dir / "ca" / "index.jsonl");
  append_durable(dir / "ca" / "index.jsonl", line.dump() + "\n");
}

}  // namespace

std::vector<IssuedCertificate> pki_index(const std::filesystem::path& dir) {
  std::vector<IssuedCertificate> out;
  std::ifstream in(dir / "ca" / "index.jsonl");
  for (std::string line; std::getline(in, line);) {
    try {
      const auto j = nlohmann::json::parse(line);
      out.push_back(
          {.serial = j.at("serial"), .name = j.at("name"), .role = j.at("role"), .not_after = j.value("not_after", "")});
    } catch (const std::exception&) {
      // a damaged line: the others still count
    }
  }
  // Which of them the CA's revocation list names (DIR/ca/crl.pem, once anything was revoked).
  const auto crl_path = dir / "ca" / "crl.pem";
  if (!std::filesystem::exists(crl_path)) return out;
  const std::string pem = read_file(crl_path);
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  CrlPtr crl(PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr));
  if (!crl) {
    // The listing is what an operator reads to find out what went wrong: given without the marks.
    ERR_clear_error();
    spdlog::warn("cannot read the revocation list {}: certificates are listed without their revoked marks",
                 crl_path.string());
    return out;
  }
  for (auto& c : out) {
    BIGNUM* bn = nullptr;
    const int digits = BN_hex2bn(&bn, c.serial.c_str());
    std::unique_ptr<BIGNUM, decltype(&BN_free)> owned(bn, &BN_free);
    if (digits <= 0 || static_cast<std::size_t>(digits) != c.serial.size()) continue;  // a damaged serial
    std::unique_ptr<ASN1_INTEGER, decltype(&ASN1_INTEGER_free)> number(BN_to_ASN1_INTEGER(bn, nullptr),
                                                                       &ASN1_INTEGER_free);
    X509_REVOKED* listed = nullptr;
    c.revoked = number && X509_CRL_get0_by_serial(crl.get(), &listed, number.get()) == 1;
  }
  return out;
}

std::filesystem::path pki_issue(const std::filesystem::path& dir, const IssueRequest& req) {
  const bool name_ok =
      !req.name.empty() && req.name.size() <= 64 && req.name != "." && req.name != ".." &&
      req.name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") ==
          std::string::npos;
  if (!name_ok) {
    throw std::invalid_argument("participant name \"" + req.name +
                                "\" must be 1-64 characters of A-Z a-z 0-9 . _ -");
  }
  if (req.role != wire::SERVER && req.role != wire::EDGE && req.role != wire::SILO && req.role != wire::ADMIN) {
    throw std::invalid_argument("role must be server, edge, silo or admin");
  }
  const auto ca_dir = dir / "ca";
  if (!std::filesystem::exists(ca_dir / "ca.key")) {
    throw std::runtime_error("no CA in " + ca_dir.string() + "; run `xsilo pki init` first");
  }
  auto ca_key = read_key(ca_dir / "ca.key");
  auto ca_cert = read_cert(ca_dir / "ca.pem");
  auto key = generate_key(req.key);
  auto cert = make_cert(key.get(), req.name, role_name(req.role), federation_of(ca_cert.get()),
                        ca_cert.get(), ca_key.get(), req.not_before_offset_s, req.days, false);
  const auto kit = dir / "kits" / req.name;
  std::filesystem::create_directories(kit);
  atomic_write_file(kit / "key.pem", crypto::SecretText(to_pem(key.get())).str(), 0600);
  atomic_write_file(kit / "cert.pem", to_pem(cert.get()), 0644);
  atomic_write_file(kit / "ca.pem", read_file(ca_dir / "ca.pem"), 0644);
  append_index(dir, cert.get(), req.name, role_name(req.role));
  return kit;
}

std::filesystem::path pki_renew(const std::filesystem::path& dir, const std::string& name, int days,
                                std::optional<KeyType> key, bool keep_old) {
  const auto kit = dir / "kits" / name;
  if (name.empty() || !std::filesystem::exists(kit / "cert.pem")) {
    throw std::invalid_argument("no kit " + kit.string() + " to renew (issue one with `xsilo pki issue`)");
  }
  const auto current = own_identity(TlsFiles::from_kit(kit));
  if (current.name != name) {
    throw std::invalid_argument("kit " + kit.string() + " holds a certificate for " + current.name + ", not " + name);
  }
  IssueRequest req;
  req.role = current.role;
  req.name = name;
  req.days = days;
  auto old = read_cert(kit / "cert.pem");
  if (key) {
    req.key = *key;
  } else {
    req.key = EVP_PKEY_get_base_id(X509_get0_pubkey(old.get())) == EVP_PKEY_ED25519 ? KeyType::Ed25519 : KeyType::P256;
  }
  const std::string old_serial = serial_hex(old.get());
  const auto renewed = pki_issue(dir, req);
  if (!keep_old) pki_revoke(dir, "", 365, old_serial);
  return renewed;
}

std::size_t pki_revoke(const std::filesystem::path& dir, const std::string& name, int days, const std::string& serial) {
  const auto ca_dir = dir / "ca";
  if (!std::filesystem::exists(ca_dir / "ca.key")) {
    throw std::runtime_error("no CA in " + ca_dir.string() + "; run `xsilo pki init` first");
  }
  auto ca_key = read_key(ca_dir / "ca.key");
  auto ca_cert = read_cert(ca_dir / "ca.pem");
  CrlPtr crl(X509_CRL_new());
  X509_CRL_set_version(crl.get(), 1);  // v2
  X509_CRL_set_issuer_name(crl.get(), X509_get_subject_name(ca_cert.get()));
  // What the list named before.
  if (std::filesystem::exists(ca_dir / "crl.pem")) {
    const std::string pem = read_file(ca_dir / "crl.pem");
    BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
    CrlPtr old(PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr));
    if (!old) ossl_fail("cannot read the revocation list " + (ca_dir / "crl.pem").string());
    STACK_OF(X509_REVOKED)* entries = X509_CRL_get_REVOKED(old.get());
    for (int i = 0; i < sk_X509_REVOKED_num(entries); ++i) {
      X509_CRL_add0_revoked(crl.get(), X509_REVOKED_dup(sk_X509_REVOKED_value(entries, i)));
    }
  }
  std::unique_ptr<ASN1_TIME, crypto::OpenSslDeleter<ASN1_TIME, ASN1_TIME_free>> now(ASN1_TIME_new()), next(ASN1_TIME_new());
  X509_gmtime_adj(now.get(), 0);
  X509_gmtime_adj(next.get(), static_cast<long>(std::int64_t{days} * 86400));
  auto revoke = [&](const ASN1_INTEGER* number) {
    X509_REVOKED* listed = nullptr;
    if (X509_CRL_get0_by_serial(crl.get(), &listed, number) == 1) return;  // already on the list
    X509_REVOKED* r = X509_REVOKED_new();
    X509_REVOKED_set_serialNumber(r, const_cast<ASN1_INTEGER*>(number));
    X509_REVOKED_set_revocationDate(r, now.get());
    X509_CRL_add0_revoked(crl.get(), r);
  };
  if (!name.empty()) {
    const auto cert_path = dir / "kits" / name / "cert.pem";
    if (!std::filesystem::exists(cert_path)) throw std::invalid_argument("no kit " + (dir / "kits" / name).string());
    auto cert = read_cert(cert_path);
    revoke(X509_get_serialNumber(cert.get()));
  }
  if (!serial.empty()) {
    const auto issued = pki_index(dir);
    const bool known = std::any_of(issued.begin(), issued.end(), [&](const IssuedCertificate& c) {
      return OPENSSL_strcasecmp(c.serial.c_str(), serial.c_str()) == 0;
    });
    if (!known) {
      throw std::invalid_argument("no certificate with serial " + serial + " in " + (ca_dir / "index.jsonl").string() +
                                  " (xsilo pki list shows what this CA issued)");
    }
    BIGNUM* bn = nullptr;
    if (!BN_hex2bn(&bn, serial.c_str())) throw std::invalid_argument("serial " + serial + " is not hex");
    std::unique_ptr<BIGNUM, decltype(&BN_free)> owned(bn, &BN_free);
    std::unique_ptr<ASN1_INTEGER, decltype(&ASN1_INTEGER_free)> number(BN_to_ASN1_INTEGER(bn, nullptr), &ASN1_INTEGER_free);
    revoke(number.get());
  }
  X509_CRL_set1_lastUpdate(crl.get(), now.get());
  X509_CRL_set1_nextUpdate(crl.get(), next.get());
  X509_CRL_sort(crl.get());
  const EVP_MD* md = EVP_PKEY_get_id(ca_key.get()) == EVP_PKEY_ED25519 ? nullptr : EVP_sha256();
  if (!X509_CRL_sign(crl.get(), ca_key.get(), md)) ossl_fail("cannot sign the revocation list");
  BioPtr out(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_X509_CRL(out.get(), crl.get())) ossl_fail("cannot encode the revocation list");
  char* data = nullptr;
  const long n = BIO_get_mem_data(out.get(), &data);
  const std::string pem(data, static_cast<std::size_t>(n));
  atomic_write_file(ca_dir / "crl.pem", pem, 0644);
  if (std::filesystem::exists(dir / "kits")) {
    for (const auto& kit : std::filesystem::directory_iterator(dir / "kits")) {
      if (kit.is_directory()) atomic_write_file(kit.path() / "crl.pem", pem, 0644);
    }
  }
  return static_cast<std::size_t>(sk_X509_REVOKED_num(X509_CRL_get_REVOKED(crl.get())));
}

}  // namespace xsilo::transport
