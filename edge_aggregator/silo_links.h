// Which connection speaks for each silo at an edge. A silo that reconnects replaces its old
// connection, which is closed; but a message the old one had already read (on its network thread,
// before the close took effect) still reaches the core afterwards, and must not be taken for the
// new connection's: the relay hears a silo only through its current connection (current()).
// Core thread only, like the relay.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

namespace xsilo::edge {

template <class Conn>
class SiloLinks {
 public:
  using Ptr = std::shared_ptr<Conn>;

  // Makes `conn` the silo's connection; returns the one it replaces (null if none).
  Ptr replace(const std::string& silo, Ptr conn) { return std::exchange(links_[silo], std::move(conn)); }
  // Whether `conn` is the silo's connection now: false once it was replaced or dropped.
  bool current(const std::string& silo, const Conn* conn) const {
    auto it = links_.find(silo);
    return it != links_.end() && it->second.get() == conn;
  }
  // Forgets the silo's connection if it is still `conn` (true: the silo is gone). A replaced
  // connection that ends changes nothing: the silo is still there, through its new one.
  bool drop(const std::string& silo, const Conn* conn) {
    if (!current(silo, conn)) return false;
    links_.erase(silo);
    return true;
  }
  // The silo's connection, or null.
  Conn* find(const std::string& silo) const {
    auto it = links_.find(silo);
    return it == links_.end() ? nullptr : it->second.get();
  }
  const std::map<std::string, Ptr>& all() const { return links_; }
  std::size_t size() const { return links_.size(); }

 private:
  std::map<std::string, Ptr> links_;
};

}  // namespace xsilo::edge
