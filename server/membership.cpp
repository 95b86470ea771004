#include "server/membership.h"

namespace xsilo::server {

std::vector<std::string> Membership::remove_session(SessionId id) {
  std::vector<std::string> gone;
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return gone;
  sessions_.erase(it);
  for (auto r = routes_.begin(); r != routes_.end();) {
    if (r->second == id) {
      gone.push_back(r->first);
      leaving_.erase(r->first);
      disowned_.erase(r->first);
      r = routes_.erase(r);
    } else {
      ++r;
    }
  }
  return gone;
}

const Peer* Membership::peer(SessionId id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

bool Membership::is_edge(SessionId id) const {
  const Peer* p = peer(id);
  return p && p->edge;
}

std::optional<SessionId> Membership::route(const std::string& silo, SessionId via) {
  std::optional<SessionId> before;
  if (auto it = routes_.find(silo); it != routes_.end() && it->second != via) before = it->second;
  routes_[silo] = via;
  leaving_.erase(silo);
  disowned_.erase(silo);
  seen_.insert(silo);
  return before;
}

bool Membership::unroute(const std::string& silo, SessionId via) {
  auto it = routes_.find(silo);
  if (it == routes_.end() || it->second != via) return false;
  routes_.erase(it);
  leaving_.erase(silo);
  disowned_.erase(silo);
  return true;
}

std::optional<SessionId> Membership::route_of(const std::string& silo) const {
  auto it = routes_.find(silo);
  if (it == routes_.end()) return std::nullopt;
  return it->second;
}

Membership::RegionChange Membership::set_region(SessionId edge, const std::set<std::string>& silos) {
  RegionChange c;
  auto it = sessions_.find(edge);
  if (it == sessions_.end()) return c;
  auto& region = it->second.region;
  for (const auto& s : region) {
    if (!silos.count(s)) c.left.push_back(s);
  }
  for (const auto& s : silos) {
    if (!region.count(s)) c.joined.push_back(s);
  }
  for (const auto& s : c.left) region.erase(s);
  return c;
}

void Membership::join_region(SessionId edge, const std::string& silo) {
  if (auto it = sessions_.find(edge); it != sessions_.end()) it->second.region.insert(silo);
}

void Membership::leave_region(SessionId edge, const std::string& silo) {
  if (auto it = sessions_.find(edge); it != sessions_.end()) it->second.region.erase(silo);
}

std::optional<SessionId> Membership::edge_announcing(const std::string& silo) const {
  const auto route = route_of(silo);
  for (const auto& [id, peer] : sessions_) {
    if (peer.edge && peer.region.count(silo) && (!route || *route != id)) return id;
  }
  return std::nullopt;
}

bool Membership::all_accounted_for(const std::set<std::string>& expected) const {
  if (expected.empty()) return false;  // "*": nobody knows who else may come
  for (const auto& s : expected) {
    if (!routes_.count(s) && !seen_.count(s)) return false;
  }
  return true;
}

}  // namespace xsilo::server
