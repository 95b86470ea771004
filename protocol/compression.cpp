#include "protocol/compression.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fnmatch.h>
#include <functional>
#include <limits>
#include <random>

#ifdef __SSE4_1__
#include <smmintrin.h>
#endif

#include "common/eigen.h"

namespace xsilo::protocol {

namespace {

using wire::Compression;
__extension__ using u128 = unsigned __int128;  // exact products of two 64-bit counts

// A 32-bit integer hash (good avalanche, vectorizes): the rounding noise of element i.
inline std::uint32_t mix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

std::uint64_t splitmix64(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::size_t blocks(const Compression& c, std::size_t count) { return (count + c.block() - 1) / c.block(); }
std::size_t code_bytes(const Compression& c, std::size_t count) {
  switch (c.scheme()) {
    case Compression::QUANTIZE: return c.bits() == 8 ? count : (count + 1) / 2;
    case Compression::SIGN: return (count + 7) / 8;
    default: return 0;
  }
}
bool sparse(const Compression& c) {
  return c.scheme() == Compression::TOP_K || c.scheme() == Compression::RANDOM_K;
}

void put_u32(std::string& out, std::size_t at, std::uint32_t v) { std::memcpy(out.data() + at, &v, 4); }

// The largest |x| of a block, and whether every element is finite.
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

// Codes of x[0, n) into q (as int32), decoded values into dec: q = clamp(floor(x inv + u)),
// u the rounding noise of element `index` onward.
void quantize_tile(const float* __restrict x, std::size_t n, float inv, float scale, float lv, std::uint32_t index,
                   std::int32_t* __restrict q, float* __restrict dec) {
  std::size_t i = 0;
#ifdef __SSE4_1__
  const __m128 vinv = _mm_set1_ps(inv), vscale = _mm_set1_ps(scale), hi = _mm_set1_ps(lv), lo = _mm_set1_ps(-lv),
               unit = _mm_set1_ps(0x1p-24f);
  const __m128i c1 = _mm_set1_epi32(0x7feb352d), c2 = _mm_set1_epi32(static_cast<int>(0x846ca68bU));
  __m128i idx = _mm_add_epi32(_mm_set1_epi32(static_cast<int>(index)), _mm_setr_epi32(0, 1, 2, 3));
  const __m128i four = _mm_set1_epi32(4);
  for (; i + 4 <= n; i += 4) {
    __m128i h = idx;  // mix32, four lanes
    h = _mm_xor_si128(h, _mm_srli_epi32(h, 16));
    h = _mm_mullo_epi32(h, c1);
    h = _mm_xor_si128(h, _mm_srli_epi32(h, 15));
    h = _mm_mullo_epi32(h, c2);
    h = _mm_xor_si128(h, _mm_srli_epi32(h, 16));
    const __m128 u = _mm_mul_ps(_mm_cvtepi32_ps(_mm_srli_epi32(h, 8)), unit);
    __m128 f = _mm_floor_ps(_mm_add_ps(_mm_mul_ps(_mm_loadu_ps(x + i), vinv), u));
    f = _mm_min_ps(_mm_max_ps(f, lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm_cvttps_epi32(f));
    _mm_storeu_ps(dec + i, _mm_mul_ps(f, vscale));
    idx = _mm_add_epi32(idx, four);
  }
#endif
  for (; i < n; ++i) {
    const float u = static_cast<float>(mix32(index + static_cast<std::uint32_t>(i)) >> 8) * 0x1p-24f;
    float f = std::floor(x[i] * inv + u);
    f = f < -lv ? -lv : (f > lv ? lv : f);
    q[i] = static_cast<std::int32_t>(f);
    dec[i] = f * scale;
  }
}

// QUANTIZE one block: codes into `codes` (int8, or packed nibbles, from element `first` of the
// chunk), decoded values into `dec`.
float quantize_block(const float* __restrict x, std::size_t n, int levels, std::uint32_t key, std::size_t first,
                     std::uint8_t* __restrict codes, bool nibbles, float* __restrict dec) {
  const auto [m, finite] = max_abs(x, n);
  const float lv = static_cast<float>(levels);
  // A block whose largest |x| is so small that levels / m overflows is sent as zeros (error
  // feedback keeps it); a non-finite one as zeros under a NaN scale, which receivers refuse.
  const bool tiny = finite && !(m >= lv * std::numeric_limits<float>::min());
  const float scale = !finite ? std::numeric_limits<float>::quiet_NaN() : tiny ? 0.0f : m / lv;
  constexpr std::size_t kTile = 256;
  alignas(64) std::int32_t q[kTile];
  for (std::size_t s = 0; s < n; s += kTile) {
    const std::size_t len = std::min(n, s + kTile) - s;
    if (!finite || tiny) {
      std::fill(q, q + len, 0);
      std::fill(dec + s, dec + s + len, 0.0f);
    } else {
      quantize_tile(x + s, len, lv / m, scale, lv, key + static_cast<std::uint32_t>(first + s), q, dec + s);
    }
    if (!nibbles) {
      std::uint8_t* out = codes + first + s;
      for (std::size_t i = 0; i < len; ++i) out[i] = static_cast<std::uint8_t>(q[i]);
    } else {
      std::size_t i = 0;
      auto one = [&](std::size_t k) {
        const std::size_t j = first + s + k;
        const auto nib = static_cast<std::uint8_t>(q[k] + 7);
        codes[j / 2] = static_cast<std::uint8_t>((j % 2) ? ((codes[j / 2] & 0x0f) | (nib << 4)) : nib);
      };
      if ((first + s) % 2) one(i++);
      std::uint8_t* out = codes + (first + s + i) / 2;
      for (; i + 2 <= len; i += 2) *out++ = static_cast<std::uint8_t>((q[i] + 7) | ((q[i + 1] + 7) << 4));
      if (i < len) one(i);
    }
  }
  return scale;
}

float sign_block(const float* __restrict x, std::size_t n, std::size_t first, std::uint8_t* __restrict bits,
                 float* __restrict dec) {
  float sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += std::fabs(x[i]);
  const float scale = sum / static_cast<float>(n);  // NaN or Inf for a non-finite input
  std::size_t i = 0;
  // Whole bytes at a time where the block is byte-aligned.
  if (first % 8 == 0) {
#ifdef __SSE4_1__
    // Eight elements a byte: "not below zero" (NaN included, as below) as a lane mask, whose
    // sign bits are the byte, and which picks +scale or -scale.
    const __m128 zero = _mm_setzero_ps(), pos_s = _mm_set1_ps(scale), neg_s = _mm_set1_ps(-scale);
    for (; i + 8 <= n; i += 8) {
      const __m128 lo = _mm_cmpnlt_ps(_mm_loadu_ps(x + i), zero), hi = _mm_cmpnlt_ps(_mm_loadu_ps(x + i + 4), zero);
      bits[(first + i) / 8] = static_cast<std::uint8_t>(_mm_movemask_ps(lo) | (_mm_movemask_ps(hi) << 4));
      _mm_storeu_ps(dec + i, _mm_blendv_ps(neg_s, pos_s, lo));
      _mm_storeu_ps(dec + i + 4, _mm_blendv_ps(neg_s, pos_s, hi));
    }
#endif
    for (; i + 8 <= n; i += 8) {
      unsigned byte = 0;
      for (unsigned b = 0; b < 8; ++b) {
        const bool pos = !(x[i + b] < 0);
        byte |= static_cast<unsigned>(pos) << b;
        dec[i + b] = pos ? scale : -scale;
      }
      bits[(first + i) / 8] = static_cast<std::uint8_t>(byte);
    }
  }
  for (; i < n; ++i) {
    const std::size_t j = first + i;
    const bool pos = !(x[i] < 0);
    if (pos) bits[j / 8] = static_cast<std::uint8_t>(bits[j / 8] | (1u << (j % 8)));
    dec[i] = pos ? scale : -scale;
  }
  return scale;
}

// The signs a byte of SIGN codes stands for: bit k set is +1 for its element k, clear is -1.
// ±1 * s is exactly ±s.
constexpr auto kByteSigns = [] {
  std::array<std::array<float, 8>, 256> t{};
  for (unsigned b = 0; b < 256; ++b) {
    for (unsigned k = 0; k < 8; ++k) t[b][k] = (b >> k) & 1 ? 1.0f : -1.0f;
  }
  return t;
}();

// The k strata of [0, d) in order: stratum j is [floor(j d / k), floor((j + 1) d / k)), walked
// without a division per stratum (j d / k = j q + floor(j r / k), with d = q k + r).
class Strata {
 public:
  Strata(std::uint64_t d, std::uint64_t k) : q_(d / k), r_(d % k), k_(k) {}
  // The next stratum's [begin, end).
  std::pair<std::uint64_t, std::uint64_t> next() {
    const std::uint64_t b = begin_;
    begin_ += q_;
    acc_ += r_;
    if (acc_ >= k_) acc_ -= k_, ++begin_;
    return {b, begin_};
  }

 private:
  std::uint64_t q_, r_, k_, acc_ = 0, begin_ = 0;
};

// POWER_SGD's decoding: out (rows x cols) = P (rows x r) Q^T (Q: cols x r), each value summed in
// k order from zero, one product at a time (no fused multiply-add: the build passes
// -ffp-contract=off, so every instruction set gets the same bits and the silo's hash matches the
// receiver's). Vectorizes across a row.
void low_rank_product(const float* p, const float* q, std::size_t rows, std::size_t cols, std::size_t r, float* out) {
  std::vector<float> qt(cols * r);
  for (std::size_t j = 0; j < cols; ++j) {
    for (std::size_t k = 0; k < r; ++k) qt[k * cols + j] = q[j * r + k];
  }
  for (std::size_t i = 0; i < rows; ++i) {
    float* o = out + i * cols;
    std::fill(o, o + cols, 0.0f);
    for (std::size_t k = 0; k < r; ++k) {
      const float pk = p[i * r + k];
      const float* qk = qt.data() + k * cols;
      for (std::size_t j = 0; j < cols; ++j) {
        const float prod = pk * qk[j];
        o[j] = o[j] + prod;
      }
    }
  }
}

// A sparse chunk of the kept coordinates set[first, last) (global), the chunk starting at `at`.
std::string sparse_chunk(const std::vector<std::uint64_t>& set, const std::vector<float>& vals, std::size_t first,
                         std::size_t last, std::uint64_t at) {
  const std::size_t m = last - first;
  std::string out(4 + 8 * m, '\0');
  put_u32(out, 0, static_cast<std::uint32_t>(m));
  for (std::size_t j = 0; j < m; ++j) put_u32(out, 4 + 4 * j, static_cast<std::uint32_t>(set[first + j] - at));
  if (m) std::memcpy(out.data() + 4 + 4 * m, vals.data() + first, 4 * m);
  return out;
}

// "1%", "12.5%": a fraction as a percentage, without trailing zeros.
std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g%%", fraction * 100);
  return buf;
}

std::string bad_scale(float s, std::size_t b) {
  return "scale of block " + std::to_string(b) + " is " + (std::isnan(s) ? "NaN" : std::isinf(s) ? "infinite" : "negative");
}

}  // namespace

bool compressed(const wire::Compression& c) { return c.scheme() != Compression::NONE; }

const std::vector<std::string>& scheme_names() {
  static const std::vector<std::string> names = {"none", "quantize", "sign", "top_k", "random_k", "powersgd"};
  return names;
}

wire::Compression::Scheme scheme_of_name(std::string_view name) {
  const auto& n = scheme_names();
  const auto it = std::find(n.begin(), n.end(), name);
  return it == n.end() ? Compression::NONE : static_cast<Compression::Scheme>(it - n.begin());
}

std::string check_compression(const wire::Compression& c) {
  if (c.dense_size() > static_cast<int>(kMaxDensePatterns)) {
    return "at most " + std::to_string(kMaxDensePatterns) + " dense patterns, not " + std::to_string(c.dense_size());
  }
  for (const auto& p : c.dense()) {
    if (p.empty() || p.size() > kMaxDensePattern || p.find('\0') != std::string::npos) {
      return "a dense pattern must be 1.." + std::to_string(kMaxDensePattern) + " characters without NUL";
    }
  }
  switch (c.scheme()) {
    case Compression::NONE: return "";
    case Compression::QUANTIZE:
      if (c.bits() != 8 && c.bits() != 4) return "quantize needs bits 8 or 4, not " + std::to_string(c.bits());
      [[fallthrough]];
    case Compression::SIGN:
      if (c.block() < 8 || c.block() > 65536) return "block must be 8..65536 elements, not " + std::to_string(c.block());
      return "";
    case Compression::TOP_K:
    case Compression::RANDOM_K:
      if (!(c.fraction() > 0 && c.fraction() <= 1)) return "fraction must be in (0, 1], not " + std::to_string(c.fraction());
      return "";
    case Compression::POWER_SGD:
      if (c.rank() < 1 || c.rank() > 64) return "rank must be 1..64, not " + std::to_string(c.rank());
      return "";
    default: return "unknown compression scheme " + std::to_string(static_cast<int>(c.scheme()));
  }
}

std::string describe(const wire::Compression& c) {
  std::string s;
  switch (c.scheme()) {
    case Compression::NONE: return "none";
    case Compression::QUANTIZE: s = "quantize-" + std::to_string(c.bits()) + "/" + std::to_string(c.block()); break;
    case Compression::SIGN: s = "sign/" + std::to_string(c.block()); break;
    case Compression::TOP_K: s = "top-k " + percent(c.fraction()); break;
    case Compression::RANDOM_K: s = "random-k " + percent(c.fraction()); break;
    case Compression::POWER_SGD: s = "powersgd-r" + std::to_string(c.rank()); break;
    default: return "unknown";
  }
  return c.error_feedback() ? s + "+ef" : s;
}

nlohmann::json to_json(const wire::Compression& c) {
  if (c.scheme() < 0 || static_cast<std::size_t>(c.scheme()) >= scheme_names().size()) return {{"scheme", "unknown"}};
  nlohmann::json j = {{"scheme", scheme_names()[static_cast<std::size_t>(c.scheme())]}};
  switch (c.scheme()) {
    case Compression::NONE: return j;
    case Compression::QUANTIZE: j["bits"] = c.bits(), j["block"] = c.block(); break;
    case Compression::SIGN: j["block"] = c.block(); break;
    case Compression::TOP_K:
    case Compression::RANDOM_K: j["fraction"] = c.fraction(); break;
    case Compression::POWER_SGD: j["rank"] = c.rank(); break;
    default: break;
  }
  j["error_feedback"] = c.error_feedback();
  if (c.seed()) j["seed"] = c.seed();
  j["dense"] = std::vector<std::string>(c.dense().begin(), c.dense().end());  // [] too: none, not the defaults
  return j;
}

std::size_t kept_count(const wire::Compression& c, std::size_t d) {
  if (d == 0) return 0;
  // Two statements: no fused multiply-add, the same k on every build of silo and server.
  const double p = c.fraction() * static_cast<double>(d);
  const double k = std::ceil(p - 1e-9);
  return std::clamp<std::size_t>(static_cast<std::size_t>(std::max(k, 1.0)), 1, d);
}

const std::vector<std::string>& default_dense_patterns() {
  static const std::vector<std::string> p = {"*running_mean", "*running_var", "*num_batches_tracked", "*moving_mean",
                                             "*moving_variance"};
  return p;
}

std::vector<bool> dense_tensors(const wire::Compression& c, const std::vector<TensorInfo>& layout) {
  std::vector<bool> dense(layout.size(), false);
  if (!compressed(c)) return dense;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    for (const auto& p : c.dense()) {
      if (fnmatch(p.c_str(), layout[i].name.c_str(), 0) == 0) dense[i] = true;
    }
  }
  return dense;
}

std::vector<std::uint64_t> random_k_set(std::uint64_t seed, std::size_t d, std::size_t k) {
  // Stratified: one coordinate drawn in each of k strata of consecutive coordinates, so the set
  // comes out sorted, exactly k, in O(k), and covers the model evenly.
  std::vector<std::uint64_t> out(std::min(k, d));
  if (out.empty()) return out;
  std::uint64_t s = seed;
  Strata strata(d, out.size());
  for (auto& o : out) {
    const auto [b, e] = strata.next();
    o = b + static_cast<std::uint64_t>((static_cast<u128>(splitmix64(s)) * (e - b)) >> 64);
  }
  return out;
}

bool low_rank(const TensorInfo& t, std::uint32_t rank) {
  if (t.shape.size() != 2 || rank == 0) return false;
  const std::uint64_t m = t.shape[0], n = t.shape[1];
  return m > 0 && n > 0 && n <= kMaxChunkCount && 2 * std::uint64_t{rank} * (m + n) <= m * n;
}

std::size_t encoded_bytes(const wire::Compression& c, std::size_t count, std::size_t nonzeros) {
  if (sparse(c)) return 4 + 8 * nonzeros;
  if (!compressed(c) || c.scheme() == Compression::POWER_SGD) return 4 * count;  // POWER_SGD: a dense tensor
  return 4 * blocks(c, count) + code_bytes(c, count);
}

std::string encode_chunk(const wire::Compression& c, std::span<const float> x, std::uint64_t seed,
                         std::span<float> decoded) {
  const std::size_t n = x.size();
  std::string out;
  if (sparse(c)) {  // the nonzero elements; what is not encoded decodes as +0 (a -0.0 would hash apart)
    std::vector<std::uint64_t> set;
    std::vector<float> vals;
    for (std::size_t i = 0; i < n; ++i) {
      decoded[i] = x[i] == 0 ? 0.0f : x[i];
      if (x[i] != 0) set.push_back(i), vals.push_back(x[i]);
    }
    return sparse_chunk(set, vals, 0, set.size(), 0);
  }
  const std::size_t nb = blocks(c, n);
  out.assign(encoded_bytes(c, n), '\0');
  auto* codes = reinterpret_cast<std::uint8_t*>(out.data()) + 4 * nb;
  const auto key = static_cast<std::uint32_t>(seed ^ (seed >> 32));
  const int levels = c.scheme() == Compression::QUANTIZE ? (1 << (c.bits() - 1)) - 1 : 0;
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t first = b * c.block(), len = std::min<std::size_t>(c.block(), n - first);
    const float scale = c.scheme() == Compression::QUANTIZE
                            ? quantize_block(x.data() + first, len, levels, key, first, codes, c.bits() == 4,
                                             decoded.data() + first)
                            : sign_block(x.data() + first, len, first, codes, decoded.data() + first);
    std::memcpy(out.data() + 4 * b, &scale, 4);
  }
  return out;
}

