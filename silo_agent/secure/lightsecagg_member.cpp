#include "silo_agent/secure/lightsecagg_member.h"

#include "crypto/prime_field.h"
#include "protocol/secagg_wire.h"
#include "silo_agent/secure/member_steps.h"

namespace xsilo::agent::secure {

namespace {

namespace lsa = crypto::lightsecagg;
namespace secagg = crypto::secagg;
using Step = wire::SecureAggregation::StepCase;

class LightSecAggMember final : public Member {
 public:
  LightSecAggMember(const wire::SecAggSetup& setup, MemberContext ctx)
      : setup_(setup), ctx_(std::move(ctx)),
        client_(protocol::lightsecagg_params(setup, ctx_.federation, ctx_.round), ctx_.me, ctx_.signer, ctx_.ca,
                setup.server_certificate(), ctx_.server_name, ctx_.floor, ctx_.sources) {}

  proto::Result<wire::SecureAggregation> start() override {
    if (setup_.modulus_bits() != 32) {
      return proto::error(wire::NOT_ALLOWED, "unusable secure group: LightSecAgg masks 32-bit field words, the setup says " +
                                                 std::to_string(setup_.modulus_bits()) + " bits");
    }
    // The server chooses L = d / (U - T): a setup whose shares this silo could not send (or
    // whose encoding would take memory and time for nothing) is refused before any work.
    const auto bytes = lsa::max_shares_message_bytes(client_.params());
    if (bytes > ctx_.max_message_bytes) {
      return proto::error(wire::NOT_ALLOWED, "unusable secure group: its encoded mask shares take up to " +
                                                 std::to_string(bytes >> 20) + " MiB in one message, above this silo's "
                                                 "transport.max_frame_bytes (" +
                                                 std::to_string(ctx_.max_message_bytes >> 20) + " MiB)");
    }
    auto keys = client_.advertise();
    if (!keys) return proto::error(wire::NOT_ALLOWED, "unusable secure group: " + keys.error().message());
    wire::SecureAggregation m;
    *m.mutable_lsa_keys() = protocol::to_wire(*keys);
    return m;
  }

  std::variant<Answer, Refusal> receive(const wire::SecureAggregation& step) override {
    switch (step.step_case()) {
      case Step::kLsaKeyList:
        // Draws the mask and encodes it for every member (N U L multiply-adds: the offline cost).
        return steps::deal(client_, step.lsa_key_list(), [](auto& m) { return m.mutable_lsa_shares(); });
      case Step::kLsaShareDelivery:
        return steps::take_delivery(client_, step.lsa_share_delivery(), ctx_.round, "share", "is",
                                    [](auto& m) { return m.mutable_lsa_receipt(); });
      case Step::kLsaSettled: return steps::settle(client_, step.lsa_settled(), settled_);
      case Step::kLsaSurvivors:
        return steps::confirm(client_, step.lsa_survivors(), [](auto& m) { return m.mutable_lsa_confirmation(); });
      case Step::kLsaUnmaskRequest:
        return steps::unmask(client_, step.lsa_unmask_request(), ctx_.round, "aggregate mask share",
                             [](auto& m) { return m.mutable_lsa_answer(); });
      default: return Refusal{"secure step", "this silo's group runs LightSecAgg, which has no step " + step_name(step)};
    }
  }

  bool ready() const override { return settled_; }

  Status mask(protocol::MaskedVector& words) override {
    if (words.bits() != 32) return Error("LightSecAgg masks 32-bit words");
    auto w = words.u32();
    crypto::field::to_field(w);  // the codec's two's-complement ring words, as field words
    return client_.mask(w);
  }

  std::string describe() const override {
    return "secure group " + std::to_string(setup_.group()) + " of " + std::to_string(setup_.members_size()) +
           " silos (LightSecAgg: private against " + std::to_string(setup_.privacy()) + " colluding, decoded from any " +
           std::to_string(setup_.target()) + " answers, threshold " + std::to_string(setup_.threshold()) +
           ", sums of at least " + std::to_string(setup_.min_survivors()) + ")";
  }

 private:
  wire::SecAggSetup setup_;
  MemberContext ctx_;
  lsa::Client client_;
  bool settled_ = false;
};

}  // namespace

std::unique_ptr<Member> make_lightsecagg_member(const wire::SecAggSetup& setup, MemberContext ctx) {
  return std::make_unique<LightSecAggMember>(setup, std::move(ctx));
}

}  // namespace xsilo::agent::secure
