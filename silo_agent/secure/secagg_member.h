// SecAgg and SecAgg+ (crypto/secagg.h) behind the member seam (silo_agent/secure/member.h): the
// silo's steps translated to and from crypto::secagg::Client's plain structs.
#pragma once

#include <memory>

#include "silo_agent/secure/member.h"

namespace xsilo::agent::secure {

std::unique_ptr<Member> make_secagg_member(const wire::SecAggSetup& setup, MemberContext ctx);

}  // namespace xsilo::agent::secure
