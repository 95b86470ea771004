#include "crypto/certs.h"

#include <ctime>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <chrono>
#include <map>
#include <mutex>
#include <stdexcept>

#include "crypto/fuzz_memo.h"
#include "crypto/openssl_ptr.h"

namespace xsilo::crypto {

namespace {

using StoreCtxPtr = std::unique_ptr<X509_STORE_CTX, OpenSslDeleter<X509_STORE_CTX, X509_STORE_CTX_free>>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, OpenSslDeleter<EVP_MD_CTX, EVP_MD_CTX_free>>;

std::string ossl_error() {
  char buf[256] = {0};
  ERR_error_string_n(ERR_get_error(), buf, sizeof buf);
  ERR_clear_error();
  return buf;
}

BioPtr mem_bio(std::string_view text) {
  return BioPtr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

X509Ptr cert_from_der(std::string_view der) {
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  X509Ptr cert(d2i_X509(nullptr, &p, static_cast<long>(der.size())));
  if (cert && p != reinterpret_cast<const unsigned char*>(der.data()) + der.size()) cert.reset();  // trailing bytes
  ERR_clear_error();
  return cert;
}

CertifiedName names_in(X509* cert) {
  char cn[256] = {0}, ou[64] = {0};
  X509_NAME* subject = X509_get_subject_name(cert);
  X509_NAME_get_text_by_NID(subject, NID_commonName, cn, sizeof cn);
  X509_NAME_get_text_by_NID(subject, NID_organizationalUnitName, ou, sizeof ou);
  return {cn, ou};
}

// SHA-256 for ECDSA and RSA keys; Ed25519 hashes by itself.
const EVP_MD* digest_for(EVP_PKEY* key) { return EVP_PKEY_get_id(key) == EVP_PKEY_ED25519 ? nullptr : EVP_sha256(); }

}  // namespace

std::optional<std::int64_t> certificate_not_after(std::string_view der) {
  X509Ptr cert = cert_from_der(der);
  std::tm tm{};
  if (!cert || ASN1_TIME_to_tm(X509_get0_notAfter(cert.get()), &tm) != 1) return std::nullopt;
  return static_cast<std::int64_t>(timegm(&tm));
}

void append_field(std::string& out, std::string_view field) {
  const auto n = static_cast<std::uint32_t>(field.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += field;
}

std::string statement(std::string_view tag, std::initializer_list<std::string_view> fields) {
  std::string out = "xsilo/";
  out += tag;
  for (auto f : fields) append_field(out, f);
  return out;
}

// ---- signer ---------------------------------------------------------------------------------

struct CertSigner::Impl {
  PkeyPtr key;
  std::string der;
  CertifiedName who;
};

CertSigner CertSigner::from_pem(std::string_view cert_pem, std::string_view key_pem) {
  auto impl = std::make_shared<Impl>();
  auto cb = mem_bio(cert_pem);
  X509Ptr cert(PEM_read_bio_X509(cb.get(), nullptr, nullptr, nullptr));
  if (!cert) throw std::invalid_argument("not a PEM certificate: " + ossl_error());
  auto kb = mem_bio(key_pem);
  impl->key.reset(PEM_read_bio_PrivateKey(kb.get(), nullptr, nullptr, nullptr));
  if (!impl->key) throw std::invalid_argument("not a PEM private key: " + ossl_error());
  if (X509_check_private_key(cert.get(), impl->key.get()) != 1) {
    ERR_clear_error();
    throw std::invalid_argument("the private key does not belong to the certificate");
  }
  unsigned char* der = nullptr;
  const int n = i2d_X509(cert.get(), &der);
  if (n <= 0) throw std::invalid_argument("cannot encode the certificate: " + ossl_error());
  impl->der.assign(reinterpret_cast<const char*>(der), static_cast<std::size_t>(n));
  OPENSSL_free(der);
  impl->who = names_in(cert.get());
  CertSigner s;
  s.impl_ = std::move(impl);
  return s;
}

const std::string& CertSigner::certificate() const { return impl_->der; }
const CertifiedName& CertSigner::who() const { return impl_->who; }

std::string CertSigner::sign(std::string_view message) const {
  return fuzz_memo::remember({impl_->der, message}, [&] {
    MdCtxPtr ctx(EVP_MD_CTX_new());
    std::size_t n = 0;
    const auto* m = reinterpret_cast<const unsigned char*>(message.data());
    if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, digest_for(impl_->key.get()), nullptr, impl_->key.get()) != 1 ||
        EVP_DigestSign(ctx.get(), nullptr, &n, m, message.size()) != 1) {
      throw std::runtime_error("cannot sign: " + ossl_error());
    }
    std::string sig(n, '\0');
    if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &n, m, message.size()) != 1) {
      throw std::runtime_error("cannot sign: " + ossl_error());
    }
    sig.resize(n);
    return sig;
  });
}

// ---- verifier -------------------------------------------------------------------------------

struct CertVerifier::Impl {
  StorePtr store;
  std::mutex mu;
  struct Checked {
    CertifiedName who;
    std::shared_ptr<EVP_PKEY> key;
    std::chrono::steady_clock::time_point at;
  };
  std::map<std::string, Checked, std::less<>> cache;  // by DER; certificates that verified

