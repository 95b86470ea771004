// Secure aggregation in-process: the primitives, the fixed-point codec, and the client and
// server state machines under every dropout timing.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "crypto/fixed_point.h"
#include "crypto/mask.h"
#include "crypto/secagg.h"
#include "crypto/shamir.h"

namespace xsilo::crypto {
namespace {

TEST(Shamir, AnyTSharesRebuildTheSecretAndFewerDoNot) {
  const Secret s = Secret::random();
  const auto shares = shamir_split(s, 3, 5);
  for (std::size_t a = 0; a < 5; ++a) {
    for (std::size_t b = a + 1; b < 5; ++b) {
      for (std::size_t c = b + 1; c < 5; ++c) {
        auto r = shamir_combine({shares[a], shares[b], shares[c]});
        ASSERT_TRUE(r);
        EXPECT_EQ(r->bytes(), s.bytes());
      }
    }
  }
  auto two = shamir_combine({shares[0], shares[1]});
  EXPECT_TRUE(!two || two->bytes() != s.bytes());
  EXPECT_FALSE(shamir_combine({shares[0], shares[0], shares[1]}));  // duplicate x
  EXPECT_THROW(shamir_split(s, 6, 5), std::invalid_argument);
}

TEST(Aead, TamperedCiphertextOrWrongContextIsRefused) {
  const Secret k = Secret::random();
  auto c = seal(k, "share bytes", "session|a|b");
  EXPECT_EQ(open(k, c, "session|a|b").value_or(""), "share bytes");
  EXPECT_FALSE(open(k, c, "session|a|c"));  // another recipient
  c[c.size() / 2] ^= 1;
  EXPECT_FALSE(open(k, c, "session|a|b"));
  EXPECT_FALSE(open(Secret::random(), seal(k, "x", ""), ""));
}

TEST(MaskPrg, MasksCancelAndTheKeystreamIsAes128Ctr) {
  const Secret seed = Secret::random();
  std::vector<std::uint32_t> v{1, 2, 3, 4, 5};
  add_mask(seed, std::span<std::uint32_t>(v), +1);
  EXPECT_NE(v[0], 1u);
  add_mask(seed, std::span<std::uint32_t>(v), -1);
  EXPECT_EQ(v, (std::vector<std::uint32_t>{1, 2, 3, 4, 5}));
  // The same seed gives the same stream at any length.
  std::vector<std::uint8_t> a(100), b(40000);
  keystream(seed, a);
  keystream(seed, b);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin()));
}

TEST(FixedPoint, RoundTripsWithinOneStepAndRoundsWithoutBias) {
  FixedPointParams p{32, 16, 10.0, 100.0};
  const std::vector<float> x{0.5f, -0.25f, 1e-6f, -3.0f};
  std::vector<std::uint32_t> enc(5);
  encode(p, x, 2.0, 7, enc);
  const auto dec = decode(p, enc);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dec[i], 2.0 * x[i], 1.0 / 65536);
  EXPECT_DOUBLE_EQ(dec[4], 2.0);
  // 1e-6 is far below one step (1.5e-5): its mean over many encodings is still 1e-6.
  double mean = 0;
  const int trials = 20000;
  for (int t = 0; t < trials; ++t) {
    encode(p, std::vector<float>{1e-6f}, 1.0, static_cast<std::uint64_t>(t), std::span<std::uint32_t>(enc).first(2));
    mean += decode(p, std::span<const std::uint32_t>(enc).first(2))[0];
  }
  EXPECT_NEAR(mean / trials, 1e-6, 3e-7);
}

