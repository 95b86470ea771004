// The butterfly: recursive doubling on a hypercube, whole vectors at every step.
#include <vector>

#include "silo_agent/collective/communicator.h"
#include "silo_agent/collective/exchange.h"

namespace xsilo::collective {

// Picture the p = 2^k ranks as the corners of a k-dimensional cube, rank r at the corner whose
// coordinates are r's bits. Step s swaps whole vectors along dimension s: r with r ^ 2^s, and
// both combine. After step s every rank holds op over the 2^(s+1) ranks that agree with it in
// the bits above s, so after k steps each holds op over all p. log2(p) messages of the full
// size per rank: the fewest steps of any all-reduce, each carrying all the bytes, so it wins
// where latency, not bandwidth, is the cost (a few KiB).
//
// Both partners compute the same element from the same two values; both put the lower rank's
// value on the left, so that even min(+0, -0) or two NaNs come out the same bits on both, and by
// induction on every rank.
//
// N not a power of two: the N - p extra ranks fold into r - p first and get the result back at
// the end (detail::fold_in / fold_out): two more steps, only for those pairs.
void butterfly_all_reduce(Mesh& mesh, std::span<float> data, std::size_t chunk_bytes, Op op) {
  const int n = mesh.size(), r = mesh.rank();
  if (n == 1 || data.empty()) return;
  const int p = detail::power_of_two_floor(n);
  std::vector<float> scratch, mine;
  if (!detail::fold_in(mesh, data, p, chunk_bytes, op, scratch)) return;
  for (int dist = 1; dist < p; dist *= 2) {
    const int partner = r ^ dist;
    mine.assign(data.begin(), data.end());  // what goes out must not change while we combine
    detail::exchange_reduce(mesh, partner, mine, partner, data, scratch, chunk_bytes, op,
                            partner < r ? Operands::in_first : Operands::acc_first);
  }
  detail::fold_out(mesh, data, p, chunk_bytes);
}

}  // namespace xsilo::collective
