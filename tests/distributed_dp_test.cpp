// Silo-level differential privacy, distributed mode (crypto/skellam.h, server/distributed_dp.h,
// docs/privacy.md): the samplers, the rotation, each silo's encoding and the server's decoding of
// the ring sum, the noise the sum carries, gamma's fit in the ring, the budget and the audit check.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "common/fs.h"
#include "crypto/skellam.h"
#include "protocol/compression.h"
#include "protocol/round_start.h"
#include "protocol/secagg_wire.h"
#include "server/audit.h"
#include "server/central_dp.h"
#include "server/distributed_dp.h"
#include "server/group_sum.h"
#include "server/secure_groups.h"
#include "tests/privacy_claims.h"
#include "tests/result_util.h"
#include "tests/testlib.h"
#include "tools/sim.h"

namespace xsilo {
namespace {

crypto::NoiseSource::Key key(std::uint8_t b) {
  crypto::NoiseSource::Key k{};
  k.fill(b);
  return k;
}

struct Moments {
  double mean = 0, variance = 0;
};

template <class F>
Moments moments_of(std::size_t n, F&& draw) {
  double s = 0, sq = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double v = draw();
    s += v;
    sq += v * v;
  }
  const double m = s / static_cast<double>(n);
  return {m, sq / static_cast<double>(n) - m * m};
}

// Both branches of the sampler (multiplication below 10, PTRS above): the sample mean within 5
// standard errors of lambda, the sample variance within 5 standard errors of lambda (the
// variance of a sample variance of n Poisson draws is about (2 lambda^2 + lambda) / n).
TEST(Skellam, ThePoissonSamplerHasTheMeanAndVarianceOfItsLambda) {
  crypto::NoiseSource noise(key(1));
  constexpr std::size_t n = 200000;
  for (const double lambda : {0.3, 3.5, 9.99, 10.0, 47.2, 1234.5, 2.5e6}) {
    const auto m = moments_of(n, [&] { return static_cast<double>(crypto::poisson(noise, lambda)); });
    EXPECT_NEAR(m.mean, lambda, 5 * std::sqrt(lambda / n)) << lambda;
    EXPECT_NEAR(m.variance, lambda, 5 * std::sqrt((2 * lambda * lambda + lambda) / n)) << lambda;
  }
  EXPECT_EQ(crypto::poisson(noise, 0), 0u);
  EXPECT_THROW(crypto::poisson(noise, -1), std::invalid_argument);
  // Above 2^52 a double cannot hold every integer near lambda: refused, not drawn coarsely.
  EXPECT_GT(crypto::poisson(noise, crypto::kMaxPoissonMean), 0u);
  EXPECT_THROW(crypto::poisson(noise, crypto::kMaxPoissonMean * 2), std::invalid_argument);
  EXPECT_THROW(crypto::poisson(noise, 1e30), std::invalid_argument);
}

TEST(Skellam, SkellamNoiseIsCentredWithItsVariance) {
  crypto::NoiseSource noise(key(2));
  constexpr std::size_t n = 200000;
  for (const double v : {1.0, 25.0, 4e4}) {
    const auto m = moments_of(n, [&] { return static_cast<double>(crypto::skellam(noise, v)); });
    EXPECT_NEAR(m.mean, 0, 5 * std::sqrt(v / n)) << v;
    EXPECT_NEAR(m.variance, v, 5 * std::sqrt((2 * v * v + v) / n)) << v;
  }
}

TEST(Skellam, TheHadamardRotationRoundTripsExactlyAndKeepsTheNorm) {
  // Integers: H H x = P x with no rounding at all.
  std::vector<double> ints(1024);
  for (std::size_t i = 0; i < ints.size(); ++i) ints[i] = static_cast<double>(static_cast<int>(i % 37) - 18);
  auto h = ints;
  crypto::walsh_hadamard(h);
  crypto::walsh_hadamard(h);
  for (std::size_t i = 0; i < ints.size(); ++i) {
    EXPECT_EQ(h[i], 1024 * ints[i]) << i;
  }
  // The randomized rotation: orthogonal, inverted by unrotate, and it spreads a spike.
  std::vector<double> x(4096, 0.0);
  x[7] = 3.0;
  auto y = x;
  crypto::rotate(y, 99);
  double sq = 0, top = 0;
  for (const double v : y) {
    sq += v * v;
    top = std::max(top, std::fabs(v));
  }
  EXPECT_NEAR(std::sqrt(sq), 3.0, 1e-12);
  EXPECT_NEAR(top, 3.0 / 64, 1e-12);  // every coordinate +-3 / sqrt(4096)
  auto back = y;
  crypto::unrotate(back, 99);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-12) << i;
  auto other = y;
  crypto::unrotate(other, 100);  // another seed's signs do not invert it
  EXPECT_GT(std::fabs(other[7] - 3.0), 0.1);
  EXPECT_THROW(crypto::walsh_hadamard(std::span<double>(x.data(), 1000)), std::invalid_argument);
}

// The centred reading of a ring word: two's complement mod 2^bits, whatever the wire ring.
TEST(Skellam, ARingWordReadsAsItsCentredValueModuloTwoToTheBits) {
  EXPECT_EQ(crypto::centred(static_cast<std::uint32_t>(-5), 20), -5);
  EXPECT_EQ(crypto::centred(static_cast<std::uint32_t>(-5), 32), -5);
  EXPECT_EQ(crypto::centred((1u << 19) - 1, 20), (1 << 19) - 1);
  EXPECT_EQ(crypto::centred(1u << 19, 20), -(1 << 19));
  EXPECT_EQ(crypto::centred((1u << 20) + 3, 20), 3);  // wraps mod 2^20
}

std::vector<std::vector<float>> random_updates(std::size_t n, std::size_t d, double scale, std::uint8_t seed) {
  crypto::NoiseSource g(key(seed));
  std::vector<std::vector<float>> out(n, std::vector<float>(d));
  for (auto& u : out) {
    for (auto& v : u) v = static_cast<float>(scale * g.gaussian());
  }
  return out;
}

template <class Word>
std::vector<double> ring_sum(const crypto::SkellamParams& p, const std::vector<std::vector<float>>& updates,
                             std::uint8_t seed) {
  const std::size_t d = updates[0].size(), P = crypto::padded_length(d);
  std::vector<Word> sum(P + 1, 0);
  for (std::size_t i = 0; i < updates.size(); ++i) {
    std::vector<Word> words(P + 1);
    crypto::NoiseSource noise(key(static_cast<std::uint8_t>(seed + i)));
    crypto::encode_skellam(p, updates[i], noise, std::span<Word>(words));
    for (std::size_t k = 0; k <= P; ++k) sum[k] = static_cast<Word>(sum[k] + words[k]);  // mod 2^ring
  }
  return crypto::decode_skellam(p, std::span<const Word>(sum), d);
}

