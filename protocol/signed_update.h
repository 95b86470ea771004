// A silo's word on its own upload, which an edge passes on unchanged: the silo signs the SHA-256
// of the update bytes it sent, its weight and sample count, for this federation and round. An
// edge folds its silos' uploads into one partial sum and forwards each silo's signed word beside
// it (Contributor); the server checks every signature before the sum is folded, and records each
// silo's own hash (which the silo's sent.jsonl names too) and the region's sum apart. An edge
// can neither change what a silo says it sent, nor speak for a silo that sent nothing.
#pragma once

#include <cstdint>
#include <string>

#include "common/result.h"
#include "crypto/certs.h"
#include "proto/xsilo.pb.h"

namespace xsilo::protocol {

// The signed bytes: federation, round, the update's SHA-256, its weight (17 significant digits)
// and sample count.
std::string update_statement(const std::string& federation, std::uint64_t round, const std::string& sha256,
                             double weight, std::uint64_t num_samples);

// Signs `end` (its update_sha256, weight and num_samples) as the silo `silo`.
void sign_update(wire::UpdateEnd& end, const crypto::CertSigner& silo, const std::string& federation, std::uint64_t round);

// A contributor's word as a silo's UpdateEnd carried it, for an edge to forward.
void copy_signed_word(const wire::UpdateEnd& from, wire::Contributor& to);

// Success when `c` is signed by a valid silo certificate naming c.silo(), over its own sha256,
// weight and sample count in this round; otherwise why not.
Status check_signed_word(const wire::Contributor& c, const crypto::CertVerifier& ca, const std::string& federation,
                         std::uint64_t round);

}  // namespace xsilo::protocol
