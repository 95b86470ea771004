// The sparse all-reduce: top-k with error feedback, its sets all-gathered around the ring.
#include "silo_agent/collective/sparse_all_reduce.h"

#include <algorithm>
#include <functional>
#include <cmath>
#include <limits>

#include "silo_agent/collective/exchange.h"

namespace xsilo::collective {

namespace {

// |v| for choosing; a NaN ranks first, so that a diverged gradient is sent and seen, not
// hidden in a residual.
float magnitude(float v) { return std::isnan(v) ? std::numeric_limits<float>::infinity() : std::fabs(v); }

std::span<const std::uint8_t> entry_bytes(const std::vector<SparseEntry>& set) {
  return {reinterpret_cast<const std::uint8_t*>(set.data()), set.size() * sizeof(SparseEntry)};
}

}  // namespace

std::size_t topk_count(std::size_t n, double fraction) {
  if (n == 0) return 0;
  const double k = std::ceil(fraction * static_cast<double>(n));
  return std::clamp<std::size_t>(static_cast<std::size_t>(std::max(1.0, k)), 1, n);
}

std::vector<SparseEntry> select_topk(std::span<const float> data, std::span<float> residual, std::size_t k) {
  const std::size_t n = data.size();
  if (n > std::numeric_limits<std::uint32_t>::max()) {
    throw std::invalid_argument("sparse all-reduce: a bucket of " + std::to_string(n) + " elements; at most 2^32 - 1");
  }
  for (std::size_t i = 0; i < n; ++i) residual[i] += data[i];
  k = std::min(k, n);
  std::vector<SparseEntry> set;
  if (k == 0) return set;
  set.reserve(k);
  // The k-th largest magnitude is the threshold: everything above it goes, and of the
  // coordinates at it, the lowest indices until there are k (one pass, no index sort).
  std::vector<float> mags(n);
  for (std::size_t i = 0; i < n; ++i) mags[i] = magnitude(residual[i]);
  std::nth_element(mags.begin(), mags.begin() + static_cast<std::ptrdiff_t>(k - 1), mags.end(), std::greater<float>());
  const float threshold = mags[k - 1];
  std::size_t above = 0;
  for (std::size_t i = 0; i < n; ++i) above += magnitude(residual[i]) > threshold;
  std::size_t ties = k - above;  // how many at the threshold still go
  for (std::size_t i = 0; i < n; ++i) {
    const float m = magnitude(residual[i]);
    if (m > threshold || (m == threshold && ties > 0)) {
      if (m == threshold) --ties;
      set.push_back({static_cast<std::uint32_t>(i), residual[i]});
      residual[i] = 0.0f;
    }
  }
  return set;
}

std::uint64_t sparse_all_reduce(Mesh& mesh, std::span<float> data, std::span<float> residual, double fraction,
                                std::size_t chunk_bytes) {
  const int n = mesh.size(), r = mesh.rank();
  if (residual.size() != data.size()) throw std::logic_error("sparse all-reduce: the residual is not the data's size");
  if (data.empty()) return 0;
  std::vector<std::vector<SparseEntry>> sets(static_cast<std::size_t>(n));
  sets[static_cast<std::size_t>(r)] = select_topk(data, residual, topk_count(data.size(), fraction));
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  const auto at = [n](int q) { return static_cast<std::size_t>((q % n + n) % n); };
  std::uint64_t sent = 0;
  for (int s = 0; s < n - 1; ++s) {
    // Imagine the sets as N parcels going round: at step s rank r passes on the parcel it got at
    // step s - 1 (its own at step 0), so after N - 1 steps each has been everywhere once.
    const auto& out = sets[at(r - s)];
    auto& in = sets[at(r - s - 1)];
    std::uint64_t out_count = out.size(), in_count = 0;
    mesh.exchange(
        right, {reinterpret_cast<const std::uint8_t*>(&out_count), 8}, left, 8, 8,
        [&](std::size_t o, std::size_t want) {
          return std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(&in_count) + o, want);
        },
        [](std::size_t, std::size_t) {});
    if (in_count > data.size()) {
      throw CollectiveError("rank " + std::to_string(left) + " sent a sparse set larger than the vector", left);
    }
    in.resize(in_count);
    auto* base = reinterpret_cast<std::uint8_t*>(in.data());
    mesh.exchange(
        right, entry_bytes(out), left, in.size() * sizeof(SparseEntry), std::max<std::size_t>(chunk_bytes, 8),
        [&](std::size_t o, std::size_t want) { return std::span<std::uint8_t>(base + o, want); },
        [](std::size_t, std::size_t) {});
    sent += 8 + out.size() * sizeof(SparseEntry);
  }
  std::fill(data.begin(), data.end(), 0.0f);
  for (int q = 0; q < n; ++q) {
    for (const auto& e : sets[static_cast<std::size_t>(q)]) {
      if (e.index >= data.size()) {
        throw CollectiveError("rank " + std::to_string(q) + "'s sparse set holds an index outside the vector", q);
      }
      data[e.index] += e.value;
    }
  }
  return sent;
}

std::vector<float> merge_ring_sum(const std::vector<std::vector<SparseEntry>>& sets, std::size_t n, std::size_t k) {
  std::vector<float> acc(n, 0.0f);
  std::vector<float> none(n, 0.0f);
  for (std::size_t q = 0; q < sets.size(); ++q) {
    for (const auto& e : sets[q]) acc[e.index] += e.value;
    if (q + 1 == sets.size()) break;  // the last rank keeps its sum whole
    // The hop to the next rank carries only the k largest of the running sum.
    std::fill(none.begin(), none.end(), 0.0f);
    const auto kept = select_topk(acc, none, k);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (const auto& e : kept) acc[e.index] = e.value;
  }
  return acc;
}

}  // namespace xsilo::collective
