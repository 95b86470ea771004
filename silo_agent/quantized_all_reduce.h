// An all-reduce in 8-bit codes between the local workers of a silo, with error feedback, for
// links slower than the workers' compute (workers on several hosts of a cluster, or on one host
// over a shared NIC). It is the "8-bit with error feedback" communication hook of DDP's menu,
// written against collective::Mesh like our float32 ring.
//
// The vector is cut into N segments, one per rank (as in the ring), and summed in two phases:
//   1. Each rank adds what its codes left out last time (`residual.sent`), encodes every other
//      rank's segment as QUANTIZE 8-bit codes (protocol/compression.h: a float32 scale per 256
//      elements, unbiased stochastic rounding) and sends segment j to rank j, while receiving
//      the codes of its own segment from every other rank (N - 1 pairwise exchanges).
//   2. Rank j sums its segment: its own values as they are, the others' decoded (always in the
//      same order), plus what the codes of its sums left out last time (`residual.summed`); it
//      encodes the
//      sum and sends the same codes to every rank (N - 1 exchanges again).
// Every rank then decodes every segment's sum from the same codes (the owner keeps exactly what
// its codes decode to), so all replicas hold bit-identical values, as the float32 ring gives.
//
// A rank sends 2 (N - 1) / N of the vector at 1 byte and 1/64 of a scale per element: 0.25x of
// the float32 ring's bytes, for two quantization errors per element that error feedback carries
// into the next call instead of losing them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "silo_agent/collective/communicator.h"

namespace xsilo::agent {

// One rank's error feedback for a vector of the same size: coordinates it sent short, and
// coordinates of the segments it summed whose codes came out short. Both persist across calls.
// When the ranks change (a re-formation), segments change owners: `handover()` moves what this
// rank still owes as a segment's owner into what it sends, so the new owner delivers it once.
struct QuantizedResidual {
  std::vector<float> sent, summed;
  void resize(std::size_t n) {
    sent.assign(n, 0.0f);
    summed.assign(n, 0.0f);
  }
  void handover() {
    for (std::size_t i = 0; i < sent.size(); ++i) sent[i] += summed[i];
    std::fill(summed.begin(), summed.end(), 0.0f);
  }
};

// Elements per encoded run: a segment longer than this is encoded as several runs, so no
// single decode stands for more than the chunk codec admits.
inline constexpr std::size_t kQuantizedRun = std::size_t{1} << 20;

// Sums `data` over the ranks of `mesh` as described above. `sent` and `summed` are this rank's
// residuals for `data` (same size; subspans of a QuantizedResidual). `seed` drives the rounding
// and must differ between calls (the step and the bucket). Throws collective::CollectiveError
// when a peer fails, std::runtime_error on every rank when a value is not finite on any of them
// (its codes carry a NaN scale, which no receiver decodes, and the owner of a segment that
// received such codes passes it on as a NaN sum: all ranks fail the step alike).
void quantized_all_reduce(collective::Mesh& mesh, std::span<float> data, std::span<float> sent,
                          std::span<float> summed, std::uint64_t seed, std::size_t chunk_bytes = 1u << 20);

// Bytes of the 8-bit codes of `n` elements (runs of kQuantizedRun).
std::size_t quantized_bytes(std::size_t n);

}  // namespace xsilo::agent
