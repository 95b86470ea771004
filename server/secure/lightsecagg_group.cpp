#include "server/secure/lightsecagg_group.h"

#include <algorithm>
#include <cstdio>

#include "crypto/prime_field.h"
#include "crypto/secagg_graph.h"
#include "protocol/secagg_wire.h"
#include "server/secure/settled_group.h"
#include "server/secure_round.h"

namespace xsilo::server::secure {

namespace {

namespace lsa = crypto::lightsecagg;
namespace secagg = crypto::secagg;
using Step = wire::SecureAggregation::StepCase;

class LightSecAggGroup final : public SettledGroup {
 public:
  LightSecAggGroup(wire::SecAggSetup setup, GroupContext ctx, crypto::X25519KeyPair box,
                   std::function<void(std::span<std::uint8_t>)> random_bytes)
      : SettledGroup(std::move(setup), std::move(ctx)),
        server_(protocol::lightsecagg_params(setup_, ctx_.federation, ctx_.round), ctx_.ca, ctx_.signer, std::move(box),
                crypto::Sources{crypto::system_unix_ms, std::move(random_bytes)}) {}

  Status finish(protocol::MaskedVector& sum) override {
    if (!sum.prime()) return Error("LightSecAgg sums are field words; this sum is a ring's");
    auto words = sum.u32();
    if (auto unmasked = server_.finish(words); !unmasked) return unmasked;
    crypto::field::from_field(words);  // the codec's ring from here: decoded as SecAgg's sums are
    return {};
  }

  nlohmann::json describe() const override {
    nlohmann::json out = {{"group", id()},
                          {"protocol", "lightsecagg"},
                          {"members", std::vector<std::string>(setup_.members().begin(), setup_.members().end())},
                          {"threshold", setup_.threshold()},
                          {"min_survivors", setup_.min_survivors()},
                          {"privacy", setup_.privacy()},
                          {"target", setup_.target()},
                          {"advertised_keys", server_.u1().size()},
                          {"shared_keys", server_.u2().size()},
                          {"settled", server_.settled().size()},
                          {"masked_inputs", server_.u3().size()},
                          {"answers", server_.unmask_replies()}};
    if (!server_.blamed().empty()) {
      nlohmann::json ex = nlohmann::json::array();
      for (const auto& b : server_.blamed()) ex.push_back({{"silo", b.silo}, {"evidence", b.why}});
      out["excluded"] = ex;
    }
    if (!failed().empty()) out["failed"] = failed();
    return out;
  }

 protected:
  bool handles(const wire::SecureAggregation& m) const override {
    const auto step = m.step_case();
    const bool setup = stage_ == Stage::Setup;
    return (setup && step == Step::kLsaKeys && phase_ == Phase::Keys) ||
           (setup && step == Step::kLsaShares && phase_ == Phase::Shares) ||
           (setup && step == Step::kLsaReceipt && phase_ == Phase::Receipts) ||
           (step == Step::kLsaConfirmation && stage_ == Stage::Confirm) ||
           (step == Step::kLsaAnswer && stage_ == Stage::Unmask);
  }

  Status handle(const std::string& silo, const wire::SecureAggregation& m) override {
    switch (m.step_case()) {
      case Step::kLsaKeys: {
        auto keys = protocol::from_wire(m.lsa_keys());
        return keys ? server_.on_keys(silo, *keys) : Error(keys.error().message());
      }
      case Step::kLsaShares: {
        auto to = protocol::from_wire(m.lsa_shares());
        return to ? server_.on_shares(silo, *to) : Error(to.error().message());
      }
      case Step::kLsaReceipt: {
        auto receipt = protocol::from_wire(m.lsa_receipt());
        return receipt ? server_.on_receipt(silo, *receipt) : Error(receipt.error().message());
      }
      case Step::kLsaConfirmation: return server_.on_confirmation(silo, m.lsa_confirmation().signature());
      case Step::kLsaAnswer: return server_.on_unmask(silo, m.lsa_answer().sealed());
      default: return Error("not a step of LightSecAgg");
    }
  }

