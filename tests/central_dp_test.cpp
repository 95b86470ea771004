// Silo-level differential privacy, central mode (server/central_dp.h, docs/privacy.md): the
// server's aggregator clips each silo's delta, divides by the fixed denominator and adds noise of
// z C / W; the accountant, the budget's end and the audit check of every round's claim.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "crypto/hash.h"
#include "protocol/upload_slot.h"
#include "server/aggregator.h"
#include "server/audit.h"
#include "server/central_dp.h"
#include "tests/privacy_claims.h"
#include "tests/result_util.h"

namespace xsilo {
namespace {

constexpr std::size_t kDim = 20000;

Model layout(std::size_t d = kDim) {
  Model m;
  m.add("w", {d});
  return m;
}

crypto::NoiseSource::Key key(std::uint8_t b) {
  crypto::NoiseSource::Key k{};
  k.fill(b);
  return k;
}

server::RoundConfig central(double z, double clip, double denominator) {
  server::RoundConfig cfg;
  server::CentralDpConfig dp;
  dp.epsilon = 10;
  dp.noise_multiplier = z;
  dp.clip_norm = clip;
  dp.denominator = denominator;
  cfg.central_dp = dp;
  return cfg;
}

// Each (weight * delta) upload through the aggregator as the server's slot hands it over, then
// the round's step.
std::vector<float> step_of(const server::RoundConfig& cfg, const std::vector<std::vector<float>>& uploads,
                           const std::vector<double>& weights, std::optional<crypto::NoiseSource::Key> k) {
  const Model l = layout(uploads.empty() ? kDim : uploads[0].size());
  auto agg = server::make_central_dp_sum(cfg, l, k);
  for (std::size_t i = 0; i < uploads.size(); ++i) {
    auto buf = agg->buffer();
    std::memcpy(buf.bytes.data(), uploads[i].data(), uploads[i].size() * sizeof(float));
    auto check = std::make_shared<protocol::UploadCheck>();
    protocol::check_work(check, buf.bytes.data(), uploads[i].size(), wire::F32, true)();
    const server::Contribution c{.silos = {"silo-" + std::to_string(i)}, .weight = weights[i], .group = 0,
                                 .declared_sha256 = crypto::sha256_hex(std::span<const float>(uploads[i])),
                                 .partial_sum = false, .scale = 1};
    EXPECT_TRUE(agg->fold(c, *check).has_value());
  }
  std::vector<float> out(l.size());
  EXPECT_TRUE(agg->combine(out, {}).has_value());
  return out;
}

double stddev(const std::vector<float>& v) {
  double sum = 0, sq = 0;
  for (float x : v) {
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(v.size()), mean = sum / n;
  return std::sqrt(sq / n - mean * mean);
}

double distance(const std::vector<float>& a, const std::vector<float>& b) {
  double sq = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sq += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(sq);
}

// With every update zero the step is the noise alone: its spread is z C / W, whatever z and C
// make that product. At a fixed key the sample is fixed, so the tolerance (six standard errors
// of a standard deviation estimated from 20000 draws, sqrt(1 / (2 n)) relative) cannot fail by
// chance; a wrong factor (W, C, z, or a variance taken for a deviation) is far outside it.
TEST(CentralDp, TheNoisesStandardDeviationIsZTimesTheClipNormOverTheDenominator) {
  const std::vector<std::vector<float>> zeros(3, std::vector<float>(kDim, 0.0f));
  const std::vector<double> ones(3, 1.0);
  const double tol = 6 / std::sqrt(2.0 * kDim);
  struct Case {
    double z, c, w;
  };
  for (const Case k : {Case{1.0, 2.0, 4.0}, Case{2.0, 1.0, 4.0}, Case{2.0, 1.0, 8.0}, Case{0.5, 3.0, 10.0}}) {
    const double want = k.z * k.c / k.w;
    const double got = stddev(step_of(central(k.z, k.c, k.w), zeros, ones, key(7)));
    EXPECT_NEAR(got / want, 1.0, tol) << "z " << k.z << ", C " << k.c << ", W " << k.w;
  }
  // The same key gives the same noise; without a key each round draws a fresh one.
  const auto cfg = central(1.0, 1.0, 4.0);
  EXPECT_EQ(step_of(cfg, zeros, ones, key(3)), step_of(cfg, zeros, ones, key(3)));
  EXPECT_NE(step_of(cfg, zeros, ones, std::nullopt), step_of(cfg, zeros, ones, std::nullopt));
}

// Adding one silo moves the step by at most C / W, whatever the silo sends and whatever weight
// (sample count) it claims: its delta is clipped, and every delta counts once.
TEST(CentralDp, OneSiloMovesTheStepByAtMostTheClipNormOverTheDenominator) {
  const std::size_t d = 50;
  const double clip = 1.0, w = 4;  // the honest updates' norms are at most 0.52
  const auto cfg = central(1e-9, clip, w);  // noise far below float rounding of the step
  std::vector<std::vector<float>> honest(3, std::vector<float>(d));
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t j = 0; j < d; ++j) honest[i][j] = 0.01f * static_cast<float>((i + 1) * (j % 5));
  }
  const std::vector<double> ones(3, 1.0);
  const auto without = step_of(cfg, honest, ones, key(1));
  auto with = honest;
  with.push_back(std::vector<float>(d, 1e6f));  // a huge update
  const double claimed_weight = 1000;           // and a huge sample count: weight * delta
  for (auto& v : with.back()) v *= static_cast<float>(claimed_weight);
  auto weights = ones;
  weights.push_back(claimed_weight);
  const auto added = step_of(cfg, with, weights, key(1));
  EXPECT_LE(distance(without, added), clip / w * (1 + 1e-5));
  EXPECT_GT(distance(without, added), clip / w * 0.99);  // clipped to C, not dropped
  // The honest updates are small: within C, they pass unchanged, divided by W (not by 3).
  const auto sum_over_w = [&](std::size_t j) { return (honest[0][j] + honest[1][j] + honest[2][j]) / w; };
  EXPECT_NEAR(without[7], sum_over_w(7), 1e-6);
}

// At full participation (q = 1) a round is the Gaussian mechanism with multiplier z, composed
// over rounds: the accountant agrees with dp-accounting's values checked into
// tests/data/privacy_reference.json (scripts/privacy_reference.py).
TEST(CentralDp, TheSpendOfItsRoundsAgreesWithDpAccountingAtFullParticipation) {
  std::ifstream in(std::string(XSILO_SOURCE_DIR) + "/tests/data/privacy_reference.json");
  ASSERT_TRUE(in) << "tests/data/privacy_reference.json";
  const auto ref = nlohmann::json::parse(in);
  const double delta = ref["delta"].get<double>();
  int checked = 0;
  for (const auto& c : ref["subsampled_gaussian"]) {
    if (c["q"].get<double>() != 1.0) continue;
    server::CentralDpConfig dp;
    dp.noise_multiplier = c["sigma"].get<double>();
    privacy::Ledger spent;
    spent.add(server::round_mechanism(dp), c["steps"].get<std::uint64_t>());
    const double want = c["dp_accounting"]["epsilon"].get<double>();
    EXPECT_NEAR(server::epsilon_of(spent, delta), want, 1e-6 * want) << c.dump();
    ++checked;
  }
  EXPECT_EQ(checked, 15);  // sigma in {0.5, 0.8, 1, 2, 5} x steps in {1, 100, 10000}
}

// The noise is chosen to last the planned rounds: they fit, one more does not.
TEST(CentralDp, TheNoiseLastsThePlannedRoundsAndNotOneMore) {
  server::CentralDpConfig dp;
  dp.epsilon = 3;
  dp.delta = 1e-5;
  dp.rounds = 20;
  dp.noise_multiplier = server::noise_multiplier_for_rounds(dp.epsilon, dp.delta, 1.0, dp.rounds);
  privacy::Ledger spent;
  for (std::uint64_t r = 0; r < dp.rounds; ++r) {
    ASSERT_TRUE(server::fits_another_round(dp, spent)) << "round " << r + 1;
    spent.add(server::round_mechanism(dp), 1);
  }
  EXPECT_LE(server::epsilon_of(spent, dp.delta), dp.epsilon);
  EXPECT_GT(server::epsilon_of(spent, dp.delta), 0.99 * dp.epsilon);
  EXPECT_FALSE(server::fits_another_round(dp, spent));
}

nlohmann::json committed_round(std::uint64_t r, const server::CentralDpConfig& dp, const privacy::Ledger& spent) {
  return {{"event", "round"}, {"round", r}, {"status", "committed"}, {"privacy", server::round_privacy_record(dp, spent)}};
}

// `xsilo audit verify` recomposes every committed round's spend from its recorded parameters: a
// record that claims less than they give, or more spent than its budget, fails; an aborted
// round spends nothing.
TEST(CentralDp, AuditVerifyCatchesARecordThatClaimsLessThanItsRoundsGive) {
  server::CentralDpConfig dp;
  dp.epsilon = 10;
  dp.noise_multiplier = 1.5;
  dp.denominator = 10;
  std::vector<nlohmann::json> log = {{{"event", "federation_start"}}};
  privacy::Ledger spent;
  for (std::uint64_t r = 1; r <= 4; ++r) {
    spent.add(server::round_mechanism(dp), 1);
    log.push_back(committed_round(r, dp, spent));
  }
  log.push_back({{"event", "round"}, {"round", 5}, {"status", "aborted"}, {"privacy", server::round_privacy_record(dp, spent)}});
  const auto ok = server::check_privacy_claims(log);
  EXPECT_TRUE(succeeded(ok));
  EXPECT_EQ(ok->silo_rounds(), 4u);
  EXPECT_NEAR(ok->silo_epsilon, server::epsilon_of(spent, dp.delta), 1e-12);

  // Round 3 claims round 1's spend only.
  test::expect_understated_epsilon_caught(log, "central DP");
  // An aborted round states the spend so far, and is held to it too.
  auto aborted_lie = log;
  aborted_lie[5]["privacy"]["epsilon"] = 0.0;
  const auto aborted = server::check_privacy_claims(aborted_lie);
  EXPECT_FALSE(aborted.has_value());
  EXPECT_NE(aborted.error().message().find("record 6 (round 5): central DP claims epsilon 0"), std::string::npos) << aborted.error().message();
  // A record whose noise was smaller than the later ones state (the claim is then too low).
  auto weaker = log;
  weaker[2]["privacy"]["noise_multiplier"] = 0.5;
  EXPECT_FALSE(server::check_privacy_claims(weaker).has_value());
  // Past the recorded budget.
  auto over = log;
  over[4]["privacy"]["max_epsilon"] = 0.1;
  const auto past = server::check_privacy_claims(over);
  EXPECT_FALSE(past.has_value());
  EXPECT_NE(past.error().message().find("past the budget"), std::string::npos) << past.error().message();
  // Unreadable parameters.
  auto broken = log;
  broken[1]["privacy"].erase("noise_multiplier");
  const auto unread = server::check_privacy_claims(broken);
  EXPECT_FALSE(unread.has_value());
  EXPECT_NE(unread.error().message().find("cannot be read"), std::string::npos) << unread.error().message();
  // An aborted round's part without its delta or epsilon: a clear failure, not a read past the end.
  for (const char* key : {"delta", "epsilon"}) {
    auto missing = log;
    missing[5]["privacy"].erase(key);
    const auto m = server::check_privacy_claims(missing);
    EXPECT_FALSE(m.has_value()) << key;
    EXPECT_NE(m.error().message().find("record 6 (round 5): its central DP spend cannot be read"), std::string::npos) << m.error().message();
  }
}

// A silo claiming a weight so small that 1 / w overflows float (or sending values that would
// overflow once divided by it) still moves the step by at most C / W: the factor is taken in
// double and the norm is never infinite or NaN, so the round commits.
TEST(CentralDp, ATinyClaimedWeightCannotOverflowTheClippingOrAbortTheRound) {
  const std::size_t d = 50;
  const double clip = 1.0, w = 4;
  const auto cfg = central(1e-9, clip, w);
  std::vector<std::vector<float>> honest(3, std::vector<float>(d, 0.01f));
  const std::vector<double> ones(3, 1.0);
  const auto without = step_of(cfg, honest, ones, key(2));
  for (const double tiny : {1e-39, 1e-300}) {
    auto with = honest;
    with.push_back(std::vector<float>(d, 3e38f));  // finite, and each value above float's max once over w
    auto weights = ones;
    weights.push_back(tiny);
    const auto added = step_of(cfg, with, weights, key(2));
    for (float v : added) ASSERT_TRUE(std::isfinite(v)) << tiny;
    EXPECT_LE(distance(without, added), clip / w * (1 + 1e-5)) << tiny;
    EXPECT_GT(distance(without, added), clip / w * 0.99) << tiny;
  }
}

// Adaptive clipping's count (server/central_dp.h): each round adds, at every order alpha, the
// RDP of a Gaussian of sensitivity 1/2 and standard deviation sigma_b, alpha / (2 (2 sigma_b)^2),
// to the update's alpha / (2 z^2): the closed form, computed here on its own, against the
// accountant's composition of the recorded mechanism.
TEST(CentralDp, TheUnclippedCountAddsTheRdpOfItsGaussianToEachRound) {
  server::CentralDpConfig dp;
  dp.noise_multiplier = 1.3;
  const std::uint64_t rounds = 7;
  privacy::Ledger without;
  without.add(server::round_mechanism(dp), rounds);
  dp.count_stddev = 2.0;
  privacy::Ledger with;
  with.add(server::round_mechanism(dp), rounds);
  const auto a = privacy::Accountant::replay(with), b = privacy::Accountant::replay(without);
  std::vector<double> closed;
  for (std::size_t i = 0; i < a.orders().size(); ++i) {
    const double alpha = a.orders()[i];
    const double update = alpha / (2 * 1.3 * 1.3), count = alpha / (2 * (2 * 2.0) * (2 * 2.0));
    closed.push_back(rounds * (update + count));
    EXPECT_NEAR(a.rdp()[i], closed.back(), 1e-9 * closed.back()) << "order " << alpha;
    EXPECT_NEAR(a.rdp()[i] - b.rdp()[i], rounds * count, 1e-9 * closed.back()) << "order " << alpha;
  }
  const double eps_closed = privacy::epsilon_from_rdp(a.orders(), closed, 1e-5).epsilon;
  EXPECT_NEAR(server::epsilon_of(with, 1e-5), eps_closed, 1e-9 * eps_closed);
  EXPECT_GT(server::epsilon_of(with, 1e-5), server::epsilon_of(without, 1e-5) * 1.05);
  // The update's z that, with sigma_b, makes a round's z; none when 2 sigma_b does not exceed it.
  EXPECT_NEAR(server::update_noise_multiplier(server::round_noise_multiplier(1.3, 2.0), 2.0), 1.3, 1e-12);
  EXPECT_THROW(server::update_noise_multiplier(1.0, 0.5), std::invalid_argument);
  // The default sigma_b: the paper's W / 20 where that costs little, else a tenth of the round's RDP.
  EXPECT_DOUBLE_EQ(server::default_count_stddev(1000, 1.0), 50);
  const double z_round = 2.0, s = server::default_count_stddev(10, z_round);
  EXPECT_NEAR((z_round / (2 * s)) * (z_round / (2 * s)), 0.1, 1e-12);
}

// With adaptive clipping and `rounds`, the round's noise (update and count together) is the one
// that lasts them: the federation spends its budget exactly, and one more round does not fit.
TEST(CentralDp, WithTheCountTheNoiseStillLastsThePlannedRoundsAndNotOneMore) {
  server::CentralDpConfig dp;
  dp.epsilon = 8;
  dp.delta = 1e-5;
  dp.rounds = 10;
  dp.denominator = 10;
  const double z_round = server::noise_multiplier_for_rounds(dp.epsilon, dp.delta, 1.0, dp.rounds);
  dp.count_stddev = server::default_count_stddev(dp.denominator, z_round);
  dp.noise_multiplier = server::update_noise_multiplier(z_round, dp.count_stddev);
  EXPECT_GT(dp.noise_multiplier, z_round);  // the update gets less of the budget than without a count
  privacy::Ledger spent;
  for (std::uint64_t r = 0; r < dp.rounds; ++r) {
    ASSERT_TRUE(server::fits_another_round(dp, spent)) << "round " << r + 1;
    spent.add(server::round_mechanism(dp), 1);
  }
  EXPECT_LE(server::epsilon_of(spent, dp.delta), dp.epsilon);
  EXPECT_GT(server::epsilon_of(spent, dp.delta), 0.999 * dp.epsilon);
  EXPECT_FALSE(server::fits_another_round(dp, spent));
  // Leaving the count out would claim less: the update's noise alone spends below the budget.
  auto update_only = dp;
  update_only.count_stddev = 0;
  privacy::Ledger partial;
  partial.add(server::round_mechanism(update_only), dp.rounds);
  EXPECT_LT(server::epsilon_of(partial, dp.delta), 0.97 * dp.epsilon);
}

// The norms of twenty silos' deltas spread evenly over (0, 2]; C starts at 0.1 and follows the
// median of the norms from the noised count alone (sigma_b 1 over W 20), to within the noise's
// reach; every round clips with its own C and states it, with the count's noise and never the
// count itself.
TEST(CentralDp, AdaptiveClippingFollowsTheQuantileOfTheNormsFromTheNoisedCount) {
  const std::size_t d = 40, silos = 20;
  auto cfg = central(1e-9, 0.1, static_cast<double>(silos));
  cfg.central_dp->count_stddev = 1.0;
  cfg.aggregation.adaptive_clip = {.quantile = 0.5, .lr = 0.2, .initial = 0.1, .min = 1e-4};
  std::vector<std::vector<float>> uploads(silos, std::vector<float>(d));
  for (std::size_t i = 0; i < silos; ++i) {
    const double norm = 0.1 * static_cast<double>(i + 1);  // 0.1 .. 2.0: the median is 1.05
    for (std::size_t j = 0; j < d; ++j) uploads[i][j] = static_cast<float>(norm / std::sqrt(static_cast<double>(d)));
  }
  const std::vector<double> ones(silos, 1.0);
  double c = 0.1;
  std::vector<double> late;
  for (std::uint8_t r = 0; r < 60; ++r) {
    const Model l = layout(d);
    auto agg = server::make_central_dp_sum(cfg, l, key(r), c);
    for (std::size_t i = 0; i < silos; ++i) {
      auto buf = agg->buffer();
      std::memcpy(buf.bytes.data(), uploads[i].data(), d * sizeof(float));
      auto check = std::make_shared<protocol::UploadCheck>();
      protocol::check_work(check, buf.bytes.data(), d, wire::F32, true)();
      const server::Contribution k{.silos = {"silo-" + std::to_string(i)}, .weight = 1, .group = 0,
                                   .declared_sha256 = crypto::sha256_hex(std::span<const float>(uploads[i])),
                                   .partial_sum = false, .scale = 1};
      ASSERT_TRUE(agg->fold(k, *check).has_value());
    }
    std::vector<float> out(d);
    auto res = agg->combine(out, {});
    ASSERT_TRUE(res.has_value());
    // Every update's norm above C is clipped to C: the step's norm is at most n C / W.
    double sq = 0;
    for (float v : out) sq += static_cast<double>(v) * v;
    EXPECT_LE(std::sqrt(sq), c * (1 + 1e-5));
    const auto& part = res->record["robust"]["adaptive_clip"];
    ASSERT_TRUE(part.is_object()) << res->record.dump();
    EXPECT_EQ(part["clip_norm"].get<double>(), c);
    EXPECT_EQ(part["count_stddev"].get<double>(), 1.0);
    EXPECT_FALSE(part.contains("unclipped"));
    ASSERT_TRUE(res->next_clip_norm);
    EXPECT_EQ(*res->next_clip_norm, part["next"].get<double>());
    c = *res->next_clip_norm;
    if (r >= 40) late.push_back(c);
  }
  // The median of the norms is 1.05; the noise on the fraction (1 / 20) moves C by a few percent.
  for (const double v : late) {
    EXPECT_GT(v, 0.75) << "late C";
    EXPECT_LT(v, 1.45) << "late C";
  }
  // The count is noised at count_stddev: one round at C = 1.05 leaves 10 of the 20 norms unclipped,
  // which a vanishing sigma_b reports as 0.5 and sigma_b 3 (0.15 on the fraction) does not.
  auto fraction_at = [&](double sigma_b, std::uint8_t k, std::size_t n) {
    auto at = cfg;
    at.central_dp->count_stddev = sigma_b;
    const Model l = layout(d);
    auto agg = server::make_central_dp_sum(at, l, key(k), 1.05);
    for (std::size_t i = 0; i < n; ++i) {
      auto buf = agg->buffer();
      std::memcpy(buf.bytes.data(), uploads[i].data(), d * sizeof(float));
      auto check = std::make_shared<protocol::UploadCheck>();
      protocol::check_work(check, buf.bytes.data(), d, wire::F32, true)();
      const server::Contribution u{.silos = {"silo-" + std::to_string(i)}, .weight = 1, .group = 0,
                                   .declared_sha256 = crypto::sha256_hex(std::span<const float>(uploads[i])),
                                   .partial_sum = false, .scale = 1};
      EXPECT_TRUE(agg->fold(u, *check).has_value());
    }
    std::vector<float> out(d);
    auto res = agg->combine(out, {});
    EXPECT_TRUE(res.has_value());
    return res->record["robust"]["adaptive_clip"]["unclipped_fraction"].get<double>();
  };
  EXPECT_NEAR(fraction_at(1e-9, 9, silos), 0.5, 1e-9);
  // With fewer uploads than W the released fraction is the centred count over W:
  // (u - n / 2) / W + 1 / 2, u the unclipped among the n (the paper's estimator at a fixed W).
  const std::size_t fewer = 13;
  double u = 0;
  for (std::size_t i = 0; i < fewer; ++i) {
    double sq = 0;
    for (float v : uploads[i]) sq += static_cast<double>(v) * v;
    u += std::sqrt(sq) <= 1.05 ? 1 : 0;
  }
  EXPECT_NEAR(fraction_at(1e-9, 9, fewer), (u - fewer / 2.0) / static_cast<double>(silos) + 0.5, 1e-9) << u;
  EXPECT_NE((u - fewer / 2.0) / static_cast<double>(silos) + 0.5, u / static_cast<double>(silos)) << u;
  double spread = 0;
  for (std::uint8_t k = 0; k < 20; ++k) spread += (fraction_at(3.0, k, silos) - 0.5) * (fraction_at(3.0, k, silos) - 0.5);
  EXPECT_GT(std::sqrt(spread / 20), 0.05);  // about 0.15, the noise over W
  EXPECT_LT(std::sqrt(spread / 20), 0.3);
  // Without adaptive clipping the aggregator releases no count.
  auto fixed = central(1e-9, 0.1, static_cast<double>(silos));
  const Model l = layout(d);
  auto agg = server::make_central_dp_sum(fixed, l, key(1));
  std::vector<float> out(d);
  auto res = agg->combine(out, {});
  ASSERT_TRUE(res.has_value());
  EXPECT_FALSE(res->next_clip_norm);
  EXPECT_FALSE(res->record.contains("robust"));
}

// `xsilo audit verify` recomposes a round that adapted C with its count's noise: a record that
// omits count_stddev (a count released and not accounted) or states less count noise than its
// claim was computed with fails.
TEST(CentralDp, AuditVerifyCatchesARecordThatOmitsOrUnderstatesTheCountsNoise) {
  server::CentralDpConfig dp;
  dp.epsilon = 10;
  dp.noise_multiplier = 1.5;
  dp.denominator = 10;
  dp.count_stddev = 2.5;
  std::vector<nlohmann::json> log = {{{"event", "federation_start"}}};
  privacy::Ledger spent;
  double c = 0.3;
  for (std::uint64_t r = 1; r <= 4; ++r) {
    dp.clip_norm = c;
    spent.add(server::round_mechanism(dp), 1);
    auto rec = committed_round(r, dp, spent);
    rec["robust"]["adaptive_clip"] = {{"clip_norm", c}, {"unclipped_fraction", 0.4}, {"quantile", 0.5},
                                      {"count_stddev", dp.count_stddev}, {"next", c * 1.02}};
    c *= 1.02;
    log.push_back(rec);
  }
  const auto ok = server::check_privacy_claims(log);
  ASSERT_TRUE(succeeded(ok));
  EXPECT_EQ(ok->silo_rounds(), 4u);
  EXPECT_NEAR(ok->silo_epsilon, server::epsilon_of(spent, dp.delta), 1e-12);
  EXPECT_EQ(log[2]["privacy"]["count_stddev"], 2.5);
  EXPECT_EQ(log[2]["privacy"]["clip_norm"], 0.3 * 1.02);
  test::expect_understated_epsilon_caught(log, "central DP");

  // A round that adapted C and states no count noise.
  auto omitted = log;
  omitted[2]["privacy"].erase("count_stddev");
  test::expect_claims_fail(omitted, "record 3 (round 2): its central DP spend cannot be read");
  test::expect_claims_fail(omitted, "states no count_stddev");
  // A server that left the count out of its accounting: every claim made without it.
  std::vector<nlohmann::json> unaccounted = {log[0]};
  auto update_only = dp;
  update_only.count_stddev = 0;
  privacy::Ledger less;
  for (std::uint64_t r = 1; r <= 4; ++r) {
    less.add(server::round_mechanism(update_only), 1);
    auto rec = committed_round(r, update_only, less);
    rec["robust"] = log[r]["robust"];
    unaccounted.push_back(rec);
  }
  test::expect_claims_fail(unaccounted, "states no count_stddev");
  // The count's noise understated in one record, its noise_multiplier restated to match: its
  // rounds give more than the claims say.
  auto understated = log;
  understated[2]["privacy"]["count_stddev"] = 0.5;
  understated[2]["privacy"]["noise_multiplier"] = server::round_noise_multiplier(dp.noise_multiplier, 0.5);
  test::expect_claims_fail(understated, "central DP claims epsilon");
  // noise_multiplier is the round's (what a reader that knows nothing of the count computes from):
  // stating the update's alone there, or dropping the update's, is refused.
  EXPECT_NEAR(log[2]["privacy"]["noise_multiplier"].get<double>(),
              server::round_noise_multiplier(dp.noise_multiplier, dp.count_stddev), 1e-12);
  EXPECT_EQ(log[2]["privacy"]["update_noise_multiplier"], dp.noise_multiplier);
  auto update_z = log;
  update_z[2]["privacy"]["noise_multiplier"] = dp.noise_multiplier;
  test::expect_claims_fail(update_z, "is not the round's");
  auto no_update_z = log;
  no_update_z[2]["privacy"].erase("update_noise_multiplier");
  test::expect_claims_fail(no_update_z, "without a number update_noise_multiplier");
  auto nonsense = log;
  nonsense[2]["privacy"]["count_stddev"] = -1;
  test::expect_claims_fail(nonsense, "count_stddev is not a number above 0");
}

}  // namespace
}  // namespace xsilo
