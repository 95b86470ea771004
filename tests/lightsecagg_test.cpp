// LightSecAgg in-process: the prime field and its mappings to the codec's ring, Lagrange coding,
// and the client and server state machines under every dropout pattern of small groups, against
// Byzantine dealers and answers, a tampering relay and a server that asks for more than it may.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <map>
#include <random>
#include <set>

#include "crypto/fixed_point.h"
#include "crypto/lightsecagg.h"
#include "crypto/mask.h"
#include "crypto/prime_field.h"
#include "tests/testlib.h"
#include "tests/result_util.h"

namespace xsilo::crypto {
namespace {

namespace lsa = lightsecagg;
using field::kPrime;

// ---- the field ----------------------------------------------------------------------------

TEST(PrimeField, ReductionAgreesWithTheRemainderForEverySixtyFourBitValue) {
  std::mt19937_64 rng(5);
  std::vector<std::uint64_t> xs{0, 1, kPrime - 1, kPrime, kPrime + 1, 0xffffffffu, std::uint64_t{1} << 32,
                                ~std::uint64_t{0}, std::uint64_t{kPrime - 1} * (kPrime - 1)};
  for (int i = 0; i < 100000; ++i) xs.push_back(rng());
  for (auto x : xs) ASSERT_EQ(field::reduce(x), x % kPrime) << x;
  for (int i = 0; i < 1000; ++i) {
    const auto a = static_cast<std::uint32_t>(rng() % kPrime), b = static_cast<std::uint32_t>(rng() % kPrime);
    ASSERT_EQ(field::add(a, b), (std::uint64_t{a} + b) % kPrime);
    ASSERT_EQ(field::sub(a, b), (std::uint64_t{a} + kPrime - b) % kPrime);
    if (a) {
      ASSERT_EQ(field::mul(a, field::inv(a)), 1u);
    }
  }
}

// The codec's two's-complement words map to the field and back exactly, for negative and
// positive sums, as long as the sum stays within +-(p - 1) / 2.
TEST(PrimeField, RingWordsRoundTripThroughTheFieldForNegativeAndPositiveSums) {
  for (std::int64_t v : {0LL, 1LL, -1LL, 12345LL, -12345LL, 2147483645LL, -2147483645LL}) {
    std::vector<std::uint32_t> w{static_cast<std::uint32_t>(v)};
    field::to_field(w);
    ASSERT_EQ(w[0], static_cast<std::uint32_t>(((v % kPrime) + kPrime) % kPrime)) << v;
    field::from_field(w);
    ASSERT_EQ(w[0], static_cast<std::uint32_t>(v)) << v;
  }
  // Sums of encoded updates, summed in the field, decode as the ring would.
  FixedPointParams p{32, 16, 10.0, 100.0};
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-9.0f, 9.0f);
  std::vector<std::uint32_t> ring(9, 0), in_field(9, 0), one(9);
  for (int silo = 0; silo < 20; ++silo) {
    std::vector<float> x(8);
    for (auto& v : x) v = u(rng);
    encode(p, x, 3.0, static_cast<std::uint64_t>(silo), std::span<std::uint32_t>(one));
    for (std::size_t k = 0; k < 9; ++k) ring[k] += one[k];
    field::to_field(one);
    field::field_add(in_field, one);
  }
  field::from_field(in_field);
  EXPECT_EQ(in_field, ring);
  EXPECT_EQ(decode(p, std::span<const std::uint32_t>(in_field)), decode(p, std::span<const std::uint32_t>(ring)));
  // What the field costs: two codes of headroom below the ring's 2^31 - 1.
  EXPECT_EQ(error_text(field::check_overflow_field(p, 20)), "");
  FixedPointParams edge{32, 0, 1.0, 2147483645.0};
  EXPECT_EQ(error_text(field::check_overflow_field(edge, 1)), "");
  edge.max_weight = 2147483646.0;
  EXPECT_EQ(error_text(check_overflow(edge, 1)), "");  // the ring still takes it
  EXPECT_NE(error_text(field::check_overflow_field(edge, 1)).find("exceeds (p - 1) / 2 = 2147483645"), std::string::npos)
      << error_text(field::check_overflow_field(edge, 1));
  FixedPointParams wide{64, 16, 1.0, 1.0};
  EXPECT_NE(error_text(field::check_overflow_field(wide, 2)).find("32-bit codes"), std::string::npos);
}

TEST(PrimeField, AddingWordsOutsideTheFieldKeepsTheSumInIt) {
  std::vector<std::uint32_t> acc{kPrime - 1, 0, 7};
  const std::vector<std::uint32_t> x{0xffffffffu, kPrime, 3};
  field::field_add(acc, x);
  EXPECT_EQ(acc, (std::vector<std::uint32_t>{(kPrime - 1 + 4) % kPrime, 0, 10}));
  EXPECT_TRUE(field::in_field(acc));
  EXPECT_FALSE(field::in_field(x));
  field::field_sub(acc, std::vector<std::uint32_t>{4, 1, 10});
  EXPECT_EQ(acc, (std::vector<std::uint32_t>{kPrime - 1, kPrime - 1, 0}));  // 3 - 4, 0 - 1, 10 - 10
}

TEST(PrimeField, UniformWordsAreTheKeystreamWhereItIsBelowP) {
  const Secret seed = Secret::random();
  std::vector<std::uint32_t> w(100000), ks(100000);
  field::uniform(seed, w);
  keystream(seed, std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(ks.data()), ks.size() * 4));
  EXPECT_TRUE(field::in_field(w));
  if (field::in_field(ks)) {  // a rejection here has probability 1e-4
    EXPECT_EQ(w, ks);
  }
}