std::string decode_chunk(const wire::Compression& c, std::string_view data, std::span<float> out,
                         std::size_t& nonzeros, const TensorInfo* tensor, std::uint64_t offset) {
  const std::size_t n = out.size();
  nonzeros = 0;
  if (c.scheme() == Compression::POWER_SGD) {
    if (!tensor) return "a PowerSGD chunk needs its tensor";
    if (!low_rank(*tensor, c.rank())) {  // sent as it is
      if (data.size() != 4 * n) {
        return "dense chunk of " + std::to_string(n) + " elements has " + std::to_string(data.size()) + " bytes";
      }
      std::memcpy(out.data(), data.data(), data.size());
      return "";
    }
    const std::uint64_t cols = tensor->shape[1], r = c.rank();
    if (offset % cols || n % cols) return "a PowerSGD chunk must cover whole rows of " + describe(*tensor);
    const std::uint64_t rows = n / cols;
    const std::uint64_t need = 4 * (rows * r + cols * r);
    if (data.size() != need) {
      return "PowerSGD chunk of " + std::to_string(rows) + " rows has " + std::to_string(data.size()) +
             " bytes, not " + std::to_string(need) + " (rank " + std::to_string(r) + ")";
    }
    std::vector<float> f(data.size() / 4);
    std::memcpy(f.data(), data.data(), data.size());
    for (float v : f) {
      if (!std::isfinite(v)) return "a PowerSGD factor is NaN or infinite";
    }
    low_rank_product(f.data(), f.data() + rows * r, rows, cols, r, out.data());
    return "";
  }
  if (sparse(c)) {
    if (data.size() < 4) return "sparse chunk of " + std::to_string(data.size()) + " bytes has no count";
    std::uint32_t m = 0;
    std::memcpy(&m, data.data(), 4);
    if (m > n) return "sparse chunk keeps " + std::to_string(m) + " of its " + std::to_string(n) + " elements";
    if (data.size() != encoded_bytes(c, n, m)) {
      return "sparse chunk of " + std::to_string(m) + " elements has " + std::to_string(data.size()) + " bytes, not " +
             std::to_string(encoded_bytes(c, n, m));
    }
    const char* idx = data.data() + 4;
    const char* val = idx + 4 * std::size_t{m};
    std::int64_t last = -1;
    for (std::size_t j = 0; j < m; ++j) {
      std::uint32_t i = 0;
      std::memcpy(&i, idx + 4 * j, 4);
      if (static_cast<std::int64_t>(i) <= last || i >= n) {
        return "sparse chunk index " + std::to_string(i) + " is out of order or past its " + std::to_string(n) +
               " elements";
      }
      last = i;
      float v = 0;
      std::memcpy(&v, val + 4 * j, 4);
      if (!std::isfinite(v)) return "sparse chunk value at " + std::to_string(i) + " is NaN or infinite";
    }
    std::fill(out.begin(), out.end(), 0.0f);
    for (std::size_t j = 0; j < m; ++j) {
      std::uint32_t i = 0;
      std::memcpy(&i, idx + 4 * j, 4);
      std::memcpy(&out[i], val + 4 * j, 4);
    }
    nonzeros = m;
    return "";
  }
  if (!compressed(c)) return "not a compressed scheme";
  if (data.size() != encoded_bytes(c, n)) {
    return "chunk of " + std::to_string(n) + " elements has " + std::to_string(data.size()) + " bytes, not " +
           std::to_string(encoded_bytes(c, n)) + " (" + describe(c) + ")";
  }
  const std::size_t nb = blocks(c, n);
  std::vector<float> scales(nb);
  std::memcpy(scales.data(), data.data(), 4 * nb);
  // A scale times the largest code must stay finite too.
  const float top = c.scheme() == Compression::QUANTIZE
                        ? std::numeric_limits<float>::max() / static_cast<float>((1 << (c.bits() - 1)) - 1)
                        : std::numeric_limits<float>::max();
  for (std::size_t b = 0; b < nb; ++b) {
    if (!std::isfinite(scales[b]) || scales[b] < 0) return bad_scale(scales[b], b);
    if (scales[b] > top) return "scale of block " + std::to_string(b) + " overflows the largest code";
  }
  const auto* codes = reinterpret_cast<const std::uint8_t*>(data.data()) + 4 * nb;
  const std::size_t bs = c.block();
  if (c.scheme() == Compression::SIGN) {
    if (n % 8 && (codes[n / 8] >> (n % 8)) != 0) return "sign chunk has bits set past its last element";
    for (std::size_t b = 0; b < nb; ++b) {
      const float s = scales[b];
      std::size_t i = b * bs;
      const std::size_t e = std::min(n, i + bs);
      for (; i < e && i % 8; ++i) out[i] = (codes[i / 8] >> (i % 8)) & 1 ? s : -s;
      for (; i + 8 <= e; i += 8) {  // a whole byte: eight products, which vectorize
        const auto& signs = kByteSigns[codes[i / 8]];
        for (unsigned k = 0; k < 8; ++k) out[i + k] = signs[k] * s;
      }
      for (; i < e; ++i) out[i] = (codes[i / 8] >> (i % 8)) & 1 ? s : -s;
    }
    return "";
  }
  bool bad = false;
  if (c.bits() == 8) {
    const auto* q = reinterpret_cast<const std::int8_t*>(codes);
    for (std::size_t b = 0; b < nb; ++b) {
      const float s = scales[b];
      const std::size_t e = std::min(n, (b + 1) * bs);
      for (std::size_t i = b * bs; i < e; ++i) {
        bad |= q[i] == -128;
        out[i] = static_cast<float>(q[i]) * s;
      }
    }
    if (bad) return "8-bit code -128 is outside [-127, 127]";
  } else {
    if (n % 2 && (codes[n / 2] >> 4) != 0) return "4-bit chunk has a code past its last element";
    for (std::size_t b = 0; b < nb; ++b) {
      const float s = scales[b];
      std::size_t i = b * bs;
      const std::size_t e = std::min(n, i + bs);
      auto one = [&](std::size_t k) {
        const int nib = (codes[k / 2] >> (4 * (k % 2))) & 0x0f;
        bad |= nib == 15;
        out[k] = static_cast<float>(nib - 7) * s;
      };
      if (i % 2) one(i++);
      for (; i + 2 <= e; i += 2) {  // a whole byte
        const int lo = codes[i / 2] & 0x0f, hi = codes[i / 2] >> 4;
        bad |= (lo == 15) | (hi == 15);
        out[i] = static_cast<float>(lo - 7) * s;
        out[i + 1] = static_cast<float>(hi - 7) * s;
      }
      if (i < e) one(i);
    }
    if (bad) return "4-bit code 15 is outside [0, 14]";
  }
  return "";
}

