// Fractional repetition: the first finisher of each group stands for it (replicated_all_reduce.h).
#include "silo_agent/collective/replicated_all_reduce.h"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>
#include <vector>

#include "silo_agent/collective/exchange.h"

namespace xsilo::collective {

namespace {

enum class Kind { offer = 1, pull = 2, result = 3, end = 4 };

using Header = std::array<float, 2>;  // kind, the rank it concerns (small integers: exact)

void send_header(Mesh& mesh, int to, Kind kind, int rank, std::size_t chunk) {
  const Header h{static_cast<float>(kind), static_cast<float>(rank)};
  detail::exchange_copy(mesh, to, h, -1, {}, chunk);
}

Header read_header(Mesh& mesh, int from, std::size_t chunk) {
  Header h{};
  detail::exchange_copy(mesh, -1, {}, from, h, chunk);
  return h;
}

Kind kind_of(const Header& h, int from) {
  const int k = static_cast<int>(h[0]);
  if (k < 1 || k > 4) {
    throw CollectiveError("replicated all-reduce: rank " + std::to_string(from) + " sent message kind " +
                              std::to_string(k) + ", not one of the protocol's",
                          from);
  }
  return static_cast<Kind>(k);
}

[[noreturn]] void unexpected(Kind got, int from, const char* state) {
  throw CollectiveError("replicated all-reduce: rank " + std::to_string(from) + " sent message kind " +
                            std::to_string(static_cast<int>(got)) + " " + state,
                        from);
}

// The leader (local rank 0 of `group`): its own gradient or the first mate's offer, the leaders'
// all-reduce, the sum to every mate, then each mate's END.
ReplicatedResult lead(Mesh& group, Mesh& leaders, std::span<const float> own, const std::function<bool()>& own_ready,
                      std::span<float> result, std::size_t chunk, FlatAllReduce across,
                      const std::function<void()>& have_result, const std::vector<int>& global) {
  const int m = group.size();
  std::vector<int> mates;
  for (int i = 1; i < m; ++i) mates.push_back(i);
  std::vector<bool> offered(static_cast<std::size_t>(m), false);
  ReplicatedResult r;
  const int first = group.first_ready(mates, own_ready);
  if (first < 0) {
    std::copy(own.begin(), own.end(), result.begin());
    r.supplier = global[0];
  } else {
    const Kind k = kind_of(read_header(group, first, chunk), global[static_cast<std::size_t>(first)]);
    if (k != Kind::offer) unexpected(k, global[static_cast<std::size_t>(first)], "before its offer");
    offered[static_cast<std::size_t>(first)] = true;
    send_header(group, first, Kind::pull, global[static_cast<std::size_t>(first)], chunk);
    detail::exchange_copy(group, -1, {}, first, result, chunk);
    r.supplier = global[static_cast<std::size_t>(first)];
  }
  have_result();
  if (leaders.size() > 1) (across ? across : ring_all_reduce)(leaders, result, chunk, Op::sum);
  for (int i : mates) {
    send_header(group, i, Kind::result, r.supplier, chunk);
    detail::exchange_copy(group, i, result, -1, {}, chunk);
  }
  // Every mate answers the sum with END, after an OFFER of its own if it had one ready.
  for (int i : mates) {
    for (;;) {
      const Kind k = kind_of(read_header(group, i, chunk), global[static_cast<std::size_t>(i)]);
      if (k == Kind::end) break;
      if (k != Kind::offer || offered[static_cast<std::size_t>(i)]) unexpected(k, global[static_cast<std::size_t>(i)], "after the sum");
      offered[static_cast<std::size_t>(i)] = true;
    }
  }
  return r;
}

// A mate: offer its gradient once ready, hand it over if pulled, take the sum, say END.
ReplicatedResult follow(Mesh& group, std::span<const float> own, const std::function<bool()>& own_ready,
                        std::span<float> result, std::size_t chunk, const std::function<void()>& have_result,
                        const std::vector<int>& global) {
  static const int leader[] = {0};
  const int leader_rank = global[0];
  if (group.first_ready(leader, own_ready) < 0) send_header(group, 0, Kind::offer, group.rank(), chunk);
  Header h = read_header(group, 0, chunk);
  if (kind_of(h, leader_rank) == Kind::pull) {
    detail::exchange_copy(group, 0, own, -1, {}, chunk);
    h = read_header(group, 0, chunk);
  }
  const Kind k = kind_of(h, leader_rank);
  if (k != Kind::result) unexpected(k, leader_rank, "where the sum was due");
  detail::exchange_copy(group, -1, {}, 0, result, chunk);
  have_result();
  send_header(group, 0, Kind::end, group.rank(), chunk);
  return {.supplier = static_cast<int>(h[1])};
}

}  // namespace

int replica_groups(int ranks, int stragglers) {
  return std::max(1, ranks / (std::max(stragglers, 0) + 1));
}

ReplicatedResult replicated_all_reduce(Mesh& mesh, int stragglers, std::span<const float> own,
                                       const std::function<bool()>& own_ready, std::span<float> result,
                                       std::size_t chunk_bytes, FlatAllReduce across,
                                       const std::function<void()>& have_result) {
  if (own.size() != result.size()) throw std::invalid_argument("replicated all-reduce: own and result differ in size");
  const int n = mesh.size(), r = mesh.rank();
  const int groups = replica_groups(n, stragglers);
  const int g = r % groups;
  std::vector<int> members;  // g, g + G, g + 2G, ...: the leader first
  for (int k = g; k < n; k += groups) members.push_back(k);
  const int local = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
  detail::SubMesh group(mesh, members, local);
  const std::size_t chunk = std::max<std::size_t>(sizeof(float), chunk_bytes);
  if (local > 0) return follow(group, own, own_ready, result, chunk, have_result, members);
  std::vector<int> leader_ranks(static_cast<std::size_t>(groups));
  for (int k = 0; k < groups; ++k) leader_ranks[static_cast<std::size_t>(k)] = k;
  detail::SubMesh leaders(mesh, leader_ranks, g);
  return lead(group, leaders, own, own_ready, result, chunk, across, have_result, members);
}

}  // namespace xsilo::collective