  // The verdict on `certificate`: from the cache, or verified (and kept) when it is not there
  // or a minute old; why not, when it does not verify. Called with `mu` held.
  Result<const Checked*> checked(std::string_view certificate);
  // Success when `certificate` verifies and names `name` in `role`; the key it certifies in `key_out`.
  Status check(std::string_view certificate, const std::string& name, const std::string& role,
               std::shared_ptr<EVP_PKEY>* key_out);
};

namespace {

// Success when a certificate that verified is the one wanted, else why not.
Status check_wanted(const CertifiedName& who, const std::string& name, const std::string& role) {
  if (who.role != role) return Error("the certificate of " + who.name + " is for role '" + who.role + "', not " + role);
  if (who.name != name) return Error("the certificate names " + who.name + ", not " + name);
  return {};
}

}  // namespace

CertVerifier CertVerifier::from_pem(std::string_view ca_pem, std::string_view crl_pem) {
  auto impl = std::make_shared<Impl>();
  impl->store.reset(X509_STORE_new());
  auto cb = mem_bio(ca_pem);
  X509Ptr ca(PEM_read_bio_X509(cb.get(), nullptr, nullptr, nullptr));
  if (!ca) throw std::invalid_argument("the CA is not a PEM certificate: " + ossl_error());
  if (X509_STORE_add_cert(impl->store.get(), ca.get()) != 1) {
    throw std::invalid_argument("cannot trust the CA: " + ossl_error());
  }
  if (!crl_pem.empty()) {
    auto rb = mem_bio(crl_pem);
    CrlPtr crl(PEM_read_bio_X509_CRL(rb.get(), nullptr, nullptr, nullptr));
    if (!crl) throw std::invalid_argument("the revocation list is not a PEM CRL: " + ossl_error());
    EVP_PKEY* ca_key = X509_get0_pubkey(ca.get());
    if (!ca_key || X509_CRL_verify(crl.get(), ca_key) != 1) {
      ERR_clear_error();
      throw std::invalid_argument("the revocation list is not signed by the federation CA");
    }
    X509_STORE_add_crl(impl->store.get(), crl.get());
    X509_STORE_set_flags(impl->store.get(), X509_V_FLAG_CRL_CHECK);
  }
  CertVerifier v;
  v.impl_ = std::move(impl);
  return v;
}

Result<const CertVerifier::Impl::Checked*> CertVerifier::Impl::checked(std::string_view certificate) {
  using Clock = std::chrono::steady_clock;
  // A verdict is kept for a minute: long enough for a round's many signatures, short enough
  // that an expiry is noticed.
  constexpr auto kFresh = std::chrono::minutes(1);
  auto it = cache.find(certificate);
  if (it != cache.end() && Clock::now() - it->second.at <= kFresh) return &it->second;
  if (it != cache.end()) cache.erase(it);
  X509Ptr cert = cert_from_der(certificate);
  if (!cert) return Error("the certificate is not DER");
  StoreCtxPtr ctx(X509_STORE_CTX_new());
  if (!ctx || X509_STORE_CTX_init(ctx.get(), store.get(), cert.get(), nullptr) != 1) {
    return Error("cannot check the certificate: " + ossl_error());
  }
  if (X509_verify_cert(ctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    return Error(std::string("the certificate did not verify against the federation CA: ") +
                 X509_verify_cert_error_string(err));
  }
  EVP_PKEY* key = X509_get_pubkey(cert.get());
  if (!key) return Error("the certificate holds no usable key");
  if (cache.size() >= 4096) cache.clear();  // bounded; a round needs far fewer
  return &cache
              .emplace(std::string(certificate),
                       Checked{names_in(cert.get()), std::shared_ptr<EVP_PKEY>(key, EVP_PKEY_free), Clock::now()})
              .first->second;
}

Status CertVerifier::Impl::check(std::string_view certificate, const std::string& name, const std::string& role,
                                std::shared_ptr<EVP_PKEY>* key_out) {
  std::lock_guard lock(mu);
  const auto c = checked(certificate);
  if (!c) return c.error();
  if (auto wanted = check_wanted((*c)->who, name, role); !wanted) return wanted;
  if (key_out) *key_out = (*c)->key;
  return {};
}

Status CertVerifier::check(std::string_view certificate, const std::string& name, const std::string& role) const {
  return impl_->check(certificate, name, role, nullptr);
}

// Parses the certificate only when its verdict is not cached (d2i_X509 costs as much as a
// signature check: half of what a silo spent on a RoundStart).
Result<CertifiedName> CertVerifier::certified(std::string_view certificate, const std::string& role) const {
  std::lock_guard lock(impl_->mu);
  const auto c = impl_->checked(certificate);
  if (!c) return c.error();
  if (auto wanted = check_wanted((*c)->who, (*c)->who.name, role); !wanted) return wanted.error();
  return (*c)->who;
}

Status CertVerifier::verify(std::string_view certificate, const std::string& name, const std::string& role,
                            std::string_view message, std::string_view signature) const {
  std::shared_ptr<EVP_PKEY> key;
  if (auto checked = impl_->check(certificate, name, role, &key); !checked) return checked;
  const bool ok = fuzz_memo::remember({certificate, message, signature}, [&] {
    MdCtxPtr ctx(EVP_MD_CTX_new());
    const bool good = ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, digest_for(key.get()), nullptr, key.get()) == 1 &&
                      EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                                       signature.size(), reinterpret_cast<const unsigned char*>(message.data()),
                                       message.size()) == 1;
    ERR_clear_error();
    return good;
  });
  if (!ok) return Error("the signature of " + name + " does not verify");
  return {};
}

}  // namespace xsilo::crypto
