#include "silo_agent/masking_job.h"

#include <cmath>
#include <string>
#include <string_view>

#include "crypto/fixed_point.h"
#include "crypto/hash.h"

namespace xsilo::agent {

MaskDone MaskingJob::operator()() const {
  MaskDone r;
  const crypto::FixedPointParams codec{setup.modulus_bits(), setup.fraction_bits(), setup.clip_norm(),
                                       setup.max_weight(), setup.count_unclipped()};
  crypto::FixedPointParams applied = codec;
  hook->encoding(applied);  // the production hook changes nothing
  // RANDOM_K: only the round's shared coordinates are masked and sent.
  const std::size_t d = kept ? kept->size() : update->size();
  if (setup.vector_length() != codec.words(d)) {
    r.error = "the secure setup's vector length " + std::to_string(setup.vector_length()) + " does not fit the model (" +
              std::to_string(codec.words(d)) + " words)";
    return r;
  }
  // The upload is weight * delta: the codec wants delta and the weight separately.
  std::vector<float> delta(d);
  const auto u = update->flat();
  for (std::size_t j = 0; j < d; ++j) delta[j] = kept ? u[(*kept)[j]] : u[j];
  for (auto& v : delta) {
    v = static_cast<float>(v / weight);
    if (!std::isfinite(v)) {
      r.error = "the update has NaN or infinite values; it cannot be encoded";
      return r;
    }
  }
  r.words = std::make_shared<protocol::MaskedVector>(codec.bits, codec.words(d));
  r.words->visit([&](auto words) { crypto::encode(applied, delta, weight, seed, words); });
  hook->encoded(*r.words, codec);
  if (auto masked = member->mask(*r.words); !masked) r.error = masked.error().message();
  const auto b = r.words->bytes();
  r.sha256 = crypto::sha256_hex(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
  return r;
}

}  // namespace xsilo::agent