// Encoding evaluates the polynomial through the segments; decoding from any U evaluations gives
// back the first U - T segments, for lengths that cut the kernel's pieces anywhere.
TEST(LagrangeCode, AnyUSharesGiveBackTheMaskSegments) {
  std::mt19937_64 rng(11);
  for (std::size_t d : {1u, 7u, 1024u, 3001u}) {
    lsa::Params p;
    p.members.resize(7);
    p.privacy = 2;
    p.target = 5;
    p.length = d;
    const std::size_t L = p.segment();
    std::vector<std::uint32_t> coded(p.target * L);
    for (auto& w : coded) w = static_cast<std::uint32_t>(rng() % kPrime);
    std::fill(coded.begin() + static_cast<std::ptrdiff_t>(d), coded.begin() + static_cast<std::ptrdiff_t>(3 * L), 0u);
    std::vector<const std::uint32_t*> in;
    for (std::size_t k = 0; k < p.target; ++k) in.push_back(coded.data() + k * L);
    std::vector<std::uint32_t> holders{1, 2, 3, 4, 5, 6, 7};
    std::vector<std::vector<std::uint32_t>> shares(7, std::vector<std::uint32_t>(L));
    std::vector<std::uint32_t*> out;
    for (auto& s : shares) out.push_back(s.data());
    lsa::encode(p, in, holders, out);
    for (int trial = 0; trial < 10; ++trial) {
      std::shuffle(holders.begin(), holders.end(), rng);
      std::vector<std::uint32_t> who(holders.begin(), holders.begin() + 5);
      std::vector<const std::uint32_t*> answers;
      for (auto j : who) answers.push_back(shares[j - 1].data());
      std::vector<std::uint32_t> z(d);
      lsa::decode(p, who, answers, z);
      ASSERT_TRUE(std::equal(z.begin(), z.end(), coded.begin())) << "d = " << d;
    }
  }
}

// ---- the protocol -------------------------------------------------------------------------

lsa::Params make_params(std::size_t n, std::uint32_t T, std::uint32_t U, std::uint32_t t, std::uint32_t m,
                        std::size_t d) {
  lsa::Params p;
  p.session = "fed/3/1";
  for (std::size_t i = 0; i < n; ++i) p.members.push_back("s" + std::to_string(i));
  p.privacy = T;
  p.target = U;
  p.threshold = t;
  p.min_survivors = m;
  p.length = d;
  return p;
}

// A group run step by step, so a test can play the server, an edge or a silo in between.
struct Group {
  lsa::Params p;
  CertSigner server_signer = test::signer(wire::SERVER, "server");
  X25519KeyPair box = X25519KeyPair::generate();
  std::vector<lsa::Client> clients;
  std::unique_ptr<lsa::Server> server;
  lsa::KeyList keys;
  std::map<std::string, lsa::Inbox> inboxes;
  std::vector<std::uint32_t> expected;  // the sum of the masked members' inputs (field words)
  explicit Group(lsa::Params params) : p(std::move(params)) {
    p.server_key = box.public_key;
    server = std::make_unique<lsa::Server>(p, test::verifier(), server_signer, box);
    for (auto& m : p.members) clients.push_back(client(m));
  }
  Group(std::size_t n, std::uint32_t T, std::uint32_t U, std::uint32_t t, std::size_t d = 5)
      : Group(make_params(n, T, U, t, std::max(t, U), d)) {}
  secagg::Floor floor{2, 0.0};
  lsa::Client client(const std::string& m) const {
    return lsa::Client(p, m, test::signer(wire::SILO, m), test::verifier(), server_signer.certificate(), "server",
                       floor);
  }
  lsa::Client& c(std::size_t i) { return clients[i]; }
  void advertise() {
    for (std::size_t i = 0; i < clients.size(); ++i) {
      auto a = clients[i].advertise();
      ASSERT_TRUE(a.has_value()) << a.error().message();
      EXPECT_TRUE(succeeded(server->on_keys(p.members[i], *a)));
    }
    keys = *server->close_keys();
  }
  void share() {
    advertise();
    for (std::size_t i = 0; i < clients.size(); ++i) {
      auto out = clients[i].share(keys);
      ASSERT_TRUE(out.has_value()) << out.error().message();
      EXPECT_TRUE(succeeded(server->on_shares(p.members[i], *out)));
    }
    inboxes = *server->close_shares();
  }
  secagg::Settled settle() {
    share();
    for (std::size_t i = 0; i < clients.size(); ++i) {
      EXPECT_TRUE(succeeded(server->on_receipt(p.members[i], *clients[i].receive(inboxes[p.members[i]]))));
    }
    auto s = *server->settle();
    for (auto& c : clients) EXPECT_TRUE(succeeded(c.settle(s)));
    return s;
  }
  // Members [0, k) mask the input (i + 1) everywhere (in field words); the others drop.
  std::vector<std::uint32_t> mask(std::size_t k) {
    std::vector<std::uint32_t> sum(p.length, 0);
    expected.assign(p.length, 0);
    for (std::size_t i = 0; i < k; ++i) {
      std::vector<std::uint32_t> x(p.length, static_cast<std::uint32_t>(i + 1));
      field::field_add(expected, x);
      EXPECT_TRUE(succeeded(clients[i].mask(x)));
      field::field_add(sum, x);
      EXPECT_TRUE(succeeded(server->on_masked_input(p.members[i])));
    }
    return sum;
  }
  // After mask(k): members [0, k) confirm and the request comes back.
  secagg::UnmaskRequest confirm(std::size_t k) {
    auto u3 = *server->close_masked();
    for (std::size_t i = 0; i < k; ++i) {
      auto c = clients[i].confirm(u3, server->survivors_signature());
      EXPECT_TRUE(c.has_value()) << c.error().message();
      EXPECT_TRUE(succeeded(server->on_confirmation(p.members[i], c->signature)));
    }
    return *server->close_confirmations();
  }
};

