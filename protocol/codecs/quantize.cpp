// QUANTIZE: per block one float32 scale (the block's largest |x| over the levels), then a code
// per element, rounded without bias: int8 in [-127, 127] for 8 bits, or two 4-bit codes per byte
// (low nibble first) holding q + 7 for q in [-7, 7]. The value is q * scale.
#include <algorithm>
#include <limits>

#ifdef __SSE4_1__
#include <smmintrin.h>
#endif

#include "protocol/codecs/detail.h"

namespace xsilo::protocol::detail {

namespace {

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

int levels(const wire::Compression& c) { return (1 << (c.bits() - 1)) - 1; }

class Quantize final : public BlockCodec {
 public:
  std::string_view name() const override { return "quantize"; }
  Status check(const wire::Compression& c) const override {
    if (c.bits() != 8 && c.bits() != 4) return Error("quantize needs bits 8 or 4, not " + std::to_string(c.bits()));
    if (c.block() < 8 || c.block() > 65536) {
      return Error("block must be 8..65536 elements, not " + std::to_string(c.block()));
    }
    return {};
  }
  std::vector<std::string> keys() const override { return {"bits", "block"}; }
  void configure(const ConfigNode& cn, wire::Compression& c) const override {
    c.set_bits(static_cast<std::uint32_t>(cn.integer("bits", 8, 4, 8)));
    if (c.bits() != 8 && c.bits() != 4) cn.fail("bits", "must be 8 or 4");
    c.set_block(static_cast<std::uint32_t>(cn.integer("block", 256, 8, 65536)));
  }
  Status secure(const wire::Compression& /*c*/) const override {
    return Error("quantized codes with per-silo scales do not add up");
  }
  std::string describe(const wire::Compression& c) const override {
    return "quantize-" + std::to_string(c.bits()) + "/" + std::to_string(c.block());
  }
  void parameters(const wire::Compression& c, nlohmann::json& j) const override {
    j["bits"] = c.bits();
    j["block"] = c.block();
  }

 protected:
  std::size_t code_bytes(const wire::Compression& c, std::size_t count) const override {
    return c.bits() == 8 ? count : (count + 1) / 2;
  }
  float largest_scale(const wire::Compression& c) const override {
    return std::numeric_limits<float>::max() / static_cast<float>(levels(c));
  }
  float encode_block(const wire::Compression& c, const float* x, std::size_t n, std::uint32_t key, std::size_t first,
                     std::uint8_t* codes, float* dec) const override;
  Status decode_codes(const wire::Compression& c, const std::uint8_t* codes, const std::vector<float>& scales,
                           std::span<float> out) const override;
};

// One block: codes into `codes` (int8, or packed nibbles, from element `first` of the chunk),
// decoded values into `dec`.
float Quantize::encode_block(const wire::Compression& c, const float* __restrict x, std::size_t n, std::uint32_t key,
                             std::size_t first, std::uint8_t* __restrict codes, float* __restrict dec) const {
  const bool nibbles = c.bits() == 4;
  const auto [m, finite] = max_abs(x, n);
  const float lv = static_cast<float>(levels(c));
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

Status Quantize::decode_codes(const wire::Compression& c, const std::uint8_t* codes, const std::vector<float>& scales,
                              std::span<float> out) const {
  const std::size_t n = out.size(), nb = scales.size(), bs = c.block();
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
    if (bad) return Error("8-bit code -128 is outside [-127, 127]");
    return {};
  }
  if (n % 2 && (codes[n / 2] >> 4) != 0) return Error("4-bit chunk has a code past its last element");
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
  if (bad) return Error("4-bit code 15 is outside [0, 14]");
  return {};
}

}  // namespace

const Codec& quantize_codec() {
  static const Quantize codec;
  return codec;
}

}  // namespace xsilo::protocol::detail
