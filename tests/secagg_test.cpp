// Secure aggregation in-process: the primitives, the fixed-point codec, and the client and
// server state machines under every dropout timing and against Byzantine silos, a tampering
// relay and a server that shows different members different views.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "crypto/fixed_point.h"
#include "crypto/fuzz_memo.h"
#include "crypto/mask.h"
#include "crypto/secagg.h"
#include "crypto/shamir.h"
#include "tests/result_util.h"
#include "tests/testlib.h"

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

// The fused pass adds exactly what one mask after another adds: word i of every term's stream
// (read from the raw keystream here) lands on word i, across the pieces the pass cuts the vector
// into and the pairs it adds them in, with any mix of signs, in every ring.
template <class T>
void check_fused_equals_one_by_one(std::size_t length, int count = 7) {
  std::vector<MaskTerm> terms;
  for (int j = 0; j < count; ++j) terms.push_back({Secret::random(), j % 3 == 0 ? -1 : +1});
  std::vector<T> fused(length), sequential(length);
  for (std::size_t i = 0; i < length; ++i) fused[i] = sequential[i] = static_cast<T>(i * 2654435761u);
  add_masks(terms, std::span<T>(fused));
  std::vector<std::uint8_t> ks(length * sizeof(T));
  for (const auto& t : terms) {
    keystream(t.seed, ks);
    for (std::size_t i = 0; i < length; ++i) {
      T w;
      std::memcpy(&w, ks.data() + i * sizeof(T), sizeof(T));
      sequential[i] = static_cast<T>(t.sign > 0 ? sequential[i] + w : sequential[i] - w);
    }
  }
  EXPECT_EQ(fused, sequential) << sizeof(T) * 8 << "-bit words, length " << length;
  add_masks(std::span<const MaskTerm>(), std::span<T>(fused));  // no terms: unchanged
  EXPECT_EQ(fused, sequential);
}