namespace {

// With error feedback, residual += update (what this round would send uncompressed); returns
// the values to compress (the residual's span then, else the update's).
std::span<float> with_residual(std::span<float> update, std::span<float> residual) {
  if (residual.empty()) return update;
  for (std::size_t i = 0; i < update.size(); ++i) residual[i] += update[i];
  return residual;
}

// The coordinates a sparsifier chooses among: those of the tensors that do not travel dense, as
// sorted, disjoint [begin, end) ranges of the whole vector (adjacent tensors merged).
using Ranges = std::vector<std::pair<std::uint64_t, std::uint64_t>>;

Ranges compressible_ranges(const std::vector<TensorInfo>& layout, const std::vector<bool>& dense) {
  Ranges r;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const auto& t = layout[i];
    if (dense[i] || t.size() == 0) continue;
    if (!r.empty() && r.back().second == t.offset) {
      r.back().second += t.size();
    } else {
      r.emplace_back(t.offset, t.offset + t.size());
    }
  }
  return r;
}

std::size_t length(const Ranges& parts) {
  std::size_t n = 0;
  for (const auto& [b, e] : parts) n += e - b;
  return n;
}

// `set`, sorted coordinates of the concatenation of `parts`, as coordinates of the whole vector.
std::vector<std::uint64_t> to_flat(std::vector<std::uint64_t> set, const Ranges& parts) {
  std::size_t j = 0, base = 0;
  for (const auto& [b, e] : parts) {
    for (; j < set.size() && set[j] < base + (e - b); ++j) set[j] = b + (set[j] - base);
    base += e - b;
  }
  return set;
}