TEST(FixedPoint, ClipsToTheNormAndCapsTheWeight) {
  FixedPointParams p{64, 20, 1.0, 5.0};
  std::vector<std::uint64_t> enc(3);
  const double factor = encode(p, std::vector<float>{3, 4}, 50.0, 1, enc);
  EXPECT_DOUBLE_EQ(factor, 0.2);
  const auto dec = decode(p, enc);
  EXPECT_NEAR(dec[0], 5.0 * 0.6, 1e-5);
  EXPECT_NEAR(dec[1], 5.0 * 0.8, 1e-5);
  EXPECT_DOUBLE_EQ(dec[2], 5.0);
}

TEST(FixedPoint, ConfigsThatCanOverflowAreExplained) {
  FixedPointParams p{32, 16, 1.0, 1000.0};
  const auto why = check_overflow(p, 100);
  EXPECT_NE(why.find("100 silos x max_weight 1000"), std::string::npos) << why;
  EXPECT_EQ(check_overflow(p, 10), "");
  p.bits = 64;
  EXPECT_EQ(check_overflow(p, 100), "");
}

// ---- the protocol -------------------------------------------------------------------------

enum Fate { Stays, BeforeKeys, AfterKeys, AfterShares, AfterMasking };

struct Outcome {
  bool aborted = false;
  std::string phase;
  std::vector<std::uint64_t> sum, expected;
  static Outcome abort(const char* phase) {
    Outcome o;
    o.aborted = true;
    o.phase = phase;
    return o;
  }
};

template <class T>
Outcome run_protocol(std::size_t n, std::uint32_t t, std::size_t len, const std::vector<Fate>& fate,
                     std::mt19937_64& rng) {
  secagg::Params p;
  p.session = "fed/1/0";
  for (std::size_t i = 0; i < n; ++i) p.members.push_back("silo-" + std::to_string(i));
  p.threshold = t;
  p.bits = sizeof(T) * 8;
  p.length = len;
  std::vector<secagg::Client> clients;
  for (auto& m : p.members) clients.emplace_back(p, m);
  secagg::Server server(p);
  Outcome o;
  o.expected.assign(len, 0);
  std::vector<T> sum(len, 0);

  for (std::size_t i = 0; i < n; ++i) {
    if (fate[i] != BeforeKeys) {
      EXPECT_EQ(server.on_keys(p.members[i], clients[i].advertise()), "");
    }
  }
  auto keys = server.close_keys();
  if (!secagg::ok(keys)) return Outcome::abort("keys");
  for (std::size_t i = 0; i < n; ++i) {
    if (fate[i] == BeforeKeys || fate[i] == AfterKeys) continue;
    auto c = clients[i].share(secagg::value(keys));
    EXPECT_TRUE(secagg::ok(c));
    EXPECT_EQ(server.on_shares(p.members[i], secagg::value(c)), "");
  }
  auto boxes = server.close_shares();
  if (!secagg::ok(boxes)) return Outcome::abort("shares");
  for (auto& [name, box] : secagg::value(boxes)) {
    EXPECT_EQ(clients[p.index_of(name) - 1].receive(box), "");
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (fate[i] != Stays && fate[i] != AfterMasking) continue;
    std::vector<T> x(len);
    for (auto& v : x) v = static_cast<T>(rng());
    for (std::size_t k = 0; k < len; ++k) o.expected[k] = static_cast<T>(o.expected[k] + x[k]);
    EXPECT_EQ(clients[i].mask(std::span<T>(x)), "");
    for (std::size_t k = 0; k < len; ++k) sum[k] = static_cast<T>(sum[k] + x[k]);
    EXPECT_EQ(server.on_masked_input(p.members[i]), "");
  }
  auto request = server.close_masked();
  if (!secagg::ok(request)) return Outcome::abort("masked");
  for (std::size_t i = 0; i < n; ++i) {
    if (fate[i] != Stays) continue;
    auto reply = clients[i].unmask(secagg::value(request));
    EXPECT_TRUE(secagg::ok(reply));
    EXPECT_EQ(server.on_unmask(p.members[i], secagg::value(reply)), "");
  }
  const std::string err = server.finish(std::span<T>(sum));
  if (!err.empty()) {
    EXPECT_NE(err.find("answered"), std::string::npos) << err;
    return Outcome::abort("unmask");
  }
  o.sum.assign(sum.begin(), sum.end());
  return o;
}