// When a member leaves, if it does: after sharing (settled, but its masked input never comes),
// after masking (in the sum, but it never confirms), during unmasking (confirmed, never answers),
// or before its receipt (not settled at all).
enum Fate { Stays, AfterSharing, AfterMasking, DuringUnmasking, BeforeReceipt };

struct Outcome {
  std::string phase, why;  // phase "" : the sum was unmasked
  bool exact = false;
};

Outcome run(const lsa::Params& params, const std::vector<Fate>& fates, std::mt19937_64& rng) {
  Group g(params);
  const auto& p = g.p;
  const std::size_t n = p.members.size();
  g.share();
  for (std::size_t i = 0; i < n; ++i) {
    if (fates[i] == BeforeReceipt) continue;
    EXPECT_TRUE(succeeded(g.server->on_receipt(p.members[i], *g.c(i).receive(g.inboxes[p.members[i]]))));
  }
  auto settled = g.server->settle();
  if (!settled) return {"settle", settled.error().message()};
  std::vector<std::uint32_t> sum(p.length, 0), expected(p.length, 0);
  for (std::size_t i = 0; i < n; ++i) {
    if (fates[i] == BeforeReceipt) continue;
    EXPECT_TRUE(succeeded(g.c(i).settle(*settled)));
    if (fates[i] == AfterSharing) continue;
    std::vector<std::uint32_t> x(p.length);
    for (auto& v : x) v = static_cast<std::uint32_t>(rng() % kPrime);
    field::field_add(expected, x);
    EXPECT_TRUE(succeeded(g.c(i).mask(x)));
    field::field_add(sum, x);
    EXPECT_TRUE(succeeded(g.server->on_masked_input(p.members[i])));
  }
  auto u3 = g.server->close_masked();
  if (!u3) return {"masked", u3.error().message()};
  for (std::size_t i = 0; i < n; ++i) {
    if (fates[i] != Stays && fates[i] != DuringUnmasking) continue;
    auto c = g.c(i).confirm(*u3, g.server->survivors_signature());
    EXPECT_TRUE(c.has_value()) << c.error().message();
    EXPECT_TRUE(succeeded(g.server->on_confirmation(p.members[i], c->signature)));
  }
  auto request = g.server->close_confirmations();
  if (!request) return {"confirm", request.error().message()};
  for (std::size_t i = 0; i < n; ++i) {
    if (fates[i] != Stays) continue;
    auto r = g.c(i).unmask(*request);
    EXPECT_TRUE(r.has_value()) << r.error().message();
    EXPECT_TRUE(succeeded(g.server->on_unmask(p.members[i], r->box)));
  }
  if (auto unmasked = g.server->finish(sum); !unmasked) return {"unmask", unmasked.error().message()};
  return {"", "", sum == expected};
}

// Where a pattern must end, from the fates alone.
std::string expected_end(const lsa::Params& p, const std::vector<Fate>& fates) {
  const std::size_t m = p.min_survivors;
  std::size_t settled = 0, in_sum = 0, confirmed = 0, answers = 0;
  for (auto f : fates) {
    settled += f != BeforeReceipt;
    in_sum += f != BeforeReceipt && f != AfterSharing;
    confirmed += f == Stays || f == DuringUnmasking;
    answers += f == Stays;
  }
  if (settled < m) return "settle";
  if (in_sum < m) return "masked";
  if (confirmed < std::max<std::size_t>(p.threshold, m)) return "confirm";
  if (answers < p.target) return "unmask";
  return "";
}