// The k coordinates of v within `parts` largest in magnitude (ties: the earliest), sorted.
std::vector<std::uint64_t> top_k_set(std::span<const float> v, std::size_t k, const Ranges& parts) {
  std::vector<std::uint64_t> set;
  if (k == 0) return set;
  std::vector<float> mag;
  mag.reserve(length(parts));
  for (const auto& [b, e] : parts) {
    for (std::size_t i = b; i < e; ++i) mag.push_back(std::fabs(v[i]));
  }
  std::nth_element(mag.begin(), mag.begin() + static_cast<std::ptrdiff_t>(k - 1), mag.end(), std::greater<float>());
  const float thr = mag[k - 1];
  std::size_t above = 0;
  for (float x : mag) above += x > thr;
  std::size_t ties = k - std::min(k, above);
  set.reserve(k);
  for (const auto& [b, e] : parts) {
    for (std::size_t i = b; i < e; ++i) {
      const float a = std::fabs(v[i]);
      if (a > thr || (a == thr && ties > 0 && ties--)) set.push_back(i);
    }
  }
  return set;
}

// Keeps `set` (sorted, within `parts`) of v: `update` becomes zero in `parts` but there, where it
// holds v (scaled when `strata_of` is not 0, for random-k without error feedback: the j-th kept
// coordinate stands for the j-th of `set.size()` strata of `strata_of` coordinates); outside
// `parts` it is left as it is. With error feedback `residual` (which is v) loses what is sent.
// Returns the values sent. `v` may be `update` itself: each value is read before it is written.
// Every coordinate of `set` lies in `parts`.
std::vector<float> keep(std::span<const float> v, const std::vector<std::uint64_t>& set, const Ranges& parts,
                        std::span<float> update, std::span<float> residual, std::size_t strata_of = 0) {
  const std::size_t k = set.size();
  const bool scaled = strata_of != 0;
  std::vector<float> vals(k);
  Strata strata(std::max<std::size_t>(strata_of, 1), std::max<std::size_t>(k, 1));
  // One pass, a block at a time: the block's kept values gathered, the block zeroed (one memset,
  // not one per gap) and the values put back while it is in the L1 cache.
  constexpr std::size_t kBlock = 4096;
  std::size_t j = 0;
  for (const auto& [begin, end] : parts) {
    for (std::size_t b = begin; b < end; b += kBlock) {
      const std::size_t e = std::min(end, b + kBlock), first = j;
      for (; j < k && set[j] < e; ++j) {
        const std::size_t i = set[j];
        float val = v[i];
        if (scaled) {
          const auto [sb, se] = strata.next();
          val *= static_cast<float>(se - sb);
        }
        vals[j] = val;
        if (!residual.empty()) residual[i] -= val;
      }
      std::fill(update.begin() + static_cast<std::ptrdiff_t>(b), update.begin() + static_cast<std::ptrdiff_t>(e), 0.0f);
      for (std::size_t q = first; q < j; ++q) update[set[q]] = vals[q];
    }
  }
  return vals;
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


// POWER_SGD (Vogels et al., NeurIPS 2019), one power iteration from a random start: P = M Q0,
// P orthonormalized, Q = M^T P; M ~ P Q^T. Appends the tensor's chunks of whole rows (`rows`
// at a time) and writes the decoded values into `dec`.
void encode_low_rank(const wire::Compression& c, const TensorInfo& t, std::span<const float> v, std::span<float> dec,
                     std::size_t chunk_elems, std::uint64_t seed, EncodedUpdate& out) {
  using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const auto m = static_cast<Eigen::Index>(t.shape[0]), n = static_cast<Eigen::Index>(t.shape[1]);
  const auto r = static_cast<Eigen::Index>(c.rank());
  const Eigen::Map<const RowMajor> mat(v.data(), m, n);
  RowMajor q0(n, r);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g;
  for (Eigen::Index i = 0; i < q0.size(); ++i) q0.data()[i] = g(rng);
  RowMajor p = mat * q0;
  // Gram-Schmidt on the columns of P. A column with (almost) nothing left beside the others is
  // rounding noise, not a direction of M: it becomes zero.
  for (Eigen::Index k = 0; k < r; ++k) {
    const float before = p.col(k).norm();
    for (Eigen::Index l = 0; l < k; ++l) p.col(k) -= p.col(l).dot(p.col(k)) * p.col(l);
    const float norm = p.col(k).norm();
    if (std::isfinite(norm) && norm > 1e-4f * before && norm > 1e-30f) p.col(k) /= norm;
    else p.col(k).setZero();
  }
  const RowMajor q = mat.transpose() * p;
  const std::size_t cols = t.shape[1], rows_per = std::max<std::size_t>(1, chunk_elems / cols);
  for (std::size_t row = 0; row < t.shape[0]; row += rows_per) {
    const std::size_t rows = std::min(rows_per, t.shape[0] - row);
    auto ch = chunk_of(c, t, row * cols, rows * cols);
    std::string data(4 * (rows + cols) * c.rank(), '\0');
    std::memcpy(data.data(), p.data() + row * c.rank(), 4 * rows * c.rank());
    std::memcpy(data.data() + 4 * rows * c.rank(), q.data(), 4 * cols * c.rank());
    low_rank_product(p.data() + row * c.rank(), q.data(), rows, cols, c.rank(), dec.data() + row * cols);
    out.bytes += data.size();
    ch.set_data(std::move(data));
    out.chunks.push_back(std::move(ch));
  }
}

}  // namespace

