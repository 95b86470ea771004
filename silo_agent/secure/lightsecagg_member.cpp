#include "silo_agent/secure/lightsecagg_member.h"

#include <spdlog/spdlog.h>

#include "crypto/prime_field.h"
#include "protocol/secagg_wire.h"

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
    wire::SecureAggregation m;
    switch (step.step_case()) {
      case Step::kLsaKeyList: {
        auto list = protocol::from_wire(step.lsa_key_list());
        if (!list) return Refusal{"key list", list.error().message};
        // Draws the mask and encodes it for every member (N U L multiply-adds: the offline cost).
        auto shares = client_.share(*list);
        if (!shares) return Refusal{"key list", shares.error().message()};
        *m.mutable_lsa_shares() = protocol::outbox_to_wire(*shares);
        return Answer{std::move(m), Sent::Shares};
      }
      case Step::kLsaShareDelivery: {
        auto from = protocol::from_wire(step.lsa_share_delivery());
        if (!from) return Refusal{"share delivery", from.error().message};
        auto receipt = client_.receive(*from);
        if (!receipt) return Refusal{"share delivery", receipt.error().message()};
        for (const auto& a : receipt->accusations) {
          spdlog::warn("round {}: the share {} dealt this silo is bad; accusing it with the evidence", ctx_.round, a.accused);
        }
        *m.mutable_lsa_receipt() = protocol::to_wire(*receipt);
        return Answer{std::move(m), Sent::Other};
      }
      case Step::kLsaSettled: {
        if (auto agreed = client_.settle(protocol::from_wire(step.lsa_settled())); !agreed) {
          return Refusal{"settled members", agreed.error().message()};
        }
        settled_ = true;
        return Answer{};
      }
      case Step::kLsaSurvivors: {
        const auto& s = step.lsa_survivors().survivors();
        auto c = client_.confirm({s.begin(), s.end()}, step.lsa_survivors().server_signature());
        if (!c) return Refusal{"survivors", c.error().message()};
        m.mutable_lsa_confirmation()->set_signature(c->signature);
        return Answer{std::move(m), Sent::Other};
      }
      case Step::kLsaUnmaskRequest: {
        auto request = protocol::from_wire(step.lsa_unmask_request());
        if (!request) return Refusal{"unmask request", request.error().message};
        auto reply = client_.unmask(*request);
        if (!reply) return Refusal{"unmask request", reply.error().message()};
        m.mutable_lsa_answer()->set_sealed(reply->box);
        spdlog::info("round {}: aggregate mask share sent, sealed to the server", ctx_.round);
        return Answer{std::move(m), Sent::Other};
      }
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
