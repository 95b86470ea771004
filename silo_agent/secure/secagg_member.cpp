#include "silo_agent/secure/secagg_member.h"

#include "protocol/secagg_wire.h"
#include "silo_agent/secure/member_steps.h"

namespace xsilo::agent::secure {

namespace {

namespace secagg = crypto::secagg;
using Step = wire::SecureAggregation::StepCase;

class SecAggMember final : public Member {
 public:
  SecAggMember(const wire::SecAggSetup& setup, MemberContext ctx)
      : setup_(setup), ctx_(std::move(ctx)),
        client_(protocol::secagg_params(setup, ctx_.federation, ctx_.round), ctx_.me, ctx_.signer, ctx_.ca,
                setup.server_certificate(), ctx_.server_name, ctx_.floor) {}

  proto::Result<wire::SecureAggregation> start() override {
    auto keys = client_.advertise();
    if (!keys) return proto::error(wire::NOT_ALLOWED, "unusable secure group: " + keys.error().message());
    wire::SecureAggregation m;
    *m.mutable_secagg_keys() = protocol::to_wire(*keys);
    return m;
  }

  std::variant<Answer, Refusal> receive(const wire::SecureAggregation& step) override {
    switch (step.step_case()) {
      case Step::kSecaggKeyList:
        return steps::deal(client_, step.secagg_key_list(), [](auto& m) { return m.mutable_secagg_shares(); });
      case Step::kSecaggShareDelivery:
        return steps::take_delivery(client_, step.secagg_share_delivery(), ctx_.round, "shares", "are",
                                    [](auto& m) { return m.mutable_secagg_receipt(); });
      case Step::kSecaggSettled: return steps::settle(client_, step.secagg_settled(), settled_);
      case Step::kSecaggSurvivors:
        return steps::confirm(client_, step.secagg_survivors(), [](auto& m) { return m.mutable_secagg_confirmation(); });
      case Step::kSecaggUnmaskRequest:
        return steps::unmask(client_, step.secagg_unmask_request(), ctx_.round, "unmasking shares",
                             [](auto& m) { return m.mutable_secagg_unmask_shares(); });
      default: return Refusal{"secure step", "this silo's group runs SecAgg, which has no step " + step_name(step)};
    }
  }

  bool ready() const override { return settled_; }

  Status mask(protocol::MaskedVector& words) override {
    return words.visit([&](auto w) { return client_.mask(w); });
  }

  std::string describe() const override {
    return "secure group " + std::to_string(setup_.group()) + " of " + std::to_string(setup_.members_size()) + " silos (" +
           std::to_string(protocol::secagg_degree(setup_)) + " neighbours each, threshold " +
           std::to_string(setup_.threshold()) + ", sums of at least " + std::to_string(setup_.min_survivors()) + ")";
  }

 private:
  wire::SecAggSetup setup_;
  MemberContext ctx_;
  secagg::Client client_;
  bool settled_ = false;
};

}  // namespace

std::unique_ptr<Member> make_secagg_member(const wire::SecAggSetup& setup, MemberContext ctx) {
  return std::make_unique<SecAggMember>(setup, std::move(ctx));
}

}  // namespace xsilo::agent::secure