std::size_t compressible(const std::vector<TensorInfo>& layout, const std::vector<bool>& dense) {
  return length(compressible_ranges(layout, dense));
}

EncodedUpdate compress_update(const wire::Compression& c, std::span<float> update, std::span<float> residual,
                              const std::vector<TensorInfo>& layout, std::size_t chunk_elems, std::uint64_t seed) {
  if (!c.error_feedback()) residual = {};
  if (c.scheme() == Compression::POWER_SGD) seed = c.seed();  // the round's start, shared by the silos
  const auto dense = dense_tensors(c, layout);
  std::span<float> v = with_residual(update, residual);
  std::vector<float> scratch;
  std::vector<std::uint64_t> set;
  std::vector<float> vals;
  if (sparse(c)) {  // the dense tensors are left alone in v (and in the update)
    const auto parts = compressible_ranges(layout, dense);
    const std::size_t d = length(parts), k = kept_count(c, d);
    set = c.scheme() == Compression::TOP_K ? top_k_set(v, k, parts) : to_flat(random_k_set(seed, d, k), parts);
    const bool scaled = c.scheme() == Compression::RANDOM_K && !c.error_feedback();
    vals = keep(v, set, parts, update, residual, scaled ? d : 0);
  } else if (v.data() == update.data()) {
    scratch.assign(update.begin(), update.end());  // the codec reads v and writes the update apart
    v = scratch;
  }
  EncodedUpdate out;
  // A sparse chunk carries an index and a value per kept element: half the span keeps it within
  // chunk_bytes. No chunk stands for more than the receivers take.
  if (sparse(c)) chunk_elems /= 2;
  chunk_elems = std::clamp<std::size_t>(chunk_elems, 1, kMaxChunkCount);
  std::uint64_t chunk_seed = seed;
  std::size_t next = 0;  // sparse: the first kept coordinate not yet in a chunk
  for (std::size_t ti = 0; ti < layout.size(); ++ti) {
    const auto& t = layout[ti];
    if (dense[ti]) {  // float32 as it is (the update holds v there), no residual left
      auto dec = update.subspan(t.offset, t.size());
      const auto src = v.subspan(t.offset, t.size());
      if (src.data() != dec.data()) std::copy(src.begin(), src.end(), dec.begin());
      // Sparse schemes are done with the residual; the others take the update out of it below.
      if (sparse(c) && !residual.empty()) std::fill(src.begin(), src.end(), 0.0f);
      for (std::size_t off = 0; off < t.size(); off += chunk_elems) {
        const std::size_t n = std::min(chunk_elems, t.size() - off);
        auto ch = chunk_of(c, t, off, n);
        ch.set_encoding(Compression::NONE);
        ch.clear_count();
        ch.set_data(std::string(reinterpret_cast<const char*>(dec.data() + off), 4 * n));
        out.bytes += ch.data().size();
        out.chunks.push_back(std::move(ch));
      }
      continue;
    }
    if (c.scheme() == Compression::POWER_SGD && low_rank(t, c.rank())) {
      encode_low_rank(c, t, v.subspan(t.offset, t.size()), update.subspan(t.offset, t.size()), chunk_elems,
                      splitmix64(chunk_seed), out);
      continue;
    }
    for (std::size_t off = 0; off < t.size(); off += chunk_elems) {
      const std::size_t n = std::min(chunk_elems, t.size() - off);
      const std::size_t at = t.offset + off;
      auto ch = chunk_of(c, t, off, n);
      if (c.scheme() == Compression::POWER_SGD) {  // a tensor PowerSGD leaves dense
        ch.set_data(std::string(reinterpret_cast<const char*>(v.data() + at), 4 * n));
        std::copy(v.begin() + static_cast<std::ptrdiff_t>(at), v.begin() + static_cast<std::ptrdiff_t>(at + n),
                  update.begin() + static_cast<std::ptrdiff_t>(at));
      } else if (sparse(c)) {
        std::size_t last = next;
        while (last < set.size() && set[last] < at + n) ++last;
        ch.set_data(sparse_chunk(set, vals, next, last, at));
        next = last;
      } else {
        ch.set_data(encode_chunk(c, v.subspan(at, n), splitmix64(chunk_seed), update.subspan(at, n)));
      }
      out.bytes += ch.data().size();
      out.chunks.push_back(std::move(ch));
    }
  }
  // What was left out stays for next round (sparse schemes took out what they sent already).
  if (!sparse(c)) {
    for (std::size_t i = 0; i < residual.size(); ++i) residual[i] -= update[i];
  }
  return out;
}