// n silos' encodings added mod 2^ring decode to the sum of their clipped updates, off by no more
// than the rounding and the noise: the per-coordinate error's RMS is about sqrt(n (v + 1/4)) /
// gamma, v each silo's noise variance (within 10%), and the count word is n. Some updates are
// longer than C (clipped), and their values wrap around the ring (negative coordinates).
TEST(Skellam, TheRingSumOfNEncodingsDecodesToTheSumOfClippedUpdatesWithinTheNoise) {
  const std::size_t n = 6, d = 3000;
  auto updates = random_updates(n, d, 0.03, 7);  // norm about 1.6: clipped to 1
  std::vector<double> clipped(d, 0.0);
  for (const auto& u : updates) {
    double sq = 0;
    for (const float v : u) sq += static_cast<double>(v) * v;
    const double f = std::min(1.0, 1.0 / std::sqrt(sq));
    for (std::size_t k = 0; k < d; ++k) clipped[k] += u[k] * f;
  }
  for (const auto& [ring, bits, gamma, v] : std::vector<std::tuple<std::uint32_t, std::uint32_t, double, double>>{
           {32, 20, 2000.0, 400.0}, {16, 12, 100.0, 4.0}, {64, 40, 1e6, 1e4}}) {
    crypto::SkellamParams p;
    p.ring = ring;
    p.bits = bits;
    p.gamma = gamma;
    p.clip_norm = 1.0;
    p.silo_variance = v;
    p.rotation_seed = 5;
    std::vector<double> got;
    if (ring == 16) got = ring_sum<std::uint16_t>(p, updates, 30);
    else if (ring == 32) got = ring_sum<std::uint32_t>(p, updates, 30);
    else got = ring_sum<std::uint64_t>(p, updates, 30);
    ASSERT_EQ(got.size(), d + 1);
    EXPECT_EQ(got[d], static_cast<double>(n)) << bits;
    double err = 0;
    for (std::size_t k = 0; k < d; ++k) err += (got[k] - clipped[k]) * (got[k] - clipped[k]);
    const double rms = std::sqrt(err / d);
    // Rounding: a uniform-ish error of variance at most 1/4 a silo and coordinate.
    const double expected = std::sqrt(n * v) / gamma;
    const double most = std::sqrt(n * (v + 0.25)) / gamma;
    EXPECT_GT(rms, 0.9 * expected) << bits;
    EXPECT_LT(rms, 1.1 * most) << bits;
  }
}

// Adaptive clipping's count word (crypto/skellam.h step 7): n silos' +-h words, each with its
// noise share, add up in the ring to h (2 u - n) plus Skellam noise, which decodes to the centred
// count u - n / 2 within the noise over 2 h; the vector decodes as without it. Repeated over
// many rounds, the decoded counts' deviation is the calibrated sqrt(n v) / (2 h) within 10%.
TEST(Skellam, TheCountWordDecodesToTheCentredUnclippedCountWithItsCalibratedNoise) {
  const std::size_t n = 8, d = 40;
  auto updates = random_updates(n, d, 0.3, 3);  // norm about 1.9
  for (std::size_t i = 0; i < 3; ++i) {
    for (auto& v : updates[i]) v *= 0.1f;  // three within C = 1, five clipped
  }
  crypto::SkellamParams p;
  p.ring = 32;
  p.bits = 20;
  p.gamma = 500;
  p.clip_norm = 1.0;
  p.silo_variance = 900;
  p.rotation_seed = 9;
  p.count_scale = 40;
  EXPECT_EQ(crypto::skellam_words(p, d), crypto::padded_length(d) + 2);
  std::vector<double> centred;
  for (std::size_t round = 0; round < 120; ++round) {
    std::vector<std::uint32_t> sum(crypto::skellam_words(p, d), 0);
    for (std::size_t i = 0; i < n; ++i) {
      auto k = key(1);
      k[0] = static_cast<std::uint8_t>(round);
      k[1] = static_cast<std::uint8_t>(i);
      crypto::NoiseSource noise(k);
      std::vector<std::uint32_t> words(sum.size());
      crypto::encode_skellam(p, updates[i], noise, std::span<std::uint32_t>(words));
      for (std::size_t w = 0; w < sum.size(); ++w) sum[w] += words[w];  // mod 2^32
    }
    const auto got = crypto::decode_skellam(p, std::span<const std::uint32_t>(sum), d);
    ASSERT_EQ(got.size(), d + 2);
    EXPECT_EQ(got[d], static_cast<double>(n));
    centred.push_back(got[d + 1]);
  }
  double mean = 0, var = 0;
  for (const double c : centred) mean += c / static_cast<double>(centred.size());
  for (const double c : centred) var += (c - mean) * (c - mean) / static_cast<double>(centred.size() - 1);
  const double sd = std::sqrt(n * p.silo_variance) / (2.0 * 40);  // 1.06 counts
  EXPECT_NEAR(mean, 3.0 - 4.0, 4 * sd / std::sqrt(120.0));
  EXPECT_NEAR(std::sqrt(var), sd, 0.15 * sd);
}

// The count word's sum, n h plus the noise, is read centred in the whole masking ring 2^ring, not
// the mechanism's 2^bits (crypto/skellam.h): with bits = 8 and ring = 32, eight unclipped
// members' 8 x 40 = 320 is beyond 2^7 and still decodes to u - n / 2 = 4 (read in 2^8 it would
// wrap to 64 / 80 = 0.8).
TEST(Skellam, TheCountWordIsReadInTheMaskingRingBeyondTheMechanismsBits) {
  const std::size_t n = 8, d = 4;
  auto updates = random_updates(n, d, 0.1, 4);  // norm about 0.2: every member within C = 1
  const crypto::SkellamParams p{
      .ring = 32, .bits = 8, .clip_norm = 1.0, .gamma = 4, .silo_variance = 1, .rotation_seed = 3, .count_scale = 40};
  std::vector<std::uint32_t> sum(crypto::skellam_words(p, d), 0);
  for (std::size_t i = 0; i < n; ++i) {
    crypto::NoiseSource noise(key(static_cast<std::uint8_t>(40 + i)));
    std::vector<std::uint32_t> words(sum.size());
    EXPECT_EQ(crypto::encode_skellam(p, updates[i], noise, std::span<std::uint32_t>(words)), 1.0);
    for (std::size_t w = 0; w < sum.size(); ++w) sum[w] += words[w];  // mod 2^32
  }
  const auto count_word = crypto::centred(sum.back(), 32);
  ASSERT_GT(count_word, 127) << "the test needs a count word beyond 2^(bits - 1)";
  const auto got = crypto::decode_skellam(p, std::span<const std::uint32_t>(sum), d);
  ASSERT_EQ(got.size(), d + 2);
  EXPECT_EQ(got[d], static_cast<double>(n));
  // The noise: Skellam of variance 8, about 2.8 / 80 = 0.035 counts; 0.5 is 14 deviations.
  EXPECT_NEAR(got[d + 1], 4.0, 0.5);
}

