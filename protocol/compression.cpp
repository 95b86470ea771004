#include "protocol/compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

namespace xsilo::protocol {

namespace {

using wire::Compression;

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

// QUANTIZE one block: codes into `codes` (int8 or packed nibbles from element `first` of the
// chunk), decoded values into `dec`.
float quantize_block(std::span<const float> x, int levels, std::uint32_t key, std::size_t first, std::uint8_t* codes,
                     bool nibbles, float* dec) {
  float m = 0, probe = 0;
  for (float v : x) {
    m = std::max(m, std::fabs(v));
    probe += v * 0.0f;  // NaN when any element is NaN or infinite
  }
  const std::size_t n = x.size();
  if (!std::isfinite(probe) || !std::isfinite(m) || m == 0) {
    const float scale = (std::isfinite(probe) && std::isfinite(m)) ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    for (std::size_t i = 0; i < n; ++i) dec[i] = 0;
    if (!nibbles) {
      std::memset(codes + first, 0, n);
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t j = first + i;
        codes[j / 2] = static_cast<std::uint8_t>((j % 2) ? ((codes[j / 2] & 0x0f) | (7 << 4)) : 7);
      }
    }
    return scale;
  }
  const float scale = m / static_cast<float>(levels);
  const float inv = static_cast<float>(levels) / m;
  const float lv = static_cast<float>(levels);
  std::int8_t q8[256];
  for (std::size_t s = 0; s < n; s += 256) {
    const std::size_t e = std::min(n, s + 256);
    for (std::size_t i = s; i < e; ++i) {
      const float u = static_cast<float>(mix32(key + static_cast<std::uint32_t>(first + i)) >> 8) * 0x1p-24f;
      const float q = std::clamp(std::floor(x[i] * inv + u), -lv, lv);
      q8[i - s] = static_cast<std::int8_t>(q);
      dec[i] = q * scale;
    }
    if (!nibbles) {
      std::memcpy(codes + first + s, q8, e - s);
    } else {
      for (std::size_t i = s; i < e; ++i) {
        const std::size_t j = first + i;
        const auto nib = static_cast<std::uint8_t>(q8[i - s] + 7);
        codes[j / 2] = static_cast<std::uint8_t>((j % 2) ? ((codes[j / 2] & 0x0f) | (nib << 4)) : nib);
      }
    }
  }
  return scale;
}

float sign_block(std::span<const float> x, std::size_t first, std::uint8_t* bits, float* dec) {
  float sum = 0;
  for (float v : x) sum += std::fabs(v);
  const float scale = sum / static_cast<float>(x.size());  // NaN or Inf for a non-finite input
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t j = first + i;
    const bool pos = !(x[i] < 0);
    if (pos) bits[j / 8] = static_cast<std::uint8_t>(bits[j / 8] | (1u << (j % 8)));
    dec[i] = pos ? scale : -scale;
  }
  return scale;
}

std::string bad_scale(float s, std::size_t b) {
  return "scale of block " + std::to_string(b) + " is " + (std::isnan(s) ? "NaN" : std::isinf(s) ? "infinite" : "negative");
}

}  // namespace

bool compressed(const wire::Compression& c) { return c.scheme() != Compression::NONE; }

std::string check_compression(const wire::Compression& c) {
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
    default: return "unknown compression scheme " + std::to_string(static_cast<int>(c.scheme()));
  }
}

std::string describe(const wire::Compression& c) {
  std::string s;
  switch (c.scheme()) {
    case Compression::NONE: return "none";
    case Compression::QUANTIZE: s = "quantize-" + std::to_string(c.bits()) + "/" + std::to_string(c.block()); break;
    case Compression::SIGN: s = "sign/" + std::to_string(c.block()); break;
    case Compression::TOP_K: s = "top-k " + std::to_string(c.fraction() * 100) + "%"; break;
    case Compression::RANDOM_K: s = "random-k " + std::to_string(c.fraction() * 100) + "%"; break;
    default: return "unknown";
  }
  if (sparse(c)) {  // trim trailing zeros of the percentage
    auto pct = s.find('%');
    auto dot = s.rfind('.', pct);
    auto end = pct;
    while (end > dot + 1 && s[end - 1] == '0') --end;
    if (end == dot + 1) --end;
    s.erase(end, pct - end);
  }
  return c.error_feedback() ? s + "+ef" : s;
}