std::string check_broadcast(const wire::Compression& c) {
  if (c.scheme() != Compression::QUANTIZE) {
    return "a model broadcast is sent as a quantized delta (scheme quantize), not " + describe(c);
  }
  if (c.error_feedback()) return "a broadcast has no error feedback: the model the silos receive is the model";
  return check_compression(c);
}

EncodedUpdate encode_model_delta(const wire::Compression& c, std::span<const float> base, std::span<float> model,
                                 const std::vector<TensorInfo>& layout, std::size_t chunk_elems, std::uint64_t seed) {
  const auto dense = dense_tensors(c, layout);
  chunk_elems = std::clamp<std::size_t>(chunk_elems, 1, kMaxChunkCount);
  std::vector<float> delta(std::min(chunk_elems, model.size())), decoded(delta.size());
  EncodedUpdate out;
  std::uint64_t chunk_seed = seed;
  for (std::size_t ti = 0; ti < layout.size(); ++ti) {
    const auto& t = layout[ti];
    for (std::size_t off = 0; off < t.size(); off += chunk_elems) {
      const std::size_t n = std::min(chunk_elems, t.size() - off);
      float* m = model.data() + t.offset + off;
      auto ch = chunk_of(c, t, off, n);
      const float* b = base.data() + t.offset + off;
      bool values = dense[ti];
      if (!values) {
        for (std::size_t i = 0; i < n; ++i) delta[i] = m[i] - b[i];
        values = !max_abs(delta.data(), n).second;  // a step past float's range has no codes
      }
      if (values) {  // the new values themselves
        ch.set_encoding(Compression::NONE);
        ch.clear_count();
        ch.set_data(std::string(reinterpret_cast<const char*>(m), 4 * n));
      } else {
        ch.set_data(encode_chunk(c, {delta.data(), n}, splitmix64(chunk_seed), {decoded.data(), n}));
        // What every receiver computes from its copy of the base: the same bits (no fused
        // multiply-add anywhere in this sum, see cmake/XsiloTarget.cmake).
        for (std::size_t i = 0; i < n; ++i) m[i] = b[i] + decoded[i];
      }
      out.bytes += ch.data().size();
      out.chunks.push_back(std::move(ch));
    }
  }
  return out;
}