// Both loops: the one this CPU gets (AVX2 where it has it) and the portable one.
TEST(MaskPrg, TheFusedPassAddsWhatOneMaskAfterAnotherAdds) {
  for (auto kernel : {MaskKernel::Auto, MaskKernel::Portable}) {
    set_mask_kernel(kernel);
    for (std::size_t length : {0u, 1u, 2047u, 2048u, 2049u, 100003u}) {  // across pieces of every word size
      check_fused_equals_one_by_one<std::uint32_t>(length);
      check_fused_equals_one_by_one<std::uint64_t>(length);
      check_fused_equals_one_by_one<std::uint16_t>(length);
      check_fused_equals_one_by_one<std::uint8_t>(length);
    }
    // More terms than one pass takes (64): the batches add up to the same. One term, and two
    // (each an odd one out of its sign, paired with zeros).
    check_fused_equals_one_by_one<std::uint32_t>(5003, 130);
    check_fused_equals_one_by_one<std::uint16_t>(5003, 130);
    check_fused_equals_one_by_one<std::uint64_t>(5003, 1);
    check_fused_equals_one_by_one<std::uint32_t>(5003, 2);
  }
  set_mask_kernel(MaskKernel::Auto);
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

// A narrower ring reads the same AES-CTR stream in smaller words: word i of a 16-bit ring is
// keystream bytes 2i and 2i + 1, little-endian.
TEST(MaskPrg, NarrowRingsTakeTheSameKeystreamInSmallerWords) {
  const Secret seed = Secret::random();
  std::vector<std::uint8_t> ks(2 * 20000);  // past one 16 KiB piece of the generator
  keystream(seed, ks);
  std::vector<std::uint16_t> v16(20000, 0);
  add_mask(seed, std::span<std::uint16_t>(v16), +1);
  std::vector<std::uint8_t> v8(20000, 0);
  add_mask(seed, std::span<std::uint8_t>(v8), +1);
  for (std::size_t i = 0; i < v16.size(); ++i) {
    ASSERT_EQ(v16[i], static_cast<std::uint16_t>(ks[2 * i] | ks[2 * i + 1] << 8)) << i;
    ASSERT_EQ(v8[i], ks[i]) << i;
  }
  std::vector<std::uint16_t> x{1, 65535, 3};
  add_mask(seed, std::span<std::uint16_t>(x), +1);
  add_mask(seed, std::span<std::uint16_t>(x), -1);
  EXPECT_EQ(x, (std::vector<std::uint16_t>{1, 65535, 3}));
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

// The compact ring: 2 bytes a coordinate, decoded with its sign, rounded without bias.
TEST(FixedPoint, SixteenBitWordsRoundTripWithinOneStepAndRoundWithoutBias) {
  FixedPointParams p{16, 8, 10.0, 1.0};
  const std::vector<float> x{0.5f, -0.25f, 0.001f, -3.0f, 9.0f};  // norm 9.5: not clipped
  std::vector<std::uint16_t> enc(6);
  encode(p, x, 1.0, 7, enc);
  const auto dec = decode(p, enc);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dec[i], x[i], 1.0 / 256) << i;
  EXPECT_LT(dec[3], 0);  // negative codes wrap to large words and decode back with their sign
  EXPECT_DOUBLE_EQ(dec[5], 1.0);
  // 0.001 is a quarter of a step (1/256): its mean over many encodings is still 0.001.
  double mean = 0;
  const int trials = 40000;
  for (int t = 0; t < trials; ++t) {
    encode(p, std::vector<float>{-0.001f}, 1.0, static_cast<std::uint64_t>(t), std::span<std::uint16_t>(enc).first(2));
    mean += decode(p, std::span<const std::uint16_t>(enc).first(2))[0];
  }
  EXPECT_NEAR(mean / trials, -0.001, 1e-4);
  // 8-bit words the same way, with a coarser step.
  FixedPointParams q{8, 4, 1.0, 1.0};
  std::vector<std::uint8_t> e8(3);
  encode(q, std::vector<float>{0.6f, -0.8f}, 1.0, 3, e8);
  const auto d8 = decode(q, e8);
  EXPECT_NEAR(d8[0], 0.6, 1.0 / 16);
  EXPECT_NEAR(d8[1], -0.8, 1.0 / 16);
  EXPECT_DOUBLE_EQ(d8[2], 1.0);
  // Words of another ring are refused, not reinterpreted.
  std::vector<std::uint32_t> wide(6);
  EXPECT_THROW(encode(p, x, 1.0, 1, wide), std::invalid_argument);
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

// Adaptive clipping's bit: 1 after the weight when the delta was within the clip norm, so a
// group's sum counts its unclipped members.
TEST(FixedPoint, AppendsTheUnclippedBitWhenAskedSoSumsCountThem) {
  FixedPointParams p{64, 20, 1.0, 5.0, /*unclipped_bit=*/true};
  std::vector<std::uint64_t> a(4), b(4), c(3);
  EXPECT_DOUBLE_EQ(encode(p, std::vector<float>{3, 4}, 2.0, 1, a), 0.2);     // clipped
  EXPECT_DOUBLE_EQ(encode(p, std::vector<float>{0.3f, 0.4f}, 2.0, 2, b), 1.0);  // within
  for (std::size_t k = 0; k < a.size(); ++k) a[k] += b[k];
  const auto sum = decode(p, a);
  EXPECT_NEAR(sum[0], 2 * 0.6 + 2 * 0.3, 1e-5);
  EXPECT_DOUBLE_EQ(sum[2], 4.0);  // the weights
  EXPECT_DOUBLE_EQ(sum[3], 1.0);  // one of the two was within the norm
  EXPECT_THROW(encode(p, std::vector<float>{1, 1}, 1.0, 3, c), std::invalid_argument);  // d + 2 words needed
}

TEST(FixedPoint, ConfigsThatCanOverflowAreExplained) {
  FixedPointParams p{32, 16, 1.0, 1000.0};
  const auto why = error_text(check_overflow(p, 100));
  EXPECT_NE(why.find("100 silos x max_weight 1000"), std::string::npos) << why;
  EXPECT_EQ(error_text(check_overflow(p, 10)), "");
  p.bits = 64;
  EXPECT_EQ(error_text(check_overflow(p, 100)), "");
  p.bits = 24;
  EXPECT_EQ(error_text(check_overflow(p, 2)), "modulus bits must be 8, 16, 32 or 64");
}

// In a 16-bit ring the check is exact: one silo's largest code is ceil(M 2^f) (M = max_weight x
// max(clip_norm, 1)), and n of them must stay at or below 32767.
TEST(FixedPoint, TheSixteenBitOverflowCheckHoldsToTheLastWord) {
  FixedPointParams p{16, 8, 10.0, 1.0};
  EXPECT_EQ(largest_code(p), 2560);
  EXPECT_EQ(error_text(check_overflow(p, 12)), "");  // 30720
  EXPECT_EQ(error_text(check_overflow(p, 13)),
            "13 silos x max_weight 1 x clip_norm 10 x 2^8 fraction bits = 33280 can reach 2^15 (32768) in a 16-bit "
            "ring: lower fraction_bits to 7 or less, or use more modulus bits");
  // 7 x 4681 = 32767, the largest positive word: accepted; a code one higher is not, and a
  // fraction of a step rounds up to it (stochastic rounding can round up).
  FixedPointParams edge{16, 1, 1.0, 2340.5};
  EXPECT_EQ(error_text(check_overflow(edge, 7)), "");
  edge.max_weight = 2340.3;  // 4680.6 steps: rounds to 4681
  EXPECT_EQ(error_text(check_overflow(edge, 7)), "");
  edge.max_weight = 2340.6;  // 4681.2 steps: can round to 4682
  EXPECT_NE(error_text(check_overflow(edge, 7)).find("can reach 2^15"), std::string::npos);
  // At the boundary the sum of seven silos' largest values, either sign, decodes exactly.
  edge.max_weight = 2340.5;
  std::vector<std::uint16_t> sum_pos(2, 0), sum_neg(2, 0), one(2);
  for (int i = 0; i < 7; ++i) {
    encode(edge, std::vector<float>{1.0f}, 2340.5, static_cast<std::uint64_t>(i), one);
    for (std::size_t k = 0; k < 2; ++k) sum_pos[k] = static_cast<std::uint16_t>(sum_pos[k] + one[k]);
    encode(edge, std::vector<float>{-1.0f}, 2340.5, static_cast<std::uint64_t>(i), one);
    sum_neg[0] = static_cast<std::uint16_t>(sum_neg[0] + one[0]);
  }
  EXPECT_DOUBLE_EQ(decode(edge, std::span<const std::uint16_t>(sum_pos))[0], 7 * 2340.5);
  EXPECT_DOUBLE_EQ(decode(edge, std::span<const std::uint16_t>(sum_pos))[1], 7 * 2340.5);  // the weights
  EXPECT_DOUBLE_EQ(decode(edge, std::span<const std::uint16_t>(sum_neg))[0], -7 * 2340.5);
  // A value a hair above the bound (float rounding in the clip) is clamped to it, never past.
  FixedPointParams tight{16, 8, 1.0, 1.0};
  std::vector<std::uint16_t> w(2);
  encode(tight, std::vector<float>{1.0000001f}, 1.0, 5, w);
  EXPECT_LE(decode(tight, std::span<const std::uint16_t>(w))[0], 1.0);
}

// ---- the protocol -------------------------------------------------------------------------

// When a silo leaves the protocol, if it does...
enum Fate { Stays, BeforeKeys, AfterKeys, AfterShares, AfterReceipt, AfterMasking, AfterConfirm };
// ... and how it misbehaves, if it is Byzantine.
enum Behaviour { Honest, Garbage, FalseAccuser, BadForwarder };

struct Silo {
  std::string name;
  Fate fate = Stays;
  Behaviour behaviour = Honest;
  std::set<std::string> garbage_to;  // Garbage: the members it deals a box that does not open
  std::string accuses;               // FalseAccuser: the honest member it accuses
};

struct Outcome {
  bool aborted = false;
  std::string phase, why;
  std::vector<std::uint64_t> sum, expected;
  std::set<std::string> blamed;
  std::size_t expansions = 0;
  std::vector<std::string> refusals;  // SecAgg+: why members declined to share or to unmask
};

secagg::Params make_params(std::size_t n, std::uint32_t t, std::uint32_t min_survivors, std::uint32_t bits,
                           std::size_t len) {
  secagg::Params p;
  p.session = "fed/1/1";
  for (std::size_t i = 0; i < n; ++i) p.members.push_back("s" + std::to_string(i));
  p.threshold = t;
  p.min_survivors = min_survivors;
  p.bits = bits;
  p.length = len;
  return p;
}

// A Byzantine forwarder's answer: shares with the right x that no dealer signed.
std::string forged_reply(const secagg::Params& p, const std::string& me, const secagg::UnmaskRequest& r) {
  secagg::UnmaskReply fake;
  Share s;
  s.x = p.index_of(me);
  s.y = {1, 2, 3, 4, 5};
  const secagg::Graph g(p.members.size(), p.graph() ? p.degree : 0, p.session + "/" + p.graph_seed);
  for (const auto& v : r.dropped) {
    if (g.adjacent(s.x, p.index_of(v))) fake.mask_key_shares[v] = {s.encode(), "forged"};
  }
  for (const auto& v : r.survivors) {
    if (v == me || g.adjacent(s.x, p.index_of(v))) fake.self_mask_shares[v] = {s.encode(), "forged"};
  }
  return seal_to(p.server_key, secagg::encode(fake));
}

// One group through the whole protocol, every silo following its fate and behaviour.
template <class T>
Outcome run_protocol(secagg::Params p, const std::vector<Silo>& silos, std::mt19937_64& rng) {
  Outcome o;
  auto abort = [&](const char* phase, std::string why) {
    o.aborted = true;
    o.phase = phase;
    o.why = std::move(why);
    return o;
  };
  auto box = X25519KeyPair::generate();
  p.server_key = box.public_key;
  const auto server_signer = test::signer(wire::SERVER, "server");
  secagg::Server server(p, test::verifier(), server_signer, box);
  std::map<std::string, secagg::Client> clients;
  std::map<std::string, const Silo*> by_name;
  for (const auto& s : silos) {
    clients.emplace(s.name, secagg::Client(p, s.name, test::signer(wire::SILO, s.name), test::verifier(),
                                           server_signer.certificate(), "server", secagg::Floor{2, 0.0}));
    by_name[s.name] = &s;
  }
  auto collect_blame = [&] {
    for (const auto& b : server.blamed()) o.blamed.insert(b.silo);
  };
  o.expected.assign(p.length, 0);
  std::vector<T> sum(p.length, 0);

  for (const auto& s : silos) {
    if (s.fate == BeforeKeys) continue;
    auto adv = clients.at(s.name).advertise();
    EXPECT_TRUE(adv.has_value());
    EXPECT_TRUE(succeeded(server.on_keys(s.name, *adv)));
  }
  auto keys = server.close_keys();
  if (!keys) return abort("keys", keys.error().message());
  for (const auto& s : silos) {
    if (s.fate == BeforeKeys || s.fate == AfterKeys) continue;
    auto out = clients.at(s.name).share(server.keys_for(s.name));  // its part of the list, as sent
    if (p.graph() && !out) {  // too few of its holders advertised keys: it goes no further
      o.refusals.push_back(s.name + ": " + out.error().message());
      continue;
    }
    EXPECT_TRUE(out.has_value()) << out.error().message();
    for (const auto& v : s.garbage_to) {
      if (!out->count(v)) continue;  // it never advertised keys: nothing dealt to it
      auto& sealed = out->at(v);
      sealed.box = seal_to(keys->at(v).inbox_keys.at(s.name), "not shares");
      sealed.signature = test::signer(wire::SILO, s.name).sign(secagg::box_statement(p.session, s.name, v, sealed.box));
    }
    EXPECT_TRUE(succeeded(server.on_shares(s.name, *out)));
  }
  auto deliveries = server.close_shares();
  if (!deliveries) return abort("shares", deliveries.error().message());
  for (const auto& [name, inbox] : *deliveries) {
    const Silo& s = *by_name.at(name);
    if (s.fate == AfterShares) continue;
    auto receipt = clients.at(name).receive(inbox);
    EXPECT_TRUE(receipt.has_value()) << receipt.error().message();
    auto& r = *receipt;
    if (s.behaviour == FalseAccuser && inbox.count(s.accuses)) {
      r.accusations.push_back({s.accuses, inbox.at(s.accuses), Secret::random()});
      r.signature = test::signer(wire::SILO, name).sign(secagg::receipt_statement(p.session, name, r));
    }
    EXPECT_TRUE(succeeded(server.on_receipt(name, r)));
  }
  auto settled = server.settle();
  collect_blame();
  if (!settled) return abort("settle", settled.error().message());
  for (const auto& name : settled->members) {
    if (by_name.at(name)->fate == AfterReceipt) continue;
    auto& c = clients.at(name);
    EXPECT_TRUE(succeeded(c.settle(*settled)));
    std::vector<T> x(p.length);
    for (auto& v : x) v = static_cast<T>(rng());
    for (std::size_t k = 0; k < p.length; ++k) o.expected[k] = static_cast<T>(o.expected[k] + x[k]);
    EXPECT_TRUE(succeeded(c.mask(std::span<T>(x))));
    for (std::size_t k = 0; k < p.length; ++k) sum[k] = static_cast<T>(sum[k] + x[k]);
    EXPECT_TRUE(succeeded(server.on_masked_input(name)));
  }
  auto u3 = server.close_masked();
  if (!u3) return abort("masked", u3.error().message());
  for (const auto& name : *u3) {
    if (by_name.at(name)->fate == AfterMasking) continue;
    auto c = clients.at(name).confirm(*u3, server.survivors_signature());
    EXPECT_TRUE(c.has_value());
    EXPECT_TRUE(succeeded(server.on_confirmation(name, c->signature)));
  }
  auto request = server.close_confirmations();
  if (!request) return abort("confirm", request.error().message());
  for (const auto& name : *u3) {
    const Silo& s = *by_name.at(name);
    if (s.fate == AfterMasking || s.fate == AfterConfirm) continue;
    auto reply = clients.at(name).unmask(*request);
    if (p.graph() && !reply) {  // too few of its holders confirmed: it does not answer
      o.refusals.push_back(name + ": " + reply.error().message());
      continue;
    }
    EXPECT_TRUE(reply.has_value()) << reply.error().message();
    const std::string sealed = s.behaviour == BadForwarder ? forged_reply(p, name, *request) : reply->box;
    EXPECT_TRUE(succeeded(server.on_unmask(name, sealed)));
  }
  const std::string err = error_text(server.finish(std::span<T>(sum)));
  collect_blame();
  if (!err.empty()) return abort("unmask", err);
  o.sum.assign(sum.begin(), sum.end());
  o.expansions = server.expansions();
  return o;
}

// What a scenario must end in, worked out from the fates and behaviours alone: the phase it
// aborts in ("" for none) and the silos excluded with proof.
std::pair<std::string, std::set<std::string>> expected_end(const secagg::Params& p, const std::vector<Silo>& silos) {
  const std::size_t m = p.min_survivors;
  std::set<std::string> u1, u2, receipted, byzantine_excluded, settled, u3, confirmed, valid_answers;
  for (const auto& s : silos) {
    if (s.fate != BeforeKeys) u1.insert(s.name);
    if (s.fate != BeforeKeys && s.fate != AfterKeys) u2.insert(s.name);
  }
  if (u1.size() < m) return {"keys", {}};
  if (u2.size() < m) return {"shares", {}};
  for (const auto& s : silos) {
    if (u2.count(s.name) && s.fate != AfterShares) receipted.insert(s.name);
  }
  for (const auto& s : silos) {
    if (!receipted.count(s.name) && !u2.count(s.name)) continue;
    // A garbage dealer is excluded once a member that sends its receipt received garbage.
    if (s.behaviour == Garbage && u2.count(s.name)) {
      for (const auto& v : s.garbage_to) {
        if (receipted.count(v)) byzantine_excluded.insert(s.name);
      }
    }
    if (s.behaviour == FalseAccuser && receipted.count(s.name) && u2.count(s.accuses)) byzantine_excluded.insert(s.name);
  }
  for (const auto& v : receipted) {
    if (!byzantine_excluded.count(v)) settled.insert(v);
  }
  if (settled.size() < m) return {"settle", byzantine_excluded};
  std::map<std::string, const Silo*> by_name;
  for (const auto& s : silos) by_name[s.name] = &s;
  for (const auto& v : settled) {
    if (by_name[v]->fate != AfterReceipt) u3.insert(v);
  }
  if (u3.size() < m) return {"masked", byzantine_excluded};
  for (const auto& v : u3) {
    if (by_name[v]->fate != AfterMasking) confirmed.insert(v);
  }
  if (confirmed.size() < m) return {"confirm", byzantine_excluded};
  std::size_t answers = 0;
  for (const auto& v : confirmed) {
    if (by_name[v]->fate == AfterConfirm) continue;
    ++answers;
    if (by_name[v]->behaviour != BadForwarder) valid_answers.insert(v);
  }
  if (answers < p.threshold || valid_answers.size() < p.threshold) return {"unmask", byzantine_excluded};
  return {"", byzantine_excluded};
}

// 1,000 random scenarios: group sizes, thresholds above half, the smallest revealed sum, rings,
// a dropout fate for every silo and, in half of them, Byzantine silos (garbage shares, false
// accusations, forged unmask shares). The result is the exact sum of the surviving silos'
// inputs, or the round aborts exactly when a phase ends with fewer than min_survivors silos (or
// fewer than t valid answers); Byzantine silos that act are excluded with proof, and no
// honest silo is ever blamed.
TEST(SecAgg, RecoversTheExactSumOrAbortsExactlyWhenItMustUnderDropoutsAndByzantineSilos) {
  std::mt19937_64 rng(2026);
  int commits = 0, aborts = 0, exclusions = 0;
  std::map<std::string, int> phases;
  for (int scenario = 0; scenario < 1000; ++scenario) {
    const std::size_t n = 2 + rng() % 9;
    const auto t = static_cast<std::uint32_t>(n / 2 + 1 + rng() % (n - n / 2));
    const auto m = static_cast<std::uint32_t>(t + rng() % (n - t + 1));
    const std::uint32_t bits = 8u << (rng() % 4);  // 8, 16, 32 or 64
    const auto p = make_params(n, t, m, bits, 1 + rng() % 12);
    std::vector<Silo> silos(n);
    const bool byzantine = rng() % 2;
    for (std::size_t i = 0; i < n; ++i) {
      auto& s = silos[i];
      s.name = p.members[i];
      s.fate = rng() % 4 == 0 ? static_cast<Fate>(1 + rng() % 6) : Stays;
      if (byzantine && rng() % 4 == 0) s.behaviour = static_cast<Behaviour>(1 + rng() % 3);
    }
    for (auto& s : silos) {
      if (s.behaviour == Garbage) {
        for (const auto& v : p.members) {
          if (v != s.name && rng() % 2) s.garbage_to.insert(v);
        }
      }
      if (s.behaviour == FalseAccuser) {
        std::vector<std::string> honest;
        for (const auto& v : silos) {
          if (v.name != s.name && v.behaviour == Honest) honest.push_back(v.name);
        }
        if (honest.empty()) s.behaviour = Honest;
        else s.accuses = honest[rng() % honest.size()];
      }
    }
    const auto [must, excluded] = expected_end(p, silos);
    const Outcome o = bits == 8    ? run_protocol<std::uint8_t>(p, silos, rng)
                      : bits == 16 ? run_protocol<std::uint16_t>(p, silos, rng)
                      : bits == 32 ? run_protocol<std::uint32_t>(p, silos, rng)
                                   : run_protocol<std::uint64_t>(p, silos, rng);
    for (const auto& b : o.blamed) {
      auto it = std::find_if(silos.begin(), silos.end(), [&](const Silo& s) { return s.name == b; });
      ASSERT_NE(it->behaviour, Honest) << "scenario " << scenario << " blamed honest " << b;
    }
    for (const auto& x : excluded) ASSERT_TRUE(o.blamed.count(x)) << "scenario " << scenario << ": " << x << " not excluded";
    exclusions += static_cast<int>(excluded.size());
    if (must.empty()) {
      ASSERT_FALSE(o.aborted) << "scenario " << scenario << " aborted in " << o.phase << ": " << o.why;
      ASSERT_EQ(o.sum, o.expected) << "scenario " << scenario;
      ++commits;
    } else {
      ASSERT_TRUE(o.aborted) << "scenario " << scenario << " should abort in " << must;
      ASSERT_EQ(o.phase, must) << "scenario " << scenario << ": " << o.why;
      ++aborts;
      ++phases[must];
    }
  }
  // The mix: about 30 % of scenarios commit, the rest abort in every phase; Byzantine silos act
  // in about a third of them.
  EXPECT_GT(commits, 250);
  EXPECT_GT(aborts, 250);
  EXPECT_GT(exclusions, 100);
  std::cout << commits << " committed, " << aborts << " aborted, " << exclusions << " exclusions\n";
  EXPECT_GE(phases.size(), 5u) << "every phase should see aborts";
}

// The compact rings: a silo that drops after its group settled (its pairwise masks are rebuilt
// from its mask key) and one that drops after masking (its input counts) leave the exact sum of
// the survivors' inputs mod 2^16 (and 2^8).
TEST(SecAgg, RecoversTheSumInSixteenAndEightBitRingsWhenSilosDrop) {
  std::mt19937_64 rng(16);
  for (std::uint32_t bits : {16u, 8u}) {
    const auto p = make_params(6, 4, 4, bits, 3000);
    std::vector<Silo> silos(6);
    for (std::size_t i = 0; i < silos.size(); ++i) silos[i].name = p.members[i];
    silos[1].fate = AfterReceipt;
    silos[4].fate = AfterMasking;
    const Outcome o = bits == 16 ? run_protocol<std::uint16_t>(p, silos, rng) : run_protocol<std::uint8_t>(p, silos, rng);
    ASSERT_FALSE(o.aborted) << bits << " bits: " << o.phase << ": " << o.why;
    EXPECT_EQ(o.sum, o.expected) << bits << " bits";
  }
}

// A group run step by step, so a test can play the server, an edge or a silo in between.
struct Group {
  secagg::Params p;
  crypto::CertSigner server_signer = test::signer(wire::SERVER, "server");
  X25519KeyPair box = X25519KeyPair::generate();
  std::vector<secagg::Client> clients;
  std::unique_ptr<secagg::Server> server;
  secagg::KeyList keys;
  std::map<std::string, secagg::Inbox> inboxes;
  explicit Group(std::size_t n, std::uint32_t t, std::size_t len = 4, std::uint32_t min_survivors = 0,
                 std::uint32_t degree = 0, std::string graph_seed = "round-seed")
      : p(make_params(n, t, min_survivors ? min_survivors : t, 32, len)) {
    p.session = "fed/7/1";
    p.degree = degree;
    p.graph_seed = std::move(graph_seed);
    p.server_key = box.public_key;
    server = std::make_unique<secagg::Server>(p, test::verifier(), server_signer, box);
    for (auto& m : p.members) clients.push_back(client(m));
  }
  // Members assume no colluder and accept sums of two unless a test sets their floor: the
  // protocol's own checks are what most tests here are about (the floor has tests of its own).
  secagg::Floor floor{2, 0.0};
  secagg::Client client(const std::string& m) const {
    return secagg::Client(p, m, test::signer(wire::SILO, m), test::verifier(), server_signer.certificate(), "server",
                          floor);
  }
  secagg::Client& c(std::size_t i) { return clients[i]; }
  // Every member's keys to the server, U1 not yet settled.
  void offer_keys() {
    for (std::size_t i = 0; i < clients.size(); ++i) {
      EXPECT_TRUE(succeeded(server->on_keys(p.members[i], *clients[i].advertise())));
    }
  }
  void advertise() {
    offer_keys();
    keys = *server->close_keys();
  }
  void share() {
    advertise();
    for (std::size_t i = 0; i < clients.size(); ++i) {
      // Each member gets its part of the list, as SecureRound sends it (all of it: complete graph).
      EXPECT_TRUE(succeeded(server->on_shares(p.members[i], *clients[i].share(server->keys_for(p.members[i])))));
    }
    inboxes = *server->close_shares();
  }
  // Through receipts and settling, every member honest.
  secagg::Settled settle() {
    share();
    for (std::size_t i = 0; i < clients.size(); ++i) {
      EXPECT_TRUE(succeeded(server->on_receipt(p.members[i], *clients[i].receive(inboxes[p.members[i]]))));
    }
    auto s = *server->settle();
    for (auto& c : clients) EXPECT_TRUE(succeeded(c.settle(s)));
    return s;
  }
  // Members [0, k) mask input i + 1 everywhere; the others drop.
  std::vector<std::uint32_t> mask(std::size_t k) {
    std::vector<std::uint32_t> sum(p.length, 0);
    for (std::size_t i = 0; i < k; ++i) {
      std::vector<std::uint32_t> x(p.length, static_cast<std::uint32_t>(i + 1));
      EXPECT_TRUE(succeeded(clients[i].mask(std::span<std::uint32_t>(x))));
      for (std::size_t j = 0; j < p.length; ++j) sum[j] += x[j];
      EXPECT_TRUE(succeeded(server->on_masked_input(p.members[i])));
    }
    return sum;
  }
};

TEST(SecAgg, AThresholdNotAboveHalfTheGroupIsRefusedByTheSilos) {
  // The split-view attack needs t <= n / 2: with n = 4, t = 2 two disjoint halves could each
  // confirm a different survivor set. A silo refuses such a group before it makes any key.
  auto p = make_params(4, 2, 2, 32, 4);
  p.server_key = X25519KeyPair::generate().public_key;
  secagg::Client c(p, "s0", test::signer(wire::SILO, "s0"), test::verifier(), "", "server");
  auto adv = c.advertise();
  ASSERT_FALSE(adv.has_value());
  EXPECT_NE(adv.error().message().find("not above half"), std::string::npos) << adv.error().message();
  p.threshold = 3;
  p.min_survivors = 2;  // a revealed sum smaller than the threshold
  EXPECT_FALSE(succeeded(secagg::check_params(p)));
}

TEST(SecAgg, KeysSwappedOrReplayedOnTheWayAreRefusedByEveryMember) {
  // An edge that substitutes a member's keys (to read the shares dealt to it), presents another
  // CA's certificate, or replays a member's keys from another round is caught by the others.
  Group g(3, 2);
  g.advertise();
  auto swapped = g.keys;
  swapped["s1"].mask_pk = X25519KeyPair::generate().public_key;
  auto out = g.c(0).share(swapped);
  ASSERT_FALSE(out.has_value());
  EXPECT_NE(out.error().message().find("keys of s1 are not signed by s1"), std::string::npos) << out.error().message();

  Group h(3, 2);
  h.advertise();
  auto foreign = h.keys;
  const auto mallory = test::foreign_signer(wire::SILO, "s1");
  foreign["s1"].certificate = mallory.certificate();
  foreign["s1"].signature = mallory.sign(secagg::keys_statement(h.p.session, "s1", foreign["s1"]));
  out = h.c(0).share(foreign);
  ASSERT_FALSE(out.has_value());
  EXPECT_NE(out.error().message().find("did not verify against the federation CA"), std::string::npos)
      << out.error().message();

  Group other_round(3, 2);
  other_round.p.session = "fed/6/1";
  other_round.clients.clear();
  for (auto& m : other_round.p.members) other_round.clients.push_back(other_round.client(m));
  Group k(3, 2);
  k.advertise();
  auto replayed = k.keys;
  replayed["s1"] = *other_round.c(1).advertise();
  EXPECT_FALSE(bool(k.c(0).share(replayed)));
  // And the server refuses keys not signed by the member they are said to come from.
  EXPECT_FALSE(succeeded(g.server->on_keys("s2", replayed["s1"])));
}

TEST(SecAgg, AMemberWhoseBoxesDoNotOpenIsExcludedWithProofAndTheGroupGoesOn) {
  Group g(4, 3);
  g.advertise();
  for (std::size_t i = 0; i < 4; ++i) {
    auto out = *g.c(i).share(g.keys);
    if (i == 3) {  // s3 deals s0 garbage, signed by it
      out["s0"].box = seal_to(g.keys["s0"].inbox_keys.at("s3"), "garbage");
      out["s0"].signature = test::signer(wire::SILO, "s3").sign(secagg::box_statement(g.p.session, "s3", "s0", out["s0"].box));
    }
    EXPECT_TRUE(succeeded(g.server->on_shares(g.p.members[i], out)));
  }
  g.inboxes = *g.server->close_shares();
  for (std::size_t i = 0; i < 4; ++i) {
    auto r = *g.c(i).receive(g.inboxes[g.p.members[i]]);
    EXPECT_EQ(r.accusations.size(), i == 0 ? 1u : 0u);
    EXPECT_TRUE(succeeded(g.server->on_receipt(g.p.members[i], r)));
  }
  auto s = *g.server->settle();
  EXPECT_EQ(s.members, (std::vector<std::string>{"s0", "s1", "s2"}));
  ASSERT_EQ(g.server->blamed().size(), 1u);
  EXPECT_EQ(g.server->blamed()[0].silo, "s3");
  EXPECT_NE(g.server->blamed()[0].why.find("malformed"), std::string::npos) << g.server->blamed()[0].why;
  for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(succeeded(g.c(i).settle(s)));
  EXPECT_FALSE(succeeded(g.c(3).settle(s)));  // excluded: it does not mask
  auto sum = g.mask(3);
  auto u3 = *g.server->close_masked();
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_TRUE(succeeded(g.server->on_confirmation(g.p.members[i], g.c(i).confirm(u3)->signature)));
  auto req = *g.server->close_confirmations();
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_TRUE(succeeded(g.server->on_unmask(g.p.members[i], g.c(i).unmask(req)->box)));
  ASSERT_TRUE(succeeded(g.server->finish(std::span<std::uint32_t>(sum))));
  EXPECT_EQ(sum, std::vector<std::uint32_t>(4, 1 + 2 + 3));
}

// A box changed on the way (by the edge that relays the delivery) no longer carries its
// dealer's signature: the recipient stops with an error instead of accusing the dealer, and
// nothing it received is opened or used.
TEST(SecAgg, ABoxAlteredOnTheWayIsRefusedByItsRecipientNotBlamedOnItsDealer) {
  for (const std::string what : {"box", "signature", "sender"}) {
    Group g(3, 2);
    g.share();
    auto inbox = g.inboxes["s0"];
    auto& from_s1 = inbox.at("s1");
    if (what == "box") from_s1.box[from_s1.box.size() / 2] ^= 0x01;
    if (what == "signature") from_s1.signature[3] ^= 0x01;
    if (what == "sender") inbox["s1"] = inbox.at("s2");  // s2's box presented as s1's
    auto r = g.c(0).receive(inbox);
    ASSERT_FALSE(r.has_value()) << what;
    EXPECT_NE(r.error().message().find("altered on the way"), std::string::npos) << what << ": " << r.error().message();
    EXPECT_TRUE(g.server->blamed().empty()) << what;
  }
}

TEST(SecAgg, AFalseAccusationExcludesTheAccuserNotTheAccused) {
  Group g(4, 3);
  g.share();
  for (std::size_t i = 0; i < 4; ++i) {
    auto r = *g.c(i).receive(g.inboxes[g.p.members[i]]);
    if (i == 1) {  // s1 accuses honest s2 with a made-up key
      r.accusations.push_back({"s2", g.inboxes["s1"].at("s2"), Secret::random()});
      r.signature = test::signer(wire::SILO, "s1").sign(secagg::receipt_statement(g.p.session, "s1", r));
    }
    EXPECT_TRUE(succeeded(g.server->on_receipt(g.p.members[i], r)));
  }
  auto s = *g.server->settle();
  EXPECT_EQ(s.members, (std::vector<std::string>{"s0", "s2", "s3"}));
  ASSERT_EQ(g.server->blamed().size(), 1u);
  EXPECT_EQ(g.server->blamed()[0].silo, "s1");
}

TEST(SecAgg, UnusableKeysSignedByTheirOwnerExcludeIt) {
  Group g(4, 3);
  for (std::size_t i = 0; i < 4; ++i) {
    auto adv = *g.c(i).advertise();
    if (i == 2) {
      adv.mask_pk = Key32{};  // a low-order point, signed by s2 itself
      adv.signature = test::signer(wire::SILO, "s2").sign(secagg::keys_statement(g.p.session, "s2", adv));
      EXPECT_FALSE(succeeded(g.server->on_keys("s2", adv)));
    } else {
      EXPECT_TRUE(succeeded(g.server->on_keys(g.p.members[i], adv)));
    }
  }
  auto keys = *g.server->close_keys();
  EXPECT_EQ(keys.size(), 3u);
  EXPECT_EQ(keys.count("s2"), 0u);
  ASSERT_EQ(g.server->blamed().size(), 1u);
  EXPECT_EQ(g.server->blamed()[0].silo, "s2");
}

TEST(SecAgg, ASplitViewOfTheSurvivorsCannotCollectEnoughConfirmations) {
  // The attack: tell some members "s3 dropped" (to get its mask key) and others "s3 survived"
  // (to get its self mask). Each honest member confirms one survivor set only, and an unmask
  // request must carry more than half of the group's signatures on the set it names.
  Group g(5, 3);
  g.settle();
  auto sum = g.mask(5);
  const std::vector<std::string> all{"s0", "s1", "s2", "s3", "s4"};
  const std::vector<std::string> without_s3{"s0", "s1", "s2", "s4"};
  // s0, s1 are shown the set without s3; s2, s3, s4 the full set.
  std::map<std::string, std::string> sig_without, sig_all;
  for (std::size_t i : {0, 1}) sig_without[g.p.members[i]] = g.c(i).confirm(without_s3)->signature;
  for (std::size_t i : {2, 3, 4}) sig_all[g.p.members[i]] = g.c(i).confirm(all)->signature;
  // A member asked to confirm a second set refuses.
  auto twice = g.c(2).confirm(without_s3);
  ASSERT_FALSE(twice.has_value());
  EXPECT_NE(twice.error().message().find("second, different survivor set"), std::string::npos);
  // The "s3 dropped" request has only two signatures: s0 and s1 refuse to reveal s3's mask key.
  secagg::UnmaskRequest dropped_s3{{"s3"}, without_s3, sig_without};
  auto r = g.c(0).unmask(dropped_s3);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("only 2 survivors signed"), std::string::npos) << r.error().message();
  // Borrowing the others' signatures does not help: they signed another set.
  auto borrowed = sig_without;
  borrowed.insert(sig_all.begin(), sig_all.end());
  EXPECT_FALSE(bool(g.c(1).unmask(secagg::UnmaskRequest{{"s3"}, without_s3, borrowed})));
  // A member shown the full set refuses a request for the reduced one.
  auto other = g.c(2).unmask(secagg::UnmaskRequest{{"s3"}, without_s3, borrowed});
  ASSERT_FALSE(other.has_value());
  EXPECT_NE(other.error().message().find("other survivors than this silo confirmed"), std::string::npos);
  (void)sum;
}

TEST(SecAgg, UnmaskAnswersAreSealedToTheServerAndForgedSharesAreBlamedOnTheirSender) {
  Group g(4, 3);
  g.settle();
  auto sum = g.mask(4);
  auto u3 = *g.server->close_masked();
  for (std::size_t i = 0; i < 4; ++i)
    EXPECT_TRUE(succeeded(g.server->on_confirmation(g.p.members[i], g.c(i).confirm(u3)->signature)));
  auto req = *g.server->close_confirmations();
  std::vector<std::string> sealed;
  for (std::size_t i = 0; i < 4; ++i) sealed.push_back(g.c(i).unmask(req)->box);
  // A relay sees ciphertext only: it cannot open it, and one changed byte makes it useless.
  EXPECT_FALSE(open_sealed(X25519KeyPair::generate(), sealed[0]));
  auto tampered = sealed[0];
  tampered[tampered.size() / 2] ^= 1;
  EXPECT_FALSE(succeeded(g.server->on_unmask("s0", tampered)));
  // s1 answers with shares no dealer signed: it is blamed, and the sum still comes out of the
  // other three answers (t = 3).
  EXPECT_TRUE(succeeded(g.server->on_unmask("s1", forged_reply(g.p, "s1", req))));
  for (std::size_t i : {0, 2, 3}) EXPECT_TRUE(succeeded(g.server->on_unmask(g.p.members[i], sealed[i])));
  ASSERT_TRUE(succeeded(g.server->finish(std::span<std::uint32_t>(sum))));
  EXPECT_EQ(sum, std::vector<std::uint32_t>(4, 1 + 2 + 3 + 4));
  ASSERT_FALSE(g.server->blamed().empty());
  EXPECT_EQ(g.server->blamed()[0].silo, "s1");
}

TEST(SecAgg, ADealerOfInconsistentSharesIsBlamedWhenTheyAreRebuilt) {
  // s3 deals shares of a self-mask seed other than the one it committed to, each signed by it:
  // nobody can tell before rebuilding, and then the signatures prove who dealt them.
  Group g(4, 3);
  g.advertise();
  for (std::size_t i = 0; i < 4; ++i) {
    auto out = *g.c(i).share(g.keys);
    if (i == 3) {
      const auto wrong = shamir_split(Secret::random(), 3, 4);
      const auto keyshares = shamir_split(Secret::random(), 3, 4);
      const auto s3 = test::signer(wire::SILO, "s3");
      for (auto& [v, sealed] : out) {
        const auto x = g.p.index_of(v) - 1;
        const auto a = keyshares[x].encode(), b = wrong[x].encode();
        std::string plain;
        for (const std::string& f : {a, s3.sign(secagg::share_statement(g.p.session, "s3", v, true, a)), b,
                                     s3.sign(secagg::share_statement(g.p.session, "s3", v, false, b))}) {
          append_field(plain, f);
        }
        sealed.box = seal_to(g.keys[v].inbox_keys.at("s3"), plain);
        sealed.signature = s3.sign(secagg::box_statement(g.p.session, "s3", v, sealed.box));
      }
    }
    EXPECT_TRUE(succeeded(g.server->on_shares(g.p.members[i], out)));
  }
  g.inboxes = *g.server->close_shares();
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(succeeded(g.server->on_receipt(g.p.members[i], *g.c(i).receive(g.inboxes[g.p.members[i]]))));
  }
  auto s = *g.server->settle();
  for (auto& c : g.clients) EXPECT_TRUE(succeeded(c.settle(s)));
  auto sum = g.mask(4);
  auto u3 = *g.server->close_masked();
  for (std::size_t i = 0; i < 4; ++i)
    EXPECT_TRUE(succeeded(g.server->on_confirmation(g.p.members[i], g.c(i).confirm(u3)->signature)));
  auto req = *g.server->close_confirmations();
  for (std::size_t i = 0; i < 4; ++i)
    EXPECT_TRUE(succeeded(g.server->on_unmask(g.p.members[i], g.c(i).unmask(req)->box)));
  const auto err = error_text(g.server->finish(std::span<std::uint32_t>(sum)));
  EXPECT_NE(err.find("self-mask seed of s3"), std::string::npos) << err;
  ASSERT_EQ(g.server->blamed().size(), 1u);
  EXPECT_EQ(g.server->blamed()[0].silo, "s3");
}

