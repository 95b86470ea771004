// The all-reduce algorithms, written against Mesh only.
#include <algorithm>
#include <cstring>
#include <vector>

#include "silo_agent/collective/communicator.h"

namespace xsilo::collective {

std::pair<std::size_t, std::size_t> segment(std::size_t n, std::size_t parts, std::size_t k) {
  const std::size_t base = n / parts, extra = n % parts;
  const std::size_t begin = k * base + std::min(k, extra);
  return {begin, base + (k < extra ? 1 : 0)};
}

namespace {

std::span<const std::uint8_t> bytes(std::span<const float> v) {
  return {reinterpret_cast<const std::uint8_t*>(v.data()), v.size() * sizeof(float)};
}

// Receives into a chunk-sized scratch buffer while sending `out` to dst, adding each received
// chunk into `into` as soon as it lands: the scratch stays in cache.
void exchange_reduce(Mesh& mesh, int dst, std::span<const float> out, int src, std::span<float> into,
                     std::vector<float>& scratch, std::size_t chunk_bytes) {
  chunk_bytes = std::max<std::size_t>(sizeof(float), chunk_bytes / sizeof(float) * sizeof(float));
  scratch.resize(std::min(into.size(), chunk_bytes / sizeof(float)));
  auto* landing = reinterpret_cast<std::uint8_t*>(scratch.data());
  mesh.exchange(
      dst, bytes(out), src, into.size() * sizeof(float), chunk_bytes,
      [&](std::size_t, std::size_t want) { return std::span<std::uint8_t>(landing, want); },
      [&](std::size_t off, std::size_t len) {
        const std::size_t first = off / sizeof(float), count = len / sizeof(float);
        float* __restrict a = into.data() + first;
        const float* __restrict b = scratch.data();
        for (std::size_t i = 0; i < count; ++i) a[i] += b[i];
      });
}

void exchange_copy(Mesh& mesh, int dst, std::span<const float> out, int src, std::span<float> into,
                   std::size_t chunk_bytes) {
  auto* base = reinterpret_cast<std::uint8_t*>(into.data());
  mesh.exchange(
      dst, bytes(out), src, into.size() * sizeof(float), chunk_bytes, [&](std::size_t off, std::size_t want) { return std::span<std::uint8_t>(base + off, want); },
      [](std::size_t, std::size_t) {});
}

}  // namespace

// Ring all-reduce. Imagine the data cut into N segments and the ranks on a ring, each sending
// to its right neighbour and receiving from its left. Scatter-reduce: at step s rank r sends
// segment (r - s) and receives segment (r - s - 1), adding it to its own; after N - 1 steps rank
// r holds the full sum of segment (r + 1). All-gather: at step s rank r sends segment
// (r + 1 - s) and receives segment (r - s), now final, overwriting its own. Every rank sends
// 2(N - 1)/N of the data, which is optimal: no link carries more than that.
//
// What a rank sends at step j + 1 is exactly what it received (and reduced) at step j, so the
// 2(N - 1) steps run as one pipeline: a chunk goes on to the right neighbour as soon as it has
// been added in, instead of waiting for the whole segment, and no step boundary stalls a link.
void ring_all_reduce(Mesh& mesh, std::span<float> data, std::size_t chunk_bytes) {
  const int n = mesh.size(), r = mesh.rank();
  if (n == 1 || data.empty()) return;
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  auto seg = [&](int k) {
    const auto [b, len] = segment(data.size(), static_cast<std::size_t>(n), static_cast<std::size_t>((k % n + n) % n));
    return data.subspan(b, len);
  };
  // Incoming segment j: the scatter-reduce steps (added in), then the all-gather steps (copied).
  const int steps = 2 * (n - 1);
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
      float* __restrict a = in_seg[j].data() + (io - in_off[j]) / sizeof(float);
      const float* __restrict b = scratch.data();
      const std::size_t count = len / sizeof(float);
      for (std::size_t i = 0; i < count; ++i) a[i] += b[i];
    }
    processed = io + len;
  };
  mesh.stream(right, out, left, in_off.back(), chunk, land, on_chunk);
}

// Recursive halving-doubling (Rabenseifner). With p = 2^k ranks: reduce-scatter by halving
// (at distance p/2, p/4, ..., 1 each rank swaps the half of its current range it will not keep
// with its partner r ^ distance, and adds the half it keeps), then all-gather by doubling (the
// same pairs in reverse order swap their finished ranges). log2(p) steps each way: fewer, larger
// messages than the ring's 2(N-1), which wins on latency for small data. With N not a power of
// two, the N - p extra ranks first fold their data into a partner and get the result back at
// the end.
void halving_doubling_all_reduce(Mesh& mesh, std::span<float> data, std::size_t chunk_bytes,
                                 std::size_t doubling_bytes) {
  const int n = mesh.size(), r = mesh.rank();
  if (n == 1 || data.empty()) return;
  int p = 1;
  while (p * 2 <= n) p *= 2;
  std::vector<float> scratch;
  const std::span<float> none;
  if (r >= p) {  // an extra rank: hand over, then wait for the result
    exchange_copy(mesh, r - p, data, -1, none, chunk_bytes);
    exchange_copy(mesh, -1, none, r - p, data, chunk_bytes);
    return;
  }
  if (r + p < n) exchange_reduce(mesh, -1, none, r + p, data, scratch, chunk_bytes);
  if (data.size() * sizeof(float) < doubling_bytes) {
    // Recursive doubling: swap whole vectors with r ^ 1, r ^ 2, ... Partners add the same two
    // values in either order, so every rank ends bit-identical.
    std::vector<float> mine;
    for (int dist = 1; dist < p; dist *= 2) {
      mine.assign(data.begin(), data.end());  // what goes out must not change while we add
      exchange_reduce(mesh, r ^ dist, mine, r ^ dist, data, scratch, chunk_bytes);
    }
    if (r + p < n) exchange_copy(mesh, r + p, data, -1, none, chunk_bytes);
    return;
  }
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
    exchange_reduce(mesh, partner, give, partner, keep, scratch, chunk_bytes);
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
  if (r + p < n) exchange_copy(mesh, r + p, data, -1, none, chunk_bytes);
}

// Binomial tree from the root: log2(N) rounds.
void tree_broadcast(Mesh& mesh, std::span<float> data, int root, std::size_t chunk_bytes) {
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

void Communicator::all_reduce_mean(std::span<float> data) {
  all_reduce(data);
  const float inv = 1.0f / static_cast<float>(size());
  for (auto& v : data) v *= inv;
}

}  // namespace xsilo::collective
