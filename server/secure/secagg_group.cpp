#include "server/secure/secagg_group.h"

#include <algorithm>
#include <array>

#include "crypto/hash.h"
#include "protocol/secagg_wire.h"
#include "server/secure/settled_group.h"
#include "server/secure_round.h"

namespace xsilo::server::secure {

namespace {

namespace secagg = crypto::secagg;
using Step = wire::SecureAggregation::StepCase;

// A seed for one group's graph in one round, fresh from the server's random source. It is public
// (signed into the setup) but unpredictable before the round: drawn from the round's
// permutation seed, which one setup reveals, every later round's graph could be worked out in
// advance, and a coalition could choose whom to corrupt to surround a silo in a round to come
// (the privacy bound assumes the corrupt silos do not depend on the graph).
std::string fresh_graph_seed(const SecureConfig& cfg) {
  std::array<std::uint8_t, 16> r{};
  cfg.random_bytes(r);
  return crypto::to_hex(r);
}

class SecAggGroup final : public SettledGroup {
 public:
  SecAggGroup(wire::SecAggSetup setup, GroupContext ctx, crypto::X25519KeyPair box)
      : SettledGroup(std::move(setup), std::move(ctx)) {
    const auto params = protocol::secagg_params(setup_, ctx_.federation, ctx_.round);
    server_ = std::make_unique<secagg::Server>(params, ctx_.ca, ctx_.signer, std::move(box));
  }

  Status finish(protocol::MaskedVector& sum) override {
    auto& server = *server_;
    return sum.visit([&](auto words) { return server.finish(words); });
  }

  nlohmann::json describe() const override {
    const auto& s = *server_;
    nlohmann::json out = {{"group", id()},
                          {"members", std::vector<std::string>(setup_.members().begin(), setup_.members().end())},
                          {"threshold", setup_.threshold()},
                          {"min_survivors", setup_.min_survivors()},
                          {"degree", protocol::secagg_degree(setup_)},
                          {"graph_seed", setup_.graph_seed()},
                          {"advertised_keys", s.u1().size()},
                          {"shared_keys", s.u2().size()},
                          {"settled", s.settled().size()},
                          {"masked_inputs", s.u3().size()},
                          {"confirmed", s.confirmed().size()}};
    if (!s.blamed().empty()) {
      nlohmann::json ex = nlohmann::json::array();
      for (const auto& b : s.blamed()) ex.push_back({{"silo", b.silo}, {"evidence", b.why}});
      out["excluded"] = ex;
    }
    if (!failed().empty()) out["failed"] = failed();
    return out;
  }

 protected:
  bool handles(const wire::SecureAggregation& m) const override {
    const auto step = m.step_case();
    const bool setup = stage_ == Stage::Setup;
    return (setup && step == Step::kSecaggKeys && phase_ == Phase::Keys) ||
           (setup && step == Step::kSecaggShares && phase_ == Phase::Shares) ||
           (setup && step == Step::kSecaggReceipt && phase_ == Phase::Receipts) ||
           (step == Step::kSecaggConfirmation && stage_ == Stage::Confirm) ||
           (step == Step::kSecaggUnmaskShares && stage_ == Stage::Unmask);
  }

  Status handle(const std::string& silo, const wire::SecureAggregation& m) override {
    auto& server = *server_;
    switch (m.step_case()) {
      case Step::kSecaggKeys: {
        auto keys = protocol::from_wire(m.secagg_keys());
        return keys ? server.on_keys(silo, *keys) : Error(keys.error().message());
      }
      case Step::kSecaggShares: {
        auto to = protocol::from_wire(m.secagg_shares());
        return to ? server.on_shares(silo, *to) : Error(to.error().message());
      }
      case Step::kSecaggReceipt: {
        auto receipt = protocol::from_wire(m.secagg_receipt());
        return receipt ? server.on_receipt(silo, *receipt) : Error(receipt.error().message());
      }
      case Step::kSecaggConfirmation: return server.on_confirmation(silo, m.secagg_confirmation().signature());
      case Step::kSecaggUnmaskShares: return server.on_unmask(silo, m.secagg_unmask_shares().sealed());
      default: return Error("not a step of SecAgg");
    }
  }

