#include "silo_agent/secure/member.h"

#include "silo_agent/secure/secagg_member.h"

namespace xsilo::agent::secure {

std::unique_ptr<Member> make_member(const wire::SecAggSetup& setup, MemberContext ctx) {
  // The protocols, by the setup's name for them. One line per protocol.
  return make_secagg_member(setup, std::move(ctx));
}

}  // namespace xsilo::agent::secure
