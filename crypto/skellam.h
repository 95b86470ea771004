// Distributed differential privacy under secure aggregation: the Skellam mechanism (Agarwal,
// Kairouz, Liu, NeurIPS 2021, "The Skellam Mechanism for Differentially Private Federated
// Learning", arXiv:2110.04995, Algorithm 1). Each silo turns its update into integers and adds
// its share of Skellam noise before masking; the masked sum the server reveals carries the sum of
// the shares, itself Skellam (Skellam(a) + Skellam(b) = Skellam(a + b)), and no party ever sees a
// less noisy value than that sum.
//
// A silo's encoding of its delta x (d coordinates), with P = the next power of two >= d:
//   1. clip:    x <- x min(1, C / ||x||_2) (every silo weighs 1, whatever its sample count)
//   2. rotate:  y = H D [x, 0...0] / sqrt(P): D diagonal random signs, H the P x P Walsh-Hadamard
//               matrix (entries +-1, H H = P I). Orthogonal: ||y|| = ||x||. The signs come from
//               the round's public rotation seed (SkellamParams::rotation_seed; a NoiseSource
//               keyed by SHA-256 of a purpose label and the seed), the same at every silo and the
//               server: it spreads a vector's mass over all coordinates, so that no coordinate of
//               the sum nears the ring's edge. It is no secret and the guarantee does not rest on
//               it (the sensitivities below hold for any signs).
//   3. scale:   y <- gamma y.
//   4. round:   each coordinate to floor(v) or floor(v) + 1 with the probabilities that make it
//               unbiased (E = v), drawn again (conditional rounding, the paper's Section 4.1)
//               until the rounded vector's squared norm is at most rounded_l2_bound()^2. Each
//               try passes with probability >= 1 - beta (the paper's Lemma: beta = e^-0.5 by
//               default); a silo that fails 10000 tries in a row reports an error rather than
//               send a vector outside the bound (probability < 0.61^10000).
//   5. noise:   + Skellam(silo_variance) per coordinate: Poisson(v/2) - Poisson(v/2), drawn from
//               the silo's own NoiseSource (never the rotation's).
//   6. ring:    each integer as a word of Z_{2^ring} (two's complement), then a word 1 (the
//               count of contributors: who took part is no secret). Masking follows unchanged.
//   7. count:   with adaptive clipping (count_scale h > 0), a last word: +h when ||x|| <= C
//               (the delta was not clipped), -h when it was, plus the same share of Skellam noise
//               as every coordinate. The sum's word is h (2 u - n) + noise, u the unclipped
//               members of n: one more coordinate of the same Skellam vector, whose sensitivity
//               to one silo is h (L1 and L2). h scales the bit so that the noise's integer
//               steps and the Skellam bound's discreteness term are small against it, exactly as
//               gamma does for the update (server/distributed_dp.h chooses h from sigma_b).
//
// The server reduces the unmasked sum's words modulo 2^bits (bits <= ring: the mechanism's
// ring; a wider wire ring only carries it), reads them centred in [-2^(bits-1), 2^(bits-1)),
// inverts 3 and 2 (divide by gamma; x = D H y / sqrt(P)) and drops the padding.
//
// Sensitivity of the sum to one silo's vector, in integer units (rdp.h's SkellamSum):
//   L2 <= Delta_2 = rounded_l2_bound(gamma C, P, beta) by the conditional rounding, and
//   L1 <= Delta_1 = min(sqrt(P) Delta_2, Delta_2^2) (Cauchy-Schwarz; and an integer vector has
//   |v_i| <= v_i^2 in every coordinate). With the count word: L2 <= sqrt(Delta_2^2 + h^2) and
//   L1 <= Delta_1 + h over the P + 1 noised words (the contributor word carries no noise and
//   is no secret).
//
// Poisson sampler (poisson()): exact rejection algorithms fed by NoiseSource's uniforms:
//   lambda < 10: multiplication of uniforms (Knuth): the smallest k with U_1...U_{k+1} < e^-lambda.
//   lambda >= 10: PTRS, transformed rejection with squeeze (Hörmann 1993, "The transformed
//   rejection method for generating Poisson random variables", Insurance: Mathematics and
//   Economics 12), the algorithm numpy uses; its acceptance test compares against the exact
//   Poisson probability (lgamma), so the output is Poisson(lambda) up to double rounding.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "crypto/noise.h"