// The sum the server decodes carries Skellam noise of variance n x (mu / n_min) in integer
// units: zero updates (no rounding), n = n_min = 8 silos, 65536 coordinates; the empirical
// variance is within 3% (its standard error is about sqrt(2 / 65536) = 0.55%).
TEST(Skellam, TheNoiseTheServerSeesInTheSumHasTheCalibratedVariance) {
  const std::size_t n = 8, d = 65536;
  const double mu = 5000;
  crypto::SkellamParams p;
  p.bits = 24;
  p.gamma = 1.0;
  p.silo_variance = mu / n;
  p.rotation_seed = 3;
  std::vector<std::vector<float>> zeros(n, std::vector<float>(d, 0.0f));
  const auto got = ring_sum<std::uint32_t>(p, zeros, 50);
  double sq = 0, s = 0;
  for (std::size_t k = 0; k < d; ++k) {
    s += got[k];
    sq += got[k] * got[k];
  }
  const double var = sq / d - (s / d) * (s / d);
  EXPECT_NEAR(var, mu, 0.03 * mu);
  EXPECT_NEAR(s / d, 0, 5 * std::sqrt(mu / d));
}

// Conditional rounding: whatever the input, the rounded vector is within the norm the
// accountant charges for (checked by decoding one silo's encoding without noise).
TEST(Skellam, ConditionalRoundingKeepsTheRoundedNormWithinTheAccountedBound) {
  const std::size_t d = 2000, P = crypto::padded_length(d);
  crypto::SkellamParams p;
  p.bits = 30;
  p.gamma = 3.0;  // gamma C small against sqrt(P): rounding dominates, the bound bites
  p.silo_variance = 1e-300;
  crypto::NoiseSource noise(key(9));
  const double bound = crypto::rounded_l2_bound(p.gamma * p.clip_norm, P, p.beta);
  for (int trial = 0; trial < 20; ++trial) {
    const auto u = random_updates(1, d, 1.0, static_cast<std::uint8_t>(60 + trial))[0];
    std::vector<std::uint32_t> words(P + 1);
    crypto::encode_skellam(p, u, noise, std::span<std::uint32_t>(words));
    double sq = 0;
    for (std::size_t k = 0; k < P; ++k) {
      const double v = static_cast<double>(crypto::centred(words[k], 32));
      sq += v * v;
    }
    EXPECT_LE(std::sqrt(sq), bound) << trial;
  }
}

server::DistributedDpConfig digits_like(std::uint32_t bits, double epsilon, std::uint64_t rounds) {
  server::DistributedDpConfig c;
  c.epsilon = epsilon;
  c.delta = 1e-5;
  c.clip_norm = 0.5;
  c.rounds = rounds;
  c.denominator = 10;
  c.bits = bits;
  c.max_group = 10;
  return c;
}

// Gamma is the largest that keeps a coordinate of 10 silos' sum inside 2^(bits-1) by the stated
// tail bound; more bits give a larger gamma and the same noise multiplier's privacy; too few
// bits are refused with the numbers.
// Random-k under distributed DP: the silos encode the round's shared kept set, whose size the
// setup's length is computed from before any set is drawn (skellam_dim: k of the compressible
// coordinates and every dense tensor's, whatever the round's seed), and the server spreads the
// decoded sum back, each kept value at its coordinate, zero elsewhere, the count last.
TEST(DistributedDp, RandomKEncodesTheSharedKeptSetAndItsSumSpreadsBackOverTheModel) {
  const std::vector<TensorInfo> layout{{.name = "w", .shape = {10, 9}, .offset = 0},
                                       {.name = "bn.running_mean", .shape = {7}, .offset = 90},
                                       {.name = "b", .shape = {3}, .offset = 97}};
  wire::Compression c;
  c.set_scheme(wire::Compression::RANDOM_K);
  c.set_fraction(0.1);
  c.add_dense("*running_mean");
  EXPECT_EQ(protocol::skellam_dim(c, layout), 10u + 7u);  // ceil(0.1 x 93) = 10, and the dense 7
  for (std::uint64_t seed : {1u, 2u, 77u}) {
    c.set_seed(seed);
    const auto kept = protocol::shared_kept_set(c, layout);
    ASSERT_EQ(kept.size(), protocol::skellam_dim(c, layout)) << seed;
    std::vector<double> decoded(kept.size() + 1);
    std::iota(decoded.begin(), decoded.end(), 1.0);  // kept value i is i + 1; the count last
    const auto spread = server::spread_kept(decoded, kept, 100);
    ASSERT_EQ(spread.size(), 101u);
    for (std::size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(spread[kept[i]], static_cast<double>(i + 1));
    EXPECT_EQ(std::count(spread.begin(), spread.begin() + 100, 0.0), 100 - static_cast<long>(kept.size()));
    EXPECT_EQ(spread[100], static_cast<double>(kept.size() + 1));
    for (std::uint64_t k = 90; k < 97; ++k) EXPECT_NE(spread[k], 0.0) << "the dense tensor is always kept";
  }
  c.set_scheme(wire::Compression::NONE);
  EXPECT_EQ(protocol::skellam_dim(c, layout), 100u);
}

TEST(DistributedDp, GammaFitsTheSumInTheRingAndTooFewBitsAreRefused) {
  double last_gamma = 0;
  for (const std::uint32_t bits : {16u, 18u, 20u}) {
    auto c = digits_like(bits, 3, 30);
    server::finalize_distributed_dp(c, 4810);
    EXPECT_EQ(c.padded, 8192u);
    EXPECT_TRUE(c.ready());
    EXPECT_LE(server::ring_reach(c, c.gamma, c.variance), std::ldexp(1.0, static_cast<int>(bits) - 1) - 1) << bits;
    EXPECT_GT(server::ring_reach(c, c.gamma * 1.01, c.variance * 1.0201), std::ldexp(1.0, static_cast<int>(bits) - 1) - 1)
        << bits << ": gamma is not the largest";
    EXPECT_GT(c.gamma, last_gamma);
    last_gamma = c.gamma;
    // The noise lasts its rounds and not one more.
    privacy::Ledger spent;
    spent.add(server::round_mechanism(c), 30);
    EXPECT_LE(server::epsilon_of(spent, c.delta), 3.0 * (1 + 1e-9));
    EXPECT_FALSE(server::fits_another_round(c, spent));
    privacy::Ledger fewer;
    fewer.add(server::round_mechanism(c), 29);
    EXPECT_TRUE(server::fits_another_round(c, fewer));
  }
  auto tight = digits_like(12, 3, 30);
  try {
    server::finalize_distributed_dp(tight, 4810);
    ADD_FAILURE() << "12 bits cannot hold 10 silos sum";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("12 bits cannot hold the sum"), std::string::npos) << e.what();
  }
}

// The noise multiplier chosen for the rounds gives mu = (z Delta_2)^2 and matches the Skellam
// RDP: a smaller one (by 1%) would pass the budget.
TEST(DistributedDp, TheNoiseMultiplierIsTheSmallestThatLastsTheRounds) {
  auto c = digits_like(20, 1, 50);
  server::finalize_distributed_dp(c, 1000);
  const double l2 = server::distributed_l2(c, c.gamma), l1 = server::distributed_l1(c, c.gamma);
  EXPECT_NEAR(c.variance, c.noise_multiplier * c.noise_multiplier * l2 * l2, 1e-6 * c.variance);
  EXPECT_LE(l1, std::sqrt(1024.0) * l2 * (1 + 1e-12));
  auto eps_at = [&](double z) {
    privacy::Accountant a;
    a.compose(privacy::SkellamSum{l1, l2, z * z * l2 * l2}, 50);
    return a.epsilon(c.delta).epsilon;
  };
  EXPECT_LE(eps_at(c.noise_multiplier), 1.0 * (1 + 1e-9));
  EXPECT_GT(eps_at(c.noise_multiplier * 0.99), 1.0);
}