void check_pattern(const lsa::Params& p, const std::vector<Fate>& fates, std::mt19937_64& rng, int& unmasked) {
  const auto must = expected_end(p, fates);
  const auto o = run(p, fates, rng);
  std::string pattern;
  for (auto f : fates) pattern += "SAMUB"[f];
  ASSERT_EQ(o.phase, must) << "n = " << fates.size() << ", pattern " << pattern << ": " << o.why;
  if (must.empty()) {
    ASSERT_TRUE(o.exact) << "pattern " << pattern;
    ++unmasked;
  } else if (must == "unmask") {
    ASSERT_NE(o.why.find("decoding the aggregate mask needs U"), std::string::npos) << o.why;
  }
}

// Every assignment of the four fates that keep a member settled to five members (4^5 = 1,024
// rounds): the sum is the exact sum of the masked members' inputs, or the round stops in the
// step that left too few members, saying why.
TEST(LightSecAgg, RecoversTheExactSumForEveryDropoutPatternOfFiveMembers) {
  std::mt19937_64 rng(2026);
  int unmasked = 0;
  const auto p = make_params(5, 1, 3, 3, 3, 6);
  std::vector<Fate> fates(5);
  for (int code = 0; code < 1024; ++code) {
    for (int i = 0, c = code; i < 5; ++i, c /= 4) fates[i] = static_cast<Fate>(c % 4);
    check_pattern(p, fates, rng, unmasked);
  }
  EXPECT_EQ(unmasked, 1 + 5 * 3 + 10 * 9);  // three or more answer: the others drop anywhere
}

// Six to eight members: every set of members dropping after sharing (so every U3) and every
// set dropping during unmasking (so every set of answers) that leaves a sum, or leaves one
// member too few; and random mixes of all five fates.
void every_set_dropping(std::size_t n, std::uint32_t U) {
  std::mt19937_64 rng(n);
  int unmasked = 0;
  const std::uint32_t T = 2, t = static_cast<std::uint32_t>(n / 2 + 1);
  const auto p = make_params(n, T, U, t, std::max(t, U), 1 + n);
  for (Fate f : {AfterSharing, DuringUnmasking}) {
    for (std::uint32_t set = 0; set < (1u << n); ++set) {
      if (std::popcount(set) > static_cast<int>(n - (f == AfterSharing ? p.min_survivors : U)) + 1) continue;
      std::vector<Fate> fates(n, Stays);
      for (std::size_t i = 0; i < n; ++i) {
        if (set >> i & 1) fates[i] = f;
      }
      check_pattern(p, fates, rng, unmasked);
    }
  }
  for (int k = 0; k < 30; ++k) {
    std::vector<Fate> fates(n);
    for (auto& f : fates) f = rng() % 2 ? Stays : static_cast<Fate>(1 + rng() % 4);
    check_pattern(p, fates, rng, unmasked);
  }
  EXPECT_GT(unmasked, 1 << (n - 3));
}
TEST(LightSecAgg, RecoversTheExactSumWhenAnySetOfSixMembersDrops) { every_set_dropping(6, 4); }
TEST(LightSecAgg, RecoversTheExactSumWhenAnySetOfSevenMembersDrops) { every_set_dropping(7, 4); }
TEST(LightSecAgg, RecoversTheExactSumWhenAnySetOfEightMembersDrops) { every_set_dropping(8, 5); }

// The server decodes from whichever U answers it has: every U-subset of seven answers gives
// the same, exact sum; and with all seven, the four beyond U check the first U.
TEST(LightSecAgg, DecodingFromAnyUOfTheAnswersGivesTheSameSum) {
  Group g(7, 2, 4, 4, 9);
  g.settle();
  auto sum = g.mask(7);
  auto request = g.confirm(7);
  std::vector<std::string> sealed;
  for (std::size_t i = 0; i < 7; ++i) sealed.push_back(g.c(i).unmask(request)->box);
  int subsets = 0;
  for (std::uint32_t set = 0; set < (1u << 7); ++set) {
    if (std::popcount(set) < 4) continue;
    lsa::Server s = *g.server;
    for (std::size_t i = 0; i < 7; ++i) {
      if (set >> i & 1) {
        ASSERT_TRUE(succeeded(s.on_unmask(g.p.members[i], sealed[i])));
      }
    }
    auto copy = sum;
    ASSERT_TRUE(succeeded(s.finish(copy))) << "answers " << set;
    ASSERT_EQ(copy, g.expected) << "answers " << set;
    ++subsets;
  }
  EXPECT_EQ(subsets, 35 + 21 + 7 + 1);
}

TEST(LightSecAgg, FewerThanUAnswersFailWithTheReasonAndLeaveTheSumMasked) {
  Group g(6, 2, 4, 4);
  g.settle();
  auto sum = g.mask(6);
  auto request = g.confirm(6);
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_TRUE(succeeded(g.server->on_unmask(g.p.members[i], g.c(i).unmask(request)->box)));
  const auto before = sum;
  const auto err = error_text(g.server->finish(sum));
  EXPECT_EQ(err, "only 3 survivors answered; decoding the aggregate mask needs U = 4");
  EXPECT_EQ(sum, before);
}

