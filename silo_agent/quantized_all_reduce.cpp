#include "silo_agent/quantized_all_reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

#include "common/result.h"
#include "protocol/compression.h"

namespace xsilo::agent {

namespace {

const wire::Compression& codec() {
  static const wire::Compression c = [] {
    wire::Compression q;
    q.set_scheme(wire::Compression::QUANTIZE);
    q.set_bits(8);
    q.set_block(256);
    return q;
  }();
  return c;
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer: distinct seeds per rank, segment, run
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <class F>
void for_each_run(std::size_t n, F&& f) {
  for (std::size_t at = 0; at < n; at += kQuantizedRun) f(at, std::min(kQuantizedRun, n - at));
}

// The codes of `x`, run after run; `decoded` gets what every receiver will decode.
std::string encode_runs(std::span<const float> x, std::uint64_t seed, std::span<float> decoded) {
  std::string out;
  out.reserve(quantized_bytes(x.size()));
  for_each_run(x.size(), [&](std::size_t at, std::size_t len) {
    out += protocol::encode_chunk(codec(), x.subspan(at, len), mix(seed + at), decoded.subspan(at, len));
  });
  return out;
}

// Success when the codes decoded into `out`, else why not.
Status decode_runs(std::string_view codes, std::span<float> out) {
  std::size_t pos = 0;
  Status decoded;
  for_each_run(out.size(), [&](std::size_t at, std::size_t len) {
    const std::size_t bytes = protocol::encoded_bytes(codec(), len);
    std::size_t nonzeros = 0;
    if (decoded) decoded = protocol::decode_chunk(codec(), codes.substr(pos, bytes), out.subspan(at, len), nonzeros);
    pos += bytes;
  });
  return decoded;
}

bool finite(std::span<const float> v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

std::span<const std::uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

// Sends `out` to dst while the codes from src land in `in` (already sized).
void exchange(collective::Mesh& mesh, int dst, const std::string& out, int src, std::string& in,
              std::size_t chunk_bytes) {
  auto* base = reinterpret_cast<std::uint8_t*>(in.data());
  mesh.exchange(
      dst, bytes_of(out), src, in.size(), chunk_bytes,
      [&](std::size_t off, std::size_t want) { return std::span<std::uint8_t>(base + off, want); },
      [](std::size_t, std::size_t) {});
}

}  // namespace

std::size_t quantized_bytes(std::size_t n) {
  std::size_t total = 0;
  for_each_run(n, [&](std::size_t, std::size_t len) { total += protocol::encoded_bytes(codec(), len); });
  return total;
}

void quantized_all_reduce(collective::Mesh& mesh, std::span<float> data, std::span<float> sent,
                          std::span<float> summed, std::uint64_t seed, std::size_t chunk_bytes) {
  const int n = mesh.size(), r = mesh.rank();
  if (n == 1 || data.empty()) return;
  if (sent.size() != data.size() || summed.size() != data.size()) {
    throw std::invalid_argument("8-bit all-reduce: the residuals must have the data's size");
  }
  auto seg = [&](int k) { return collective::segment(data.size(), static_cast<std::size_t>(n), static_cast<std::size_t>(k)); };
  const auto [own_begin, own_len] = seg(r);
  const auto id = [&](int k, int phase) {
    return seed ^ mix((static_cast<std::uint64_t>(r) << 33) | (static_cast<std::uint64_t>(k) << 1) | phase);
  };

  // A failure (a value that is not finite here, codes from a peer that do not decode) is not
  // thrown at once: the exchanges go on, and this rank's sum goes out as NaN, whose codes no
  // rank decodes. So every rank learns of it in phase 2 and all of them fail the step alike,
  // instead of some going on without the others. (A rank that owns no element, with fewer
  // elements than ranks, cannot pass it on; its peers then time out.)
  std::string failed;

  // Phase 1: the codes of every other rank's segment, with what was left out last time added.
  for (std::size_t i = 0; i < data.size(); ++i) data[i] += sent[i];
  if (!finite(data)) failed = "8-bit all-reduce: the gradient is NaN or infinite here (the training diverged)";
  std::vector<std::string> out(static_cast<std::size_t>(n));
  std::vector<float> decoded(seg(0).second);  // segment 0 is the longest
  for (int k = 0; k < n; ++k) {
    const auto [begin, len] = seg(k);
    if (k == r) {  // kept as it is: nothing left out
      std::fill_n(sent.begin() + static_cast<std::ptrdiff_t>(begin), len, 0.0f);
      continue;
    }
    out[static_cast<std::size_t>(k)] = encode_runs(data.subspan(begin, len), id(k, 0), std::span(decoded.data(), len));
    for (std::size_t i = 0; i < len; ++i) sent[begin + i] = data[begin + i] - decoded[i];
  }
  std::vector<float> sum(own_len);
  for (std::size_t i = 0; i < own_len; ++i) sum[i] = data[own_begin + i] + summed[own_begin + i];
  std::string in(quantized_bytes(own_len), '\0');
  for (int s = 1; s < n; ++s) {
    const int dst = (r + s) % n, src = (r - s + n) % n;
    exchange(mesh, dst, out[static_cast<std::size_t>(dst)], src, in, chunk_bytes);
    if (!failed.empty()) continue;
    if (const auto decoded_in = decode_runs(in, std::span(decoded.data(), own_len)); !decoded_in) {
      failed = "8-bit all-reduce: the codes from rank " + std::to_string(src) + " do not decode (" +
               decoded_in.error().message() + "): its gradient is NaN or infinite";
      continue;
    }
    for (std::size_t i = 0; i < own_len; ++i) sum[i] += decoded[i];
  }
  if (failed.empty() && !finite(sum)) failed = "8-bit all-reduce: a sum overflowed (the training diverged)";
  if (!failed.empty()) std::fill(sum.begin(), sum.end(), std::numeric_limits<float>::quiet_NaN());

  // Phase 2: the codes of this segment's sum to everyone; this rank keeps what they decode to.
  auto own = data.subspan(own_begin, own_len);
  const std::string codes = encode_runs(sum, id(r, 1), own);
  if (failed.empty()) {
    for (std::size_t i = 0; i < own_len; ++i) summed[own_begin + i] = sum[i] - own[i];
  }
  for (int s = 1; s < n; ++s) {
    const int dst = (r + s) % n, src = (r - s + n) % n;
    const auto [begin, len] = seg(src);
    in.assign(quantized_bytes(len), '\0');
    exchange(mesh, dst, codes, src, in, chunk_bytes);
    if (!failed.empty()) continue;
    if (const auto decoded_sum = decode_runs(in, data.subspan(begin, len)); !decoded_sum) {
      failed = "8-bit all-reduce: rank " + std::to_string(src) + "'s sum does not decode (" +
               decoded_sum.error().message() + "): a gradient of this step is NaN or infinite";
    }
  }
  if (!failed.empty()) throw std::runtime_error(failed);
}

}  // namespace xsilo::agent
