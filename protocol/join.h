// A silo joining through an edge, signed end to end. The server gives each edge session a fresh
// nonce (JoinChallenge); the edge hands it to its silos; each silo signs "I, silo S, join
// federation F through edge E for nonce N" with its certificate key; the edge relays the
// proofs in RegionStatus and the server admits a silo behind an edge only when its proof
// verifies against the federation CA for that edge and that nonce. An edge can withhold a
// silo, never invent or take one over.
#pragma once

#include <string>

#include "common/result.h"
#include "crypto/certs.h"
#include "proto/xsilo.pb.h"

namespace xsilo::protocol {

std::string join_statement(const std::string& federation, const std::string& edge, const std::string& nonce,
                           const std::string& silo);

// The silo's answer to `nonce` from `edge` (the name in the edge's TLS certificate).
wire::JoinProof sign_join(const crypto::CertSigner& silo, const std::string& federation, const std::string& edge,
                          const std::string& nonce);

// Whether `proof` is `silo`'s signed join of `federation` through `edge` for `nonce`, by a valid
// silo certificate of the federation CA naming `silo`, or why not.
Status check_join(const crypto::CertVerifier& ca, const wire::JoinProof& proof, const std::string& federation,
                                     const std::string& edge, const std::string& nonce, const std::string& silo);

}  // namespace xsilo::protocol
