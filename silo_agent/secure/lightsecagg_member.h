// LightSecAgg (crypto/lightsecagg.h) behind the member seam (silo_agent/secure/member.h): the
// silo's steps translated to and from crypto::lightsecagg::Client's plain structs. The encoded
// update (the fixed-point codec's ring words) is mapped into the field of p = 2^32 - 5 and
// masked there.
#pragma once

#include <memory>

#include "silo_agent/secure/member.h"

namespace xsilo::agent::secure {

std::unique_ptr<Member> make_lightsecagg_member(const wire::SecAggSetup& setup, MemberContext ctx);

}  // namespace xsilo::agent::secure
