#include "tools/sim_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "common/config.h"
#include "crypto/secagg.h"
#include "protocol/secagg_wire.h"
#include "transport/tls.h"

namespace xsilo::tools {

namespace {

namespace secagg = crypto::secagg;
using json = nlohmann::json;

// The record, one JSON object a line, every one with "round", "group" and "event":
//   split     "victim", "survived" (the silos told it survived, itself included), "dropped",
//             "holders" (the victim and its neighbours: who holds shares of its secrets),
//             "threshold", "min_survivors", "degree" (0: the complete graph)
//   confirmed "silo", "view" ("survived" or "dropped"): it signed the set it was shown
//   asked     "silo", "view", "signatures": an unmask request went to it
//   answered  "silo", "view": it sent its unmask shares
//   refused   "silo", "view", "why": it answered the request with an error
class HostileServer final : public server::ServerHook {
 public:
  HostileServer(const server::ServerConfig& cfg, SimServerConfig sim)
      : federation_(cfg.federation), sim_(std::move(sim)), signer_(transport::load_signer(cfg.tls)),
        record_(sim_.record, std::ios::app) {}

  bool to_silo(const std::string& silo, wire::Envelope& e) override {
    if (e.has_round_start() && e.round() != round_) new_round(e.round());
    if (e.round() != round_) return true;  // not about the round it is splitting
    if (e.has_round_start() && e.round_start().secagg().members_size() > 0) {
      const auto& s = e.round_start().secagg();
      group_of_[silo] = s.group();
      auto& g = groups_[s.group()];
      g.id = s.group();
      g.params = protocol::secagg_params(s, federation_, e.round());
    } else if (Group* g = group(silo); g && e.secure().has_secagg_settled()) {
      const auto& m = e.secure().secagg_settled().members();
      g->settled = {m.begin(), m.end()};
    } else if (g && e.secure().has_secagg_survivors()) {
      split(*g, silo, *e.mutable_secure()->mutable_secagg_survivors());
    } else if (g && e.secure().has_secagg_unmask_request() && !g->victim.empty()) {
      // The ordinary server's own request, to those that confirmed the set it holds.
      g->asked.insert(silo);
      note(*g, "asked", silo, {{"signatures", e.secure().secagg_unmask_request().signatures_size()}});
    }
    return true;
  }

  void from_silo(const std::string& silo, const wire::Envelope& e) override {
    Group* g = e.round() == round_ ? group(silo) : nullptr;
    if (!g || g->victim.empty()) return;
    if (e.secure().has_secagg_confirmation()) {
      note(*g, "confirmed", silo);
      if (!g->dropped.count(silo)) return;
      g->confirmations[silo] = e.secure().secagg_confirmation().signature();
      if (g->confirmations.size() == g->dropped.size()) ask_dropped_side(*g);
    } else if (e.secure().has_secagg_unmask_shares() && g->asked.erase(silo)) {
      note(*g, "answered", silo);
    } else if (e.has_error() && g->asked.erase(silo)) {
      note(*g, "refused", silo, {{"why", e.error().message()}});
    }
  }

  std::vector<std::pair<std::string, wire::Envelope>> take_out() override { return std::exchange(out_, {}); }

 private:
  struct Group {
    std::uint32_t id = 0;
    secagg::Params params;
    std::vector<std::string> settled;             // U2, as the server's signed list names it
    std::string victim;                           // "" until the survivors are named
    std::vector<std::string> without;             // U3 without the victim
    std::string without_signature;                // the server's, on `without`
    std::set<std::string> dropped;                // the silos shown `without`
    std::map<std::string, std::string> confirmations;  // of `without`
    std::set<std::string> asked;                  // sent an unmask request, not answered yet
  };

  void new_round(std::uint64_t round) {
    round_ = round;
    groups_.clear();
    group_of_.clear();
  }
  Group* group(const std::string& silo) {
    const auto it = group_of_.find(silo);
    return it == group_of_.end() ? nullptr : &groups_[it->second];
  }