// A federation_start and committed round records 1..4 of c, its setups signed with rotation seed
// 7, and their spend; with adaptive clipping (c.count_scale > 0) round r runs at C = 0.5 x 1.3^(r-1)
// (at_clip_norm) and its record has the robust.adaptive_clip part.
struct RoundLog {
  std::vector<nlohmann::json> records;
  privacy::Ledger spent;
};
RoundLog four_committed_rounds(const server::DistributedDpConfig& c) {
  RoundLog log{{{{"event", "federation_start"}}}, {}};
  double clip = 0.5;
  for (std::uint64_t r = 1; r <= 4; ++r, clip *= 1.3) {
    const auto round = c.count_scale > 0 ? server::at_clip_norm(c, clip) : c;
    log.spent.add(server::round_mechanism(round), 1);
    nlohmann::json rec = {
        {"event", "round"},
        {"round", r},
        {"status", "committed"},
        {"privacy", server::round_privacy_record(round, server::signed_part(round, 7), c.padded, log.spent)}};
    if (c.count_scale > 0) rec["robust"]["adaptive_clip"] = {{"clip_norm", clip}, {"next", clip * 1.3}};
    log.records.push_back(rec);
  }
  return log;
}

// `xsilo audit verify` recomposes the Skellam rounds from gamma, C, P, beta and mu: an
// understated epsilon, or a record whose variance was smaller than it claims, fails.
TEST(DistributedDp, AuditVerifyFailsOnAnUnderstatedEpsilon) {
  auto c = digits_like(20, 8, 10);
  server::finalize_distributed_dp(c, 4810);
  const auto [log, spent] = four_committed_rounds(c);
  const auto ok = server::check_privacy_claims(log);
  EXPECT_TRUE(succeeded(ok));
  EXPECT_EQ(ok->silo_rounds(), 4u);
  EXPECT_NEAR(ok->silo_epsilon, server::epsilon_of(spent, c.delta), 1e-12);
  EXPECT_EQ(log[4]["privacy"]["mechanism"], "skellam");
  for (const char* k : {"gamma", "variance", "bits", "clip_norm", "epsilon"}) {
    EXPECT_TRUE(log[4]["privacy"].contains(k)) << k;
  }

  test::expect_understated_epsilon_caught(log, "distributed DP");
  auto weaker = log;
  weaker[2]["privacy"]["variance"] = c.variance / 4;  // round 2 had less noise than the later claims count
  EXPECT_FALSE(server::check_privacy_claims(weaker).has_value());
  auto broken = log;
  broken[1]["privacy"].erase("gamma");
  EXPECT_FALSE(server::check_privacy_claims(broken).has_value());
  // The recovery reads the same records.
  const auto m = server::silo_level_mechanism_of(log[2]);
  ASSERT_TRUE(m);
  EXPECT_EQ(*m, server::round_mechanism(c));
}

// Adaptive clipping (issue 42): the count word is one more coordinate of the same Skellam
// vector, of sensitivity h; the round's multiplier over the whole vector is the central formula's
// (z^-2 + (2 sigma_b)^-2)^-1/2 up to h's rounding; with `rounds` the round's noise is what lasts
// them, count included. `xsilo audit verify` recomputes it: a record that claims less epsilon,
// or that adapted C but drops its count word, fails.
TEST(DistributedDp, AdaptiveClippingsCountWordIsAccountedAndAuditVerifyFailsARecordClaimingLess) {
  auto c = digits_like(20, 8, 10);
  c.counts_unclipped = true;
  c.count_stddev = 1.5;
  server::finalize_distributed_dp(c, 4810);
  ASSERT_GT(c.count_scale, 0u);
  const double l2 = server::distributed_l2(c, c.gamma);
  EXPECT_GE(server::count_noise_stddev(c), 1.5);
  EXPECT_LT(server::count_noise_stddev(c), 1.5 * static_cast<double>(c.count_scale + 1) / static_cast<double>(c.count_scale));
  const auto m = std::get<privacy::SkellamSum>(server::round_mechanism(c));
  const double h = static_cast<double>(c.count_scale);
  EXPECT_DOUBLE_EQ(m.l2, std::sqrt(l2 * l2 + h * h));
  EXPECT_DOUBLE_EQ(m.l1, server::distributed_l1(c, c.gamma) + h);
  const double z_round = std::sqrt(c.variance) / m.l2;
  const double central = 1 / std::sqrt(1 / (c.noise_multiplier * c.noise_multiplier) + 1 / (4 * 1.5 * 1.5));
  EXPECT_NEAR(z_round, central, 0.01 * central);
  // Ten rounds fit the budget, and a round's noise 1% smaller would not.
  privacy::Accountant a;
  a.compose(m, 10);
  EXPECT_LE(a.epsilon(c.delta).epsilon, 8 * (1 + 1e-9));
  privacy::Accountant weaker;
  weaker.compose(privacy::SkellamSum{m.l1, m.l2, m.variance * 0.98}, 10);
  EXPECT_GT(weaker.epsilon(c.delta).epsilon, 8.0);
  // Records of four rounds at moving C: the mechanism is the same, the records pass verify.
  const auto [log, spent] = four_committed_rounds(c);
  double clip = 0.5;
  for (std::uint64_t r = 1; r <= 4; ++r, clip *= 1.3) {
    const auto moved = std::get<privacy::SkellamSum>(*server::recorded_skellam_mechanism(log[r]));
    EXPECT_NEAR(moved.l2, m.l2, 1e-12 * m.l2);
    EXPECT_EQ(moved.variance, m.variance);
    EXPECT_EQ(log[r]["privacy"]["count_scale"], c.count_scale);
    EXPECT_EQ(log[r]["privacy"]["clip_norm"].get<double>(), clip);
    EXPECT_NEAR(log[r]["privacy"]["noise_multiplier"].get<double>(), z_round, 1e-12 * z_round);
  }
  const auto ok = server::check_privacy_claims(log);
  ASSERT_TRUE(succeeded(ok));
  EXPECT_NEAR(ok->silo_epsilon, server::epsilon_of(spent, c.delta), 1e-12);
  test::expect_understated_epsilon_caught(log, "distributed DP");
  // The count word's release without it: verify refuses a record that adapted C but states no
  // count scale, and a record that drops the scale but keeps its setup_sha256 no longer hashes to
  // the signed setup.
  auto uncounted = log;
  uncounted[2]["privacy"].erase("count_scale");
  test::expect_claims_fail(uncounted, "record 3 (round 2): its distributed DP spend cannot be read (its clip norm "
                                      "adapted to a count of unclipped updates (robust.adaptive_clip) but its privacy "
                                      "part states no count_scale: the count's release is not accounted)");
  uncounted[2].erase("robust");
  test::expect_claims_fail(uncounted, "record 3 (round 2): its distributed DP parameters do not match the signed setup "
                                      "the silos were sent: its privacy part's bits, gamma, variance, clip_norm, beta, "
                                      "rotation_seed and padded_length are not the signed setup it names");
  // A setup signed, and hashed, honestly without a count word, in a round whose C adapted: only
  // the explicit check catches it (the hash and the stated multipliers are all the vector's).
  auto vector_setup = c;
  vector_setup.count_scale = 0;
  auto adapted = four_committed_rounds(vector_setup).records;
  ASSERT_TRUE(succeeded(server::check_privacy_claims(adapted)));
  adapted[2]["robust"]["adaptive_clip"] = {{"clip_norm", 0.5}, {"next", 0.6}};
  test::expect_claims_fail(adapted, "record 3 (round 2): its distributed DP spend cannot be read (its clip norm "
                                    "adapted to a count of unclipped updates (robust.adaptive_clip) but its privacy "
                                    "part states no count_scale");
  // The count's part of the round, taken away, would claim less: the epsilon the records state is
  // more than the vector alone would cost.
  privacy::Ledger less;
  less.add(server::round_mechanism(vector_setup), 4);
  EXPECT_GT(ok->silo_epsilon, server::epsilon_of(less, c.delta));
}

