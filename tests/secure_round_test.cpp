// The server's side of secure groups, without the network: how silos are split into groups,
// each group's threshold, and groups too small to be revealed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <type_traits>

#include "crypto/fixed_point.h"
#include "crypto/secagg.h"
#include "protocol/masked.h"
#include "protocol/secagg_wire.h"
#include "server/aggregator.h"
#include "server/secure_groups.h"
#include "server/secure_round.h"
#include "tests/testlib.h"
#include "tests/result_util.h"

namespace xsilo::server {
namespace {

std::vector<std::string> silos(std::size_t n) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back("silo-" + std::to_string(100 + i));
  return out;
}

// t is strictly above half the group (two disjoint halves can never both reach it), at least
// the configured fraction, at least 2 and at most n.
TEST(SecureGroups, TheThresholdIsAboveHalfTheGroupAndAtLeastTheFraction) {
  SecureConfig cfg;
  cfg.threshold = 2.0 / 3.0;
  const std::vector<std::pair<std::size_t, std::uint32_t>> expect = {{2, 2}, {3, 2}, {4, 3},  {5, 4},
                                                                    {6, 4}, {7, 5}, {10, 7}, {100, 67}};
  for (const auto& [n, t] : expect) EXPECT_EQ(group_threshold(cfg, n), t) << n;
  for (double fraction : {0.51, 0.6, 2.0 / 3.0, 0.75, 0.9, 1.0}) {
    cfg.threshold = fraction;
    for (std::size_t n = 2; n <= 300; ++n) {
      const auto t = group_threshold(cfg, n);
      EXPECT_GT(2 * t, n) << fraction << " " << n;
      EXPECT_LE(t, n) << fraction << " " << n;
      EXPECT_GE(t, 2u);
      EXPECT_GE(t + 1e-9, fraction * static_cast<double>(n)) << fraction << " " << n;
    }
  }
  cfg.threshold = 2.0 / 3.0;
  cfg.min_group = 5;
  EXPECT_EQ(group_min_survivors(cfg, 6), 5u);  // min_group above t
  EXPECT_EQ(group_min_survivors(cfg, 9), 6u);  // t above min_group
}

// The masked sums count the members within the clip norm (secure.clipped) in a secure round
// without silo-level DP, where the count word needs no more of the ring than the updates; under
// adaptive clipping always, which steers by it; never under silo-level DP (it would be released
// without noise) nor without secure aggregation.
TEST(SecureGroups, TheSumsCountTheUnclippedMembersOnlyWhereThatReleasesNothingUnnoised) {
  RoundConfig cfg;
  EXPECT_FALSE(counts_unclipped(cfg, std::nullopt));  // plain mode
  cfg.secure.mode = SecureMode::Global;
  EXPECT_TRUE(counts_unclipped(cfg, std::nullopt));
  EXPECT_TRUE(counts_unclipped(cfg, 0.5));
  cfg.secure.max_weight = 0.5;  // max_weight x max(clip_norm, 1) below 1: the bit would need more room
  EXPECT_FALSE(counts_unclipped(cfg, std::nullopt));
  cfg.secure.clip_norm = 4;
  EXPECT_TRUE(counts_unclipped(cfg, std::nullopt));
  cfg.secure = SecureConfig{};
  cfg.secure.mode = SecureMode::Grouped;
  cfg.central_dp.emplace();
  EXPECT_FALSE(counts_unclipped(cfg, std::nullopt));
  cfg.central_dp.reset();
  cfg.distributed_dp.emplace();
  EXPECT_FALSE(counts_unclipped(cfg, std::nullopt));
}

// Grouped: floor(n / group_size) groups (at least one), none smaller than min_group, every
// silo in exactly one; the split depends on the seed. Global: one group of all.
TEST(SecureGroups, SilosAreSplitIntoGroupsOfAtLeastMinGroup) {
  SecureConfig cfg;
  cfg.mode = SecureMode::Grouped;
  for (std::size_t dropouts : {0u, 1u, 2u}) {
  cfg.group_dropouts = dropouts;
  for (std::size_t min_group : {2u, 3u, 5u}) {
    cfg.min_group = min_group;
    for (std::size_t n = min_group; n <= 40; ++n) {
      const auto groups = make_groups(silos(n), cfg, 7 + n);
      EXPECT_EQ(groups.size(), std::max<std::size_t>(1, n / group_size(cfg)));
      std::multiset<std::string> all;
      for (const auto& g : groups) {
        EXPECT_GE(g.size(), min_group) << n;
        // Every group drawn at group_size or more survives `dropouts` dropouts.
        if (g.size() >= group_size(cfg)) {
          EXPECT_GE(g.size() - group_min_survivors(cfg, g.size()), dropouts) << n;
        }
        all.insert(g.begin(), g.end());
      }
      const auto want = silos(n);
      EXPECT_EQ(all, std::multiset<std::string>(want.begin(), want.end())) << n;
    }
  }
  }
  // Found by the 2026-12-04 operator's run (issue 37): groups of exactly min_group fail whole
  // with one dropout (one kill cost 4 silos). The default sizes them for one.
  cfg.group_dropouts = 1;
  cfg.min_group = 3;
  EXPECT_EQ(group_size(cfg), 4u);
  cfg.group_dropouts = 2;
  EXPECT_EQ(group_size(cfg), 6u);
  cfg.group_dropouts = 0;
  EXPECT_EQ(group_size(cfg), 3u);
  cfg.min_group = 3;
  EXPECT_NE(make_groups(silos(12), cfg, 1), make_groups(silos(12), cfg, 2));
  cfg.mode = SecureMode::Global;
  EXPECT_EQ(make_groups(silos(12), cfg, 1).size(), 1u);
}

// At run time, a group below min_group (fewer silos selected than it needs) fails before any
// key is asked for: its silos are dropouts with the reason, and nothing is sent to them.
TEST(SecureGroups, AGroupSmallerThanMinGroupFailsBeforeKeys) {
  SecureConfig cfg;
  cfg.mode = SecureMode::Global;
  cfg.min_group = 4;
  const std::optional<crypto::CertSigner> signer = test::signer(wire::SERVER, "server");
  const std::optional<crypto::CertVerifier> ca = test::verifier();
  SecureRound round(cfg, signer, ca, "fed", 1, 1, silos(3), 10);
  const auto dropped = round.take_dropped();
  ASSERT_EQ(dropped.size(), 3u);
  for (const auto& d : dropped) {
    EXPECT_NE(d.why.find("smaller than min_group 4"), std::string::npos) << d.why;
    EXPECT_NE(d.reason, secure::DropReason::Excluded);
    EXPECT_FALSE(round.may_upload(d.silo));
  }
  EXPECT_TRUE(round.take_out().empty());
  EXPECT_TRUE(round.settled());  // nothing to wait for

  SecureRound enough(cfg, signer, ca, "fed", 1, 1, silos(4), 10);
  EXPECT_TRUE(enough.take_dropped().empty());
  EXPECT_EQ(enough.setup(1).min_survivors(), 4u);
  EXPECT_EQ(enough.setup(1).threshold(), 3u);
  EXPECT_THROW(SecureRound(cfg, std::nullopt, ca, "fed", 1, 1, silos(4), 10), std::invalid_argument);
}

// protocol lightsecagg: each group's setup names LightSecAgg with its T and U (signed: a relay
// cannot change either), U = min_survivors, so it tolerates SecAgg's dropouts, and its sums are
// field words. A group whose encoded shares would not fit in one message fails with the reason
// before any key is asked for.
TEST(SecureGroups, ALightSecAggGroupIsPlannedSignedAndRefusedWhereItsSharesWouldNotFit) {
  SecureConfig cfg;
  cfg.mode = SecureMode::Grouped;
  cfg.protocol = SecureProtocol::LightSecAgg;
  cfg.min_group = 3;
  const std::optional<crypto::CertSigner> signer = test::signer(wire::SERVER, "server");
  const std::optional<crypto::CertVerifier> ca = test::verifier();
  SecureRound round(cfg, signer, ca, "fed", 2, 7, silos(8), 1000);
  ASSERT_TRUE(round.take_dropped().empty());
  for (const auto g : round.groups()) {
    const auto& s = round.setup(g);
    EXPECT_EQ(s.protocol(), wire::LIGHTSECAGG);
    EXPECT_EQ(s.target(), s.min_survivors());
    EXPECT_GE(s.privacy(), 1u);
    EXPECT_LT(s.privacy(), s.target());
    EXPECT_EQ(protocol::MaskedVector::for_setup(s).prime(), true);
    EXPECT_TRUE(succeeded(crypto::lightsecagg::check_params(protocol::lightsecagg_params(s, "fed", 2))));
    auto tampered = s;
    tampered.set_privacy(s.privacy() + 1);
    EXPECT_NE(protocol::setup_statement(tampered, "fed", 2), protocol::setup_statement(s, "fed", 2));
  }
  // Keys are asked for at once, as LightSecAgg's own step.
  const auto out = round.take_out();
  EXPECT_TRUE(out.empty()) << "nothing is sent before the members advertise";

  // Every signature of the group binds the whole setup (review of 421039f): members shown
  // setups that differ in their order, T or U do not even share a session, and members out of
  // order are refused.
  const auto& s1 = round.setup(1);
  auto reordered = s1;
  reordered.mutable_members()->SwapElements(0, 1);
  auto weaker = s1;
  weaker.set_target(s1.target() + 1);
  const auto session = protocol::lightsecagg_params(s1, "fed", 2).session;
  EXPECT_NE(protocol::lightsecagg_params(reordered, "fed", 2).session, session);
  EXPECT_NE(protocol::lightsecagg_params(weaker, "fed", 2).session, session);
  EXPECT_NE(
      error_text(crypto::lightsecagg::check_params(protocol::lightsecagg_params(reordered, "fed", 2))).find("in order"),
      std::string::npos);

  cfg.max_message_bytes = 64 << 10;  // 64 KiB: groups of 4 with d = 100k need about 130 KiB each
  SecureRound big(cfg, signer, ca, "fed", 2, 7, silos(8), 100000);
  const auto dropped = big.take_dropped();
  ASSERT_EQ(dropped.size(), 8u);
  for (const auto& d : dropped) {
    EXPECT_NE(d.why.find("above transport.max_frame_bytes"), std::string::npos) << d.why;
    EXPECT_EQ(d.reason, secure::DropReason::GroupFailed);
  }
}

// SecAgg's session binds the setup signed, as LightSecAgg's does: members shown setups that
// differ (here only in the packed width, or the clip norm) do not share a session, so the
// other member's signed keys fail the first's check and the split view stops before any mask.
TEST(SecureGroups, SecAggMembersShownDifferentSetupsRefuseEachOthersKeys) {
  SecureConfig cfg;
  cfg.mode = SecureMode::Global;
  cfg.min_group = 3;
  const std::optional<crypto::CertSigner> signer = test::signer(wire::SERVER, "server");
  const std::optional<crypto::CertVerifier> ca = test::verifier();
  SecureRound round(cfg, signer, ca, "fed", 2, 7, silos(3), 100);
  const auto& s1 = round.setup(1);
  ASSERT_EQ(s1.protocol(), wire::SECAGG);
  auto packed = s1;
  packed.set_wire_bits(20);
  auto looser = s1;
  looser.set_clip_norm(s1.clip_norm() * 2);
  const auto session = protocol::secagg_params(s1, "fed", 2).session;
  EXPECT_NE(protocol::secagg_params(packed, "fed", 2).session, session);
  EXPECT_NE(protocol::secagg_params(looser, "fed", 2).session, session);
  EXPECT_EQ(protocol::secagg_params(s1, "fed", 2).session, session);  // one setup, one session

  const std::vector<std::string> members(s1.members().begin(), s1.members().end());
  auto client = [&](const wire::SecAggSetup& s, const std::string& me) {
    return crypto::secagg::Client(protocol::secagg_params(s, "fed", 2), me, test::signer(wire::SILO, me),
                                  test::verifier(), signer->certificate(), "server", crypto::secagg::Floor{2, 0.0});
  };
  for (const auto* other : {&packed, &looser}) {
    std::vector<crypto::secagg::Client> clients;
    crypto::secagg::KeyList agreed;
    for (const auto& m : members) {
      clients.push_back(client(s1, m));
      auto a = clients.back().advertise();
      ASSERT_TRUE(a.has_value()) << a.error().message();
      agreed[m] = *a;
    }
    EXPECT_TRUE(clients[0].share(agreed).has_value());
    // The last member was shown the other setup: its keys are signed under another session.
    auto shown_client = client(*other, members.back());
    auto shown = shown_client.advertise();
    ASSERT_TRUE(shown.has_value()) << shown.error().message();
    auto split = agreed;
    split[members.back()] = *shown;
    const auto refused = clients[1].share(split);
    ASSERT_FALSE(refused.has_value());
    EXPECT_NE(refused.error().message().find(members.back()), std::string::npos) << refused.error().message();
  }
}

// secure.graph: each group gets SecAgg+'s plan for its size (signed into its setup, so a relay
// cannot change it), or the complete graph where no smaller one meets the bounds.
TEST(SecureGroups, AGraphIsPlannedForEachGroupLargeEnoughToHaveOne) {
  SecureConfig cfg;
  cfg.mode = SecureMode::Global;
  cfg.graph = true;
  cfg.graph_dropout = 0.1;
  cfg.graph_corrupt = 0.0;
  const std::optional<crypto::CertSigner> signer = test::signer(wire::SERVER, "server");
  const std::optional<crypto::CertVerifier> ca = test::verifier();
  SecureRound big(cfg, signer, ca, "fed", 3, 9, silos(40), 10);
  const auto plan = crypto::secagg::plan_graph(40, 0.1, 0.0);
  ASSERT_NE(plan.degree, 0u);
  EXPECT_EQ(big.setup(1).degree(), plan.degree);
  EXPECT_EQ(big.setup(1).threshold(), plan.threshold);
  EXPECT_FALSE(big.setup(1).graph_seed().empty());
  // The graph's seed is fresh in every round, not derived from the config's seed and the round
  // (which one setup reveals): the same round built again draws another graph, and the audit
  // record names the one drawn.
  SecureRound again(cfg, signer, ca, "fed", 3, 9, silos(40), 10);
  EXPECT_EQ(again.setup(1).graph_seed().size(), 32u);
  EXPECT_NE(again.setup(1).graph_seed(), big.setup(1).graph_seed());
  EXPECT_EQ(big.describe()["groups"][0]["graph_seed"], big.setup(1).graph_seed());
  EXPECT_TRUE(big.take_dropped().empty()) << "the plan's parameters pass the members' checks";
  const auto params = protocol::secagg_params(big.setup(1), "fed", 3);
  EXPECT_TRUE(params.graph());
  auto tampered = big.setup(1);
  tampered.set_degree(plan.degree + 2);
  EXPECT_NE(protocol::setup_statement(tampered, "fed", 3), protocol::setup_statement(big.setup(1), "fed", 3));
  SecureRound small(cfg, signer, ca, "fed", 3, 9, silos(5), 10);
  EXPECT_EQ(small.setup(1).degree(), 0u) << "five silos: the complete graph";
}

}  // namespace
}  // namespace xsilo::server

