// Every codec by its Compression.Scheme value (protocol/codec.h). A new codec is a line here.
#include "protocol/codecs/detail.h"

namespace xsilo::protocol {

namespace detail {

namespace {

// NONE: a dense upload, float32 values as they are; nothing to encode or decode.
class None final : public Codec {
 public:
  std::string_view name() const override { return "none"; }
  Status check(const wire::Compression& /*c*/) const override { return {}; }
  Status secure(const wire::Compression& /*c*/) const override { return {}; }
  std::string describe(const wire::Compression& /*c*/) const override { return "none"; }
  void parameters(const wire::Compression& /*c*/, nlohmann::json& /*j*/) const override {}
  std::size_t bytes(const wire::Compression& /*c*/, std::size_t count, std::size_t /*nonzeros*/) const override {
    return 4 * count;
  }
  std::string encode(const wire::Compression& /*c*/, std::span<const float> x, std::uint64_t /*seed*/,
                     std::span<float> decoded) const override {
    std::copy(x.begin(), x.end(), decoded.begin());
    return std::string(reinterpret_cast<const char*>(x.data()), 4 * x.size());
  }
  Status decode(const wire::Compression& /*c*/, std::string_view /*data*/, std::span<float> /*out*/,
                std::size_t& nonzeros, const TensorInfo* /*tensor*/, std::uint64_t /*offset*/) const override {
    nonzeros = 0;
    return Error("not a compressed scheme");
  }
};

}  // namespace

const Codec& none_codec() {
  static const None codec;
  return codec;
}

}  // namespace detail

const std::vector<const Codec*>& codecs() {
  using wire::Compression;
  // In Scheme order: codecs()[scheme] is that scheme's.
  static const std::vector<const Codec*> table = [] {
    std::vector<const Codec*> t(Compression::Scheme_ARRAYSIZE, nullptr);
    t[Compression::NONE] = &detail::none_codec();
    t[Compression::QUANTIZE] = &detail::quantize_codec();
    t[Compression::SIGN] = &detail::sign_codec();
    t[Compression::TOP_K] = &detail::top_k_codec();
    t[Compression::RANDOM_K] = &detail::random_k_codec();
    t[Compression::POWER_SGD] = &detail::powersgd_codec();
    return t;
  }();
  return table;
}

const Codec* find_codec(wire::Compression::Scheme scheme) {
  const auto& t = codecs();
  return scheme >= 0 && static_cast<std::size_t>(scheme) < t.size() ? t[static_cast<std::size_t>(scheme)] : nullptr;
}

}  // namespace xsilo::protocol
