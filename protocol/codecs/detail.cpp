#include "protocol/codecs/detail.h"

#include <algorithm>
#include <limits>

#ifdef __SSE4_1__
#include <smmintrin.h>
#endif

namespace xsilo::protocol::detail {

std::pair<float, bool> max_abs(const float* x, std::size_t n) {
  std::size_t i = 0;
  float m = 0, probe = 0;
#ifdef __SSE4_1__
  const __m128 sign = _mm_set1_ps(-0.0f), zero = _mm_setzero_ps();
  __m128 vm = zero, vp = zero;
  for (; i + 4 <= n; i += 4) {
    const __m128 v = _mm_loadu_ps(x + i);
    vm = _mm_max_ps(vm, _mm_andnot_ps(sign, v));
    vp = _mm_add_ps(vp, _mm_mul_ps(v, zero));  // NaN when any element is NaN or infinite
  }
  alignas(16) float lm[4], lp[4];
  _mm_store_ps(lm, vm);
  _mm_store_ps(lp, vp);
  for (int l = 0; l < 4; ++l) m = std::max(m, lm[l]), probe += lp[l];
#endif
  for (; i < n; ++i) {
    m = std::max(m, std::fabs(x[i]));
    probe += x[i] * 0.0f;
  }
  return {m, std::isfinite(probe) && std::isfinite(m)};
}

wire::TensorChunk chunk_of(const wire::Compression& c, const TensorInfo& t, std::size_t off, std::size_t n) {
  wire::TensorChunk ch;
  ch.set_name(t.name);
  ch.set_dtype(wire::F32);
  for (auto s : t.shape) ch.add_shape(s);
  ch.set_offset(off);
  ch.set_encoding(c.scheme());
  ch.set_count(n);
  return ch;
}

// ---- block codecs ---------------------------------------------------------------------------

std::size_t BlockCodec::bytes(const wire::Compression& c, std::size_t count, std::size_t /*nonzeros*/) const {
  return 4 * blocks(c, count) + code_bytes(c, count);
}

std::string BlockCodec::encode(const wire::Compression& c, std::span<const float> x, std::uint64_t seed,
                               std::span<float> decoded) const {
  const std::size_t n = x.size(), nb = blocks(c, n);
  std::string out(bytes(c, n, 0), '\0');
  auto* codes = reinterpret_cast<std::uint8_t*>(out.data()) + 4 * nb;
  const auto key = static_cast<std::uint32_t>(seed ^ (seed >> 32));
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t first = b * c.block(), len = std::min<std::size_t>(c.block(), n - first);
    const float scale = encode_block(c, x.data() + first, len, key, first, codes, decoded.data() + first);
    std::memcpy(out.data() + 4 * b, &scale, 4);
  }
  return out;
}

Status BlockCodec::decode(const wire::Compression& c, std::string_view data, std::span<float> out,
                          std::size_t& nonzeros, const TensorInfo* /*tensor*/, std::uint64_t /*offset*/) const {
  const std::size_t n = out.size();
  nonzeros = 0;
  if (data.size() != bytes(c, n, 0)) {
    return Error("chunk of " + std::to_string(n) + " elements has " + std::to_string(data.size()) + " bytes, not " +
                 std::to_string(bytes(c, n, 0)) + " (" + protocol::describe(c) + ")");
  }
  const std::size_t nb = blocks(c, n);
  std::vector<float> scales(nb);
  std::memcpy(scales.data(), data.data(), 4 * nb);
  // A scale times the largest code must stay finite too.
  const float top = largest_scale(c);
  for (std::size_t b = 0; b < nb; ++b) {
    const float s = scales[b];
    if (!std::isfinite(s) || s < 0) {
      return Error("scale of block " + std::to_string(b) + " is " +
                   (std::isnan(s) ? "NaN" : std::isinf(s) ? "infinite" : "negative"));
    }
    if (s > top) return Error("scale of block " + std::to_string(b) + " overflows the largest code");
  }
  return decode_codes(c, reinterpret_cast<const std::uint8_t*>(data.data()) + 4 * nb, scales, out);
}

// ---- sparse codecs --------------------------------------------------------------------------