namespace xsilo::server {
namespace {

// A group sum kept as its words reads, block by block and coordinate by coordinate, the same
// doubles as decoding all of it at once did: across block edges, in every ring, with the
// weight and count after d, and under RANDOM_K with the left-out coordinates zero.
TEST(SecureGroups, AGroupSumReadsTheSameDoublesAsDecodingItWhole) {
  const std::size_t d = GroupSum::kBlock * 2 + 37;  // three blocks, the last one short
  for (const std::uint32_t bits : {16u, 32u, 64u}) {
    const crypto::FixedPointParams codec{.bits = bits, .fraction_bits = bits == 16 ? 6u : 16u, .clip_norm = 1.0,
                                         .max_weight = 2.0, .unclipped_bit = true};
    for (const bool random_k : {false, true}) {
      std::shared_ptr<const std::vector<std::uint64_t>> kept;
      if (random_k) {
        auto k = std::make_shared<std::vector<std::uint64_t>>();
        for (std::uint64_t j = 3; j < d; j += 7) k->push_back(j);
        kept = k;
      }
      const std::size_t held = kept ? kept->size() : d;
      protocol::MaskedVector words(bits, held + 2);
      std::uint64_t x = 0x9e3779b97f4a7c15ull;
      words.visit([&](auto w) {
        for (auto& v : w) {
          x = x * 6364136223846793005ull + 1442695040888963407ull;
          v = static_cast<std::remove_reference_t<decltype(v)>>(x >> 17);
        }
      });
      // What finish() used to hold: everything decoded, the kept coordinates put back in place.
      const auto whole = words.visit([&](auto w) { return crypto::decode(codec, w); });
      std::vector<double> expect(d + 2, 0.0);
      for (std::size_t j = 0; j < held; ++j) expect[kept ? (*kept)[j] : j] = whole[j];
      expect[d] = whole[held];
      expect[d + 1] = whole[held + 1];

      const GroupSum sum(words, codec, d, kept);
      ASSERT_EQ(sum.size(), d + 2);
      std::vector<double> blocks;
      sum.for_each_block([&](std::size_t from, std::span<const double> b) {
        EXPECT_EQ(from, blocks.size());
        blocks.insert(blocks.end(), b.begin(), b.end());
      });
      ASSERT_EQ(blocks.size(), d);
      EXPECT_TRUE(std::equal(blocks.begin(), blocks.end(), expect.begin())) << bits << " bits, random_k " << random_k;
      for (const std::size_t k : {std::size_t{0}, std::size_t{3}, GroupSum::kBlock - 1, GroupSum::kBlock, d - 1, d, d + 1}) {
        EXPECT_EQ(sum.at(k), expect[k]) << k;
      }
      EXPECT_EQ(sum.weight(), expect[d]);
      std::vector<double> straddle(5);  // the last coordinates and the extras in one read
      sum.decode(d - 3, straddle);
      EXPECT_TRUE(std::equal(straddle.begin(), straddle.end(), expect.begin() + static_cast<std::ptrdiff_t>(d - 3)));
      std::vector<double> past(3);
      EXPECT_THROW(sum.decode(d, past), std::out_of_range);
    }
  }
  EXPECT_THROW(GroupSum(protocol::MaskedVector(32, 3), crypto::FixedPointParams{}, 4), std::invalid_argument);
}

// A group sum holding `values` (d coordinates, then the weight and the count) as a 64-bit ring's
// words with 32 fraction bits, as the server holds a sum it unmasked.
namespace {
GroupSum sum_of(const std::vector<double>& values, std::size_t d) {
  crypto::FixedPointParams codec;
  codec.bits = 64;
  codec.fraction_bits = 32;
  protocol::MaskedVector words(64, values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    words.u64()[i] = static_cast<std::uint64_t>(std::llround(std::ldexp(values[i], 32)));
  }
  return GroupSum(std::move(words), codec, d);
}
}  // namespace

// What an unmasked group sum must look like to be used: the weight, the norm bound and (with
// adaptive clipping) the count of members within the clip norm.
TEST(SecureGroups, ASumNoHonestGroupCouldMakeIsRejectedWithTheReason) {
  SecureConfig sc;
  sc.clip_norm = 1.0;
  sc.max_weight = 10;
  sc.fraction_bits = 16;
  // Three members of weight 2 within the norm: d = 2, then the weight, then the count.
  const std::vector<double> honest = {1.2, 1.6, 6.0, 2.0};
  EXPECT_EQ(error_text(check_plausible_sum(sum_of(honest, 2), 3, sc, true)), "");
  EXPECT_EQ(error_text(check_plausible_sum(sum_of({1.2, 1.6, 6.0}, 2), 3, sc, false)), "");
  auto with_count = [&](double c) {
    auto s = honest;
    s[3] = c;
    return error_text(check_plausible_sum(sum_of(s, 2), 3, sc, true));
  };
  EXPECT_EQ(with_count(0), "");
  EXPECT_EQ(with_count(3), "");
  for (double bad : {-1.0, 4.0, 1.5, 1000.0}) {
    EXPECT_NE(with_count(bad).find("a member sent a bit other than 0 or 1"), std::string::npos) << bad;
  }
  EXPECT_NE(error_text(check_plausible_sum(sum_of({6.0, 8.0, 6.0, 2.0}, 2), 3, sc, true)).find("a member skipped clipping"), std::string::npos);
  EXPECT_NE(error_text(check_plausible_sum(sum_of({0.1, 0.1, 31.0, 2.0}, 2), 3, sc, true)).find("summed weight"), std::string::npos);
}

// Adaptive clipping's step: toward the quantile, never above the ceiling (secure.clip_norm) nor
// below the floor, whatever the counts say (liars included).
TEST(AdaptiveClip, StepsTowardTheQuantileBetweenTheFloorAndTheCeiling) {
  AggregationConfig::AdaptiveClip ac;
  ac.quantile = 0.5;
  ac.lr = 0.2;
  ac.initial = 1.0;
  ac.min = 0.5;
  auto [up, part] = adapt_clip_norm(ac, 1.0, 0, 4);  // all clipped: the norm grows
  EXPECT_NEAR(up, std::exp(0.1), 1e-12);
  EXPECT_DOUBLE_EQ(part["unclipped_fraction"].get<double>(), 0.0);
  auto [capped, cpart] = adapt_clip_norm(ac, 1.0, 0, 4, 1.05);
  EXPECT_DOUBLE_EQ(capped, 1.05);
  EXPECT_DOUBLE_EQ(cpart["capped_at"].get<double>(), 1.05);
  auto [down, dpart] = adapt_clip_norm(ac, 0.52, 4, 4);  // none clipped: it shrinks, to the floor
  EXPECT_DOUBLE_EQ(down, 0.5);
  EXPECT_DOUBLE_EQ(dpart["floored_at"].get<double>(), 0.5);
}

}  // namespace
}  // namespace xsilo::server