// An answer changed by its own member (signed by it, so the relay is not to blame): with more
// than U answers the server refuses to return a sum; with exactly U it cannot tell (the header
// says so).
TEST(LightSecAgg, AnAnswerAlteredByAByzantineMemberIsDetectedWithMoreThanUAnswers) {
  Group g(6, 2, 4, 4, 7);
  g.settle();
  auto sum = g.mask(6);
  auto request = g.confirm(6);
  std::vector<std::string> sealed;
  for (std::size_t i = 0; i < 6; ++i) sealed.push_back(g.c(i).unmask(request)->box);
  // s2's answer: other field words, signed by s2 for this survivor set.
  std::vector<std::uint32_t> words(g.p.segment(), 12345);
  const std::string bytes(reinterpret_cast<const char*>(words.data()), words.size() * 4);
  const auto s2 = test::signer(wire::SILO, "s2");
  const std::string forged = seal_to(
      g.p.server_key,
      lsa::encode_answer("s2", bytes, s2.sign(lsa::answer_statement(g.p.session, "s2", request.survivors, bytes))));
  for (std::size_t extra : {1u, 2u}) {
    lsa::Server s = *g.server;
    for (std::size_t i = 0; i < 4 + extra; ++i)
      ASSERT_TRUE(succeeded(s.on_unmask(g.p.members[i], i == 2 ? forged : sealed[i])));
    auto copy = sum;
    const auto err = error_text(s.finish(copy));
    EXPECT_NE(err.find("do not lie on one polynomial"), std::string::npos) << err;
    EXPECT_EQ(copy, sum);
  }
  lsa::Server exactly_u = *g.server;
  for (std::size_t i = 0; i < 4; ++i)
    ASSERT_TRUE(succeeded(exactly_u.on_unmask(g.p.members[i], i == 2 ? forged : sealed[i])));
  auto copy = sum;
  EXPECT_TRUE(succeeded(exactly_u.finish(copy)));
  EXPECT_NE(copy, g.expected);  // undetectable without redundancy
  // The honest answers still give the exact sum.
  lsa::Server honest = *g.server;
  for (std::size_t i = 0; i < 6; ++i) ASSERT_TRUE(succeeded(honest.on_unmask(g.p.members[i], sealed[i])));
  ASSERT_TRUE(succeeded(honest.finish(sum)));
  EXPECT_EQ(sum, g.expected);
}

// A relay cannot forge or swap answers: each is signed by its member for the named set.
TEST(LightSecAgg, AnAnswerNotSignedByItsMemberIsRefused) {
  Group g(5, 1, 3, 3);
  g.settle();
  g.mask(5);
  auto request = g.confirm(5);
  const auto a0 = g.c(0).unmask(request)->box;
  EXPECT_NE(error_text(g.server->on_unmask("s1", a0)).find("names another member"),
            std::string::npos);  // s0's answer as s1's
  std::vector<std::uint32_t> words(g.p.segment(), 1);
  const std::string bytes(reinterpret_cast<const char*>(words.data()), words.size() * 4);
  const auto s3 = test::signer(wire::SILO, "s3");
  const auto other_set = lsa::answer_statement(g.p.session, "s1", {"s0", "s1", "s2"}, bytes);
  EXPECT_NE(error_text(
                g.server->on_unmask("s1", seal_to(g.p.server_key, lsa::encode_answer("s1", bytes, s3.sign(other_set)))))
                .find("not signed by it"),
            std::string::npos);
  EXPECT_TRUE(succeeded(g.server->on_unmask("s0", a0)));
}

// A dealer whose shares are not on one polynomial (one holder gets other words, signed by the
// dealer, so nobody can refuse them) corrupts the aggregate: detected beyond U answers.
TEST(LightSecAgg, ADealerWhoseSharesAreNotOnOnePolynomialIsDetectedWithMoreThanUAnswers) {
  Group g(6, 2, 4, 4);
  g.advertise();
  const auto s5 = test::signer(wire::SILO, "s5");
  for (std::size_t i = 0; i < 6; ++i) {
    auto out = *g.c(i).share(g.keys);
    if (i == 5) {
      std::vector<std::uint32_t> words(g.p.segment(), 777);
      const std::string bytes(reinterpret_cast<const char*>(words.data()), words.size() * 4);
      std::string plain;
      append_field(plain, bytes);
      append_field(plain, s5.sign(lsa::share_statement(g.p.session, "s5", "s0", bytes)));
      out["s0"].box = seal_to(g.keys["s0"].inbox_keys.at("s5"), plain);
      out["s0"].signature = s5.sign(lsa::box_statement(g.p.session, "s5", "s0", out["s0"].box));
    }
    EXPECT_TRUE(succeeded(g.server->on_shares(g.p.members[i], out)));
  }
  g.inboxes = *g.server->close_shares();
  for (std::size_t i = 0; i < 6; ++i) {
    auto r = *g.c(i).receive(g.inboxes[g.p.members[i]]);
    EXPECT_TRUE(r.accusations.empty());
    EXPECT_TRUE(succeeded(g.server->on_receipt(g.p.members[i], r)));
  }
  auto s = *g.server->settle();
  for (auto& c : g.clients) EXPECT_TRUE(succeeded(c.settle(s)));
  auto sum = g.mask(6);
  auto request = g.confirm(6);
  for (std::size_t i = 0; i < 6; ++i)
    EXPECT_TRUE(succeeded(g.server->on_unmask(g.p.members[i], g.c(i).unmask(request)->box)));
  const auto err = error_text(g.server->finish(sum));
  EXPECT_NE(err.find("a dealer encoded inconsistently"), std::string::npos) << err;
}