nlohmann::json to_json(const wire::Compression& c) {
  nlohmann::json j;
  switch (c.scheme()) {
    case Compression::NONE: return {{"scheme", "none"}};
    case Compression::QUANTIZE: j = {{"scheme", "quantize"}, {"bits", c.bits()}, {"block", c.block()}}; break;
    case Compression::SIGN: j = {{"scheme", "sign"}, {"block", c.block()}}; break;
    case Compression::TOP_K: j = {{"scheme", "top_k"}, {"fraction", c.fraction()}}; break;
    case Compression::RANDOM_K: j = {{"scheme", "random_k"}, {"fraction", c.fraction()}}; break;
    default: return {{"scheme", "unknown"}};
  }
  j["error_feedback"] = c.error_feedback();
  if (c.seed()) j["seed"] = c.seed();
  return j;
}

std::size_t kept_count(const wire::Compression& c, std::size_t d) {
  if (d == 0) return 0;
  const double k = std::ceil(c.fraction() * static_cast<double>(d) - 1e-9);
  return std::clamp<std::size_t>(static_cast<std::size_t>(std::max(k, 1.0)), 1, d);
}

std::vector<std::uint32_t> random_k_set(std::uint64_t seed, std::size_t d, std::size_t k) {
  // Selection sampling (Knuth's algorithm S): one pass, sorted, exactly k.
  std::vector<std::uint32_t> out;
  out.reserve(k);
  std::uint64_t s = seed;
  for (std::size_t i = 0; i < d && out.size() < k; ++i) {
    const double u = static_cast<double>(splitmix64(s) >> 11) * 0x1p-53;
    if (u * static_cast<double>(d - i) < static_cast<double>(k - out.size())) out.push_back(static_cast<std::uint32_t>(i));
  }
  return out;
}

std::size_t encoded_bytes(const wire::Compression& c, std::size_t count, std::size_t nonzeros) {
  if (sparse(c)) return 4 + 8 * nonzeros;
  if (!compressed(c)) return 4 * count;
  return 4 * blocks(c, count) + code_bytes(c, count);
}

std::string encode_chunk(const wire::Compression& c, std::span<const float> x, std::uint64_t seed,
                         std::span<float> decoded) {
  const std::size_t n = x.size();
  std::string out;
  if (sparse(c)) {
    std::size_t m = 0;
    for (float v : x) m += v != 0;
    out.assign(encoded_bytes(c, n, m), '\0');
    put_u32(out, 0, static_cast<std::uint32_t>(m));
    std::size_t j = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (x[i] == 0) continue;
      put_u32(out, 4 + 4 * j, static_cast<std::uint32_t>(i));
      std::memcpy(out.data() + 4 + 4 * m + 4 * j, &x[i], 4);
      ++j;
    }
    if (decoded.data() != x.data()) std::copy(x.begin(), x.end(), decoded.begin());
    return out;
  }
  const std::size_t nb = blocks(c, n);
  out.assign(encoded_bytes(c, n), '\0');
  auto* codes = reinterpret_cast<std::uint8_t*>(out.data()) + 4 * nb;
  const auto key = static_cast<std::uint32_t>(seed ^ (seed >> 32));
  const int levels = (1 << (c.bits() - 1)) - 1;
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t first = b * c.block(), len = std::min<std::size_t>(c.block(), n - first);
    const auto xs = x.subspan(first, len);
    const float scale = c.scheme() == Compression::QUANTIZE
                            ? quantize_block(xs, levels, key, first, codes, c.bits() == 4, decoded.data() + first)
                            : sign_block(xs, first, codes, decoded.data() + first);
    std::memcpy(out.data() + 4 * b, &scale, 4);
  }
  return out;
}

