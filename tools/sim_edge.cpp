#include "tools/sim_edge.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/config.h"
#include "protocol/join.h"
#include "transport/tls.h"

namespace xsilo::tools {

namespace {

class HostileEdge final : public edge::EdgeHook {
 public:
  HostileEdge(const edge::EdgeConfig& cfg, SimEdgeConfig sim)
      : federation_(cfg.federation), sim_(std::move(sim)), signer_(transport::load_signer(cfg.tls)) {}

  bool to_server(wire::Envelope& e) override {
    if (e.has_region_status()) claim(*e.mutable_region_status());
    if (sim_.hostile == "swap_keys" && e.secure().has_secagg_keys() && !e.secure().secagg_keys().mask_pk().empty()) {
      flip(*e.mutable_secure()->mutable_secagg_keys()->mutable_mask_pk());
      spdlog::warn("hostile: altered {}'s advertised mask key on its way to the server", e.silo());
    }
    return true;
  }

  bool to_silo(const std::string& silo, wire::Envelope& e) override {
    if (e.has_join_challenge()) nonce_ = e.join_challenge().nonce();
    if (sim_.hostile == "swap_keys" && e.secure().has_secagg_key_list()) {
      for (auto& entry : *e.mutable_secure()->mutable_secagg_key_list()->mutable_entries()) {
        if (entry.silo() != silo && !entry.keys().mask_pk().empty()) {
          flip(*entry.mutable_keys()->mutable_mask_pk());
          spdlog::warn("hostile: altered {}'s mask key in the list for {}", entry.silo(), silo);
          break;
        }
      }
    }
    if (sim_.hostile == "split_view" && e.secure().has_secagg_unmask_request() && (++requests_ % 2 == 0)) {
      // Every other silo is told a survivor dropped: to get both of its secrets, were the
      // silos to answer.
      auto* r = e.mutable_secure()->mutable_secagg_unmask_request();
      auto* survivors = r->mutable_survivors();
      auto victim = std::find_if(survivors->begin(), survivors->end(), [&](const auto& s) { return s != silo; });
      if (victim != survivors->end()) {
        r->add_dropped(*victim);
        spdlog::warn("hostile: told {} that {} dropped", silo, *victim);
        survivors->erase(victim);
      }
    }
    return true;
  }

 private:
  static void flip(std::string& key) { key[0] = static_cast<char>(key[0] ^ 0x01); }

  // Adds silos that never signed a join through this edge to what it announces.
  void claim(wire::RegionStatus& status) {
    if (status.proofs_size() > 0) borrowed_ = status.proofs(0);
    if (sim_.hostile == "hijack" && borrowed_) {
      for (const auto& v : sim_.victims) {
        if (std::count(status.silos().begin(), status.silos().end(), v)) continue;
        status.add_silos(v);
        auto* p = status.add_proofs();
        *p = *borrowed_;
        p->set_silo(v);  // another silo's signature, relabelled
      }
    } else if (sim_.hostile == "forge_join" && !nonce_.empty()) {
      status.add_silos("ghost-silo");
      auto proof = protocol::sign_join(signer_, federation_, signer_.who().name, nonce_);
      proof.set_silo("ghost-silo");
      *status.add_proofs() = proof;
    }
  }

  std::string federation_;
  SimEdgeConfig sim_;
  crypto::CertSigner signer_;
  std::string nonce_;
  std::optional<wire::JoinProof> borrowed_;
  std::uint64_t requests_ = 0;
};

}  // namespace

SimEdgeConfig load_sim_edge_config(const std::filesystem::path& file) {
  const auto j = ConfigNode::load_file(file);
  ConfigNode root(j, file.string());
  SimEdgeConfig c;
  c.hostile = root.one_of("hostile", "", {"hijack", "forge_join", "swap_keys", "split_view"});
  c.victims = root.str_list("victims");
  root.finish();
  return c;
}

nlohmann::json to_json(const SimEdgeConfig& c) { return {{"hostile", c.hostile}, {"victims", c.victims}}; }

std::unique_ptr<edge::EdgeHook> make_sim_edge_hook(const edge::EdgeConfig& cfg, const SimEdgeConfig& sim) {
  return std::make_unique<HostileEdge>(cfg, sim);
}

}  // namespace xsilo::tools
