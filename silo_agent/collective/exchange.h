// What the TCP all-reduce algorithms share, on top of Mesh: swapping a run of floats with a
// peer (reduced into ours or copied over), and folding the extra ranks of a count that is not
// a power of two into partners. Internal to xsilo_collective.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "silo_agent/collective/communicator.h"

namespace xsilo::collective::detail {

std::span<const std::uint8_t> bytes(std::span<const float> v);

// Sends `out` to dst while receiving into a chunk-sized scratch buffer from src, combining each
// received chunk into `into` as soon as it lands (the scratch stays in cache). dst or src -1:
// that side is empty.
void exchange_reduce(Mesh& mesh, int dst, std::span<const float> out, int src, std::span<float> into,
                     std::vector<float>& scratch, std::size_t chunk_bytes, Op op,
                     Operands order = Operands::acc_first);
// Sends `out` to dst while receiving `into` from src, overwriting it.
void exchange_copy(Mesh& mesh, int dst, std::span<const float> out, int src, std::span<float> into,
                   std::size_t chunk_bytes);

// The scatter-reduce half of the ring (N - 1 pipelined steps): afterwards rank r holds op over
// every rank of segment (r + 1) % N, segment() cutting `data` into N pieces; the rest of its
// data is partial.
void ring_reduce_scatter(Mesh& mesh, std::span<float> data, std::size_t chunk_bytes, Op op);

// Rank 0's `data` to every rank along the chain 0 -> 1 -> ... -> N-1, chunk by chunk: a rank
// passes a chunk on as soon as it has landed, so the vector reaches the end after about its own
// time plus N - 2 chunk-times.
void chain_broadcast(Mesh& mesh, std::span<float> data, std::size_t chunk_bytes);

// Ranks `ranks` of `parent` (in this order) as a mesh of their own: rank k here is ranks[k]
// there. `me` is this rank's index in `ranks`.
class SubMesh : public Mesh {
 public:
  SubMesh(Mesh& parent, std::vector<int> ranks, int me) : parent_(parent), ranks_(std::move(ranks)), me_(me) {}
  int rank() const override { return me_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  void stream(int dst, const Outgoing& out, int src, std::size_t in_bytes, std::size_t chunk, const Landing& land,
              const OnChunk& on_chunk) override {
    parent_.stream(dst < 0 ? -1 : ranks_.at(static_cast<std::size_t>(dst)), out,
                   src < 0 ? -1 : ranks_.at(static_cast<std::size_t>(src)), in_bytes, chunk, land, on_chunk);
  }
  int first_ready(std::span<const int> peers, const std::function<bool()>& local_done) override {
    std::vector<int> theirs;
    for (int p : peers) theirs.push_back(ranks_.at(static_cast<std::size_t>(p)));
    const int got = parent_.first_ready(theirs, local_done);
    if (got < 0) return got;
    return static_cast<int>(std::find(ranks_.begin(), ranks_.end(), got) - ranks_.begin());
  }

 private:
  Mesh& parent_;
  std::vector<int> ranks_;
  int me_;
};

// One connected TCP socket per other rank (descriptor -1 at `rank`): rank r connects to the lower
// ranks' listening sockets, sending its rank, and accepts the higher ones on `listen_fd`, all
// within `timeout`. The TCP mesh and the gossip links (gossip_links.h) form their links so.
// Throws CollectiveError (closing what it had opened) when a peer is unreachable.
std::vector<int> connect_peers(int rank, const std::vector<PeerAddress>& peers, int listen_fd,
                               std::chrono::milliseconds timeout);

// The largest power of two not above n.
int power_of_two_floor(int n);

// With p = power_of_two_floor(N) < N, the N - p extra ranks r >= p hand their data to r - p,
// which combines it into its own before the power-of-two algorithm runs on ranks 0..p-1, and
// hands the result back after it (fold_out). Returns false on an extra rank, which by then
// holds the result and is done; true on the ranks that take part.
bool fold_in(Mesh& mesh, std::span<float> data, int p, std::size_t chunk_bytes, Op op, std::vector<float>& scratch);
void fold_out(Mesh& mesh, std::span<const float> data, int p, std::size_t chunk_bytes);

}  // namespace xsilo::collective::detail