std::string decode_chunk(const wire::Compression& c, std::string_view data, std::span<float> out,
                         std::size_t& nonzeros) {
  const std::size_t n = out.size();
  nonzeros = 0;
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
  for (std::size_t b = 0; b < nb; ++b) {
    if (!std::isfinite(scales[b]) || scales[b] < 0) return bad_scale(scales[b], b);
  }
  const auto* codes = reinterpret_cast<const std::uint8_t*>(data.data()) + 4 * nb;
  const std::size_t bs = c.block();
  if (c.scheme() == Compression::SIGN) {
    if (n % 8 && (codes[n / 8] >> (n % 8)) != 0) return "sign chunk has bits set past its last element";
    for (std::size_t i = 0; i < n; ++i) {
      const float s = scales[i / bs];
      out[i] = (codes[i / 8] >> (i % 8)) & 1 ? s : -s;
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
    for (std::size_t i = 0; i < n; ++i) {
      const int nib = (codes[i / 2] >> (4 * (i % 2))) & 0x0f;
      bad |= nib == 15;
      out[i] = static_cast<float>(nib - 7) * scales[i / bs];
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

// Zeroes every element of `v` outside its `k` largest in magnitude (ties: the earliest).
void keep_top_k(std::span<float> v, std::size_t k) {
  if (k >= v.size()) return;
  std::vector<float> mag(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) mag[i] = std::fabs(v[i]);
  std::nth_element(mag.begin(), mag.begin() + static_cast<std::ptrdiff_t>(k - 1), mag.end(), std::greater<float>());
  const float thr = mag[k - 1];
  std::size_t above = 0;
  for (float x : v) above += std::fabs(x) > thr;
  std::size_t ties = k - above;
  for (auto& x : v) {
    const float a = std::fabs(x);
    if (a > thr) continue;
    if (a == thr && ties > 0) {
      --ties;
      continue;
    }
    x = 0;
  }
}

// Keeps `set` of `v` (scaled by `scale`), zeroes the rest.
void keep_set(std::span<float> v, const std::vector<std::uint32_t>& set, float scale) {
  std::size_t j = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (j < set.size() && set[j] == i) {
      v[i] *= scale;
      ++j;
    } else {
      v[i] = 0;
    }
  }
}

// Unbiased random-k without error feedback scales what it keeps by d / k.
float random_k_scale(const wire::Compression& c, std::size_t d, std::size_t k) {
  return c.error_feedback() ? 1.0f : static_cast<float>(static_cast<double>(d) / static_cast<double>(k));
}

}  // namespace

EncodedUpdate compress_update(const wire::Compression& c, std::span<float> update, std::span<float> residual,
                              const std::vector<TensorInfo>& layout, std::size_t chunk_elems, std::uint64_t seed) {
  if (!c.error_feedback()) residual = {};
  const std::span<float> v = with_residual(update, residual);
  const std::size_t d = update.size();
  if (sparse(c) && v.data() != update.data()) std::copy(v.begin(), v.end(), update.begin());
  if (c.scheme() == Compression::TOP_K) {
    keep_top_k(update, kept_count(c, d));
  } else if (c.scheme() == Compression::RANDOM_K) {
    const auto k = kept_count(c, d);
    keep_set(update, random_k_set(seed, d, k), random_k_scale(c, d, k));
  }
  EncodedUpdate out;
  chunk_elems = std::max<std::size_t>(chunk_elems, 1);
  std::uint64_t chunk_seed = seed;
  for (const auto& t : layout) {
    for (std::size_t off = 0; off < t.size(); off += chunk_elems) {
      const std::size_t n = std::min(chunk_elems, t.size() - off);
      const std::size_t at = t.offset + off;
      wire::TensorChunk ch;
      ch.set_name(t.name);
      ch.set_dtype(wire::F32);
      for (auto s : t.shape) ch.add_shape(s);
      ch.set_offset(off);
      ch.set_encoding(c.scheme());
      ch.set_count(n);
      // Sparse schemes encode the update already sparsified; the others encode v.
      const auto src = sparse(c) ? update.subspan(at, n) : v.subspan(at, n);
      ch.set_data(encode_chunk(c, src, splitmix64(chunk_seed), update.subspan(at, n)));
      out.bytes += ch.data().size();
      out.chunks.push_back(std::move(ch));
    }
  }
  // What was left out stays for next round.
  for (std::size_t i = 0; i < residual.size(); ++i) residual[i] -= update[i];
  return out;
}

std::vector<std::uint32_t> keep_shared_random_k(const wire::Compression& c, std::span<float> update,
                                                std::span<float> residual) {
  if (!c.error_feedback()) residual = {};
  const std::span<float> v = with_residual(update, residual);
  if (v.data() != update.data()) std::copy(v.begin(), v.end(), update.begin());
  const std::size_t d = update.size(), k = kept_count(c, d);
  auto set = random_k_set(c.seed(), d, k);
  keep_set(update, set, random_k_scale(c, d, k));
  for (std::size_t i = 0; i < residual.size(); ++i) residual[i] -= update[i];
  return set;
}

}  // namespace xsilo::protocol