// A box changed on the way no longer carries its dealer's signature: the recipient stops with
// an error instead of accusing the dealer.
TEST(LightSecAgg, ABoxAlteredOnTheWayIsRefusedByItsRecipientNotBlamedOnItsDealer) {
  for (const std::string what : {"box", "signature", "sender"}) {
    Group g(5, 1, 3, 3);
    g.share();
    auto inbox = g.inboxes["s0"];
    auto& from_s1 = inbox.at("s1");
    if (what == "box") from_s1.box[from_s1.box.size() / 2] ^= 0x01;
    if (what == "signature") from_s1.signature[3] ^= 0x01;
    if (what == "sender") inbox["s1"] = inbox.at("s2");
    auto r = g.c(0).receive(inbox);
    ASSERT_FALSE(r.has_value()) << what;
    EXPECT_NE(r.error().message().find("altered on the way"), std::string::npos) << what << ": " << r.error().message();
    EXPECT_TRUE(g.server->blamed().empty());
  }
}

// A dealer's signed box that does not open, or opens to a share it did not sign, is an
// accusation the server judges from the evidence: the dealer is excluded and the group goes on
// to the exact sum. A false accusation excludes the accuser.
TEST(LightSecAgg, ABadBoxExcludesItsDealerWithProofAndAFalseAccusationItsAccuser) {
  for (const std::string what : {"does not open", "not signed by it"}) {
    Group g(6, 2, 4, 4);
    g.advertise();
    const auto s5 = test::signer(wire::SILO, "s5");
    for (std::size_t i = 0; i < 6; ++i) {
      auto out = *g.c(i).share(g.keys);
      if (i == 5) {
        std::string plain;
        if (what == "does not open") {
          out["s0"].box = seal_to(X25519KeyPair::generate().public_key, "garbage");
        } else {
          std::vector<std::uint32_t> words(g.p.segment(), 5);
          const std::string bytes(reinterpret_cast<const char*>(words.data()), words.size() * 4);
          append_field(plain, bytes);
          append_field(plain, s5.sign(lsa::share_statement(g.p.session, "s5", "s1", bytes)));  // for another holder
          out["s0"].box = seal_to(g.keys["s0"].inbox_keys.at("s5"), plain);
        }
        out["s0"].signature = s5.sign(lsa::box_statement(g.p.session, "s5", "s0", out["s0"].box));
      }
      EXPECT_TRUE(succeeded(g.server->on_shares(g.p.members[i], out)));
    }
    g.inboxes = *g.server->close_shares();
    for (std::size_t i = 0; i < 6; ++i) {
      auto r = *g.c(i).receive(g.inboxes[g.p.members[i]]);
      EXPECT_EQ(r.accusations.size(), i == 0 ? 1u : 0u);
      if (i == 2) {  // s2 accuses honest s3 with a made-up key
        r.accusations.push_back({"s3", g.inboxes["s2"].at("s3"), Secret::random()});
        r.signature = test::signer(wire::SILO, "s2").sign(secagg::receipt_statement(g.p.session, "s2", r));
      }
      EXPECT_TRUE(succeeded(g.server->on_receipt(g.p.members[i], r)));
    }
    auto s = *g.server->settle();
    EXPECT_EQ(s.members, (std::vector<std::string>{"s0", "s1", "s3", "s4"})) << what;
    ASSERT_EQ(g.server->blamed().size(), 2u);
    std::map<std::string, std::string> blamed;
    for (const auto& b : g.server->blamed()) blamed[b.silo] = b.why;
    EXPECT_NE(blamed["s5"].find(what), std::string::npos) << blamed["s5"];
    EXPECT_NE(blamed["s2"].find("with a key that is not the one it advertised"), std::string::npos) << blamed["s2"];
    std::vector<lsa::Client*> in;
    for (std::size_t i : {0, 1, 3, 4}) {
      EXPECT_TRUE(succeeded(g.c(i).settle(s)));
      in.push_back(&g.c(i));
    }
    EXPECT_FALSE(succeeded(g.c(5).settle(s)));
    std::vector<std::uint32_t> sum(g.p.length, 0), expected(g.p.length, 0);
    for (std::size_t k = 0; k < in.size(); ++k) {
      std::vector<std::uint32_t> x(g.p.length, static_cast<std::uint32_t>(10 + k));
      field::field_add(expected, x);
      EXPECT_TRUE(succeeded(in[k]->mask(x)));
      field::field_add(sum, x);
      EXPECT_TRUE(succeeded(g.server->on_masked_input(s.members[k])));
    }
    auto u3 = *g.server->close_masked();
    for (std::size_t k = 0; k < in.size(); ++k) {
      EXPECT_TRUE(succeeded(g.server->on_confirmation(s.members[k], in[k]->confirm(u3)->signature)));
    }
    auto request = *g.server->close_confirmations();
    for (std::size_t k = 0; k < in.size(); ++k) {
      EXPECT_TRUE(succeeded(g.server->on_unmask(s.members[k], in[k]->unmask(request)->box)));
    }
    ASSERT_TRUE(succeeded(g.server->finish(sum)));
    EXPECT_EQ(sum, expected);
  }
}