 private:
  secagg::Settlement& settlement() override { return server_; }
  const secagg::Settlement& settlement() const override { return server_; }

  void put_delivery(wire::SecureAggregation& m, const secagg::Inbox& inbox) const override {
    *m.mutable_lsa_share_delivery() = protocol::delivery_to_wire(inbox);
  }
  void put_settled(wire::SecureAggregation& m, const secagg::Settled& settled) const override {
    *m.mutable_lsa_settled() = protocol::to_wire(settled);
  }
  void put_survivors(wire::SecureAggregation& m, const std::vector<std::string>& u3,
                     const std::string& server_signature) const override {
    for (const auto& v : u3) m.mutable_lsa_survivors()->add_survivors(v);
    m.mutable_lsa_survivors()->set_server_signature(server_signature);
  }
  void put_unmask_request(wire::SecureAggregation& m, const secagg::UnmaskRequest& r) const override {
    *m.mutable_lsa_unmask_request() = protocol::to_wire(r);
  }

  void close_keys() override {
    auto keys = server_.close_keys();
    if (!keys) return fail(keys.error().message());
    for (const auto& silo : setup_.members()) {
      if (waiting_.count(silo)) drop(silo, DropReason::NoKeys, label() + ": no valid signed keys from it in time");
    }
    // Every member shares with every other: one list for all.
    wire::SecureAggregation m;
    *m.mutable_lsa_key_list() = protocol::to_wire(*keys);
    waiting_.clear();
    for (const auto& [silo, k] : *keys) {
      waiting_.insert(silo);
      send(silo, m);
    }
    phase_ = Phase::Shares;
  }

  void close_shares() override { delivered(server_.close_shares()); }

  lsa::Server server_;
};

}  // namespace

std::unique_ptr<Group> make_lightsecagg_group(const SecureConfig& cfg, wire::SecAggSetup s, GroupContext ctx) {
  const auto n = static_cast<std::size_t>(s.members_size());
  s.set_protocol(wire::LIGHTSECAGG);
  s.set_threshold(group_threshold(cfg, n));
  s.set_min_survivors(group_min_survivors(cfg, n));
  s.set_target(s.min_survivors());
  s.set_privacy(std::max<std::uint32_t>(1, secagg::corrupt_count(n, cfg.privacy_corrupt)));
  auto box = crypto::X25519KeyPair::generate();
  s.set_server_key(std::string(reinterpret_cast<const char*>(box.public_key.data()), box.public_key.size()));
  s.set_server_certificate(ctx.signer.certificate());
  s.set_server_signature(ctx.signer.sign(protocol::setup_statement(s, ctx.federation, ctx.round)));
  const auto params = protocol::lightsecagg_params(s, ctx.federation, ctx.round);
  auto g = std::make_unique<LightSecAggGroup>(std::move(s), std::move(ctx), std::move(box), cfg.random_bytes);
  // A member's shares travel in one message (and each member's delivery in one): n - 1 boxes of
  // L words, each with its seal, signatures and names, at most lsa::max_shares_message_bytes(),
  // which the crypto server enforces box by box.
  const auto message = static_cast<double>(lsa::max_shares_message_bytes(params));
  auto mib = [](double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
    return std::string(buf);
  };
  if (n < cfg.min_group) {
    g->fail("a group of " + std::to_string(n) + " silos is smaller than min_group " + std::to_string(cfg.min_group) +
            ": its sum would reveal too little about too few");
  } else if (auto usable = lsa::check_params(params); !usable) {
    g->fail(usable.error().message());
  } else if (message > static_cast<double>(cfg.max_message_bytes)) {
    g->fail("LightSecAgg's encoded mask shares of a member of this group take " + mib(message) +
            " in one message, above transport.max_frame_bytes (" + mib(static_cast<double>(cfg.max_message_bytes)) +
            "): raise it on the server, edges and silos, draw smaller groups, or use protocol secagg");
  }
  return g;
}

}  // namespace xsilo::server::secure
