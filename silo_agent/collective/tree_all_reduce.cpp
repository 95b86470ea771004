// The tree all-reduce: a pipelined reduce up a binary tree, then a pipelined broadcast down it.
#include <algorithm>
#include <vector>

#include "silo_agent/collective/communicator.h"
#include "silo_agent/collective/exchange.h"

namespace xsilo::collective {

// The ranks form a binary tree in heap order: rank r's children are 2r + 1 and 2r + 2, its
// parent (r - 1) / 2, rank 0 the root; any N fits, the last level simply stays partly empty.
// The vector is cut into pieces of `chunk_bytes`.
//
// Up: for piece k, a rank receives piece k from its first child while it sends piece k - 1 (now
// complete: its own values combined with both subtrees') to its parent, then receives piece k
// from its second child. Piece k travels up one level while piece k + 1 is being combined below
// it, so a vector of P pieces reaches the root after about P + depth piece-times rather than
// P x depth. The root ends with op over every rank.
//
// Down: the same pipeline the other way: a rank receives piece k from its parent while it sends
// piece k - 1 to its first child, then sends piece k - 1 to its second child.
//
// For a small vector (one piece) that is 2 floor(log2 N) levels, each a message latency (two,
// where a rank has two children), against the butterfly's log2 N swaps: the tree's use is where
// the messages are small and the ranks many, or where N is far from a power of two. Each
// element is combined on one rank only and copied down, so every rank ends bit-identical.
//
// The two phases do not overlap (the root starts down only when all is up): for large vectors a
// link carries each piece twice each way at best, and the ring, which moves 2(N - 1)/N, wins.
void tree_all_reduce(Mesh& mesh, std::span<float> data, std::size_t chunk_bytes, Op op) {
  const int n = mesh.size(), r = mesh.rank();
  if (n == 1 || data.empty()) return;
  const int parent = r == 0 ? -1 : (r - 1) / 2;
  const int first = 2 * r + 1 < n ? 2 * r + 1 : -1, second = 2 * r + 2 < n ? 2 * r + 2 : -1;
  const std::size_t piece = std::max<std::size_t>(1, chunk_bytes / sizeof(float));
  const std::size_t pieces = (data.size() + piece - 1) / piece;
  const std::span<float> none;
  // Piece k; k == pieces (one past the end) is empty, so the loops below need no special last step.
  auto part = [&](std::size_t k) {
    const std::size_t begin = std::min(k * piece, data.size());
    return data.subspan(begin, std::min(piece, data.size() - begin));
  };
  std::vector<float> scratch;
  for (std::size_t k = 0; k <= pieces; ++k) {
    const auto done = k > 0 ? part(k - 1) : none, next = part(k);
    detail::exchange_reduce(mesh, k > 0 ? parent : -1, done, next.empty() ? -1 : first, next, scratch, chunk_bytes, op);
    if (!next.empty() && second >= 0) detail::exchange_reduce(mesh, -1, none, second, next, scratch, chunk_bytes, op);
  }
  for (std::size_t k = 0; k <= pieces; ++k) {
    const auto done = k > 0 ? part(k - 1) : none, next = part(k);
    detail::exchange_copy(mesh, k > 0 ? first : -1, done, next.empty() ? -1 : parent, next, chunk_bytes);
    if (k > 0 && second >= 0) detail::exchange_copy(mesh, second, done, -1, none, chunk_bytes);
  }
}

}  // namespace xsilo::collective
