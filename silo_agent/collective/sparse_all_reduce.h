// Sparse all-reduce: each rank sends only the top-k coordinates of its gradient by magnitude,
// as (index, value) pairs, and keeps the rest as error feedback for its next call (Deep
// Gradient Compression, Lin et al. 2018; the "top-k with error feedback" of the issue).
//
//   1. Rank r adds its residual to `data` (acc = data + residual) and picks the k coordinates
//      of largest |acc| (k = ceil(fraction * n), at least 1; ties by the lower index, a NaN
//      counts as the largest). It sends those k values of acc; the residual keeps acc at every
//      other coordinate and 0 at the chosen ones, so nothing is lost, only delayed.
//   2. The sets travel as variable-length messages by a ring all-gather: at step s rank r sends
//      set (r - s) mod N to its right neighbour, its length first (8 bytes), then its entries
//      (a uint32 index and a float32 value each), and receives set (r - s - 1) from its left.
//      After N - 1 steps every rank holds every set, unchanged.
//   3. Every rank adds the N sets into a zeroed `data`, in rank order 0..N-1: the result is the
//      sum of the sparse contributions, the same bits on every rank.
//
// Why an all-gather and not a ring that merges the sets hop by hop: a merged set of N sparse
// sets has up to N k entries; a ring that cuts it back to k at every hop (to keep messages
// small) drops mass at every hop, and what it drops is no rank's residual, so error feedback
// cannot give it back. That loss grows with the hops (docs/collectives.md, "Sparse all-reduce",
// measures it with merge_ring_sum below). The all-gather sums exactly what was chosen, and
// error feedback holds exactly what was not.
//
// Bytes a rank sends: (N - 1) (8 + 8k), against the float32 ring's 2 (N - 1)/N 4n: at N = 4 and
// fraction 1 %, 4 % of the dense bytes. The all-gather's bytes grow with N where the ring's do
// not, so the sparse path pays while N fraction stays well below 1/4.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "silo_agent/collective/communicator.h"

namespace xsilo::collective {

struct SparseEntry {
  std::uint32_t index;
  float value;
};

// k for a vector of n elements: ceil(fraction * n), at least 1, at most n (0 when n is 0).
std::size_t topk_count(std::size_t n, double fraction);

// Step 1 alone: adds `data` into `residual`, moves the k largest coordinates of the result out
// of it, and returns them in ascending index order. `data` is left as it was.
std::vector<SparseEntry> select_topk(std::span<const float> data, std::span<float> residual, std::size_t k);

// Steps 1-3 over `mesh`. `residual` is this rank's error feedback for `data` (same size; kept
// by the caller between calls, zero at first). Returns the bytes this rank sent. Throws
// CollectiveError when a peer fails or sends an index outside the vector.
std::uint64_t sparse_all_reduce(Mesh& mesh, std::span<float> data, std::span<float> residual, double fraction,
                                std::size_t chunk_bytes = 1u << 20);

// The alternative the header argues against, for measuring it (no sockets): the N sets merged
// along a ring 0 -> 1 -> ... -> N-1, the running sum cut back to its k largest entries after
// each hop. Returns the dense result the last rank would hold.
std::vector<float> merge_ring_sum(const std::vector<std::vector<SparseEntry>>& sets, std::size_t n, std::size_t k);

}  // namespace xsilo::collective