// 1,000 random scenarios: group sizes, thresholds, rings and a fate for every silo. The result
// is the exact sum of the surviving silos' inputs, or the round aborts exactly when a phase
// ends with fewer than t silos.
TEST(SecAgg, RecoversTheExactSumOrAbortsExactlyWhenItMustUnderRandomDropouts) {
  std::mt19937_64 rng(2026);
  int commits = 0, aborts = 0;
  for (int scenario = 0; scenario < 1000; ++scenario) {
    const std::size_t n = 2 + rng() % 9;
    const auto t = static_cast<std::uint32_t>(2 + rng() % (n - 1));
    const std::size_t len = 1 + rng() % 12;
    std::vector<Fate> fate(n);
    std::size_t u1 = 0, u2 = 0, u3 = 0, u4 = 0;
    for (auto& f : fate) {
      f = rng() % 4 == 0 ? static_cast<Fate>(1 + rng() % 4) : Stays;
      u1 += f != BeforeKeys;
      u2 += f != BeforeKeys && f != AfterKeys;
      u3 += f == Stays || f == AfterMasking;
      u4 += f == Stays;
    }
    const std::string must = u1 < t ? "keys" : u2 < t ? "shares" : u3 < t ? "masked" : u4 < t ? "unmask" : "";
    const bool wide = rng() % 2;
    const Outcome o = wide ? run_protocol<std::uint64_t>(n, t, len, fate, rng)
                           : run_protocol<std::uint32_t>(n, t, len, fate, rng);
    if (must.empty()) {
      ASSERT_FALSE(o.aborted) << "scenario " << scenario << " aborted in " << o.phase;
      ASSERT_EQ(o.sum, o.expected) << "scenario " << scenario;
      ++commits;
    } else {
      ASSERT_TRUE(o.aborted) << "scenario " << scenario << " should abort in " << must;
      ASSERT_EQ(o.phase, must) << "scenario " << scenario;
      ++aborts;
    }
  }
  EXPECT_GT(commits, 300);
  EXPECT_GT(aborts, 50);
}

struct Group {
  secagg::Params p;
  std::vector<secagg::Client> clients;
  secagg::Server server;
  std::map<std::string, secagg::Ciphertexts> boxes;
  explicit Group(std::size_t n, std::uint32_t t, std::size_t len = 4) : p(make(n, t, len)), server(p) {
    for (auto& m : p.members) clients.emplace_back(p, m);
    for (std::size_t i = 0; i < n; ++i) server.on_keys(p.members[i], clients[i].advertise());
    auto keys = server.close_keys();
    for (std::size_t i = 0; i < n; ++i) server.on_shares(p.members[i], secagg::value(clients[i].share(secagg::value(keys))));
    boxes = secagg::value(server.close_shares());
  }
  static secagg::Params make(std::size_t n, std::uint32_t t, std::size_t len) {
    secagg::Params p;
    p.session = "fed/7/1";
    for (std::size_t i = 0; i < n; ++i) p.members.push_back("s" + std::to_string(i));
    p.threshold = t;
    p.length = len;
    return p;
  }
};

TEST(SecAgg, TamperedShareCiphertextsAreDetectedAndNamed) {
  Group g(4, 3);
  auto box = g.boxes["s0"];
  box["s2"][40] ^= 0x01;
  const auto err = g.clients[0].receive(box);
  EXPECT_NE(err.find("from s2 do not decrypt"), std::string::npos) << err;
}