TEST(SecAgg, ASettledListNotSignedByTheServerIsRefused) {
  Group g(3, 2);
  g.share();
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_TRUE(succeeded(g.server->on_receipt(g.p.members[i], *g.c(i).receive(g.inboxes[g.p.members[i]]))));
  auto s = *g.server->settle();
  auto forged = s;
  forged.members = {"s0", "s1"};  // an edge drops s2 from s0's view
  const auto err = error_text(g.c(0).settle(forged));
  EXPECT_NE(err.find("not signed by the server"), std::string::npos) << err;
  EXPECT_TRUE(succeeded(g.c(0).settle(s)));
}

TEST(SecAgg, NoSumOfFewerThanMinSurvivorsIsRevealed) {
  // t = 3 of 5, but the group promises sums of at least 4 silos: with 3 survivors left the
  // server refuses to ask for unmasking, however many shares it could gather.
  Group g(5, 3, 4, /*min_survivors=*/4);
  g.settle();
  g.mask(3);
  auto u3 = g.server->close_masked();
  ASSERT_FALSE(u3.has_value());
  EXPECT_NE(u3.error().message().find("a sum needs 4"), std::string::npos) << u3.error().message();
  // And a member refuses to confirm so small a set.
  EXPECT_FALSE(bool(g.c(0).confirm({"s0", "s1", "s2"})));
}

