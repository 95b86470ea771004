#include "silo_agent/collective/gossip_links.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "silo_agent/collective/exchange.h"

namespace xsilo::collective {

namespace {

using Clock = std::chrono::steady_clock;

// kind u32, reserved u32, float count u64, weight f64, loss sum f64, steps u64, rows u64; little-endian
// hosts only, like the rest of the mesh (the workers of a silo run the same binary).
constexpr std::size_t kHeader = 48;

std::vector<std::uint8_t> encode(const GossipMessage& m) {
  std::vector<std::uint8_t> b(kHeader + m.x.size() * sizeof(float));
  const auto kind = static_cast<std::uint32_t>(m.kind);
  const std::uint32_t reserved = 0;
  const std::uint64_t count = m.x.size();
  std::memcpy(b.data(), &kind, 4);
  std::memcpy(b.data() + 4, &reserved, 4);
  std::memcpy(b.data() + 8, &count, 8);
  std::memcpy(b.data() + 16, &m.weight, 8);
  std::memcpy(b.data() + 24, &m.loss_sum, 8);
  std::memcpy(b.data() + 32, &m.steps, 8);
  std::memcpy(b.data() + 40, &m.rows, 8);
  if (!m.x.empty()) std::memcpy(b.data() + kHeader, m.x.data(), m.x.size() * sizeof(float));
  return b;
}

bool carries_mass(GossipKind k) { return k == GossipKind::push || k == GossipKind::final; }

}  // namespace

GossipLinks::GossipLinks(int rank, const std::vector<PeerAddress>& peers, int listen_fd, std::size_t floats,
                         std::chrono::milliseconds timeout)
    : rank_(rank), floats_(floats), timeout_(timeout), links_(peers.size()) {
  const auto fds = detail::connect_peers(rank, peers, listen_fd, timeout);
  for (std::size_t p = 0; p < fds.size(); ++p) {
    links_[p].fd = fds[p];
    if (fds[p] < 0) continue;
    int size = 4 << 20;
    ::setsockopt(fds[p], SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    ::setsockopt(fds[p], SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  }
}

GossipLinks::~GossipLinks() {
  for (auto& l : links_) {
    if (l.fd >= 0) ::close(l.fd);
  }
}

bool GossipLinks::live(int peer) const {
  return peer != rank_ && peer >= 0 && peer < size() && links_[static_cast<std::size_t>(peer)].fd >= 0;
}

std::vector<int> GossipLinks::live_peers() const {
  std::vector<int> out;
  for (int p = 0; p < size(); ++p) {
    if (live(p)) out.push_back(p);
  }
  return out;
}

std::size_t GossipLinks::pending(int peer) const {
  std::size_t n = 0;
  for (const auto& o : links_.at(static_cast<std::size_t>(peer)).out) n += o.bytes.size() - o.sent;
  return n;
}

bool GossipLinks::send(int peer, GossipMessage m) {
  if (!live(peer)) return false;
  auto& l = links_[static_cast<std::size_t>(peer)];
  if (l.out.empty()) l.moved = Clock::now();
  auto bytes = encode(m);
  l.out.push_back({std::move(m), std::move(bytes), 0});
  write_some(peer);
  return true;
}

void GossipLinks::drop(int peer, const std::string& why) {
  auto& l = links_.at(static_cast<std::size_t>(peer));
  if (l.fd < 0) return;
  ::close(l.fd);
  l.fd = -1;
  // Nothing here was written to the end: the peer drops what it got of it, so its mass is ours.
  for (auto& o : l.out) {
    if (carries_mass(o.message.kind)) returned_.push_back(std::move(o.message));
  }
  l.out.clear();
  l.in.clear();
  l.have = 0;
  events_.push_back("rank " + std::to_string(peer) + " " + why);
}

std::vector<GossipMessage> GossipLinks::take_returned() { return std::exchange(returned_, {}); }

void GossipLinks::write_some(int peer) {
  auto& l = links_[static_cast<std::size_t>(peer)];
  while (l.fd >= 0 && !l.out.empty()) {
    auto& o = l.out.front();
    const ssize_t n = ::send(l.fd, o.bytes.data() + o.sent, o.bytes.size() - o.sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      o.sent += static_cast<std::size_t>(n);
      l.moved = Clock::now();
      if (o.sent == o.bytes.size()) l.out.pop_front();
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    drop(peer, "closed its link");
  }
}

void GossipLinks::read_some(int peer, std::vector<GossipMessage>& arrived) {
  auto& l = links_[static_cast<std::size_t>(peer)];
  while (l.fd >= 0) {
    if (l.in.size() < kHeader) l.in.resize(kHeader);
    const ssize_t n = ::recv(l.fd, l.in.data() + l.have, l.in.size() - l.have, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      drop(peer, "closed its link");
      return;
    }
    if (n < 0) return;
    l.have += static_cast<std::size_t>(n);
    if (l.have < l.in.size()) continue;
    std::uint32_t kind = 0;
    std::uint64_t count = 0;
    std::memcpy(&kind, l.in.data(), 4);
    std::memcpy(&count, l.in.data() + 8, 8);
    if (kind < 1 || kind > 4) {
      drop(peer, "sent a message that is not gossip (kind " + std::to_string(kind) + ")");
      return;
    }
    // The size is checked against the model before any of it is allocated: a header may not
    // make this worker reserve what it says.
    const std::uint64_t want = carries_mass(static_cast<GossipKind>(kind)) ? floats_ : 0;
    if (count != want) {
      drop(peer, "sent a malformed message (kind " + std::to_string(kind) + " with " + std::to_string(count) +
                     " floats, not " + std::to_string(want) + ")");
      return;
    }
    if (l.in.size() == kHeader && count > 0) {
      l.in.resize(kHeader + count * sizeof(float));
      continue;
    }
    GossipMessage m;
    m.from = peer;
    m.kind = static_cast<GossipKind>(kind);
    std::memcpy(&m.weight, l.in.data() + 16, 8);
    std::memcpy(&m.loss_sum, l.in.data() + 24, 8);
    std::memcpy(&m.steps, l.in.data() + 32, 8);
    std::memcpy(&m.rows, l.in.data() + 40, 8);
    m.x.resize(count);
    if (count > 0) std::memcpy(m.x.data(), l.in.data() + kHeader, count * sizeof(float));
    arrived.push_back(std::move(m));
    l.in.clear();
    l.have = 0;
  }
}

std::vector<GossipMessage> GossipLinks::pump(std::chrono::milliseconds wait) {
  std::vector<GossipMessage> arrived;
  const auto until = Clock::now() + wait;
  for (;;) {
    for (int p = 0; p < size(); ++p) {
      if (!live(p)) continue;
      write_some(p);
      read_some(p, arrived);
    }
    const auto now = Clock::now();
    for (int p = 0; p < size(); ++p) {
      const auto& l = links_[static_cast<std::size_t>(p)];
      if (live(p) && !l.out.empty() && now - l.moved >= timeout_) {
        drop(p, "did not take a message within " + std::to_string(timeout_.count()) + " ms");
      }
    }
    if (!arrived.empty() || now >= until) return arrived;
    std::vector<pollfd> fds;
    for (int p = 0; p < size(); ++p) {
      if (!live(p)) continue;
      const auto& l = links_[static_cast<std::size_t>(p)];
      fds.push_back({l.fd, static_cast<short>(POLLIN | (l.out.empty() ? 0 : POLLOUT)), 0});
    }
    if (fds.empty()) return arrived;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count();
    ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<long long>(left, 1, 100)));
  }
}

}  // namespace xsilo::collective