TEST(LightSecAgg, AMemberConfirmsOneSurvivorSetOnlyAndAnswersOnlyARequestWithEnoughConfirmations) {
  Group g(5, 1, 3, 3);
  g.settle();
  g.mask(5);
  const std::vector<std::string> all{"s0", "s1", "s2", "s3", "s4"};
  const std::vector<std::string> without_s4{"s0", "s1", "s2", "s3"};
  std::map<std::string, std::string> sig_without, sig_all;
  for (std::size_t i : {0, 1}) sig_without[g.p.members[i]] = g.c(i).confirm(without_s4)->signature;
  for (std::size_t i : {2, 3, 4}) sig_all[g.p.members[i]] = g.c(i).confirm(all)->signature;
  auto twice = g.c(2).confirm(without_s4);
  ASSERT_FALSE(twice.has_value());
  EXPECT_EQ(twice.error().message(), "asked to confirm a second, different survivor set; refusing");
  // Two signatures where three are needed; borrowed signatures on another set do not count.
  auto borrowed = sig_without;
  borrowed.insert(sig_all.begin(), sig_all.end());
  auto r = g.c(0).unmask(secagg::UnmaskRequest{{"s4"}, without_s4, borrowed});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message(), "only 2 survivors signed the survivor set; 3 must");
  auto other = g.c(2).unmask(secagg::UnmaskRequest{{"s4"}, without_s4, borrowed});
  ASSERT_FALSE(other.has_value());
  EXPECT_EQ(other.error().message(), "the request names other survivors than this silo confirmed");
  // An honest request is answered once.
  secagg::UnmaskRequest honest{{}, all, sig_all};
  EXPECT_TRUE(bool(g.c(2).unmask(honest)));
  EXPECT_FALSE(bool(g.c(2).unmask(honest)));
}

// s4 dealt s0 nothing (the relay dropped its box) and left before its receipt: a survivor set
// naming it is refused by s0, which could not remove its mask.
TEST(LightSecAgg, AMemberRefusesASurvivorSetNamingSomeoneWhoDealtItNothing) {
  Group g(5, 1, 3, 3);
  g.share();
  g.inboxes["s0"].erase("s4");
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(succeeded(g.server->on_receipt(g.p.members[i], *g.c(i).receive(g.inboxes[g.p.members[i]]))));
  }
  auto s = *g.server->settle();
  EXPECT_TRUE(succeeded(g.c(0).settle(s)));
  std::vector<std::uint32_t> x(g.p.length, 1);
  EXPECT_TRUE(succeeded(g.c(0).mask(x)));
  auto c = g.c(0).confirm({"s0", "s1", "s4"});
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().message(), "survivor s4 dealt this silo no share: its mask could not be removed");
  // And a settled list naming it is refused before anything is masked.
  Group h(5, 1, 3, 3);
  h.share();
  h.inboxes["s0"].erase("s4");
  for (std::size_t i = 0; i < 5; ++i)
    EXPECT_TRUE(succeeded(h.server->on_receipt(h.p.members[i], *h.c(i).receive(h.inboxes[h.p.members[i]]))));
  EXPECT_EQ(error_text(h.c(0).settle(*h.server->settle())),
            "the settled list names s4, whose share this silo does not hold");
}

TEST(LightSecAgg, AnInputOutsideTheFieldIsRefusedAndNeverSentHalfMasked) {
  Group g(5, 1, 3, 3, 4);
  g.settle();
  std::vector<std::uint32_t> x{1, 2, 0xfffffffeu, 4};
  EXPECT_NE(error_text(g.c(0).mask(x)).find("field words below p"), std::string::npos);
  EXPECT_EQ(x, std::vector<std::uint32_t>(4, 0));
  field::to_field(x = {1, 2, 0xfffffffeu, 4});
  EXPECT_TRUE(succeeded(g.c(0).mask(x)));
}