 private:
  secagg::Settlement& settlement() override { return *server_; }
  const secagg::Settlement& settlement() const override { return *server_; }

  void put_delivery(wire::SecureAggregation& m, const secagg::Inbox& inbox) const override {
    *m.mutable_secagg_share_delivery() = protocol::delivery_to_wire(inbox);
  }
  void put_settled(wire::SecureAggregation& m, const secagg::Settled& settled) const override {
    *m.mutable_secagg_settled() = protocol::to_wire(settled);
  }
  void put_survivors(wire::SecureAggregation& m, const std::vector<std::string>& u3,
                     const std::string& server_signature) const override {
    for (const auto& v : u3) m.mutable_secagg_survivors()->add_survivors(v);
    m.mutable_secagg_survivors()->set_server_signature(server_signature);
  }
  void put_unmask_request(wire::SecureAggregation& m, const secagg::UnmaskRequest& r) const override {
    *m.mutable_secagg_unmask_request() = protocol::to_wire(r);
  }

  void close_keys() override {
    auto keys = server_->close_keys();
    if (!keys) return fail(keys.error().message());
    // The complete graph: one list for every member. A graph: each member its neighbours' part.
    const bool graph = server_->graph();
    wire::SecureAggregation m;
    if (!graph) *m.mutable_secagg_key_list() = protocol::to_wire(*keys);
    // Members without valid keys in U1 cannot take part from here: dropouts now, not at the
    // training deadline.
    for (const auto& silo : setup_.members()) {
      if (waiting_.count(silo)) drop(silo, DropReason::NoKeys, label() + ": no valid signed keys from it in time");
    }
    waiting_.clear();
    for (const auto& [silo, k] : *keys) {
      waiting_.insert(silo);
      if (graph) *m.mutable_secagg_key_list() = protocol::to_wire(server_->keys_for(silo));
      send(silo, m);
    }
    phase_ = Phase::Shares;
  }

  void close_shares() override { delivered(server_->close_shares()); }

  std::unique_ptr<secagg::Server> server_;
};

}  // namespace

std::unique_ptr<Group> make_secagg_group(const SecureConfig& cfg, wire::SecAggSetup s, GroupContext ctx) {
  const auto n = static_cast<std::size_t>(s.members_size());
  s.set_threshold(group_threshold(cfg, n));
  s.set_min_survivors(group_min_survivors(cfg, n));
  if (cfg.graph) {
    // SecAgg+ where a graph smaller than the complete one meets the bounds for this group.
    const auto plan = secagg::plan_graph(n, cfg.graph_dropout, cfg.graph_corrupt);
    if (plan.degree) {
      s.set_degree(plan.degree);
      s.set_graph_seed(fresh_graph_seed(cfg));
      s.set_threshold(plan.threshold);
      s.set_min_survivors(std::max(plan.threshold, static_cast<std::uint32_t>(cfg.min_group)));
    }
  }
  auto box = crypto::X25519KeyPair::generate();
  s.set_server_key(std::string(reinterpret_cast<const char*>(box.public_key.data()), box.public_key.size()));
  s.set_server_certificate(ctx.signer.certificate());
  s.set_server_signature(ctx.signer.sign(protocol::setup_statement(s, ctx.federation, ctx.round)));
  const auto params = protocol::secagg_params(s, ctx.federation, ctx.round);
  auto g = std::make_unique<SecAggGroup>(std::move(s), std::move(ctx), std::move(box));
  if (n < cfg.min_group) {
    g->fail("a group of " + std::to_string(n) + " silos is smaller than min_group " + std::to_string(cfg.min_group) +
            ": its sum would reveal too little about too few");
  } else if (auto usable = secagg::check_params(params); !usable) {
    g->fail(usable.error().message());
  }
  return g;
}

}  // namespace xsilo::server::secure