TEST(SecAgg, TamperedUnmaskSharesAreDetected) {
  for (bool mask_key : {true, false}) {
    Group g(4, 3);
    for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(g.clients[i].receive(g.boxes[g.p.members[i]]), "");
    std::vector<std::uint32_t> sum(4, 0);
    for (std::size_t i = 0; i < 3; ++i) {  // s3 drops after sharing: its mask key is rebuilt
      std::vector<std::uint32_t> x(4, static_cast<std::uint32_t>(i));
      g.clients[i].mask(std::span<std::uint32_t>(x));
      for (std::size_t k = 0; k < 4; ++k) sum[k] += x[k];
      g.server.on_masked_input(g.p.members[i]);
    }
    auto req = secagg::value(g.server.close_masked());
    for (std::size_t i = 0; i < 3; ++i) {
      auto reply = secagg::value(g.clients[i].unmask(req));
      if (i == 1) {
        auto& share = mask_key ? reply.mask_key_shares["s3"] : reply.self_mask_shares["s0"];
        share[10] ^= 0x04;
      }
      g.server.on_unmask(g.p.members[i], reply);
    }
    const auto err = g.server.finish(std::span<std::uint32_t>(sum));
    EXPECT_NE(err.find("tampered"), std::string::npos) << err;
  }
}

TEST(SecAgg, NoSurvivorRevealsBothSharesOfOnePeer) {
  Group g(3, 2);
  for (std::size_t i = 0; i < 3; ++i) g.clients[i].receive(g.boxes[g.p.members[i]]);
  std::vector<std::uint32_t> x(4, 1);
  g.clients[0].mask(std::span<std::uint32_t>(x));
  secagg::UnmaskRequest greedy{{"s1"}, {"s0", "s1", "s2"}};
  auto r = g.clients[0].unmask(greedy);
  ASSERT_FALSE(secagg::ok(r));
  EXPECT_NE(secagg::error(r).find("both shares of s1"), std::string::npos);
  // And once it has answered an honest request, it answers no other.
  secagg::UnmaskRequest honest{{"s1"}, {"s0", "s2"}};
  EXPECT_TRUE(secagg::ok(g.clients[0].unmask(honest)));
  secagg::UnmaskRequest again{{}, {"s0", "s1", "s2"}};
  EXPECT_FALSE(secagg::ok(g.clients[0].unmask(again)));
}

// What the server or an edge receives looks uniformly random whatever the input, and the same
// statistic flags the unmasked input: a chi-square test on the bytes of 16 KiB of words.
double chi_square_bytes(std::span<const std::uint32_t> words) {
  std::array<double, 256> count{};
  const auto* b = reinterpret_cast<const std::uint8_t*>(words.data());
  for (std::size_t i = 0; i < words.size() * 4; ++i) count[b[i]]++;
  const double expected = static_cast<double>(words.size() * 4) / 256.0;
  double chi = 0;
  for (double c : count) chi += (c - expected) * (c - expected) / expected;
  return chi;
}

TEST(SecAgg, MaskedUploadsAreStatisticallyIndependentOfThePlaintext) {
  const std::size_t len = 4096;
  FixedPointParams codec{32, 16, 1.0, 100.0};
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0, 0.01f);
  std::vector<float> update(len - 1);
  for (auto& v : update) v = g(rng);
  for (const bool zeros : {true, false}) {
    Group grp(3, 2, len);
    for (std::size_t i = 0; i < 3; ++i) grp.clients[i].receive(grp.boxes[grp.p.members[i]]);
    std::vector<std::uint32_t> x(len, 0);
    if (!zeros) encode(codec, update, 50.0, 1, x);
    // 255 degrees of freedom: the 99.9th percentile of chi-square is about 330.
    if (!zeros) {
      EXPECT_GT(chi_square_bytes(x), 1000.0) << "the plaintext itself must fail the test";
    }
    grp.clients[0].mask(std::span<std::uint32_t>(x));
    EXPECT_LT(chi_square_bytes(x), 330.0) << (zeros ? "zeros" : "update");
  }
}

}  // namespace
}  // namespace xsilo::crypto
