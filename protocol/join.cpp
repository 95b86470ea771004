#include "protocol/join.h"

namespace xsilo::protocol {

std::string join_statement(const std::string& federation, const std::string& edge, const std::string& nonce,
                           const std::string& silo) {
  return crypto::statement("join", {federation, edge, nonce, silo});
}

wire::JoinProof sign_join(const crypto::CertSigner& silo, const std::string& federation, const std::string& edge,
                          const std::string& nonce) {
  wire::JoinProof p;
  p.set_silo(silo.who().name);
  p.set_certificate(silo.certificate());
  p.set_nonce(nonce);
  p.set_signature(silo.sign(join_statement(federation, edge, nonce, silo.who().name)));
  return p;
}

Status check_join(const crypto::CertVerifier& ca, const wire::JoinProof& proof, const std::string& federation,
                  const std::string& edge, const std::string& nonce, const std::string& silo) {
  if (proof.silo() != silo) return Error("the proof is for " + proof.silo() + ", not " + silo);
  if (nonce.empty() || proof.nonce() != nonce) {
    return Error("the proof answers another edge session's challenge, or an earlier one of this session");
  }
  const auto verdict = ca.verify(proof.certificate(), silo, "silo", join_statement(federation, edge, nonce, silo),
                                 proof.signature());
  if (!verdict) return Error("its join signature does not verify: " + verdict.error().message());
  return {};
}

}  // namespace xsilo::protocol