TEST(SecAgg, NoSurvivorRevealsBothSharesOfOnePeer) {
  Group g(3, 2);
  g.settle();
  g.mask(3);
  auto u3 = *g.server->close_masked();
  std::map<std::string, std::string> sigs;
  for (std::size_t i = 0; i < 3; ++i) sigs[g.p.members[i]] = g.c(i).confirm(u3)->signature;
  secagg::UnmaskRequest greedy{{"s1"}, {"s0", "s1", "s2"}, sigs};
  auto r = g.c(0).unmask(greedy);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("both shares of s1"), std::string::npos);
  // And once it has answered an honest request, it answers no other.
  secagg::UnmaskRequest honest{{}, {"s0", "s1", "s2"}, sigs};
  EXPECT_TRUE(bool(g.c(0).unmask(honest)));
  EXPECT_FALSE(bool(g.c(0).unmask(honest)));
}

// The fuzz build's memo of public-key results (crypto/fuzz_memo.h) is compiled out of every
// other build: each signature is made and each check computed, every time.
TEST(FuzzMemo, OrdinaryBuildsComputeEveryTime) {
  static_assert(!fuzz_memo::kOn, "FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION reached a build that is not a fuzz build");
  int computed = 0;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(fuzz_memo::remember({"same", "key"}, [&] { return ++computed; }), i + 1);
  // A tampered signature is refused even right after the true one verified.
  const auto s = test::signer(wire::SILO, "hospital-a");
  const auto v = test::verifier();
  const auto msg = statement("test", {"memo"});
  auto sig = s.sign(msg);
  EXPECT_TRUE(v.verify(s.certificate(), "hospital-a", "silo", msg, sig));
  sig[sig.size() / 2] ^= 1;
  EXPECT_FALSE(v.verify(s.certificate(), "hospital-a", "silo", msg, sig));
}

