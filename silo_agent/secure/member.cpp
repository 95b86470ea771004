#include "silo_agent/secure/member.h"

#include "silo_agent/secure/lightsecagg_member.h"
#include "silo_agent/secure/secagg_member.h"

namespace xsilo::agent::secure {

std::string step_name(const wire::SecureAggregation& step) {
  const auto* f = wire::SecureAggregation::descriptor()->FindFieldByNumber(step.step_case());
  return f ? f->name() : "(none)";
}

std::unique_ptr<Member> make_member(const wire::SecAggSetup& setup, MemberContext ctx) {
  // The protocols, by the setup's name for them. One line per protocol.
  switch (setup.protocol()) {
    case wire::SECAGG: return make_secagg_member(setup, std::move(ctx));
    case wire::LIGHTSECAGG: return make_lightsecagg_member(setup, std::move(ctx));
    default: return nullptr;
  }
}

}  // namespace xsilo::agent::secure