std::size_t SparseCodec::bytes(const wire::Compression& /*c*/, std::size_t /*count*/, std::size_t nonzeros) const {
  return 4 + 8 * nonzeros;
}

Status SparseCodec::check(const wire::Compression& c) const {
  if (!(c.fraction() > 0 && c.fraction() <= 1)) {
    return Error("fraction must be in (0, 1], not " + std::to_string(c.fraction()));
  }
  return {};
}

std::string SparseCodec::encode(const wire::Compression& /*c*/, std::span<const float> x, std::uint64_t /*seed*/,
                                std::span<float> decoded) const {
  // The nonzero elements; what is not encoded decodes as +0 (a -0.0 would hash apart).
  std::vector<std::uint64_t> set;
  std::vector<float> vals;
  for (std::size_t i = 0; i < x.size(); ++i) {
    decoded[i] = x[i] == 0 ? 0.0f : x[i];
    if (x[i] != 0) set.push_back(i), vals.push_back(x[i]);
  }
  return sparse_chunk(set, vals, 0, set.size(), 0);
}

Status SparseCodec::decode(const wire::Compression& c, std::string_view data, std::span<float> out,
                           std::size_t& nonzeros, const TensorInfo* /*tensor*/, std::uint64_t /*offset*/) const {
  const std::size_t n = out.size();
  nonzeros = 0;
  if (data.size() < 4) return Error("sparse chunk of " + std::to_string(data.size()) + " bytes has no count");
  std::uint32_t m = 0;
  std::memcpy(&m, data.data(), 4);
  if (m > n) return Error("sparse chunk keeps " + std::to_string(m) + " of its " + std::to_string(n) + " elements");
  if (data.size() != bytes(c, n, m)) {
    return Error("sparse chunk of " + std::to_string(m) + " elements has " + std::to_string(data.size()) +
                 " bytes, not " + std::to_string(bytes(c, n, m)));
  }
  const char* idx = data.data() + 4;
  const char* val = idx + 4 * std::size_t{m};
  std::int64_t last = -1;
  for (std::size_t j = 0; j < m; ++j) {
    std::uint32_t i = 0;
    std::memcpy(&i, idx + 4 * j, 4);
    if (static_cast<std::int64_t>(i) <= last || i >= n) {
      return Error("sparse chunk index " + std::to_string(i) + " is out of order or past its " +
                   std::to_string(n) + " elements");
    }
    last = i;
    float v = 0;
    std::memcpy(&v, val + 4 * j, 4);
    if (!std::isfinite(v)) return Error("sparse chunk value at " + std::to_string(i) + " is NaN or infinite");
  }
  std::fill(out.begin(), out.end(), 0.0f);
  for (std::size_t j = 0; j < m; ++j) {
    std::uint32_t i = 0;
    std::memcpy(&i, idx + 4 * j, 4);
    std::memcpy(&out[i], val + 4 * j, 4);
  }
  nonzeros = m;
  return {};
}

std::string sparse_chunk(const std::vector<std::uint64_t>& set, const std::vector<float>& vals, std::size_t first,
                         std::size_t last, std::uint64_t at) {
  const std::size_t m = last - first;
  std::string out(4 + 8 * m, '\0');
  put_u32(out, 0, static_cast<std::uint32_t>(m));
  for (std::size_t j = 0; j < m; ++j) put_u32(out, 4 + 4 * j, static_cast<std::uint32_t>(set[first + j] - at));
  if (m) std::memcpy(out.data() + 4 + 4 * m, vals.data() + first, 4 * m);
  return out;
}

std::size_t length(const Ranges& parts) {
  std::size_t n = 0;
  for (const auto& [b, e] : parts) n += e - b;
  return n;
}

std::vector<std::uint64_t> to_flat(std::vector<std::uint64_t> set, const Ranges& parts) {
  std::size_t j = 0, base = 0;
  for (const auto& [b, e] : parts) {
    for (; j < set.size() && set[j] < base + (e - b); ++j) set[j] = b + (set[j] - base);
    base += e - b;
  }
  return set;
}

}  // namespace xsilo::protocol::detail
