#include "protocol/signed_update.h"

#include <cstdio>

namespace xsilo::protocol {

std::string update_statement(const std::string& federation, std::uint64_t round, const std::string& sha256,
                             double weight, std::uint64_t num_samples) {
  char w[64];
  std::snprintf(w, sizeof w, "%.17g", weight);
  return crypto::statement("update", {federation, std::to_string(round), sha256, w, std::to_string(num_samples)});
}

void sign_update(wire::UpdateEnd& end, const crypto::CertSigner& silo, const std::string& federation, std::uint64_t round) {
  end.set_silo_certificate(silo.certificate());
  end.set_silo_signature(
      silo.sign(update_statement(federation, round, end.update_sha256(), end.weight(), end.num_samples())));
}

void copy_signed_word(const wire::UpdateEnd& from, wire::Contributor& to) {
  to.set_update_sha256(from.update_sha256());
  to.set_silo_signature(from.silo_signature());
  to.set_silo_certificate(from.silo_certificate());
}

Status check_signed_word(const wire::Contributor& c, const crypto::CertVerifier& ca, const std::string& federation,
                         std::uint64_t round) {
  if (c.silo_signature().empty()) return Error("carries no signature of " + c.silo() + " over its update");
  const auto verdict = ca.verify(c.silo_certificate(), c.silo(), "silo",
                                 update_statement(federation, round, c.update_sha256(), c.weight(), c.num_samples()),
                                 c.silo_signature());
  if (verdict) return {};
  return Error("the word of " + c.silo() + " on its update does not verify (" + verdict.error().message() + ")");
}

}  // namespace xsilo::protocol
