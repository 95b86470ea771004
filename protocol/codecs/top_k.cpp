// TOP_K: the k coordinates of the update (with error feedback, of the update plus what was left
// out before) largest in magnitude, k = ceil(fraction x the compressible coordinates); index +
// value chunks (detail::SparseCodec).
#include <algorithm>
#include <functional>

#include "protocol/codecs/detail.h"

namespace xsilo::protocol::detail {

namespace {

class TopK final : public SparseCodec {
 public:
  std::string_view name() const override { return "top_k"; }
  Status secure(const wire::Compression& /*c*/) const override {
    return Error("each silo's top-k picks its own coordinates");
  }
  std::string describe(const wire::Compression& c) const override { return "top-k " + percent(c.fraction()); }

  // The k coordinates of v within `parts` largest in magnitude (ties: the earliest), sorted.
  std::vector<std::uint64_t> select(const wire::Compression& c, std::span<const float> v, const Ranges& parts,
                                    std::uint64_t /*seed*/) const override {
    const std::size_t k = kept_count(c, length(parts));
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
};

}  // namespace

const Codec& top_k_codec() {
  static const TopK codec;
  return codec;
}

}  // namespace xsilo::protocol::detail
