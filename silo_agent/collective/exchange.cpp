#include "silo_agent/collective/exchange.h"

#include <algorithm>

namespace xsilo::collective::detail {

std::span<const std::uint8_t> bytes(std::span<const float> v) {
  return {reinterpret_cast<const std::uint8_t*>(v.data()), v.size() * sizeof(float)};
}

void exchange_reduce(Mesh& mesh, int dst, std::span<const float> out, int src, std::span<float> into,
                     std::vector<float>& scratch, std::size_t chunk_bytes, Op op, Operands order) {
  chunk_bytes = std::max<std::size_t>(sizeof(float), chunk_bytes / sizeof(float) * sizeof(float));
  scratch.resize(std::min(into.size(), chunk_bytes / sizeof(float)));
  auto* landing = reinterpret_cast<std::uint8_t*>(scratch.data());
  mesh.exchange(
      dst, bytes(out), src, src < 0 ? 0 : into.size() * sizeof(float), chunk_bytes,
      [&](std::size_t, std::size_t want) { return std::span<std::uint8_t>(landing, want); },
      [&](std::size_t off, std::size_t len) {
        const std::size_t first = off / sizeof(float), count = len / sizeof(float);
        combine(op, into.subspan(first, count), std::span<const float>(scratch.data(), count), order);
      });
}

void exchange_copy(Mesh& mesh, int dst, std::span<const float> out, int src, std::span<float> into,
                   std::size_t chunk_bytes) {
  auto* base = reinterpret_cast<std::uint8_t*>(into.data());
  mesh.exchange(
      dst, bytes(out), src, src < 0 ? 0 : into.size() * sizeof(float), chunk_bytes,
      [&](std::size_t off, std::size_t want) { return std::span<std::uint8_t>(base + off, want); },
      [](std::size_t, std::size_t) {});
}

int power_of_two_floor(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

bool fold_in(Mesh& mesh, std::span<float> data, int p, std::size_t chunk_bytes, Op op, std::vector<float>& scratch) {
  const int n = mesh.size(), r = mesh.rank();
  const std::span<float> none;
  if (r >= p) {  // an extra rank: hand over, then wait for the result
    exchange_copy(mesh, r - p, data, -1, none, chunk_bytes);
    exchange_copy(mesh, -1, none, r - p, data, chunk_bytes);
    return false;
  }
  if (r + p < n) exchange_reduce(mesh, -1, none, r + p, data, scratch, chunk_bytes, op);
  return true;
}

void fold_out(Mesh& mesh, std::span<const float> data, int p, std::size_t chunk_bytes) {
  const int r = mesh.rank();
  if (r + p < mesh.size()) exchange_copy(mesh, r + p, data, -1, std::span<float>(), chunk_bytes);
}

}  // namespace xsilo::collective::detail
