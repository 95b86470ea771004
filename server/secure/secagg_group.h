// SecAgg and SecAgg+ (crypto/secagg.h) behind the secure-group seam (server/secure/group.h): the
// server's side of one group, its steps translated to and from crypto::secagg::Server's plain
// structs. SecAgg+ is the same protocol on a neighbour graph: the setup's degree says which.
#pragma once

#include <memory>

#include "server/secure/group.h"

namespace xsilo::server::secure {

// Plans the setup's SecAgg fields (threshold, min_survivors, SecAgg+'s degree and graph seed,
// the key unmask answers are sealed to), signs it and returns the group.
std::unique_ptr<Group> make_secagg_group(const SecureConfig& cfg, wire::SecAggSetup setup, GroupContext ctx);

}  // namespace xsilo::server::secure
