// A RoundStart signed by the server. An edge relays it to its silos, and without a signature
// it could hand them another model (with a matching hash), layout or plan, or drop the secure
// setup to make a silo upload in the clear. The server signs all of it, the secure setup
// included (one signature per silo: setups differ by group), with its certificate key; a silo
// takes part only in a round whose start a server of its federation signed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/model.h"
#include "common/result.h"
#include "crypto/certs.h"
#include "proto/xsilo.pb.h"

namespace xsilo::protocol {

// The largest model a silo or an edge accepts by default: 2^34 parameters (64 GiB of float32).
inline constexpr std::uint64_t kMaxModelElements = std::uint64_t{1} << 34;

// Success when the RoundStart's model layout can be allocated: names present and unique, shapes that
// do not overflow, at most `max_elements` in all, and a secure setup (if any) whose ring is 32
// or 64 bits with a vector of at most the model plus its two extra words; otherwise why not.
// Checked before anything is allocated from it.
Status check_layout(const wire::RoundStart& rs, std::uint64_t max_elements = kMaxModelElements);

// Success when the setup's packed wire (wire_bits: protocol/packed.h) is none, or is exactly the
// width every word is decoded in: distributed DP's bits, below a power-of-two masking ring
// (SecAgg or SecAgg+), without an adaptive count word (read in the whole ring, beyond bits).
// Otherwise why not: a width other than bits would make the server decode words it never got.
Status check_wire_bits(const wire::SecAggSetup& s);

// The coordinates a distributed-DP setup encodes (crypto/skellam.h) for `layout`: all of them, or
// under RANDOM_K the shared kept set's (shared_kept_set: k of the compressible coordinates and
// every dense tensor's; its size does not depend on the round's seed). The setup's vector is
// the next power of two above it, plus the count word.
std::size_t skellam_dim(const wire::Compression& c, const std::vector<TensorInfo>& layout);

// Appends `layout`'s tensors to the RoundStart's model layout, as float32 specs, in order.
void add_layout(wire::RoundStart& rs, const std::vector<TensorInfo>& layout);

// The signed bytes: a tag, the federation, and the RoundStart's deterministic protobuf
// encoding without `server_certificate` and `server_signature`.
std::string round_start_statement(const wire::RoundStart& rs, const std::string& federation);

void sign_round_start(wire::RoundStart& rs, const crypto::CertSigner& server, const std::string& federation);

// The name of the server whose valid certificate signed `rs`, or why there is none.
Result<std::string> round_start_signer(const wire::RoundStart& rs, const crypto::CertVerifier& ca,
                                       const std::string& federation);

}  // namespace xsilo::protocol