// `xsilo audit verify` compares what a distributed-DP record states its spend by (docs/privacy.md
// lets a reader take it from noise_multiplier, l1 and l2) with what its signed setup gives, as in
// central mode: a record stating a larger or smaller multiplier or sensitivity, or with adaptive
// clipping another count_stddev or update_noise_multiplier, or leaving one out, fails, naming it.
TEST(DistributedDp, AuditVerifyFailsARecordWhoseStatedMultipliersAreNotItsSignedSetups) {
  auto fixed = digits_like(20, 8, 10);
  server::finalize_distributed_dp(fixed, 4810);
  auto adaptive = digits_like(20, 8, 10);
  adaptive.counts_unclipped = true;
  adaptive.count_stddev = 1.5;
  server::finalize_distributed_dp(adaptive, 4810);
  ASSERT_GT(adaptive.count_scale, 0u);
  for (const auto* c : {&fixed, &adaptive}) {
    SCOPED_TRACE(c->count_scale > 0 ? "adaptive" : "fixed C");
    const auto log = four_committed_rounds(*c).records;
    ASSERT_TRUE(succeeded(server::check_privacy_claims(log)));
    std::vector<std::string> fields = {"noise_multiplier", "l1", "l2"};
    if (c->count_scale > 0) fields.insert(fields.end(), {"count_stddev", "update_noise_multiplier"});
    for (const auto& f : fields) {
      SCOPED_TRACE(f);
      for (const double by : {1.01, 0.99, 1 + 1e-8}) {
        auto lie = log;
        lie[2]["privacy"][f] = log[2]["privacy"][f].get<double>() * by;
        test::expect_claims_fail(lie, "record 3 (round 2): its distributed DP spend cannot be read (its privacy part's " +
                                          f + " ");
      }
      auto dropped = log;
      dropped[2]["privacy"].erase(f);
      test::expect_claims_fail(dropped, "(its privacy part has no number \"" + f + "\")");
      // A reader's rounding, well within a relative 1e-9, passes.
      auto rounded = log;
      rounded[2]["privacy"][f] = log[2]["privacy"][f].get<double>() * (1 + 1e-12);
      EXPECT_TRUE(succeeded(server::check_privacy_claims(rounded)));
    }
  }
}

// A record's packed width (secure.wire_bits) is checked by the rule silos and edges take a
// signed setup's by: the DP's bits below the ring, SecAgg, no count word. Another width, or one
// beside an adaptive count word, fails `audit verify` with the reason; the true width passes.
TEST(DistributedDp, AuditVerifyFailsARecordWhosePackedWidthIsNotItsDecodesBits) {
  auto fixed = digits_like(20, 8, 10);
  server::finalize_distributed_dp(fixed, 4810);
  auto log = four_committed_rounds(fixed).records;
  for (std::size_t i = 1; i < log.size(); ++i) log[i]["secure"] = {{"modulus_bits", 32}, {"wire_bits", fixed.bits}};
  EXPECT_TRUE(succeeded(server::check_privacy_claims(log)));
  auto other = log;
  other[2]["secure"]["wire_bits"] = fixed.bits - 4;
  test::expect_claims_fail(other, "record 3 (round 2): its secure.wire_bits: the secure setup packs its words in " +
                                      std::to_string(fixed.bits - 4) + " bits, not the " +
                                      std::to_string(fixed.bits) + " bits its distributed DP is decoded in");
  auto narrow = log;
  narrow[2]["secure"]["modulus_bits"] = 16;  // a ring no wider than the width
  test::expect_claims_fail(narrow, "not fewer than its ring's 16");
  auto field = log;
  field[2]["secure"]["protocol"] = "lightsecagg";
  test::expect_claims_fail(field, "masks in a prime field");
  auto junk = log;
  junk[2]["secure"]["wire_bits"] = -3;
  test::expect_claims_fail(junk, "its secure.wire_bits -3 is not a width of bits");

  auto adaptive = digits_like(20, 8, 10);
  adaptive.counts_unclipped = true;
  adaptive.count_stddev = 1.5;
  server::finalize_distributed_dp(adaptive, 4810);
  auto counted = four_committed_rounds(adaptive).records;
  counted[2]["secure"] = {{"modulus_bits", 32}, {"wire_bits", adaptive.bits}};
  test::expect_claims_fail(counted, "count word is read in the whole ring");
}