TEST(LightSecAgg, ParametersAreRefusedWithTheirReason) {
  auto p = make_params(6, 2, 4, 4, 4, 10);
  p.server_key = X25519KeyPair::generate().public_key;
  EXPECT_TRUE(succeeded(lsa::check_params(p)));
  auto with = [&](auto change) {
    auto q = p;
    change(q);
    return error_text(lsa::check_params(q));
  };
  EXPECT_EQ(with([](lsa::Params& q) { q.members.clear(); }), "a secure group needs members");
  EXPECT_EQ(with([](lsa::Params& q) { q.members[1] = "s0"; }), "a secure group names a member twice");
  EXPECT_EQ(with([](lsa::Params& q) { q.privacy = 0; }),
            "the privacy T must be at least 1 (T colluding members learn nothing of a mask)");
  EXPECT_EQ(with([](lsa::Params& q) { q.target = 2; }),
            "the target U 2 must exceed the privacy T 2 (the mask takes U - T segments of the code)");
  EXPECT_EQ(with([](lsa::Params& q) { q.target = 7; }),
            "the target U 7 exceeds the group's 6 members: the server could never gather U answers");
  EXPECT_EQ(with([](lsa::Params& q) { q.threshold = 3; }),
            "threshold 3 is not above half of the group's 6 members: two different survivor sets could each collect it");
  EXPECT_EQ(with([](lsa::Params& q) { q.threshold = 7; }), "threshold 7 exceeds the group's 6 members");
  EXPECT_EQ(with([](lsa::Params& q) { q.target = 5; }),
            "the smallest revealed sum (4 silos) must lie between max(t, U) = 5 and the group's 6 members");
  EXPECT_EQ(with([](lsa::Params& q) { q.length = 0; }), "an input needs at least one word");
  EXPECT_EQ(with([](lsa::Params& q) { q.server_key = Key32{}; }), "the server's key is not a usable X25519 key");
  EXPECT_EQ(p.segment(), 5u);  // ceil(10 / (4 - 2))
}

TEST(LightSecAgg, AMemberRefusesASetupBelowItsOwnFloor) {
  auto p = make_params(20, 2, 12, 12, 12, 10);
  p.server_key = X25519KeyPair::generate().public_key;
  const secagg::Floor floor{3, 0.1};  // c = 2 colluders
  EXPECT_TRUE(succeeded(lsa::check_floor(p, floor)));
  p.privacy = 1;
  EXPECT_NE(error_text(lsa::check_floor(p, floor)).find("privacy T = 1 is below the colluders"), std::string::npos)
      << error_text(lsa::check_floor(p, floor));
  p.privacy = 2;
  EXPECT_NE(error_text(lsa::check_floor(p, secagg::Floor{13, 0.1})).find("sums of 12 silos; this silo's floor is 13"),
            std::string::npos);
  EXPECT_NE(error_text(lsa::check_floor(p, secagg::Floor{2, 0.5})).find("privacy T = 2 is below the colluders"),
            std::string::npos);
  auto q = make_params(20, 5, 6, 11, 11, 10);  // c = 5: 2 x 11 <= 20 + 5
  EXPECT_NE(error_text(lsa::check_floor(q, secagg::Floor{2, 0.25})).find("a split view of the survivors"),
            std::string::npos)
      << error_text(lsa::check_floor(q, secagg::Floor{2, 0.25}));
  auto r = make_params(20, 9, 10, 11, 11, 10);  // c = 10, T = 9
  EXPECT_NE(error_text(lsa::check_floor(r, secagg::Floor{2, 0.5})).find("privacy T = 9"), std::string::npos);
  auto small = make_params(8, 4, 5, 5, 5, 10);  // c = 4: a sum of 5 is the member and the colluders
  EXPECT_NE(error_text(lsa::check_floor(small, secagg::Floor{2, 0.5}))
                .find("which this silo and the colluders alone could make"),
            std::string::npos)
      << error_text(lsa::check_floor(small, secagg::Floor{2, 0.5}));
  // advertise() refuses it, naming the floor.
  Group g(5, 1, 3, 3);
  g.floor = secagg::Floor{};  // sums of at least 3, 5 % colluders: c = 1, 2 x 3 <= 5 + 1
  auto a = g.client("s0").advertise();
  ASSERT_FALSE(a.has_value());
  EXPECT_NE(a.error().message().find("below this silo's floor"), std::string::npos) << a.error().message();
}

// Any T members' shares of one mask are uniform whatever the mask: with T = 2, the pairs of
// shares two colluders hold of a zero mask and of an all-ones mask take every value alike
// (checked on the first word over many draws: means and a coarse histogram).
TEST(LightSecAgg, TSharesOfAMaskSayNothingAboutIt) {
  lsa::Params p = make_params(6, 2, 4, 4, 4, 2);
  const std::size_t L = p.segment();
  std::mt19937_64 rng(3);
  for (std::uint32_t value : {0u, 1u}) {
    std::vector<int> hist(16, 0);
    for (int draw = 0; draw < 4000; ++draw) {
      std::vector<std::uint32_t> coded(p.target * L, value);
      for (std::size_t k = 2 * L; k < coded.size(); ++k) coded[k] = static_cast<std::uint32_t>(rng() % kPrime);  // noise
      std::vector<const std::uint32_t*> in;
      for (std::size_t k = 0; k < p.target; ++k) in.push_back(coded.data() + k * L);
      std::vector<std::uint32_t> a(L), b(L);
      std::vector<std::uint32_t*> out{a.data(), b.data()};
      lsa::encode(p, in, std::vector<std::uint32_t>{2, 5}, out);
      ++hist[(a[0] >> 30) * 4 + (b[0] >> 30)];
    }
    for (int h = 0; h < 16; ++h) EXPECT_NEAR(hist[h], 250, 80) << "mask " << value << ", cell " << h;
  }
}

}  // namespace
}  // namespace xsilo::crypto
