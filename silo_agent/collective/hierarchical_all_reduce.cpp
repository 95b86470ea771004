// The hierarchical all-reduce: a ring inside each host, a ring across the hosts' leaders.
#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "silo_agent/collective/communicator.h"
#include "silo_agent/collective/exchange.h"

namespace xsilo::collective {

namespace detail {

void chain_broadcast(Mesh& mesh, std::span<float> data, std::size_t chunk_bytes) {
  const int n = mesh.size(), r = mesh.rank();
  if (n == 1 || data.empty()) return;
  const std::span<std::uint8_t> all(reinterpret_cast<std::uint8_t*>(data.data()), data.size() * sizeof(float));
  std::size_t got = r == 0 ? all.size() : 0;  // bytes that have landed, and may go on
  Mesh::Outgoing out{all.size(), [&](std::size_t o) -> std::span<const std::uint8_t> { return all.subspan(o); },
                     [&] { return got; }};
  mesh.stream(r + 1 < n ? r + 1 : -1, out, r > 0 ? r - 1 : -1, r > 0 ? all.size() : 0,
              std::max<std::size_t>(sizeof(float), chunk_bytes),
              [&](std::size_t o, std::size_t want) { return all.subspan(o, want); },
              [&](std::size_t o, std::size_t len) { got = o + len; });
}

}  // namespace detail

HostLayout::HostLayout(std::span<const int> host_of) {
  std::map<int, std::size_t> index;  // label -> host, hosts in the order of their lowest rank
  host_.resize(host_of.size());
  for (std::size_t r = 0; r < host_of.size(); ++r) {
    auto [it, fresh] = index.try_emplace(host_of[r], members_.size());
    if (fresh) members_.emplace_back();
    members_[it->second].push_back(static_cast<int>(r));
    host_[r] = it->second;
  }
  for (const auto& m : members_) leaders_.push_back(m.front());
}

// Three phases, each a ring or a chain over a SubMesh of the one mesh:
//
//   1. Inside each host of m ranks: the ring's scatter-reduce (m - 1 pipelined steps), after
//      which local rank i holds op over the host of segment (i + 1) % m, then each local rank
//      i > 0 hands that segment to the leader (local rank 0), which now holds the host's
//      partial result whole. Each rank sends (m - 1)/m of the vector, then 1/m.
//   2. Across hosts: the leaders, one per host, run `across` (the ring by default) on the host
//      partials: with the ring each leader sends 2(H - 1)/H of the vector over the slow links,
//      and only the leaders use them, so H streams cross the inter-host network instead of the
//      flat ring's N.
//   3. Inside each host: the leader's result goes down the chain 0 -> 1 -> ... -> m-1,
//      pipelined by chunks.
//
// Each element's result is computed once (phase 2's owner of its segment) and copied to every
// other rank, so every rank ends with the same bits, for every op. A host of one rank skips
// phases 1 and 3; one host is the ring's reduce-scatter + gather + chain.
namespace {

void hd_all_reduce(Mesh& mesh, std::span<float> data, std::size_t chunk_bytes, Op op) {
  halving_doubling_all_reduce(mesh, data, chunk_bytes, op);
}

}  // namespace

const std::vector<std::string>& across_host_algorithms() {
  static const std::vector<std::string> names{"ring", "hd", "tree", "butterfly"};
  return names;
}

FlatAllReduce across_host_algorithm(const std::string& name) {
  if (name == "ring") return ring_all_reduce;
  if (name == "hd") return hd_all_reduce;
  if (name == "tree") return tree_all_reduce;
  if (name == "butterfly") return butterfly_all_reduce;
  throw std::invalid_argument("across hosts the leaders run ring, hd, tree or butterfly, not " + name);
}

const std::vector<std::string>& intra_host_transports() {
  static const std::vector<std::string> names{"tcp", "nccl", "auto"};
  return names;
}

void hierarchical_all_reduce(Mesh& mesh, std::span<float> data, const HostLayout& hosts, std::size_t chunk_bytes,
                             Op op, FlatAllReduce across, Communicator* inside) {
  const int n = mesh.size(), r = mesh.rank();
  if (n == 1 || data.empty()) return;
  if (hosts.ranks() != static_cast<std::size_t>(n)) {
    throw std::logic_error("hierarchical all-reduce: a host layout of " + std::to_string(hosts.ranks()) +
                           " ranks on a mesh of " + std::to_string(n));
  }
  const std::size_t h = hosts.host(r);
  const auto& mine = hosts.members(h);
  const int m = static_cast<int>(mine.size());
  const int local_rank = static_cast<int>(std::find(mine.begin(), mine.end(), r) - mine.begin());
  detail::SubMesh local(mesh, mine, local_rank);
  if (inside && m > 1) {
    if (inside->size() != m || inside->rank() != local_rank) {
      throw std::logic_error("hierarchical all-reduce: the host's communicator has rank " + std::to_string(inside->rank()) +
                             " of " + std::to_string(inside->size()) + ", the layout says " +
                             std::to_string(local_rank) + " of " + std::to_string(m));
    }
    inside->all_reduce(data, op);  // every rank of the host holds the host's partial
    if (hosts.hosts() > 1) {
      if (local_rank == 0) {
        detail::SubMesh leaders(mesh, hosts.leaders(), static_cast<int>(h));
        (across ? across : ring_all_reduce)(leaders, data, chunk_bytes, op);
      }
      inside->broadcast(data, 0);
    }
    return;
  }
  if (m > 1) {
    detail::ring_reduce_scatter(local, data, chunk_bytes, op);
    const auto seg = [&](int i) {
      const auto [b, len] = segment(data.size(), static_cast<std::size_t>(m), static_cast<std::size_t>((i + 1) % m));
      return data.subspan(b, len);
    };
    const std::span<float> none;
    if (local_rank == 0) {
      for (int i = 1; i < m; ++i) detail::exchange_copy(local, -1, none, i, seg(i), chunk_bytes);
    } else {
      detail::exchange_copy(local, 0, seg(local_rank), -1, none, chunk_bytes);
    }
  }
  if (local_rank == 0 && hosts.hosts() > 1) {
    detail::SubMesh leaders(mesh, hosts.leaders(), static_cast<int>(h));
    (across ? across : ring_all_reduce)(leaders, data, chunk_bytes, op);
  }
  if (m > 1) detail::chain_broadcast(local, data, chunk_bytes);
}

}  // namespace xsilo::collective
