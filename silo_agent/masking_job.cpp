#include "silo_agent/masking_job.h"

#include <cmath>
#include <string>
#include <string_view>

#include "crypto/fixed_point.h"
#include "crypto/hash.h"
#include "crypto/skellam.h"

namespace xsilo::agent {

namespace {

// Distributed DP (crypto/skellam.h): the weight-1 clipped delta, rotated, scaled, rounded, with
// this silo's share of the noise (variance / min_survivors), then the count word 1 (and, under
// adaptive clipping, the noised +-h of whether the delta was within C).
MaskDone encode_skellam_update(const MaskingJob& j) {
  MaskDone r;
  const auto& k = j.setup.skellam();
  // Under RANDOM_K the silo encodes the round's shared kept coordinates only (the rest stays in
  // its error feedback): the server spreads the decoded sum back over the model.
  const std::size_t d = j.kept ? j.kept->size() : j.update->size();
  if (j.setup.vector_length() != crypto::padded_length(d) + 1 + (k.count_scale() > 0 ? 1 : 0) ||
      k.bits() > j.setup.modulus_bits() || (j.setup.wire_bits() != 0 && j.setup.wire_bits() != k.bits()) ||
      j.setup.min_survivors() < 1 || !(k.variance() > 0) || !(k.gamma() > 0)) {
    r.error = "the secure setup's distributed-DP parameters do not fit the model (" + std::to_string(d) +
              " coordinates) or its ring";
    return r;
  }
  std::vector<float> delta(d);
  const auto u = j.update->flat();
  for (std::size_t i = 0; i < d; ++i) {
    delta[i] = static_cast<float>(u[j.kept ? (*j.kept)[i] : i] / j.weight);
    if (!std::isfinite(delta[i])) {
      r.error = "the update has NaN or infinite values; it cannot be encoded";
      return r;
    }
  }
  crypto::SkellamParams p;
  p.ring = j.setup.modulus_bits();
  p.bits = k.bits();
  p.clip_norm = k.clip_norm();
  p.gamma = k.gamma();
  p.silo_variance = k.variance() / static_cast<double>(j.setup.min_survivors());
  p.beta = k.beta();
  p.rotation_seed = k.rotation_seed();
  p.count_scale = k.count_scale();  // adaptive clipping: the unclipped word, noised like the rest
  r.words = std::make_shared<protocol::MaskedVector>(j.setup.modulus_bits(), crypto::skellam_words(p, d));
  try {
    crypto::NoiseSource noise(j.noise_key);
    r.words->visit([&](auto words) { crypto::encode_skellam(p, delta, noise, words); });
  } catch (const std::exception& e) {
    r.error = std::string("distributed DP encoding failed: ") + e.what();
    return r;
  }
  if (auto masked = j.member->mask(*r.words); !masked) r.error = masked.error().message();
  // The packed wire (protocol/packed.h): the words mod 2^wire_bits are what is sent and hashed.
  r.words->set_wire_bits(j.setup.wire_bits());
  r.words->reduce_to_wire();
  const auto b = r.words->bytes();
  r.sha256 = crypto::sha256_hex(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
  return r;
}

}  // namespace

MaskDone MaskingJob::operator()() const {
  if (setup.has_skellam()) return encode_skellam_update(*this);
  MaskDone r;
  const crypto::FixedPointParams codec{.bits = setup.modulus_bits(),
                                       .fraction_bits = setup.fraction_bits(),
                                       .clip_norm = setup.clip_norm(),
                                       .max_weight = setup.max_weight(),
                                       .unclipped_bit = setup.count_unclipped()};
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
  double factor = 1;
  r.words->visit([&](auto words) { factor = crypto::encode(applied, delta, weight, seed, words); });
  if (factor < 1) {
    r.clipped_to = applied.clip_norm;
    r.norm = applied.clip_norm / factor;
  }
  hook->encoded(*r.words, codec);
  if (auto masked = member->mask(*r.words); !masked) r.error = masked.error().message();
  const auto b = r.words->bytes();
  r.sha256 = crypto::sha256_hex(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
  return r;
}

}  // namespace xsilo::agent