TEST(CertSigner, SignaturesVerifyOnlyForTheCertifiedNameRoleAndMessage) {
  const auto s = test::signer(wire::SILO, "hospital-a");
  const auto v = test::verifier();
  const auto msg = statement("test", {"a", "b"});
  const auto sig = s.sign(msg);
  EXPECT_TRUE(v.verify(s.certificate(), "hospital-a", "silo", msg, sig));
  EXPECT_FALSE(v.verify(s.certificate(), "hospital-b", "silo", msg, sig));
  EXPECT_FALSE(v.verify(s.certificate(), "hospital-a", "edge", msg, sig));
  EXPECT_FALSE(v.verify(s.certificate(), "hospital-a", "silo", statement("test", {"ab", ""}), sig));
  EXPECT_FALSE(v.verify(test::foreign_signer(wire::SILO, "hospital-a").certificate(), "hospital-a", "silo", msg,
                     test::foreign_signer(wire::SILO, "hospital-a").sign(msg)));
  EXPECT_FALSE(v.verify("not a certificate", "hospital-a", "silo", msg, sig));
  auto who = v.certified(s.certificate(), "silo");
  ASSERT_TRUE(who) << who.error().message();
  EXPECT_EQ(who->name, "hospital-a");
  // Asked again, the verdict comes from the cache: the same name, the role still checked.
  who = v.certified(s.certificate(), "silo");
  ASSERT_TRUE(who) << who.error().message();
  EXPECT_EQ(who->name, "hospital-a");
  const auto as_edge = v.certified(s.certificate(), "edge");
  ASSERT_FALSE(as_edge);
  EXPECT_NE(as_edge.error().message().find("is for role 'silo', not edge"), std::string::npos) << as_edge.error().message();
  const auto foreign = v.certified(test::foreign_signer(wire::SILO, "hospital-a").certificate(), "silo");
  ASSERT_FALSE(foreign);
  EXPECT_NE(foreign.error().message().find("did not verify against the federation CA"), std::string::npos)
      << foreign.error().message();
  const auto garbage = v.certified("not a certificate", "silo");
  ASSERT_FALSE(garbage);
  EXPECT_EQ(garbage.error().message(), "the certificate is not DER");
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
    grp.settle();
    std::vector<std::uint32_t> x(len, 0);
    if (!zeros) encode(codec, update, 50.0, 1, x);
    // 255 degrees of freedom: the 99.9th percentile of chi-square is about 330.
    if (!zeros) {
      EXPECT_GT(chi_square_bytes(x), 1000.0) << "the plaintext itself must fail the test";
    }
    EXPECT_TRUE(succeeded(grp.clients[0].mask(std::span<std::uint32_t>(x))));
    EXPECT_LT(chi_square_bytes(x), 330.0) << (zeros ? "zeros" : "update");
  }
}

