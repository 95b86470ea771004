// What the TCP all-reduce algorithms share, on top of Mesh: swapping a run of floats with a
// peer (reduced into ours or copied over), and folding the extra ranks of a count that is not
// a power of two into partners. Internal to xsilo_collective.
#pragma once

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

// The largest power of two not above n.
int power_of_two_floor(int n);

// With p = power_of_two_floor(N) < N, the N - p extra ranks r >= p hand their data to r - p,
// which combines it into its own before the power-of-two algorithm runs on ranks 0..p-1, and
// hands the result back after it (fold_out). Returns false on an extra rank, which by then
// holds the result and is done; true on the ranks that take part.
bool fold_in(Mesh& mesh, std::span<float> data, int p, std::size_t chunk_bytes, Op op, std::vector<float>& scratch);
void fold_out(Mesh& mesh, std::span<const float> data, int p, std::size_t chunk_bytes);

}  // namespace xsilo::collective::detail