namespace xsilo::crypto {

struct SkellamParams {
  std::uint32_t ring = 32;        // the masking ring's bits (8, 16, 32, 64): the wire words
  std::uint32_t bits = 20;        // the mechanism's ring 2^bits, bits <= ring
  double clip_norm = 1.0;         // C
  double gamma = 1.0;             // scale before rounding
  double silo_variance = 1.0;     // this silo's share of the Skellam variance (integer units)
  double beta = 0.6065306597126334;  // conditional rounding: e^-0.5
  std::uint64_t rotation_seed = 0;
  std::uint64_t count_scale = 0;  // h: adaptive clipping's count word (0: none)
};

// The words an encoding of d coordinates takes: the rotated length, the contributor word, and
// the count word when p.count_scale > 0.
std::size_t skellam_words(const SkellamParams& p, std::size_t d);

// The next power of two >= d (1 for d = 0).
std::size_t padded_length(std::size_t d);

// The paper's bound on the norm of a conditionally rounded vector of norm <= c in P
// coordinates: sqrt(min(c^2 + P/4 + sqrt(2 ln(1/beta)) (c + sqrt(P)/2), (c + sqrt(P))^2)).
double rounded_l2_bound(double c, std::size_t padded, double beta);
// The noise multiplier a setup's parameters give: the standard deviation of the sum's noise over
// its L2 sensitivity, sqrt(variance) / rounded_l2_bound(gamma clip_norm, padded, beta). It does
// not depend on how the variance is shared: what a silo checks against its own floor. With a
// count word of scale h (count_scale > 0) the sensitivity is the whole vector's, the count's
// h included: sqrt(variance) / sqrt(Delta_2^2 + h^2), the round's multiplier.
double skellam_noise_multiplier(double variance, double gamma, double clip_norm, std::size_t padded, double beta,
                                std::uint64_t count_scale = 0);

// y = H x (unnormalized fast Walsh-Hadamard transform), x.size() a power of two.
void walsh_hadamard(std::span<double> x);
// y = H D x / sqrt(P) and its inverse x = D H y / sqrt(P), D the signs of `seed`.
void rotate(std::span<double> x, std::uint64_t seed);
void unrotate(std::span<double> x, std::uint64_t seed);

// Exact samplers (above). Above kMaxPoissonMean a double no longer holds every integer near
// lambda (draws would come in steps of 2, 4, ... 256 and leave the sum's low bits without noise,
// and from 2^64 the conversion is undefined): poisson() throws there, and a silo refuses a
// setup that would ask for it (silo_agent/secure_client.cpp).
inline constexpr double kMaxPoissonMean = 4503599627370496.0;  // 2^52
std::uint64_t poisson(NoiseSource& noise, double lambda);
std::int64_t skellam(NoiseSource& noise, double variance);

// Encodes delta (steps 1-7) into out (skellam_words(p, delta.size()) words). Returns the clip
// factor applied (1 if none). Throws std::runtime_error when the conditional rounding keeps
// failing or a value does not fit in 62 bits.
double encode_skellam(const SkellamParams& p, std::span<const float> delta, NoiseSource& noise,
                      std::span<std::uint8_t> out);
double encode_skellam(const SkellamParams& p, std::span<const float> delta, NoiseSource& noise,
                      std::span<std::uint16_t> out);
double encode_skellam(const SkellamParams& p, std::span<const float> delta, NoiseSource& noise,
                      std::span<std::uint32_t> out);
double encode_skellam(const SkellamParams& p, std::span<const float> delta, NoiseSource& noise,
                      std::span<std::uint64_t> out);

// Word k of a sum as the mechanism's signed integer: reduced mod 2^bits, centred.
std::int64_t centred(std::uint64_t word, std::uint32_t bits);

// Decodes a sum of encodings (skellam_words(p, d) words): the d coordinates of sum(clip(x))
// plus noise / gamma, then the count of contributors (d + 1 values); with a count word, then
// the centred noisy count u - n / 2 + noise / (2 h), its word read centred in the masking ring
// 2^p.ring (d + 2 values).
std::vector<double> decode_skellam(const SkellamParams& p, std::span<const std::uint8_t> sum, std::size_t d);
std::vector<double> decode_skellam(const SkellamParams& p, std::span<const std::uint16_t> sum, std::size_t d);
std::vector<double> decode_skellam(const SkellamParams& p, std::span<const std::uint32_t> sum, std::size_t d);
std::vector<double> decode_skellam(const SkellamParams& p, std::span<const std::uint64_t> sum, std::size_t d);

}  // namespace xsilo::crypto