// ---- SecAgg+: neighbour graphs -------------------------------------------------------------

TEST(SecAggPlus, EveryMemberHasKNeighboursAndEveryPartyDrawsTheSameGraphFromTheSeed) {
  const secagg::Graph g(50, 8, "fed/3/1/seed"), again(50, 8, "fed/3/1/seed"), other(50, 8, "fed/4/1/seed");
  bool differs = false;
  for (std::uint32_t a = 1; a <= 50; ++a) {
    const auto near = g.neighbours(a);
    ASSERT_EQ(near.size(), 8u);
    EXPECT_EQ(near, again.neighbours(a));
    differs = differs || near != other.neighbours(a);
    for (std::uint32_t b = 1; b <= 50; ++b) {
      const bool listed = std::binary_search(near.begin(), near.end(), b);
      EXPECT_EQ(g.adjacent(a, b), listed) << a << " " << b;
      EXPECT_EQ(g.adjacent(a, b), g.adjacent(b, a));
    }
    EXPECT_FALSE(g.adjacent(a, a));
  }
  EXPECT_TRUE(differs) << "another round's seed draws another graph";
  // Degree 0, or too large for the group: the complete graph.
  for (const secagg::Graph& c : {secagg::Graph(10, 0, "s"), secagg::Graph(10, 9, "s"), secagg::Graph(10, 12, "s")}) {
    EXPECT_TRUE(c.complete());
    EXPECT_EQ(c.neighbours(3).size(), 9u);
  }
}

TEST(SecAggPlus, ConnectivityAgreesWithASearchOverTheEdgesAndSeesAnIsolatedMember) {
  const secagg::Graph g(40, 4, "seed");
  std::mt19937_64 rng(7);
  int split = 0;
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<std::uint32_t> alive;
    for (std::uint32_t m = 1; m <= 40; ++m) {
      if (rng() % 100 < 45) alive.push_back(m);  // about 55 % drop: splits happen
    }
    if (alive.empty()) continue;
    // Reference: a search that only asks adjacent().
    std::set<std::uint32_t> seen{alive.front()};
    std::vector<std::uint32_t> todo{alive.front()};
    while (!todo.empty()) {
      const auto a = todo.back();
      todo.pop_back();
      for (auto b : alive) {
        if (!seen.count(b) && g.adjacent(a, b)) {
          seen.insert(b);
          todo.push_back(b);
        }
      }
    }
    const bool reference = seen.size() == alive.size();
    EXPECT_EQ(g.connected(alive), reference) << "trial " << trial;
    split += !reference;
  }
  EXPECT_GT(split, 50) << "the trials should include split survivor sets";
  // Everyone but member 1's neighbours: member 1 is cut off.
  const auto near = g.neighbours(1);
  std::vector<std::uint32_t> alive;
  for (std::uint32_t m = 1; m <= 40; ++m) {
    if (!std::binary_search(near.begin(), near.end(), m)) alive.push_back(m);
  }
  EXPECT_FALSE(g.connected(alive));
}

TEST(SecAggPlus, BinomialTailsMatchTheirExactValues) {
  EXPECT_NEAR(secagg::binomial_tail(4, 0.5, 3), 5.0 / 16.0, 1e-12);
  EXPECT_NEAR(secagg::binomial_tail(10, 0.3, 0), 1.0, 1e-12);
  EXPECT_NEAR(secagg::binomial_tail(10, 0.3, 10), std::pow(0.3, 10), 1e-15);
  EXPECT_EQ(secagg::binomial_tail(10, 0.3, 11), 0.0);
  EXPECT_EQ(secagg::binomial_tail(10, 0.0, 1), 0.0);
}

// What one round of a planned graph comes to, drawn at random: a member drops with probability
// `dropout`. The round fails when the survivors split or a secret (a survivor's self mask, a
// dropped member's mask key) has fewer than t live holders.
int failed_rounds(std::size_t n, const secagg::GraphPlan& plan, double dropout, int rounds) {
  std::mt19937_64 rng(11);
  std::bernoulli_distribution drops(dropout);
  int failed = 0;
  for (int r = 0; r < rounds; ++r) {
    const secagg::Graph g(n, plan.degree, "round " + std::to_string(r));
    std::vector<char> live(n + 1);
    std::vector<std::uint32_t> alive;
    for (std::uint32_t m = 1; m <= n; ++m) {
      live[m] = !drops(rng);
      if (live[m]) alive.push_back(m);
    }
    bool fail = !g.connected(alive);
    for (std::uint32_t m = 1; m <= n; ++m) {
      std::uint32_t holders = live[m] ? 1 : 0;
      for (auto v : g.neighbours(m)) holders += live[v];
      fail = fail || holders < plan.threshold;
    }
    failed += fail;
  }
  return failed;
}

TEST(SecAggPlus, RoundsFailNoMoreOftenThanThePlanBound) {
  // A loose bound (2^-5), so that a few thousand drawn rounds can tell a wrong one.
  for (const auto& [n, dropout, corrupt] :
       {std::tuple{60, 0.1, 0.0}, std::tuple{80, 0.05, 0.05}, std::tuple{120, 0.1, 0.02}, std::tuple{60, 0.2, 0.0}}) {
    const auto plan = secagg::plan_graph(n, dropout, corrupt, 5);
    ASSERT_NE(plan.degree, 0u) << n;
    ASSERT_LE(plan.p_unavailable, std::exp2(-5));
    const int rounds = 4000;
    const int failed = failed_rounds(n, plan, dropout, rounds);
    std::cout << "n = " << n << ", dropout " << dropout << ", corrupt " << corrupt << ": k = " << plan.degree
              << ", t = " << plan.threshold << "; failed " << failed << " of " << rounds << " (bound "
              << plan.p_unavailable * rounds << ")\n";
    // Three standard deviations above the bound's expectation, at least 5 rounds.
    EXPECT_LE(failed, plan.p_unavailable * rounds + std::max(5.0, 3 * std::sqrt(plan.p_unavailable * rounds)));
  }
}

// The plan is the one docs/security.md states: the smallest even k for which a t above
// (k + 1 + c) / 2 meets the availability bound, and for it the largest such t.
TEST(SecAggPlus, ThePlanTakesTheLargestThresholdAndTheSmallestDegreeTheBoundsAllow) {
  for (const auto& [n, dropout, corrupt] :
       {std::tuple{100, 0.1, 0.05}, std::tuple{1000, 0.2, 0.05}, std::tuple{60, 0.02, 0.0}, std::tuple{200, 0.1, 0.01}}) {
    const auto plan = secagg::plan_graph(n, dropout, corrupt);
    ASSERT_NE(plan.degree, 0u) << n;
    const double nn = n, eta = std::exp2(-secagg::kGraphEtaBits);
    const std::uint32_t c = secagg::corrupt_count(n, corrupt);
    EXPECT_EQ(plan.corrupt, c);
    auto unavailable = [&](std::uint32_t k, std::uint32_t t) {
      return nn * secagg::binomial_tail(k, dropout, k - t + 1) + nn * nn * std::pow(dropout, k);
    };
    const std::uint32_t k = plan.degree, t = plan.threshold;
    EXPECT_GT(2 * t, k + 1 + c) << n << ": a split view could gather t on both sides";
    EXPECT_LE(unavailable(k, t), eta) << n;
    if (t <= k) {
      EXPECT_GT(unavailable(k, t + 1), eta) << n << ": t could be " << t + 1;
    }
    for (std::uint32_t smaller = 2; smaller < k; smaller += 2) {
      const std::uint32_t t_min = secagg::split_safe_threshold(smaller, c);
      EXPECT_FALSE(t_min <= smaller + 1 && unavailable(smaller, t_min) <= eta) << n << ": k = " << smaller << " would do";
    }
  }
}

