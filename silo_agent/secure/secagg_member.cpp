#include "silo_agent/secure/secagg_member.h"

#include <spdlog/spdlog.h>

#include "protocol/secagg_wire.h"

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
      case Step::kSecaggKeyList: return on_key_list(step.secagg_key_list());
      case Step::kSecaggShareDelivery: return on_share_delivery(step.secagg_share_delivery());
      case Step::kSecaggSettled: {
        // Checks U2 and agrees the pairwise mask seeds here, on the network thread (one X25519
        // per settled neighbour, about 5 ms at 100): the worker is usually still training then,
        // and a job would queue behind the training and put the agreements back between it and
        // the masking.
        if (auto agreed = client_.settle(protocol::from_wire(step.secagg_settled())); !agreed) {
          return Refusal{"settled members", agreed.error().message()};
        }
        settled_ = true;
        return Answer{};
      }
      case Step::kSecaggSurvivors: {
        const auto& s = step.secagg_survivors().survivors();
        auto c = client_.confirm({s.begin(), s.end()}, step.secagg_survivors().server_signature());
        if (!c) return Refusal{"survivors", c.error().message()};
        wire::SecureAggregation m;
        m.mutable_secagg_confirmation()->set_signature(c->signature);
        return Answer{std::move(m), Sent::Other};
      }
      case Step::kSecaggUnmaskRequest: {
        auto request = protocol::from_wire(step.secagg_unmask_request());
        if (!request) return Refusal{"unmask request", request.error().message};
        auto reply = client_.unmask(*request);
        if (!reply) return Refusal{"unmask request", reply.error().message()};
        wire::SecureAggregation m;
        m.mutable_secagg_unmask_shares()->set_sealed(reply->box);
        spdlog::info("round {}: unmasking shares sent, sealed to the server", ctx_.round);
        return Answer{std::move(m), Sent::Other};
      }
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
  std::variant<Answer, Refusal> on_key_list(const wire::SecAggKeyList& l) {
    auto list = protocol::from_wire(l);
    if (!list) return Refusal{"key list", list.error().message};
    auto shares = client_.share(*list);
    if (!shares) return Refusal{"key list", shares.error().message()};
    wire::SecureAggregation m;
    *m.mutable_secagg_shares() = protocol::outbox_to_wire(*shares);
    return Answer{std::move(m), Sent::Shares};
  }

  std::variant<Answer, Refusal> on_share_delivery(const wire::SecAggShareDelivery& d) {
    auto from = protocol::from_wire(d);
    if (!from) return Refusal{"share delivery", from.error().message};
    auto receipt = client_.receive(*from);
    if (!receipt) return Refusal{"share delivery", receipt.error().message()};
    for (const auto& a : receipt->accusations) {
      spdlog::warn("round {}: the shares {} dealt this silo are bad; accusing it with the evidence", ctx_.round,
                   a.accused);
    }
    wire::SecureAggregation m;
    *m.mutable_secagg_receipt() = protocol::to_wire(*receipt);
    return Answer{std::move(m), Sent::Other};
  }

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
