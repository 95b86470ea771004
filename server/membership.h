// Who is connected: sessions (a silo's own connection, or an edge's), which session reaches
// each silo (its route), the silos behind each edge, and the silos seen since the server
// started. Bookkeeping only: it reports what changed and the coordinator decides what that
// means for the round.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "server/selection.h"

namespace xsilo::server {

using SessionId = std::uint64_t;

struct Peer {
  std::string name;
  bool edge = false;
  std::set<std::string> region;  // edges: the silos announced behind it
  std::string join_nonce;        // edges: the nonce its silos sign to join through this session
  // The model (SHA-256) this session's peer said it holds since the server last sent it one: a
  // compressed broadcast may go to it as a delta against that model. Empty: none known.
  std::string held_model;
  std::uint64_t model_round = 0;  // the round of the last model sent to it: older words are stale
};

class Membership {
 public:
  void add_session(SessionId id, const std::string& name, bool edge, std::string join_nonce = {}) {
    sessions_[id] = Peer{.name = name,
                         .edge = edge,
                         .region = {},
                         .join_nonce = std::move(join_nonce),
                         .held_model = {},
                         .model_round = 0};
  }
  // Removes a session; returns the silos whose route it was (gone with it).
  std::vector<std::string> remove_session(SessionId id);

  const Peer* peer(SessionId id) const;
  void set_join_nonce(SessionId id, std::string nonce) {
    if (auto it = sessions_.find(id); it != sessions_.end()) it->second.join_nonce = std::move(nonce);
  }
  // A model of round `round` goes to session `id`: it holds none the server knows of.
  void model_sent(SessionId id, std::uint64_t round) {
    if (auto it = sessions_.find(id); it != sessions_.end()) it->second.held_model.clear(), it->second.model_round = round;
  }
  // The session says, in a message of round `round`, that it holds model `sha256`; a word from
  // before the last model sent to it is ignored.
  void set_held_model(SessionId id, std::string sha256, std::uint64_t round) {
    auto it = sessions_.find(id);
    if (it != sessions_.end() && round >= it->second.model_round) it->second.held_model = std::move(sha256);
  }
  bool is_edge(SessionId id) const;
  const std::map<SessionId, Peer>& sessions() const { return sessions_; }

  // `silo` is reachable through `via` from now on; returns the route it replaces, if any.
  std::optional<SessionId> route(const std::string& silo, SessionId via);
  // The route of `silo` went away if it was `via`; true when it was.
  bool unroute(const std::string& silo, SessionId via);
  std::optional<SessionId> route_of(const std::string& silo) const;
  const std::map<std::string, SessionId>& routes() const { return routes_; }
  std::size_t connected() const { return routes_.size(); }
  // `silo` asked to leave its route between rounds (Leaving): no round selects it until it has
  // a new route. `selectable()` counts the connected silos that have not asked.
  void set_leaving(const std::string& silo) {
    if (routes_.count(silo)) leaving_.insert(silo);
  }
  bool leaving(const std::string& silo) const { return leaving_.count(silo) > 0; }
  // `silo` witnessed audit heads of another log (Witness): it would refuse this server's rounds,
  // so none selects it while this route lasts.
  void set_disowned(const std::string& silo) {
    if (routes_.count(silo)) disowned_.insert(silo);
  }
  // `silo` reported that its record-level privacy budget is spent (docs/privacy.md): no round
  // selects it again, whatever route it comes back on.
  void set_budget_spent(const std::string& silo) { spent_.insert(silo); }
  std::size_t budget_spent() const { return spent_.size(); }
  // The silos that could still train: connected now or since start (or, with an allow-list,
  // expected), less those whose budget is spent.
  std::size_t could_train(const std::set<std::string>& expected) const {
    std::set<std::string> all = seen_;
    all.insert(expected.begin(), expected.end());
    for (const auto& [silo, via] : routes_) all.insert(silo);
    std::size_t n = 0;
    for (const auto& silo : all) n += spent_.count(silo) ? 0 : 1;
    return n;
  }
  // Not to be selected: leaving, disowned, or its privacy budget spent.
  bool excluded(const std::string& silo) const {
    return leaving_.count(silo) > 0 || disowned_.count(silo) > 0 || spent_.count(silo) > 0;
  }
  std::size_t selectable() const {
    std::size_t n = 0;
    for (const auto& [silo, via] : routes_) n += excluded(silo) ? 0 : 1;
    return n;
  }
  std::size_t disowned() const { return disowned_.size(); }
  // Every routed silo with what selection needs to know of it (server/selection.h).
  std::vector<Candidate> candidates() const {
    std::vector<Candidate> out;
    for (const auto& [silo, via] : routes_) {
      out.push_back({.silo = silo, .route = via, .leaving = leaving_.count(silo) > 0,
                     .disowned = disowned_.count(silo) > 0, .budget_spent = spent_.count(silo) > 0});
    }
    return out;
  }

  // An edge's RegionStatus: the silos that left it and those newly announced, in order.
  struct RegionChange {
    std::vector<std::string> left, joined;
  };
  // (The left ones are out of the region already; the caller admits the joined ones.)
  RegionChange set_region(SessionId edge, const std::set<std::string>& silos);
  void join_region(SessionId edge, const std::string& silo);
  void leave_region(SessionId edge, const std::string& silo);
  // An edge whose region lists `silo` but is not its route (its claim is waiting), if any.
  std::optional<SessionId> edge_announcing(const std::string& silo) const;

  // Every one of `expected` is connected now or was connected since start (and left).
  bool all_accounted_for(const std::set<std::string>& expected) const;

 private:
  std::map<SessionId, Peer> sessions_;
  std::map<std::string, SessionId> routes_;  // silo -> its session or its edge's
  std::set<std::string> seen_;               // silos connected at some time since start
  std::set<std::string> leaving_;            // a subset of routes_' silos
  std::set<std::string> disowned_;           // likewise
  std::set<std::string> spent_;              // privacy budget spent: for good
};

}  // namespace xsilo::server