// Safety against a deviating server costs room: more than half of every secret's holders must
// survive, so a dropout rate near a third leaves no graph below the complete one at n = 100 (the
// group then runs on the complete graph), while 10 % does (k = 46 of 99).
TEST(SecAggPlus, APlanExistsOnlyWhereTheDropoutRateLeavesMoreThanHalfTheHoldersAlive) {
  EXPECT_EQ(secagg::plan_graph(100, 0.3, 0.05).degree, 0u);
  const auto ten = secagg::plan_graph(100, 0.1, 0.05);
  const auto thousand = secagg::plan_graph(1000, 0.2, 0.05);
  for (const auto& plan : {ten, thousand}) {
    ASSERT_NE(plan.degree, 0u);
    EXPECT_EQ(plan.degree % 2, 0u);
    EXPECT_LE(plan.p_unavailable, std::exp2(-20));
    EXPECT_GT(2 * plan.threshold, plan.degree + 1 + plan.corrupt);
    EXPECT_LE(plan.threshold, plan.degree + 1);
  }
  EXPECT_LT(ten.degree, 99u);
  EXPECT_LT(thousand.degree, 999u / 4) << "k for 1,000 silos";
  std::cout << "n = 100, 10 % dropouts, 5 % colluders: k = " << ten.degree << ", t = " << ten.threshold
            << "; n = 1000, 20 %, 5 %: k = " << thousand.degree << ", t = " << thousand.threshold << "\n";
}

// The deviating server of the 2026-12-04 review (N1): after everyone masked, it signs two survivor
// sets, A without the victim (to get its mask key) and B with it (to get its self mask), shows A
// to some of the victim's holders and B to the rest, and collects what each side reveals. Every
// honest member confirms one set and answers once; `colluders` (among the victim's neighbours)
// are counted on both sides, as if they handed the server everything they hold. Returns, over
// every split of the honest holders (and both ways of showing the other members a set), the most
// shares of the victim's mask key and self mask the server gathered on the weaker side.
std::size_t best_split_view(std::size_t n, std::uint32_t k, std::uint32_t t, const std::string& seed, std::uint32_t victim,
                            const std::set<std::uint32_t>& colluders) {
  const secagg::Graph graph(n, k, "fed/7/1/" + seed);
  const auto around = graph.neighbours(victim);
  std::vector<std::uint32_t> honest;  // the victim's honest neighbours, to split
  for (auto w : around) {
    if (!colluders.count(w)) honest.push_back(w);
  }
  // Every subset of the honest neighbours shown A; for many of them, the first a of them for each
  // a (how many, not which, sets what each side can reveal).
  std::vector<std::uint32_t> splits;
  if (honest.size() <= 6) {
    for (std::uint32_t s = 0; s < (1u << honest.size()); ++s) splits.push_back(s);
  } else {
    for (std::size_t a = 0; a <= honest.size(); ++a) splits.push_back((1u << a) - 1);
  }
  std::size_t best = 0;
  for (const std::uint32_t split : splits) {
    for (bool others_see_a : {false, true}) {
      Group g(n, t, 2, t, k, seed);
      g.settle();
      g.mask(n);
      const std::string v = g.p.members[victim - 1];
      std::vector<std::string> all = g.p.members, without_v;
      for (const auto& m : all) {
        if (m != v) without_v.push_back(m);
      }
      std::sort(all.begin(), all.end());
      auto sees_a = [&](std::uint32_t m) {
        if (m == victim) return false;
        const auto it = std::find(honest.begin(), honest.end(), m);
        if (it != honest.end()) return ((split >> (it - honest.begin())) & 1u) != 0;
        return others_see_a;
      };
      const std::string sig_a = g.server_signer.sign(secagg::survivors_statement(g.p.session, without_v));
      const std::string sig_b = g.server_signer.sign(secagg::survivors_statement(g.p.session, all));
      std::map<std::string, std::string> signed_a, signed_b;
      for (std::uint32_t m = 1; m <= n; ++m) {
        if (colluders.count(m)) continue;
        const auto name = g.p.members[m - 1];
        auto c = sees_a(m) ? g.c(m - 1).confirm(without_v, sig_a) : g.c(m - 1).confirm(all, sig_b);
        if (c.has_value()) (sees_a(m) ? signed_a : signed_b)[name] = c->signature;
      }
      secagg::UnmaskRequest ra{{v}, without_v, signed_a}, rb{{}, all, signed_b};
      std::size_t key_shares = 0, self_shares = 0;
      for (std::uint32_t m = 1; m <= n; ++m) {
        if (colluders.count(m)) continue;
        auto r = g.c(m - 1).unmask(sees_a(m) ? ra : rb);
        if (!r) continue;
        auto plain = open_sealed(g.box, r->box);
        auto reply = secagg::decode_reply(*plain);
        key_shares += reply->mask_key_shares.count(v);
        self_shares += reply->self_mask_shares.count(v);
      }
      best = std::max(best, std::min(key_shares, self_shares) + colluders.size());
    }
  }
  return best;
}

TEST(SecAggPlus, ASplitViewOfTheSurvivorsCannotRebuildBothSecretsOfAMember) {
  // n = 8, k = 4: each secret has 5 holders. t = 3 is above half of them (2 was refused above);
  // over every split the weaker side holds at most 2 shares.
  const std::size_t weaker = best_split_view(8, 4, 3, "n1", 1, {});
  EXPECT_LT(weaker, 3u) << "the server gathered t shares of both secrets";
  EXPECT_GE(weaker, 1u) << "the attack ran";
}

// Grinding the graph gains a deviating server nothing: the seed below puts both colluders of a
// group of 20 next to the victim (of 2,000 seeds tried, the first to do so), and with the plan's
// k and t for 2 colluders the split view still leaves the weaker side short of t.
TEST(SecAggPlus, AGroundGraphWithTheColludersAroundAMemberDoesNotExposeIt) {
  const std::size_t n = 20;
  const auto plan = secagg::plan_graph(n, 0.01, 0.1);  // c = 2
  ASSERT_EQ(plan.corrupt, 2u);
  ASSERT_NE(plan.degree, 0u);
  const std::set<std::uint32_t> colluders{5, 9};
  std::string ground;
  for (int i = 0; i < 2000 && ground.empty(); ++i) {
    const std::string seed = "grind-" + std::to_string(i);
    const secagg::Graph g(n, plan.degree, "fed/7/1/" + seed);
    if (g.adjacent(1, 5) && g.adjacent(1, 9)) ground = seed;
  }
  ASSERT_FALSE(ground.empty());
  EXPECT_LT(best_split_view(n, plan.degree, plan.threshold, ground, 1, colluders), plan.threshold)
      << "k = " << plan.degree << ", t = " << plan.threshold;
}

// A member joins only setups at or above its own floor, whatever the server signed (N1b): sums of
// two, a ring with t = 2, a complete group whose threshold two split sides could each meet with
// one colluder. The defaults the server plans pass.
TEST(SecAgg, AMemberRefusesASignedSetupBelowItsOwnFloor) {
  const secagg::Floor floor;  // the defaults: sums of at least 3, 5 % colluders
  auto refused = [&](std::size_t n, std::uint32_t t, std::uint32_t m, std::uint32_t k) {
    auto p = make_params(n, t, m, 32, 4);
    p.degree = k;
    p.server_key = X25519KeyPair::generate().public_key;
    return error_text(secagg::check_floor(p, floor));
  };
  EXPECT_NE(refused(2, 2, 2, 0).find("sums of 2 silos; this silo's floor is 3"), std::string::npos);
  EXPECT_NE(refused(8, 2, 3, 2).find("a split view of the survivors"), std::string::npos) << refused(8, 2, 3, 2);
  EXPECT_NE(refused(5, 3, 3, 0).find("a split view of the survivors"), std::string::npos) << refused(5, 3, 3, 0);
  // Nine members, 45 % assumed colluding: c = 5. t = 5 is above half and 2 x 8 > 9 + 5, but the
  // five colluders' own shares rebuild any member's secrets.
  const secagg::Floor wary{3, 0.45};
  auto p9 = make_params(9, 5, 8, 32, 4);
  p9.server_key = X25519KeyPair::generate().public_key;
  EXPECT_NE(error_text(secagg::check_floor(p9, wary)).find("the colluders alone hold that many shares"),
            std::string::npos)
      << error_text(secagg::check_floor(p9, wary));
  p9.threshold = 6;
  EXPECT_EQ(error_text(secagg::check_floor(p9, wary)), "");
  EXPECT_EQ(refused(6, 4, 4, 0), "");   // the server's default threshold, 2/3
  EXPECT_EQ(refused(12, 9, 9, 0), "");
  const auto plan = secagg::plan_graph(100, 0.1, 0.05);
  EXPECT_EQ(refused(100, plan.threshold, plan.threshold, plan.degree), "");
  // And the member itself: advertise() refuses such a setup, naming the floor.
  Group g(5, 3);
  g.floor = secagg::Floor{};
  auto c = g.client("s0");
  auto a = c.advertise();
  ASSERT_FALSE(a.has_value());
  EXPECT_NE(a.error().message().find("below this silo's floor"), std::string::npos) << a.error().message();
}

TEST(SecAggPlus, ParametersAreCheckedForTheGraph) {
  auto p = make_params(20, 4, 10, 32, 4);
  p.server_key = X25519KeyPair::generate().public_key;
  p.degree = 6;
  EXPECT_TRUE(succeeded(secagg::check_params(p))) << "t below half the group is allowed with a graph";
  p.degree = 5;
  EXPECT_NE(error_text(secagg::check_params(p)).find("must be even"), std::string::npos);
  p.degree = 6;
  p.threshold = 8;
  EXPECT_NE(error_text(secagg::check_params(p)).find("exceeds the 7 holders"), std::string::npos);
  // Not above half of a secret's holders: found by the 2026-12-04 review (N1), a server that signs
  // two survivor sets collects both of a member's secrets from the two halves.
  p.threshold = 3;
  EXPECT_NE(error_text(secagg::check_params(p)).find("not above half of each secret's 7 holders"), std::string::npos)
      << error_text(secagg::check_params(p));
  p.degree = 19;  // the complete graph: t > n / 2 again
  EXPECT_NE(error_text(secagg::check_params(p)).find("not above half"), std::string::npos);
}

