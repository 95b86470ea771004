// The all-reduce algorithms, written against Mesh only.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "silo_agent/collective/communicator.h"
#include "silo_agent/collective/exchange.h"

namespace xsilo::collective {

std::pair<std::size_t, std::size_t> segment(std::size_t n, std::size_t parts, std::size_t k) {
  const std::size_t base = n / parts, extra = n % parts;
  const std::size_t begin = k * base + std::min(k, extra);
  return {begin, base + (k < extra ? 1 : 0)};
}

// Ring all-reduce. Imagine the data cut into N segments and the ranks on a ring, each sending
// to its right neighbour and receiving from its left. Scatter-reduce: at step s rank r sends
// segment (r - s) and receives segment (r - s - 1), combining it into its own (adding, for a
// sum); after N - 1 steps rank r holds the full result of segment (r + 1). All-gather: at step
// s rank r sends segment (r + 1 - s) and receives segment (r - s), now final, overwriting its
// own. Every rank sends
// 2(N - 1)/N of the data, which is optimal: no link carries more than that.
//
// What a rank sends at step j + 1 is exactly what it received (and reduced) at step j, so the
// 2(N - 1) steps run as one pipeline: a chunk goes on to the right neighbour as soon as it has
// been added in, instead of waiting for the whole segment, and no step boundary stalls a link.
//
// Stopping after the scatter-reduce (N - 1 steps) is the reduce-scatter the hierarchical
// all-reduce runs inside each host.
namespace {

void ring(Mesh& mesh, std::span<float> data, std::size_t chunk_bytes, Op op, bool all_gather) {
  const int n = mesh.size(), r = mesh.rank();
  if (n == 1 || data.empty()) return;
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  auto seg = [&](int k) {
    const auto [b, len] = segment(data.size(), static_cast<std::size_t>(n), static_cast<std::size_t>((k % n + n) % n));
    return data.subspan(b, len);
  };
  // Incoming segment j: the scatter-reduce steps (added in), then the all-gather steps (copied).
  const int steps = all_gather ? 2 * (n - 1) : n - 1;
  std::vector<std::span<float>> in_seg;
  std::vector<std::size_t> in_off{0};  // byte offset of each incoming segment in the stream
  for (int j = 0; j < steps; ++j) {
    in_seg.push_back(j < n - 1 ? seg(r - j - 1) : seg(r - (j - (n - 1))));
    in_off.push_back(in_off.back() + in_seg.back().size() * sizeof(float));
  }
  const std::size_t first = seg(r).size() * sizeof(float);
  // Outgoing: our own segment, then each incoming segment but the last once it is processed.
  std::size_t processed = 0;  // bytes of the incoming stream added in or copied
  std::size_t out_cursor = 0, in_cursor = 0;
  auto segment_bytes = [](std::span<float> s) {
    return std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(s.data()), s.size() * sizeof(float));
  };
  Mesh::Outgoing out;
  out.total = first + in_off[static_cast<std::size_t>(steps - 1)];
  out.ready = [&] { return first + processed; };
  out.at = [&](std::size_t o) -> std::span<const std::uint8_t> {
    if (o < first) return segment_bytes(seg(r)).subspan(o);
    const std::size_t io = o - first;  // the same bytes as incoming offset io
    while (in_off[out_cursor + 1] <= io) ++out_cursor;
    return segment_bytes(in_seg[out_cursor]).subspan(io - in_off[out_cursor]);
  };
  const std::size_t chunk = std::max<std::size_t>(sizeof(float), chunk_bytes / sizeof(float) * sizeof(float));
  std::vector<float> scratch(std::min(data.size(), chunk / sizeof(float)));
  auto seg_of = [&](std::size_t io) {
    while (in_off[in_cursor + 1] <= io) ++in_cursor;
    return in_cursor;
  };
  const auto land = [&](std::size_t io, std::size_t want) -> std::span<std::uint8_t> {
    const std::size_t j = seg_of(io);
    const std::size_t len = std::min(want, in_off[j + 1] - io);  // never across a segment
    if (static_cast<int>(j) < n - 1) return {reinterpret_cast<std::uint8_t*>(scratch.data()), len};
    return segment_bytes(in_seg[j]).subspan(io - in_off[j], len);
  };
  const auto on_chunk = [&](std::size_t io, std::size_t len) {
    const std::size_t j = seg_of(io);
    if (static_cast<int>(j) < n - 1) {
      const std::size_t count = len / sizeof(float);
      combine(op, in_seg[j].subspan((io - in_off[j]) / sizeof(float), count), std::span<const float>(scratch.data(), count));
    }
    processed = io + len;
  };
  mesh.stream(right, out, left, in_off.back(), chunk, land, on_chunk);
}

}  // namespace

