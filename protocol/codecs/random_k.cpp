// RANDOM_K: k coordinates drawn from a seed, one in each of k strata of the compressible
// coordinates; index + value chunks (detail::SparseCodec). Without error feedback each kept value
// is scaled by its stratum's size, so the update stays unbiased. Under secure aggregation every
// silo keeps the same set, drawn from the round's seed (compression.h, shared_kept_set).
#include "protocol/codecs/detail.h"

namespace xsilo::protocol {

std::vector<std::uint64_t> random_k_set(std::uint64_t seed, std::size_t d, std::size_t k) {
  // Stratified: one coordinate drawn in each of k strata of consecutive coordinates, so the set
  // comes out sorted, exactly k, in O(k), and covers the model evenly.
  std::vector<std::uint64_t> out(std::min(k, d));
  if (out.empty()) return out;
  std::uint64_t s = seed;
  detail::Strata strata(d, out.size());
  for (auto& o : out) {
    const auto [b, e] = strata.next();
    o = b + static_cast<std::uint64_t>((static_cast<detail::u128>(detail::splitmix64(s)) * (e - b)) >> 64);
  }
  return out;
}

namespace detail {

namespace {

class RandomK final : public SparseCodec {
 public:
  std::string_view name() const override { return "random_k"; }
  // The set drawn from the round's seed is every silo's (shared_kept_set).
  Status secure(const wire::Compression& /*c*/) const override { return {}; }
  std::string describe(const wire::Compression& c) const override { return "random-k " + percent(c.fraction()); }
  std::vector<std::uint64_t> select(const wire::Compression& c, std::span<const float> /*v*/, const Ranges& parts,
                                    std::uint64_t seed) const override {
    const std::size_t d = length(parts);
    return to_flat(random_k_set(seed, d, kept_count(c, d)), parts);
  }
  bool scales_kept(const wire::Compression& c) const override { return !c.error_feedback(); }
};

}  // namespace

const Codec& random_k_codec() {
  static const RandomK codec;
  return codec;
}

}  // namespace detail
}  // namespace xsilo::protocol