std::optional<EncodedUpdate> encode_same_model(const wire::Compression& c, std::span<const float> model,
                                               const std::vector<TensorInfo>& layout, std::size_t chunk_elems,
                                               std::uint64_t seed) {
  // The same chunks, seeds and checks as a delta: a step of zeros from the model to itself,
  // then what a receiver rebuilds compared with the model, bit for bit.
  std::vector<float> copy(model.begin(), model.end());
  auto out = encode_model_delta(c, model, copy, layout, chunk_elems, seed);
  if (!std::equal(copy.begin(), copy.end(), model.begin(), [](float a, float b) {
        return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
      })) {
    return std::nullopt;
  }
  return out;
}

std::vector<std::uint64_t> shared_kept_set(const wire::Compression& c, const std::vector<TensorInfo>& layout) {
  const auto dense = dense_tensors(c, layout);
  const auto parts = compressible_ranges(layout, dense);
  // Drawn among the compressible coordinates, counted without the dense tensors' in between.
  const std::size_t d = length(parts);
  const auto drawn = to_flat(random_k_set(c.seed(), d, kept_count(c, d)), parts);
  // Every coordinate of the dense tensors joins it, in order.
  std::vector<std::uint64_t> set;
  set.reserve(drawn.size() + elements(layout) - d);
  auto next = drawn.begin();
  for (std::size_t i = 0; i < layout.size(); ++i) {
    if (!dense[i]) continue;
    const auto& t = layout[i];
    for (; next != drawn.end() && *next < t.offset; ++next) set.push_back(*next);
    for (std::uint64_t x = t.offset; x < t.offset + t.size(); ++x) set.push_back(x);
  }
  set.insert(set.end(), next, drawn.end());
  return set;
}

std::vector<std::uint64_t> keep_shared_random_k(const wire::Compression& c, std::span<float> update,
                                                std::span<float> residual, const std::vector<TensorInfo>& layout) {
  if (!c.error_feedback()) residual = {};
  const std::span<float> v = with_residual(update, residual);
  auto set = shared_kept_set(c, layout);
  // Never scaled: the fixed-point codec clips each update, so secure random-k needs error feedback.
  keep(v, set, {{0, update.size()}}, update, residual);
  return set;
}

}  // namespace xsilo::protocol