void ring_all_reduce(Mesh& mesh, std::span<float> data, std::size_t chunk_bytes, Op op) {
  ring(mesh, data, chunk_bytes, op, true);
}

namespace detail {
void ring_reduce_scatter(Mesh& mesh, std::span<float> data, std::size_t chunk_bytes, Op op) {
  ring(mesh, data, chunk_bytes, op, false);
}
}  // namespace detail

// Recursive halving-doubling (Rabenseifner). With p = 2^k ranks: reduce-scatter by halving
// (at distance p/2, p/4, ..., 1 each rank swaps the half of its current range it will not keep
// with its partner r ^ distance, and combines the half it keeps), then all-gather by doubling
// (the same pairs in reverse order swap their finished ranges). log2(p) steps each way: fewer,
// larger messages than the ring's 2(N-1), which wins on latency for small data. With N not a
// power of two, the N - p extra ranks first fold their data into a partner and get the result
// back at the end. Each element's result is computed on one rank and copied to the others.
void halving_doubling_all_reduce(Mesh& mesh, std::span<float> data, std::size_t chunk_bytes, Op op,
                                 std::size_t doubling_bytes) {
  const int n = mesh.size(), r = mesh.rank();
  if (n == 1 || data.empty()) return;
  if (data.size() * sizeof(float) < doubling_bytes) return butterfly_all_reduce(mesh, data, chunk_bytes, op);
  using detail::exchange_copy;
  using detail::exchange_reduce;
  const int p = detail::power_of_two_floor(n);
  std::vector<float> scratch;
  if (!detail::fold_in(mesh, data, p, chunk_bytes, op, scratch)) return;
  // Halving: track the range [lo, hi) of segments this rank is responsible for.
  std::size_t lo = 0, hi = static_cast<std::size_t>(p);
  auto range = [&](std::size_t a, std::size_t b) {
    const std::size_t begin = segment(data.size(), static_cast<std::size_t>(p), a).first;
    const std::size_t end = b == static_cast<std::size_t>(p) ? data.size() : segment(data.size(), static_cast<std::size_t>(p), b).first;
    return data.subspan(begin, end - begin);
  };
  std::vector<std::pair<std::size_t, std::size_t>> kept;  // ranges after each halving, for doubling
  for (int dist = p / 2; dist >= 1; dist /= 2) {
    const int partner = r ^ dist;
    const std::size_t mid = (lo + hi) / 2;
    const bool lower = (r & dist) == 0;
    const auto keep = lower ? range(lo, mid) : range(mid, hi);
    const auto give = lower ? range(mid, hi) : range(lo, mid);
    exchange_reduce(mesh, partner, give, partner, keep, scratch, chunk_bytes, op);
    kept.emplace_back(lo, hi);
    if (lower) hi = mid;
    else lo = mid;
  }
  for (int dist = 1; dist < p; dist *= 2) {
    const int partner = r ^ dist;
    const auto [plo, phi] = kept.back();
    kept.pop_back();
    const std::size_t mid = (plo + phi) / 2;
    const bool lower = (r & dist) == 0;
    const auto mine = lower ? range(plo, mid) : range(mid, phi);
    const auto theirs = lower ? range(mid, phi) : range(plo, mid);
    exchange_copy(mesh, partner, mine, partner, theirs, chunk_bytes);
    lo = plo;
    hi = phi;
  }
  detail::fold_out(mesh, data, p, chunk_bytes);
}

// Binomial tree from the root: log2(N) rounds.
void tree_broadcast(Mesh& mesh, std::span<float> data, int root, std::size_t chunk_bytes) {
  using detail::exchange_copy;
  const int n = mesh.size();
  const int me = (mesh.rank() - root + n) % n;  // position relative to the root
  const std::span<float> none;
  int mask = 1;
  while (mask < n) {
    if (me < mask) {
      const int to = me + mask;
      if (to < n) exchange_copy(mesh, (to + root) % n, data, -1, none, chunk_bytes);
    } else if (me < 2 * mask) {
      exchange_copy(mesh, -1, none, (me - mask + root) % n, data, chunk_bytes);
    }
    mask *= 2;
  }
}

const std::vector<std::string>& tcp_backends() {
  static const std::vector<std::string> names{"ring", "hd", "tree", "butterfly", "hierarchical", "auto"};
  return names;
}

int Mesh::first_ready(std::span<const int>, const std::function<bool()>&) {
  throw std::logic_error("this mesh cannot wait on several peers at once");
}

void Communicator::all_reduce_mean(std::span<float> data) {
  all_reduce(data);
  const float inv = 1.0f / static_cast<float>(size());
  for (auto& v : data) v *= inv;
}

}  // namespace xsilo::collective