// Random groups with a graph, dropouts in every phase and Byzantine silos: every round ends in
// the exact sum of the survivors' inputs or aborts with a reason, no honest silo is blamed, and
// the server expands one mask per (dropped, surviving neighbour) pair and per survivor.
TEST(SecAggPlus, RecoversTheExactSumUnderDropoutsAndByzantineSilos) {
  std::mt19937_64 rng(2027);
  int commits = 0, aborts = 0, clean_commits = 0;
  for (int scenario = 0; scenario < 120; ++scenario) {
    const std::size_t n = 12 + rng() % 20;
    const std::uint32_t k = 4 + 2 * static_cast<std::uint32_t>(rng() % 3);  // 4, 6 or 8
    // Above half of each secret's k + 1 holders (check_params), at most all of them.
    const std::uint32_t t = k / 2 + 1 + static_cast<std::uint32_t>(rng() % (k / 2 + 1));
    auto p = make_params(n, t, std::max(t, static_cast<std::uint32_t>(n / 2)), 32, 1 + rng() % 8);
    p.degree = k;
    p.graph_seed = "scenario " + std::to_string(scenario);
    const bool clean = scenario % 4 == 0;  // no dropouts, no Byzantine silos: must commit
    std::vector<Silo> silos(n);
    for (std::size_t i = 0; i < n; ++i) {
      silos[i].name = p.members[i];
      if (clean) continue;
      silos[i].fate = rng() % 8 == 0 ? static_cast<Fate>(1 + rng() % 6) : Stays;
      if (rng() % 10 == 0) silos[i].behaviour = rng() % 2 ? Garbage : BadForwarder;
    }
    for (auto& s : silos) {
      if (s.behaviour != Garbage) continue;
      for (const auto& v : p.members) {
        if (v != s.name && rng() % 2) s.garbage_to.insert(v);
      }
    }
    const Outcome o = run_protocol<std::uint32_t>(p, silos, rng);
    for (const auto& b : o.blamed) {
      auto it = std::find_if(silos.begin(), silos.end(), [&](const Silo& s) { return s.name == b; });
      ASSERT_NE(it->behaviour, Honest) << "scenario " << scenario << " blamed honest " << b;
    }
    if (o.aborted) {
      ASSERT_FALSE(clean) << "scenario " << scenario << " aborted in " << o.phase << ": " << o.why;
      ASSERT_FALSE(o.why.empty());
      ++aborts;
      continue;
    }
    ASSERT_EQ(o.sum, o.expected) << "scenario " << scenario;
    ++commits;
    if (clean) {
      ++clean_commits;
      EXPECT_EQ(o.expansions, n) << "no dropouts: only the survivors' self masks";
    }
  }
  // Thresholds above half of each secret's holders (split-view safe) abort more rounds under
  // these random dropouts than the old lower ones did: about half of the scenarios commit.
  EXPECT_EQ(clean_commits, 30);
  EXPECT_GT(commits, 45);
  EXPECT_GT(aborts, 5);
  std::cout << commits << " committed, " << aborts << " aborted\n";
}

TEST(SecAggPlus, TheServerUnmasksOnlyNeighbourPairsOfTheDroppedMembers) {
  Group g(30, 4, 16, 15, 6);
  g.settle();
  auto sum = g.mask(27);  // s27, s28 and s29 drop after settling
  auto u3 = *g.server->close_masked();
  for (const auto& m : u3) {
    const auto i = static_cast<std::size_t>(g.p.index_of(m) - 1);
    ASSERT_TRUE(
        succeeded(g.server->on_confirmation(m, g.c(i).confirm(u3, g.server->survivors_signature())->signature)));
  }
  auto request = *g.server->close_confirmations();
  for (const auto& m : u3) {
    const auto i = static_cast<std::size_t>(g.p.index_of(m) - 1);
    ASSERT_TRUE(succeeded(g.server->on_unmask(m, g.c(i).unmask(request)->box)));
  }
  ASSERT_TRUE(succeeded(g.server->finish(std::span<std::uint32_t>(sum))));
  for (auto v : sum) EXPECT_EQ(v, 27u * 28u / 2u);
  const secagg::Graph graph(30, 6, g.p.session + "/" + g.p.graph_seed);
  std::size_t pairs = 0;
  for (std::uint32_t v = 28; v <= 30; ++v) {
    for (auto w : graph.neighbours(v)) pairs += w <= 27;
  }
  EXPECT_EQ(g.server->expansions(), pairs + 27);
  EXPECT_LT(g.server->expansions(), 3u * 27u + 27u) << "fewer than the complete graph's";
}

// Each member is sent its own keys and its neighbours' (Server::keys_for): k + 1 entries, here
// fewer than min_survivors, which members of a graph check at confirmation instead (the test
// above sums exactly with such lists). The complete graph sends everyone all of U1.
TEST(SecAggPlus, EachMemberIsSentOnlyItsNeighboursKeys) {
  Group g(30, 4, 16, 15, 6);
  EXPECT_TRUE(g.server->graph());
  g.offer_keys();
  EXPECT_TRUE(g.server->keys_for("s0").empty()) << "nothing is sent before U1 is settled";
  g.keys = *g.server->close_keys();
  const secagg::Graph graph(30, 6, g.p.session + "/" + g.p.graph_seed);
  for (const auto& m : g.p.members) {
    const auto part = g.server->keys_for(m);
    ASSERT_EQ(part.size(), 7u) << m;
    EXPECT_TRUE(part.count(m));
    for (const auto& [name, keys] : part) {
      if (name != m) {
        EXPECT_TRUE(graph.adjacent(g.p.index_of(m), g.p.index_of(name))) << m << " got " << name;
      }
    }
  }
  Group complete(6, 4);
  EXPECT_FALSE(complete.server->graph());
  complete.advertise();
  EXPECT_EQ(complete.server->keys_for("s0").size(), 6u);
}

TEST(SecAggPlus, SurvivorsThatFallApartAreNeverUnmasked) {
  // s0's neighbours all vanish after settling: s0 alone would be a piece of its own, and the sum
  // of that piece is its input. The server does not ask, and a member asked anyway refuses.
  Group g(20, 3, 4, 10, 4);
  g.settle();
  const secagg::Graph graph(20, 4, g.p.session + "/" + g.p.graph_seed);
  const auto near = graph.neighbours(1);
  std::vector<std::string> u3;
  for (std::size_t i = 0; i < 20; ++i) {
    if (std::binary_search(near.begin(), near.end(), static_cast<std::uint32_t>(i + 1))) continue;
    std::vector<std::uint32_t> x(4, 1);
    ASSERT_TRUE(succeeded(g.c(i).mask(std::span<std::uint32_t>(x))));
    ASSERT_TRUE(succeeded(g.server->on_masked_input(g.p.members[i])));
    u3.push_back(g.p.members[i]);
  }
  auto closed = g.server->close_masked();
  ASSERT_FALSE(closed.has_value());
  EXPECT_NE(closed.error().message().find("fall apart"), std::string::npos) << closed.error().message();
  // Members shown the split set with every survivor's signature on it refuse: s0 because too
  // few of its holders signed, the others because the set falls apart.
  std::sort(u3.begin(), u3.end());
  const std::string signed_by_server = g.server_signer.sign(secagg::survivors_statement(g.p.session, u3));
  std::map<std::string, std::string> sigs;
  for (const auto& m : u3) {
    sigs[m] = g.c(static_cast<std::size_t>(g.p.index_of(m) - 1)).confirm(u3, signed_by_server)->signature;
  }
  std::vector<std::string> dropped;
  for (auto v : near) dropped.push_back(g.p.members[v - 1]);
  int apart = 0;
  for (const auto& m : u3) {
    auto r = g.c(static_cast<std::size_t>(g.p.index_of(m) - 1)).unmask(secagg::UnmaskRequest{dropped, u3, sigs});
    ASSERT_FALSE(r.has_value()) << m;
    apart += r.error().message().find("fall apart") != std::string::npos;
  }
  EXPECT_GT(apart, 10) << "most survivors see that the set falls apart";
}

// In a graph a member counts only its own holders' confirmations, so a relay that showed the
// members on one side of v a survivor set without v, and the rest the true one, could collect
// enough confirmations for both and have v's two secrets revealed. The server signs the one set
// it names; a member of a graph confirms nothing else.
TEST(SecAggPlus, ASurvivorSetTheServerDidNotSignIsNotConfirmed) {
  Group g(20, 3, 4, 10, 4);
  g.settle();
  auto sum = g.mask(20);
  auto u3 = *g.server->close_masked();
  const std::string& real = g.server->survivors_signature();
  std::vector<std::string> without_v(u3.begin() + 1, u3.end());
  for (const std::string& sig : {real, std::string()}) {
    auto r = g.c(1).confirm(without_v, sig);
    ASSERT_FALSE(r.has_value());
    EXPECT_NE(r.error().message().find("not signed by the server"), std::string::npos) << r.error().message();
  }
  EXPECT_FALSE(bool(g.c(1).confirm(u3, "")));
  auto ok = g.c(1).confirm(u3, real);
  EXPECT_TRUE(ok.has_value()) << ok.error().message();
  (void)sum;
}

}  // namespace
}  // namespace xsilo::crypto
