// LightSecAgg (crypto/lightsecagg.h) behind the secure-group seam (server/secure/group.h): the
// server's side of one group. Its masked inputs and sums are words of the field of p = 2^32 - 5
// (protocol::MaskedVector::field); finish() maps the unmasked sum back to the fixed-point
// codec's ring, so that decoding is the same as for SecAgg.
#pragma once

#include <memory>

#include "server/secure/group.h"

namespace xsilo::server::secure {

// Plans the setup's LightSecAgg fields for a group of n: t = group_threshold(n) confirmations,
// U = min_survivors = group_min_survivors(n) (so a group tolerates as many dropouts as under
// SecAgg), T = max(1, corrupt_count(n, privacy_corrupt)); keys, signs and returns the group.
std::unique_ptr<Group> make_lightsecagg_group(const SecureConfig& cfg, wire::SecAggSetup setup, GroupContext ctx);

}  // namespace xsilo::server::secure