// The count word's sum reaches n h plus the noise's tail in the masking ring: a config whose h
// (sqrt(mu) / (2 count_stddev)) makes it pass 2^(ring - 1) is refused at load with the numbers,
// and the same config in a wider masking ring is not.
TEST(DistributedDp, ACountWordBeyondTheMaskingRingIsRefusedAtLoad) {
  auto c = digits_like(20, 8, 0);
  c.noise_multiplier = 1;
  c.counts_unclipped = true;
  c.count_stddev = 1e-6;  // h of about sqrt(mu) / 2e-6: 10 silos' 10 h far beyond 2^31
  c.ring = 32;
  try {
    auto refused = c;
    server::finalize_distributed_dp(refused, 4810);
    ADD_FAILURE() << "a count word of scale " << refused.count_scale << " fit 2^32";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the unclipped count word (scale "), std::string::npos) << what;
    EXPECT_NE(what.find(", 10 silos, noise variance "), std::string::npos) << what;
    EXPECT_NE(what.find("beyond the masking ring of 2^32; use more secure.bits or a larger count_stddev"),
              std::string::npos)
        << what;
  }
  c.ring = 64;
  server::finalize_distributed_dp(c, 4810);
  EXPECT_GT(10.0 * static_cast<double>(c.count_scale), std::ldexp(1.0, 31));
}

// The server's plausibility check of a group's decoded sum under adaptive clipping: the centred
// count u - n / 2 + noise / (2 h) may pass n / 2 by at most six of the noise's deviations (and 1);
// a count word beyond that (a member sent another word than +-h) fails the group, with its value.
TEST(DistributedDp, AnImplausibleCountWordFailsTheGroupsSum) {
  server::DistributedDpConfig dp;
  dp.padded = 4;
  dp.gamma = 100;
  dp.clip_norm = 1;
  dp.variance = 400;  // n = n_min = 4: the sum's noise deviation 20, 1 count at h = 10
  dp.count_scale = 10;
  // 4 coordinates (zero), the member count 4, then the centred count.
  auto sum = [](double count) { return server::GroupSum({0, 0, 0, 0, 4, count}, 4); };
  EXPECT_EQ(error_text(server::check_plausible_skellam_sum(sum(1.5), 4, 4, dp)), "");
  EXPECT_EQ(error_text(server::check_plausible_skellam_sum(sum(-8.9), 4, 4, dp)), "");  // 2 + 6 + 1
  EXPECT_EQ(error_text(server::check_plausible_skellam_sum(sum(12), 4, 4, dp)),
            "unclipped count word 12.000000 is beyond what 4 members' +-10 and the noise can make: a member sent "
            "another word");
  EXPECT_NE(error_text(server::check_plausible_skellam_sum(sum(-9.1), 4, 4, dp)).find("unclipped count word -9.1"),
            std::string::npos);
  // Without a count word the same values are the vector's and the member count only.
  dp.count_scale = 0;
  EXPECT_EQ(error_text(server::check_plausible_skellam_sum(server::GroupSum({0, 0, 0, 0, 4}, 4), 4, 4, dp)), "");
}

// The count word's scale h is rounded down (at least 1): the count's noise in count units,
// sqrt(mu) / (2 h), is never below the configured sigma_b, and h is the largest that keeps it
// there (rounded to the nearest, h would lower it half the time).
TEST(DistributedDp, TheCountsNoiseIsNeverBelowTheConfiguredCountStddev) {
  for (const double sigma_b : {0.3, 0.45, 0.7, 1.1, 1.5, 2.2, 3.3, 5.0}) {
    SCOPED_TRACE(sigma_b);
    auto c = digits_like(20, 8, 0);
    c.noise_multiplier = 1;
    c.counts_unclipped = true;
    c.count_stddev = sigma_b;
    server::finalize_distributed_dp(c, 4810);
    ASSERT_GT(c.count_scale, 1u);
    EXPECT_GE(server::count_noise_stddev(c), sigma_b);
    auto one_more = c;
    ++one_more.count_scale;
    EXPECT_LT(server::count_noise_stddev(one_more), sigma_b);
  }
}

// Adaptive clipping's C comes from noised counts, so a round's C is random, and gamma' C is gamma
// C only up to a rounding: a product an ulp above the planned one would make the round cost more
// than z was chosen for, and randomly refuse the last planned round. At any C the product is never
// above the planned one (the planned one itself for most C), and finalize leaves epsilon a relative
// 1e-9 margin over the planned rounds, so that they fit at any Cs, composed in any order, and one
// more does not.
TEST(DistributedDp, AdaptiveClippingsPlannedRoundsFitAtAnyClipNormsAndOneMoreDoesNot) {
  auto c = digits_like(20, 8, 10);
  c.counts_unclipped = true;
  c.count_stddev = 1.5;
  server::finalize_distributed_dp(c, 4810);
  const double planned = c.gamma * c.clip_norm;
  const auto at_plan = std::get<privacy::SkellamSum>(server::round_mechanism(c));
  privacy::Accountant a;
  a.compose(at_plan, c.rounds);
  EXPECT_LE(a.epsilon(c.delta).epsilon, 8 * (1 - 1e-9));
  std::size_t exact = 0;
  std::vector<double> clips;
  for (int k = 0; k < 2000; ++k) clips.push_back(c.clip_norm * std::exp(-3 + 6 * k / 1999.0));
  for (const double clip : clips) {
    const auto round = server::at_clip_norm(c, clip);
    ASSERT_EQ(round.clip_norm, clip);
    ASSERT_LE(round.gamma * round.clip_norm, planned) << "at C = " << clip;
    ASSERT_GT(std::nextafter(round.gamma, 1e300) * round.clip_norm, planned) << "at C = " << clip << ": not the largest";
    const auto m = std::get<privacy::SkellamSum>(server::round_mechanism(round));
    ASSERT_LE(m.l2, at_plan.l2);
    ASSERT_LE(m.l1, at_plan.l1);
    exact += round.gamma * round.clip_norm == planned ? 1 : 0;
  }
  EXPECT_GT(exact, clips.size() * 3 / 4);
  // The planned rounds at Cs taken along the grid, 200 runs of them: each fits.
  for (std::size_t run = 0; run < 200; ++run) {
    privacy::Ledger spent;
    for (std::uint64_t r = 0; r < c.rounds; ++r) {
      const auto round = server::at_clip_norm(c, clips[(run * 37 + r * 211) % clips.size()]);
      ASSERT_TRUE(server::fits_another_round(round, spent)) << "run " << run << ", round " << r + 1;
      spent.add(server::round_mechanism(round), 1);
    }
    EXPECT_FALSE(server::fits_another_round(server::at_clip_norm(c, clips[run]), spent)) << "run " << run;
  }
}

// A digits-sized federation's parameters, and the setup part a deviating server signs for it:
// the configured one with a sixteenth of the variance (a quarter of the noise multiplier).
server::DistributedDpConfig finalized() {
  auto c = digits_like(20, 8, 10);
  server::finalize_distributed_dp(c, 4810);
  return c;
}
wire::SkellamSetup sixteenth_of_the_variance(const server::DistributedDpConfig& c) {
  auto weak = server::signed_part(c, 7);
  weak.set_variance(c.variance / 16);
  return weak;
}

// Issue 42, a deviating server (docs/privacy.md): a round's record is built from the Skellam part
// its setups signed, not from the server's config, and names its hash. A server that signs a
// quarter of the configured variance is charged, and recorded, for that smaller noise.
TEST(DistributedDp, ARoundIsChargedAndRecordedForTheNoiseItsSetupSignedNotTheConfiguredOne) {
  const auto c = finalized();
  const auto weak = sixteenth_of_the_variance(c);
  privacy::Ledger spent;
  spent.add(server::round_mechanism(server::as_signed(c, weak, c.padded)), 1);
  const auto rec = server::round_privacy_record(c, weak, c.padded, spent);
  EXPECT_EQ(rec["variance"].get<double>(), c.variance / 16);
  EXPECT_NEAR(rec["noise_multiplier"].get<double>(), c.noise_multiplier / 4, 1e-9 * c.noise_multiplier);
  EXPECT_EQ(rec["setup_sha256"], protocol::skellam_sha256(weak, c.padded));
  EXPECT_NE(rec["setup_sha256"], protocol::skellam_sha256(server::signed_part(c, 7), c.padded));
  privacy::Ledger configured;
  configured.add(server::round_mechanism(c), 1);
  EXPECT_GT(rec["epsilon"].get<double>(), 2 * server::epsilon_of(configured, c.delta));
  // What the recovery and the audit check read back is the signed mechanism.
  const nlohmann::json round = {{"event", "round"}, {"round", 1}, {"status", "committed"}, {"privacy", rec}};
  const auto m = server::silo_level_mechanism_of(round);
  ASSERT_TRUE(m);
  EXPECT_EQ(*m, server::round_mechanism(server::as_signed(c, weak, c.padded)));
}

// The record's parameters must hash to the setup it names: a server that signed a weak setup
// but records its configured parameters (with the weak setup's hash, the one its silos hold) is
// caught by `xsilo audit verify`, as is a record that names no setup at all.
TEST(DistributedDp, AuditVerifyFailsWhenARecordsParametersAreNotTheSignedSetupItNames) {
  const auto c = finalized();
  const auto weak = sixteenth_of_the_variance(c);
  privacy::Ledger spent;
  spent.add(server::round_mechanism(c), 1);
  std::vector<nlohmann::json> log = {
      {{"event", "federation_start"}},
      {{"event", "round"}, {"round", 1}, {"status", "committed"},
       {"privacy", server::round_privacy_record(c, server::signed_part(c, 7), c.padded, spent)}}};
  const auto honest = server::check_privacy_claims(log);
  EXPECT_TRUE(succeeded(honest));
  auto lie = log;
  lie[1]["privacy"]["setup_sha256"] = protocol::skellam_sha256(weak, c.padded);
  test::expect_claims_fail(lie, "record 2 (round 1): its distributed DP parameters do not match the signed setup the "
                                "silos were sent: its privacy part's bits, gamma, variance");
  EXPECT_EQ(error_text(server::check_privacy_claims(lie)).find("cannot be read"), std::string::npos);
  // A smaller rotated length than was signed would shrink the sensitivity, and so the epsilon:
  // the hash covers it.
  auto shorter = log;
  shorter[1]["privacy"]["padded_length"] = c.padded / 2;
  test::expect_claims_fail(shorter, "not the signed setup it names");
  auto unnamed = log;
  unnamed[1]["privacy"].erase("setup_sha256");
  test::expect_claims_fail(unnamed, "do not match the signed setup the silos were sent: its privacy part names no "
                                    "setup_sha256");
  // A spend that cannot be read is said as such, in the record's own mode.
  auto unreadable = log;
  unreadable[1]["privacy"].erase("gamma");
  test::expect_claims_fail(unreadable, "record 2 (round 1): its distributed DP spend cannot be read (its privacy part "
                                       "has no number \"gamma\")");
}

// A log of distributed-DP records as the server writes them, and the spend they give: the
// round records, the unmask_begun records before their unmasking (a round record right after
// one is charged, aborted or not), and a round whose unmasking was interrupted (charged, with no
// record of its own).
struct SkellamLog {
  server::DistributedDpConfig c = finalized();
  wire::SkellamSetup k = server::signed_part(c, 7);
  privacy::Mechanism mech = server::round_mechanism(server::as_signed(c, k, c.padded));
  privacy::Ledger spent;
  std::vector<nlohmann::json> log = {{{"event", "federation_start"}}};
  bool unmasking = false;  // the last record is an unmask_begun

  void round(std::uint64_t r, const char* status, std::uint64_t revealed) {
    if (std::string(status) == "committed" || revealed > 0 || unmasking) spent.add(mech, 1);
    unmasking = false;
    auto p = server::round_privacy_record(c, k, c.padded, spent);
    p["sums_revealed"] = revealed;
    log.push_back({{"event", "round"}, {"round", r}, {"status", status}, {"privacy", p}});
  }
  void begun(std::uint64_t r) {
    auto if_charged = spent;
    if_charged.add(mech, 1);
    log.push_back({{"event", server::kUnmaskBegun}, {"round", r},
                   {"privacy", server::round_privacy_record(c, k, c.padded, if_charged)}});
    unmasking = true;
  }
  void interrupted() {
    spent.add(mech, 1);
    unmasking = false;
  }
};

// Issue 42: a round that aborts after its noisy sums were unmasked has released them to the
// server: its record says how many ("sums_revealed") and states the spend with it, and the audit
// check (as the recovery, which reads the same records) counts it; a round that aborted before
// any unmasking spends nothing, and an aborted record that hides its spend is caught.
TEST(DistributedDp, ARoundAbortedAfterItsSumsWereUnmaskedSpendsAndAuditVerifyCountsIt) {
  SkellamLog s;
  s.round(1, "committed", 2);
  s.round(2, "aborted", 2);  // both groups unmasked, then too few updates left: spent
  s.round(3, "aborted", 0);  // aborted while collecting: nothing seen
  s.round(4, "committed", 1);
  const auto& log = s.log;
  const auto ok = server::check_privacy_claims(log);
  ASSERT_TRUE(succeeded(ok));
  EXPECT_EQ(ok->silo_mode, "distributed");
  EXPECT_EQ(ok->silo_committed, 2u);
  EXPECT_EQ(ok->silo_aborted, 1u);  // round 2; round 3 spent nothing
  EXPECT_EQ(ok->silo_interrupted, 0u);
  EXPECT_EQ(ok->silo_rounds(), 3u);
  EXPECT_NEAR(ok->silo_epsilon, server::epsilon_of(s.spent, s.c.delta), 1e-12);
  EXPECT_TRUE(server::silo_level_mechanism_of(log[2]));
  EXPECT_FALSE(server::silo_level_mechanism_of(log[3]));
  // Round 2's record claiming only the spend before it (as if the abort had spent nothing).
  auto hidden = log;
  hidden[2]["privacy"]["epsilon"] = log[1]["privacy"]["epsilon"];
  test::expect_claims_fail(hidden, "record 3 (round 2): distributed DP claims epsilon");
  auto unreadable = log;
  unreadable[2]["privacy"]["sums_revealed"] = "two";
  EXPECT_FALSE(server::check_privacy_claims(unreadable).has_value());
}

// Issue 42: the server writes an unmask_begun record before it asks any silo for unmask shares.
// The round record that follows closes it and is charged once, aborted or not (an abort after the
// shares were asked for, with no sum revealed, is charged too: the shares the server holds could
// unmask the sum); one that no record of its round follows (the server started again, or the log
// ends) is charged. An unmask_begun record's own claim is checked as if charged, and its
// parameters must be the setup it names.
TEST(DistributedDp, AnUnmaskingWhoseRoundRecordNeverFollowedIsChargedAndOneThatIsFollowedIsChargedOnce) {
  SkellamLog s;
  s.begun(1);
  s.round(1, "committed", 1);  // once
  s.begun(2);
  s.round(2, "aborted", 0);  // too few unmask answers, no sum revealed: charged all the same, once
  s.round(3, "aborted", 0);  // aborted while collecting (no unmask_begun): nothing
  s.begun(4);
  s.interrupted();  // the server died before round 4's record
  s.log.push_back({{"event", "federation_start"}});
  s.begun(4);
  s.round(4, "committed", 1);
  s.begun(5);
  s.interrupted();  // the log ends while round 5 unmasks
  const auto ok = server::check_privacy_claims(s.log);
  ASSERT_TRUE(succeeded(ok)) << ok.error().message();
  EXPECT_EQ(ok->silo_committed, 2u);    // rounds 1 and 4
  EXPECT_EQ(ok->silo_aborted, 1u);      // round 2, aborted after its unmasking began
  EXPECT_EQ(ok->silo_interrupted, 2u);  // round 4's first unmasking, and round 5's
  EXPECT_EQ(ok->silo_rounds(), 5u);
  EXPECT_NEAR(ok->silo_epsilon, server::epsilon_of(s.spent, s.c.delta), 1e-12);
  // Round 2's record on its own does not charge (no sum revealed): the unmask_begun before it does.
  EXPECT_FALSE(server::silo_level_mechanism_of(s.log[4]));
  // Round 2's record claiming only the spend before it (as if the abort had spent nothing).
  auto unspent = s.log;
  unspent[4]["privacy"]["epsilon"] = s.log[2]["privacy"]["epsilon"];
  test::expect_claims_fail(unspent, "record 5 (round 2): distributed DP claims epsilon");
  // The same records, read by the watch as the recovery reads them.
  server::UnmaskingWatch watch;
  privacy::Ledger rebuilt;
  std::vector<std::pair<std::uint64_t, bool>> charged;  // the watch's charges: round, interrupted
  for (const auto& r : s.log) {
    if (const auto c = watch.take(r)) {
      rebuilt.add(c->mechanism, 1);
      charged.emplace_back(c->round, c->interrupted);
    }
    if (const auto m = server::silo_level_mechanism_of(r)) rebuilt.add(*m, 1);
  }
  EXPECT_EQ(charged, (std::vector<std::pair<std::uint64_t, bool>>{{2, false}, {4, true}}));
  EXPECT_EQ(watch.open_round(), 5u);
  ASSERT_TRUE(watch.open());
  rebuilt.add(*watch.open(), 1);
  EXPECT_EQ(rebuilt, s.spent);
  // An unmask_begun record claiming the spend without its round; one with other parameters than its setup.
  auto hidden = s.log;
  hidden[6]["privacy"]["epsilon"] = s.log[4]["privacy"]["epsilon"];
  test::expect_claims_fail(hidden, "record 7 (round 4): distributed DP claims epsilon");
  auto weaker = s.log;
  weaker[6]["privacy"]["variance"] = s.c.variance / 4;
  test::expect_claims_fail(weaker, "not the signed setup it names");
}

// Review of issue 42: a deviating server sends the silos a weak setup, writes unmask_begun naming
// it, then a round record of the same round naming the strong setup (charged at it). The watch,
// which the audit check and the recovery share, refuses a round record that closes an
// unmask_begun of its round under another setup. And a second round record of one round with no
// restart between (an aborted one naming one setup, a committed one another) is refused: an honest
// server runs a round number again only after a federation_start.
TEST(DistributedDp, ARoundRecordOfAnotherSetupThanItsUnmaskBegunOrASecondRecordOfItsRoundFailsVerify) {
  SkellamLog s;
  auto weak = s.k;
  weak.set_variance(s.c.variance * 0.9);  // weaker, within the budget: the round record must still match
  privacy::Ledger weak_spent;
  weak_spent.add(server::round_mechanism(server::as_signed(s.c, weak, s.c.padded)), 1);
  s.log.push_back({{"event", server::kUnmaskBegun}, {"round", 1},
                   {"privacy", server::round_privacy_record(s.c, weak, s.c.padded, weak_spent)}});
  s.round(1, "committed", 1);
  test::expect_claims_fail(s.log, "the unmask_begun record it closes names setup " +
                                      protocol::skellam_sha256(weak, s.c.padded));
  server::UnmaskingWatch watch;
  EXPECT_FALSE(watch.take(s.log[0]));
  EXPECT_FALSE(watch.take(s.log[1]));
  EXPECT_THROW(watch.take(s.log[2]), std::invalid_argument);

  SkellamLog twice;
  twice.round(1, "aborted", 0);
  twice.round(1, "committed", 1);
  test::expect_claims_fail(twice.log, "record 3 (round 1): a second record of this round with no federation_start");
  SkellamLog restarted;  // the same round run again after a restart: fine
  restarted.round(1, "aborted", 0);
  restarted.log.push_back({{"event", "federation_start"}});
  restarted.round(1, "committed", 1);
  EXPECT_TRUE(succeeded(server::check_privacy_claims(restarted.log)));
}

// Issue 42 item 5: a robust rule across secure groups under distributed DP, in-process (digits,
// logistic, 20 silos in four groups of five, three of them sign-flipping): the rule runs on the
// groups' noisy means, the model learns, and the spend is the accountant's for the six rounds the
// noise was chosen for, the very epsilon the same federation spends with fedavg (the rule is
// post-processing of the released sums).
TEST(DistributedDp, ARobustRuleAcrossNoisyGroupSumsLearnsAndSpendsWhatFedAvgSpends) {
  test::TempDir dir;
  auto run = [&](const char* rule) {
    nlohmann::json j = {
        {"name", rule}, {"silos", 20}, {"rounds", 6}, {"seed", 4}, {"baseline", false},
        {"data", {{"dataset", "digits"}, {"standardize", true}}},
        {"model", {{"kind", "logistic"}}},
        {"training", {{"local_epochs", 2}, {"batch_size", 32}, {"learning_rate", 0.05}}},
        {"selection", {{"min_silos", 20}, {"min_updates", 20}}},
        {"secure", {{"mode", "grouped"}, {"min_group", 5}, {"group_dropouts", 0}, {"max_weight", 1}}},
        {"aggregation", {{"rule", rule}, {"f", std::string(rule) == "fedavg" ? 0 : 1}}},
        {"attack", {{"silos", 3}, {"kind", "sign_flip"}, {"scale", 4.0}}},
        {"privacy", {{"level", "silo"}, {"mode", "distributed"}, {"epsilon", 30.0}, {"delta", 1e-5},
                     {"rounds", 6}, {"clip_norm", 0.3}, {"bits", 20}}}};
    atomic_write_file(dir / (std::string(rule) + ".json"), j.dump());
    std::vector<double> accuracy;  // after each committed round
    const auto r = tools::run_sim_in_process(tools::load_sim_config(dir / (std::string(rule) + ".json")), dir / rule,
                                             [&](std::uint64_t, bool committed, const Model&, double a, double) {
                                               if (committed) accuracy.push_back(a);
                                             });
    return std::pair(r, accuracy);
  };
  const auto [fedavg, fedavg_accuracy] = run("fedavg");
  EXPECT_EQ(fedavg.rounds_committed, 6u);
  for (const char* rule : {"median", "trimmed_mean"}) {
    SCOPED_TRACE(rule);
    const auto [r, accuracy] = run(rule);
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_EQ(r.rounds_committed, 6u);
    // Six rounds at the noise chosen for six: just within the budget, and exactly fedavg's.
    EXPECT_LE(r.epsilon_spent, 30.0);
    EXPECT_GT(r.epsilon_spent, 29.97);
    EXPECT_EQ(r.epsilon_spent, fedavg.epsilon_spent);
    // The model learns on the noisy group means (at epsilon 30 with 20 silos, about 0.27 after one
    // round and 0.6 after six, fedavg's too; chance is 0.1).
    ASSERT_EQ(accuracy.size(), 6u);
    std::string curve;
    for (const double a : accuracy) curve += std::to_string(a) + " ";
    EXPECT_GT(r.final_accuracy, 0.45) << curve << "; fedavg " << fedavg.final_accuracy;
    EXPECT_GT(r.final_accuracy, accuracy.front() + 0.15) << curve;
  }
}

}  // namespace
}  // namespace xsilo
