// SIGN: per block one float32 scale (the block's mean |x|), then a bit per element (1: +scale,
// 0: -scale), least significant first, the unused bits of the last byte zero.
#include <array>
#include <limits>

#ifdef __SSE4_1__
#include <smmintrin.h>
#endif

#include "protocol/codecs/detail.h"

namespace xsilo::protocol::detail {

namespace {

// The signs a byte of codes stands for: bit k set is +1 for its element k, clear is -1.
// ±1 * s is exactly ±s.
constexpr auto kByteSigns = [] {
  std::array<std::array<float, 8>, 256> t{};
  for (unsigned b = 0; b < 256; ++b) {
    for (unsigned k = 0; k < 8; ++k) t[b][k] = (b >> k) & 1 ? 1.0f : -1.0f;
  }
  return t;
}();

class Sign final : public BlockCodec {
 public:
  std::string_view name() const override { return "sign"; }
  Status check(const wire::Compression& c) const override {
    if (c.block() < 8 || c.block() > 65536) {
      return Error("block must be 8..65536 elements, not " + std::to_string(c.block()));
    }
    return {};
  }
  std::vector<std::string> keys() const override { return {"block"}; }
  void configure(const ConfigNode& cn, wire::Compression& c) const override {
    c.set_block(static_cast<std::uint32_t>(cn.integer("block", 256, 8, 65536)));
  }
  Status secure(const wire::Compression& /*c*/) const override {
    return Error("signs with per-silo scales do not add up");
  }
  std::string describe(const wire::Compression& c) const override { return "sign/" + std::to_string(c.block()); }
  void parameters(const wire::Compression& c, nlohmann::json& j) const override { j["block"] = c.block(); }

 protected:
  std::size_t code_bytes(const wire::Compression& /*c*/, std::size_t count) const override { return (count + 7) / 8; }
  float largest_scale(const wire::Compression& /*c*/) const override { return std::numeric_limits<float>::max(); }
  float encode_block(const wire::Compression& c, const float* x, std::size_t n, std::uint32_t key, std::size_t first,
                     std::uint8_t* codes, float* dec) const override;
  Status decode_codes(const wire::Compression& c, const std::uint8_t* codes, const std::vector<float>& scales,
                           std::span<float> out) const override;
};

float Sign::encode_block(const wire::Compression& /*c*/, const float* __restrict x, std::size_t n,
                         std::uint32_t /*key*/, std::size_t first, std::uint8_t* __restrict bits,
                         float* __restrict dec) const {
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

Status Sign::decode_codes(const wire::Compression& c, const std::uint8_t* codes, const std::vector<float>& scales,
                          std::span<float> out) const {
  const std::size_t n = out.size(), bs = c.block();
  if (n % 8 && (codes[n / 8] >> (n % 8)) != 0) return Error("sign chunk has bits set past its last element");
  for (std::size_t b = 0; b < scales.size(); ++b) {
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
  return {};
}

}  // namespace

const Codec& sign_codec() {
  static const Sign codec;
  return codec;
}

}  // namespace xsilo::protocol::detail