  // The first survivor set of a group chooses the split; every survivor set sent after it is
  // the victim's truth or, to the "dropped" side, the set without it, signed.
  void split(Group& g, const std::string& silo, wire::SecAggSurvivors& s) {
    if (g.victim.empty()) {
      std::vector<std::string> u3(s.survivors().begin(), s.survivors().end());
      std::sort(u3.begin(), u3.end());
      if (u3.size() < 3) return;
      g.victim = u3.front();
      json survived = json::array({g.victim});
      for (std::size_t i = 1; i < u3.size(); ++i) {
        if (i % 2) {
          survived.push_back(u3[i]);
        } else {
          g.dropped.insert(u3[i]);
        }
        g.without.push_back(u3[i]);
      }
      g.without_signature = signer_.sign(secagg::survivors_statement(g.params.session, g.without));
      note(g, "split", "", {{"victim", g.victim}, {"survived", survived}, {"dropped", g.dropped},
                            {"holders", holders(g)}, {"threshold", g.params.threshold},
                            {"min_survivors", g.params.min_survivors}, {"degree", g.params.graph() ? g.params.degree : 0}});
    }
    if (!g.dropped.count(silo)) return;
    s.clear_survivors();
    for (const auto& v : g.without) s.add_survivors(v);
    s.set_server_signature(g.without_signature);
    spdlog::warn("round {}: hostile: told {} that {} dropped, signed", round_, silo, g.victim);
  }

  // Asks the silos shown the set without the victim to unmask it as a dropout, with every
  // signature that set gathered.
  void ask_dropped_side(Group& g) {
    secagg::UnmaskRequest r;
    const auto& u2 = g.settled.empty() ? g.params.members : g.settled;
    for (const auto& v : u2) {
      (std::binary_search(g.without.begin(), g.without.end(), v) ? r.survivors : r.dropped).push_back(v);
    }
    r.signatures = g.confirmations;
    wire::Envelope e;
    e.set_federation(federation_);
    e.set_round(round_);
    *e.mutable_secure()->mutable_secagg_unmask_request() = protocol::to_wire(r);
    for (const auto& silo : g.dropped) {
      g.asked.insert(silo);
      note(g, "asked", silo, {{"signatures", r.signatures.size()}});
      spdlog::warn("round {}: hostile: asked {} for its share of {}'s mask key", round_, silo, g.victim);
      out_.emplace_back(silo, e);
    }
  }

  std::vector<std::string> holders(const Group& g) const {
    const auto& p = g.params;
    const secagg::Graph graph(p.members.size(), p.graph() ? p.degree : 0, p.session + "/" + p.graph_seed);
    std::vector<std::string> out{g.victim};
    for (auto i : graph.neighbours(p.index_of(g.victim))) out.push_back(p.members.at(i - 1));
    std::sort(out.begin(), out.end());
    return out;
  }

  void note(const Group& g, const std::string& event, const std::string& silo, json more = json::object()) {
    more["round"] = round_;
    more["group"] = g.id;
    more["event"] = event;
    if (!silo.empty()) {
      more["silo"] = silo;
      more["view"] = g.dropped.count(silo) ? "dropped" : "survived";
    }
    record_ << more.dump() << '\n' << std::flush;
  }

  std::string federation_;
  SimServerConfig sim_;
  crypto::CertSigner signer_;
  std::ofstream record_;
  std::uint64_t round_ = 0;
  std::map<std::uint32_t, Group> groups_;
  std::map<std::string, std::uint32_t> group_of_;
  std::vector<std::pair<std::string, wire::Envelope>> out_;
};

}  // namespace

SimServerConfig load_sim_server_config(const std::filesystem::path& file) {
  const auto j = ConfigNode::load_file(file);
  ConfigNode root(j, file.string());
  SimServerConfig c;
  c.hostile = root.one_of("hostile", "", {"split_view"});
  c.record = root.path("record", "");
  root.finish();
  if (c.hostile.empty() || c.record.empty()) {
    throw ConfigError("config " + file.string() + ": a hostile server needs \"hostile\" and \"record\"");
  }
  return c;
}

json to_json(const SimServerConfig& c) { return {{"hostile", c.hostile}, {"record", c.record.string()}}; }

std::unique_ptr<server::ServerHook> make_sim_server_hook(const server::ServerConfig& cfg, const SimServerConfig& sim) {
  return std::make_unique<HostileServer>(cfg, sim);
}

}  // namespace xsilo::tools
