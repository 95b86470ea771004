// Compressed uploads (protocol/compression.h): each scheme's codec, its error feedback, the
// receiver that decodes chunks in place, and every kind of malformed chunk refused before
// anything is decoded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "crypto/hash.h"
#include "protocol/codec.h"
#include "protocol/compression.h"
#include "protocol/round_start.h"
#include "protocol/tensor_stream.h"
#include "protocol/upload_slot.h"
#include "tests/result_util.h"

namespace xsilo::protocol {
namespace {

using C = wire::Compression;

C scheme(C::Scheme s, std::uint32_t bits = 0, std::uint32_t block = 0, double fraction = 0, bool ef = true) {
  C c;
  c.set_scheme(s);
  c.set_bits(bits);
  c.set_block(block);
  c.set_fraction(fraction);
  c.set_error_feedback(ef);
  return c;
}

std::vector<float> gaussian(std::size_t n, std::uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

std::vector<C> every_scheme() {
  return {scheme(C::QUANTIZE, 8, 64), scheme(C::QUANTIZE, 4, 33), scheme(C::SIGN, 0, 40), scheme(C::SIGN, 0, 13),
          scheme(C::TOP_K, 0, 0, 0.1), scheme(C::RANDOM_K, 0, 0, 0.25)};
}

TEST(Compression, EveryChunkDecodesToExactlyWhatTheSiloComputedWhenEncoding) {
  for (const auto& c : every_scheme()) {
    for (std::size_t n : {1u, 7u, 64u, 65u, 1001u}) {
      auto x = gaussian(n, static_cast<std::uint32_t>(n));
      if (c.scheme() == C::TOP_K || c.scheme() == C::RANDOM_K) {
        for (std::size_t i = 0; i < n; i += 3) x[i] = 0;  // sparse chunks carry the nonzero elements
      }
      std::vector<float> decoded(n), back(n, -1.0f);
      const auto data = encode_chunk(c, x, 42, decoded);
      std::size_t kept = 0;
      ASSERT_TRUE(succeeded(decode_chunk(c, data, back, kept))) << describe(c) << " n=" << n;
      EXPECT_EQ(std::memcmp(decoded.data(), back.data(), n * 4), 0) << describe(c) << " n=" << n;
      if (c.scheme() == C::SIGN) {
        // Each element decodes to its own block's mean |x| with its own sign: the packed bits
        // (eight at a time where a block is byte-aligned) are in element order.
        for (std::size_t b = 0; b < n; b += c.block()) {
          const std::size_t e = std::min<std::size_t>(n, b + c.block());
          float sum = 0;
          for (std::size_t i = b; i < e; ++i) sum += std::fabs(x[i]);
          const float s = sum / static_cast<float>(e - b);
          for (std::size_t i = b; i < e; ++i) ASSERT_EQ(back[i], x[i] < 0 ? -s : s) << "n=" << n << " i=" << i;
        }
      }
      std::size_t nonzero = 0;
      for (float v : x) nonzero += v != 0;
      EXPECT_EQ(data.size(), encoded_bytes(c, n, nonzero)) << describe(c);
    }
  }
}

TEST(Compression, QuantizationIsUnbiasedAndWithinOneStep) {
  const auto c = scheme(C::QUANTIZE, 4, 256);
  const auto x = gaussian(256, 7);
  float m = 0;
  for (float v : x) m = std::max(m, std::fabs(v));
  const double step = m / 7.0;
  std::vector<double> mean(x.size(), 0.0);
  const int trials = 4000;
  std::vector<float> dec(x.size());
  for (int t = 0; t < trials; ++t) {
    encode_chunk(c, x, 1000 + t, dec);
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_LE(std::fabs(dec[i] - x[i]), step * 1.0001) << i;
      mean[i] += dec[i] / trials;
    }
  }
  // The mean of 4000 unbiased roundings is within 4 standard errors (step / 2 / sqrt(4000)).
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(mean[i], x[i], 4 * step / 2 / std::sqrt(trials)) << i;
}

TEST(Compression, TopKKeepsTheLargestAndErrorFeedbackKeepsTheRest) {
  const auto c = scheme(C::TOP_K, 0, 0, 0.05);
  std::vector<TensorInfo> layout{{"a", {300}, 0}, {"b", {10, 20}, 300}};
  auto u = gaussian(500, 3);
  const auto before = u;
  std::vector<float> residual(500, 0.0f);
  residual[17] = 100.0f;  // left out last round: must be sent now
  auto enc = compress_update(c, u, residual, layout, 256, 9);  // sparse: chunks span half of 256
  std::size_t kept = 0;
  for (float v : u) kept += v != 0;
  EXPECT_EQ(kept, kept_count(c, 500));
  EXPECT_EQ(kept_count(c, 500), 25u);
  EXPECT_EQ(u[17], before[17] + 100.0f);
  for (std::size_t i = 0; i < 500; ++i) {
    // What was sent plus what is kept is exactly what there was to send.
    EXPECT_FLOAT_EQ(u[i] + residual[i], before[i] + (i == 17 ? 100.0f : 0.0f)) << i;
    EXPECT_TRUE(u[i] == 0 || residual[i] == 0) << i;
  }
  // Chunks of at most 128 elements (an index and a value each: within 256 floats' bytes),
  // tensor by tensor, offsets in order.
  ASSERT_EQ(enc.chunks.size(), 3u + 2u);
  EXPECT_EQ(enc.chunks[2].offset(), 256u);
  EXPECT_EQ(enc.chunks[2].count(), 44u);
  EXPECT_EQ(enc.chunks[3].name(), "b");
}

TEST(Compression, SignWithErrorFeedbackCarriesTheWholeSumOverRounds) {
  // EF-SignSGD: after T rounds, what was sent plus the residual equals what there was to send.
  const auto c = scheme(C::SIGN, 0, 64);
  std::vector<TensorInfo> layout{{"w", {256}, 0}};
  std::vector<float> residual(256, 0.0f);
  std::vector<double> sent(256, 0.0), total(256, 0.0);
  for (int t = 0; t < 50; ++t) {
    auto u = gaussian(256, 100 + t, 0.1f);
    for (std::size_t i = 0; i < 256; ++i) total[i] += u[i];
    compress_update(c, u, residual, layout, 1 << 16, t);
    for (std::size_t i = 0; i < 256; ++i) sent[i] += u[i];
  }
  double worst = 0;
  for (std::size_t i = 0; i < 256; ++i) {
    EXPECT_NEAR(sent[i] + residual[i], total[i], 1e-3) << i;
    worst = std::max(worst, std::fabs(double(residual[i])));
  }
  // The residual stays bounded (it does not absorb the sum): the error feedback works.
  EXPECT_LT(worst, 1.0);
}

TEST(Compression, RandomKWithoutErrorFeedbackIsUnbiased) {
  const auto c = scheme(C::RANDOM_K, 0, 0, 0.25, /*ef=*/false);
  std::vector<TensorInfo> layout{{"w", {40}, 0}};
  const auto x = gaussian(40, 11);
  std::vector<double> mean(40, 0.0);
  const int trials = 20000;
  for (int t = 0; t < trials; ++t) {
    auto u = x;
    compress_update(c, u, {}, layout, 1024, static_cast<std::uint64_t>(t) * 7919);
    for (std::size_t i = 0; i < 40; ++i) mean[i] += u[i] / trials;
  }
  // Each coordinate is kept with probability 1/4 and scaled by 4: variance 3 x^2 per trial.
  for (std::size_t i = 0; i < 40; ++i) {
    EXPECT_NEAR(mean[i], x[i], 4 * std::sqrt(3.0) * std::fabs(x[i]) / std::sqrt(trials) + 1e-6) << i;
  }
}

TEST(Compression, TheSharedRandomSetIsTheSameForTheSameSeedSortedAndExactlyK) {
  const auto a = random_k_set(77, 10000, 1234), b = random_k_set(77, 10000, 1234), other = random_k_set(78, 10000, 1234);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);
  ASSERT_EQ(a.size(), 1234u);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::adjacent_find(a.begin(), a.end()), a.end());
  EXPECT_LT(a.back(), 10000u);
  EXPECT_EQ(random_k_set(1, 5, 5), (std::vector<std::uint64_t>{0, 1, 2, 3, 4}));

  auto c = scheme(C::RANDOM_K, 0, 0, 0.1);
  c.set_seed(77);
  auto u = gaussian(1000, 5);
  const auto before = u;
  std::vector<float> residual(1000, 0.0f);
  const auto set = keep_shared_random_k(c, u, residual, {TensorInfo{"w", {1000}, 0}});
  EXPECT_EQ(set, random_k_set(77, 1000, 100));
  for (std::size_t i = 0; i < 1000; ++i) EXPECT_FLOAT_EQ(u[i] + residual[i], before[i]);
}

// Sends `enc` through a ChunkSource to a receiver of scheme `c`: it must decode into exactly
// `m` (the silo's decoded update), with its hash, counting the bytes as they travelled.
void expect_received_as_decoded(const C& c, const Model& m, const EncodedUpdate& enc) {
  auto chunks = std::make_shared<const std::vector<wire::TensorChunk>>(enc.chunks);
  ChunkSource src(chunks, "fed", 3);
  std::vector<float> into(m.size(), 7.0f);
  TensorReceiver rx;
  rx.reset(into, m.tensors(), true, c);
  while (auto e = src.next()) ASSERT_TRUE(rx.add(e->tensor_chunk())) << describe(c);
  ASSERT_TRUE(rx.complete());
  EXPECT_EQ(rx.finish_sha256(), crypto::sha256_hex(m.flat())) << describe(c);
  EXPECT_EQ(std::memcmp(into.data(), m.flat().data(), m.bytes()), 0) << describe(c);
  EXPECT_EQ(rx.bytes(), enc.bytes) << describe(c);
}

// The receiver decodes a silo's compressed upload into place: the same values and hash as the
// silo's decoded update, the bytes counted as they travelled.
TEST(Compression, TheReceiverDecodesAnUploadIntoPlaceWithTheSilosHash) {
  for (const auto& c : every_scheme()) {
    Model m;
    m.add("w", {50, 20});
    m.add("b", {20});
    auto x = gaussian(m.size(), 21);
    std::copy(x.begin(), x.end(), m.flat().begin());
    std::vector<float> residual(m.size(), 0.0f);
    auto enc = compress_update(c, m.flat(), residual, m.tensors(), 300, 5);
    expect_received_as_decoded(c, m, enc);
    EXPECT_LT(enc.bytes, m.bytes() * 0.55) << describe(c);  // random-k 25%: an index and a value per kept element
  }
}

// Normalisation statistics travel dense under every scheme (docs/compression.md, "Dense
// tensors"): float32 chunks of encoding NONE holding exactly the update plus what was held back
// (the residual of a state file from before), no residual left for them, and a sparsifier's k
// counted over the other tensors only. The receiver takes both kinds in one upload.
Model batch_norm_model() {
  Model m;
  m.add("conv.weight", {8, 30});
  m.add("bn.running_mean", {8});
  m.add("bn.running_var", {8});
  m.add("bn.num_batches_tracked", {1});
  m.add("fc.weight", {10, 24});
  m.add("fc.bias", {10});
  return m;
}

TEST(Compression, NormalisationStatisticsTravelDenseOutsideTheErrorFeedback) {
  auto schemes = every_scheme();
  schemes.push_back(scheme(C::RANDOM_K, 0, 0, 0.1, false));  // scaled: the strata are the other tensors'
  auto p = scheme(C::POWER_SGD);
  p.set_rank(1);
  schemes.push_back(p);
  for (auto c : schemes) {
    for (const auto& pat : default_dense_patterns()) c.add_dense(pat);
    ASSERT_EQ(error_text(check_compression(c)), "");
    Model m = batch_norm_model();
    const auto dense = dense_tensors(c, m.tensors());
    ASSERT_EQ(dense, (std::vector<bool>{false, true, true, true, false, false}));
    const std::size_t other = compressible(m.tensors(), dense);
    ASSERT_EQ(other, 8u * 30 + 10 * 24 + 10);
    auto x = gaussian(m.size(), 31);
    std::copy(x.begin(), x.end(), m.flat().begin());
    auto residual = gaussian(m.size(), 32, 0.1f);  // held back last round (the dense part too: an old state file)
    const auto held = residual;
    auto enc = compress_update(c, m.flat(), residual, m.tensors(), 64, 9);
    std::size_t nonzero_other = 0;
    for (std::size_t ti = 0; ti < m.tensors().size(); ++ti) {
      const auto& t = m.tensors()[ti];
      for (std::size_t i = t.offset; i < t.offset + t.size(); ++i) {
        if (dense[ti]) {
          const float v = c.error_feedback() ? x[i] + held[i] : x[i];
          EXPECT_EQ(m.flat()[i], v) << describe(c) << " " << t.name;
          if (c.error_feedback()) {
            EXPECT_EQ(residual[i], 0.0f) << describe(c) << " " << t.name;
          }
        } else {
          nonzero_other += m.flat()[i] != 0;
        }
      }
    }
    if (c.scheme() == C::TOP_K || c.scheme() == C::RANDOM_K) {
      EXPECT_EQ(nonzero_other, kept_count(c, other)) << describe(c);
    }
    for (const auto& ch : enc.chunks) {
      const bool is_dense = ch.name().find("bn.") == 0;
      EXPECT_EQ(ch.encoding(), is_dense ? C::NONE : c.scheme()) << describe(c) << " " << ch.name();
    }
    expect_received_as_decoded(c, m, enc);
  }
}

// Any layout: dense tensors first, last, side by side or none, empty tensors, tensors across
// keep()'s blocks of 4,096. Top-k against a plain reference (the k largest of the other tensors'
// coordinates, all distinct here); random-k keeps the draw of random_k_set over the other
// tensors' coordinates, scaled by its stratum's size without error feedback. The dense tensors'
// values and the residual are exact either way.
TEST(Compression, SparsifiersLeaveDenseTensorsAloneWhereverTheyLie) {
  std::mt19937 rng(77);
  const std::uint64_t sizes[] = {0, 4095, 4096, 4097, 8193};
  for (int trial = 0; trial < 300; ++trial) {
    Model m;
    const int tensors = 1 + static_cast<int>(rng() % 7);
    for (int i = 0; i < tensors; ++i) {
      const std::uint64_t size = rng() % 4 == 0 ? sizes[rng() % 5] : 1 + rng() % 40;
      m.add((rng() % 3 == 0 ? "bn" + std::to_string(i) + ".running_var" : "w" + std::to_string(i)), {size});
    }
    const bool ef = rng() % 2 == 0, top = rng() % 2 == 0;
    auto c = top ? scheme(C::TOP_K, 0, 0, 0.2, ef) : scheme(C::RANDOM_K, 0, 0, 0.2, ef);
    for (const auto& pat : default_dense_patterns()) c.add_dense(pat);
    const auto& layout = m.tensors();
    const auto dense = dense_tensors(c, layout);
    const std::size_t other = compressible(layout, dense), k = kept_count(c, other);
    const auto x = gaussian(m.size(), 100 + static_cast<std::uint32_t>(trial));
    std::copy(x.begin(), x.end(), m.flat().begin());
    std::vector<float> residual = ef ? gaussian(m.size(), 500 + static_cast<std::uint32_t>(trial), 0.1f)
                                     : std::vector<float>(m.size(), 0.0f);
    std::vector<float> v = x;
    if (ef) {
      for (std::size_t i = 0; i < v.size(); ++i) v[i] += residual[i];
    }
    std::vector<float> mags;  // the others' magnitudes, for top-k's threshold
    std::vector<std::size_t> flat;  // the others' coordinates in order, for random-k's draw
    for (std::size_t ti = 0; ti < layout.size(); ++ti) {
      for (std::size_t i = layout[ti].offset; !dense[ti] && i < layout[ti].offset + layout[ti].size(); ++i) {
        mags.push_back(std::fabs(v[i]));
        flat.push_back(i);
      }
    }
    std::sort(mags.begin(), mags.end(), std::greater<float>());
    std::vector<char> drawn(m.size(), 0);
    for (auto j : random_k_set(3, other, k)) drawn[flat[j]] = 1;
    if (!top) {  // the secure set: the same draw from the round's seed, and every dense coordinate
      auto shared = c;
      shared.set_seed(3);
      std::vector<std::uint64_t> expected;
      for (std::size_t i = 0; i < m.size(); ++i) {
        if (drawn[i]) expected.push_back(i);
      }
      for (std::size_t ti = 0; ti < layout.size(); ++ti) {
        for (std::size_t i = layout[ti].offset; dense[ti] && i < layout[ti].offset + layout[ti].size(); ++i) {
          expected.push_back(i);
        }
      }
      std::sort(expected.begin(), expected.end());
      ASSERT_EQ(shared_kept_set(shared, layout), expected) << trial;
    }
    auto res = residual;
    (void)compress_update(c, m.flat(), res, layout, 16, 3);
    std::size_t kept = 0;
    for (std::size_t ti = 0; ti < layout.size(); ++ti) {
      for (std::size_t i = layout[ti].offset; i < layout[ti].offset + layout[ti].size(); ++i) {
        const float out = m.flat()[i];
        if (dense[ti]) {
          ASSERT_EQ(out, v[i]) << trial << " " << layout[ti].name;
          if (ef) {
            ASSERT_EQ(res[i], 0.0f) << trial;
          }
          continue;
        }
        kept += out != 0.0f;
        if (top) {
          const bool chosen = k > 0 && std::fabs(v[i]) >= mags[k - 1];
          ASSERT_EQ(out, chosen ? v[i] : 0.0f) << trial << " " << layout[ti].name << " " << i;
        } else if (!drawn[i]) {
          ASSERT_EQ(out, 0.0f) << trial << " " << i;
        } else if (ef) {
          ASSERT_EQ(out, v[i]) << trial << " " << i;
        } else {  // a stratum of other / k coordinates, or one more
          const float q = static_cast<float>(other / k);
          ASSERT_TRUE(out == v[i] * q || out == v[i] * (q + 1.0f)) << trial << " " << i << " " << out / v[i];
        }
        if (ef) {
          ASSERT_EQ(res[i], out != 0.0f ? v[i] - out : v[i]) << trial << " " << i;
        }
      }
    }
    ASSERT_EQ(kept, k) << trial;
  }
}

TEST(Compression, ATensorThatTravelsDenseMustComeUncompressedAndTheOthersCompressed) {
  auto c = scheme(C::QUANTIZE, 8, 16);
  c.add_dense("bn.*");
  Model m = batch_norm_model();
  auto x = gaussian(m.size(), 5);
  std::copy(x.begin(), x.end(), m.flat().begin());
  std::vector<float> residual(m.size(), 0.0f);
  const auto enc = compress_update(c, m.flat(), residual, m.tensors(), 1024, 1);
  auto run = [&](std::size_t which, C::Scheme as) {
    std::vector<float> into(m.size());
    TensorReceiver rx;
    rx.reset(into, m.tensors(), true, c);
    for (std::size_t i = 0; i < enc.chunks.size(); ++i) {
      auto ch = enc.chunks[i];
      if (i == which) ch.set_encoding(as);
      if (auto st = rx.add(ch); !st) return st.error().message();
    }
    return std::string();
  };
  EXPECT_EQ(run(enc.chunks.size(), C::NONE), "");
  EXPECT_NE(run(1, C::QUANTIZE).find("compressed but the round's scheme is quantize-8/16+ef and this tensor travels dense"),
            std::string::npos)
      << run(1, C::QUANTIZE);
  EXPECT_NE(run(0, C::NONE).find("not compressed but the round's scheme is quantize-8/16+ef"), std::string::npos);
  // A dense chunk is whole float32 values.
  std::vector<float> into(m.size());
  TensorReceiver rx;
  rx.reset(into, m.tensors(), true, c);
  ASSERT_TRUE(rx.add(enc.chunks[0]));
  auto bad = enc.chunks[1];
  bad.set_data(bad.data().substr(1));
  EXPECT_NE(error_text(rx.add(bad)).find("not a positive multiple of 4"), std::string::npos);
}

TEST(Compression, ASecureSharedSetHoldsEveryDenseCoordinateAndKOfTheOthers) {
  auto c = scheme(C::RANDOM_K, 0, 0, 0.1);
  c.set_seed(41);
  for (const auto& pat : default_dense_patterns()) c.add_dense(pat);
  Model m = batch_norm_model();
  const auto& layout = m.tensors();
  const auto set = shared_kept_set(c, layout);
  // Built by hand: the draw over the 490 coordinates outside the statistics (conv.weight
  // [0, 240), then fc.weight and fc.bias [257, 507)), and the statistics' 17 at [240, 257).
  std::vector<std::uint64_t> expected;
  for (auto x : random_k_set(41, 490, kept_count(c, 490))) expected.push_back(x < 240 ? x : x + 17);
  for (std::uint64_t x = 240; x < 257; ++x) expected.push_back(x);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(set, expected);
  EXPECT_TRUE(std::is_sorted(set.begin(), set.end()));
  EXPECT_EQ(std::adjacent_find(set.begin(), set.end()), set.end());
  const auto dense = dense_tensors(c, layout);
  std::size_t in_dense = 0;
  for (std::size_t ti = 0; ti < layout.size(); ++ti) {
    for (auto i : set) in_dense += dense[ti] && i >= layout[ti].offset && i < layout[ti].offset + layout[ti].size();
  }
  EXPECT_EQ(in_dense, 17u);
  EXPECT_EQ(set.size(), 17u + kept_count(c, compressible(layout, dense)));
  // Without dense tensors the set is random_k_set's, as before.
  auto plain = c;
  plain.clear_dense();
  EXPECT_EQ(shared_kept_set(plain, layout), random_k_set(41, m.size(), kept_count(plain, m.size())));

  auto x = gaussian(m.size(), 8);
  std::copy(x.begin(), x.end(), m.flat().begin());
  std::vector<float> residual(m.size(), 0.5f);
  EXPECT_EQ(keep_shared_random_k(c, m.flat(), residual, layout), set);
  for (auto i : set) EXPECT_EQ(m.flat()[i], x[i] + 0.5f);
  for (std::size_t i = layout[1].offset; i < layout[4].offset; ++i) EXPECT_EQ(residual[i], 0.0f);
}

// A silo refuses a secure random-k round without error feedback, which the server's config
// never makes: its kept coordinates would not be scaled (the codec clips each update).
TEST(Compression, ASecureRandomKRoundWithoutErrorFeedbackIsRefusedBySilosAndEdges) {
  wire::RoundStart rs;
  auto* t = rs.add_tensors();
  t->set_name("w");
  t->set_dtype(wire::F32);
  t->add_shape(10);
  rs.mutable_secagg()->set_modulus_bits(32);
  rs.mutable_secagg()->set_vector_length(3);
  *rs.mutable_compression() = scheme(C::RANDOM_K, 0, 0, 0.1);
  EXPECT_EQ(error_text(check_layout(rs)), "");
  rs.mutable_compression()->set_error_feedback(false);
  EXPECT_NE(error_text(check_layout(rs)).find("secure random-k needs error feedback"), std::string::npos)
      << error_text(check_layout(rs));
}

TEST(Compression, DensePatternsAreCheckedAndOnlyMatterWhenSomethingIsCompressed) {
  auto c = scheme(C::TOP_K, 0, 0, 0.1);
  c.add_dense("");
  EXPECT_NE(error_text(check_compression(c)).find("dense pattern must be 1..256 characters"), std::string::npos);
  c.clear_dense();
  for (int i = 0; i < 65; ++i) c.add_dense("x");
  EXPECT_NE(error_text(check_compression(c)).find("at most 64 dense patterns"), std::string::npos);
  C none;
  none.add_dense("*");
  Model m = batch_norm_model();
  EXPECT_EQ(dense_tensors(none, m.tensors()), std::vector<bool>(6, false));
  EXPECT_EQ(to_json(c)["dense"].size(), 65u);
}

// ---- bad input --------------------------------------------------------------------------------

std::string refusal(const C& c, std::string data, std::size_t n) {
  std::vector<float> out(n);
  std::size_t kept = 0;
  return error_text(decode_chunk(c, data, out, kept));
}

std::string with_scale(std::string data, float s) {
  std::memcpy(data.data(), &s, 4);
  return data;
}

TEST(Compression, MalformedChunksAreRefusedWithTheReason) {
  const auto q8 = scheme(C::QUANTIZE, 8, 16), q4 = scheme(C::QUANTIZE, 4, 16), sg = scheme(C::SIGN, 0, 16),
             tk = scheme(C::TOP_K, 0, 0, 0.5);
  const auto x = gaussian(20, 1);
  std::vector<float> dec(20);
  const auto d8 = encode_chunk(q8, x, 1, dec), d4 = encode_chunk(q4, x, 1, dec), ds = encode_chunk(sg, x, 1, dec);

  EXPECT_NE(refusal(q8, d8.substr(1), 20).find("bytes, not"), std::string::npos);
  EXPECT_NE(refusal(q8, d8 + "x", 20).find("bytes, not"), std::string::npos);
  EXPECT_NE(refusal(q8, d8, 21).find("bytes, not"), std::string::npos);  // the count does not match the codes
  EXPECT_NE(refusal(q8, with_scale(d8, NAN), 20).find("NaN"), std::string::npos);
  EXPECT_NE(refusal(q8, with_scale(d8, INFINITY), 20).find("infinite"), std::string::npos);
  EXPECT_NE(refusal(q4, with_scale(d4, -1.0f), 20).find("negative"), std::string::npos);
  EXPECT_NE(refusal(sg, with_scale(ds, NAN), 20).find("NaN"), std::string::npos);
  auto bad8 = d8;
  bad8[8 + 3] = static_cast<char>(0x80);  // -128: outside the symmetric range
  EXPECT_NE(refusal(q8, bad8, 20).find("-128"), std::string::npos);
  auto bad4 = d4;
  bad4[8] = static_cast<char>(0xff);
  EXPECT_NE(refusal(q4, bad4, 20).find("15"), std::string::npos);
  auto pad = ds;
  pad.back() = static_cast<char>(pad.back() | 0x80);  // 20 elements: bits 4..7 of the last byte unused
  EXPECT_NE(refusal(sg, pad, 20).find("past its last"), std::string::npos);

  auto sparse = [](std::vector<std::uint32_t> idx, std::vector<float> val, std::uint32_t m) {
    std::string s(4 + 4 * idx.size() + 4 * val.size(), '\0');
    std::memcpy(s.data(), &m, 4);
    if (!idx.empty()) std::memcpy(s.data() + 4, idx.data(), 4 * idx.size());
    if (!val.empty()) std::memcpy(s.data() + 4 + 4 * idx.size(), val.data(), 4 * val.size());
    return s;
  };
  EXPECT_EQ(refusal(tk, sparse({1, 5}, {0.5f, -1.0f}, 2), 10), "");
  EXPECT_NE(refusal(tk, sparse({5, 1}, {0.5f, -1.0f}, 2), 10).find("out of order"), std::string::npos);
  EXPECT_NE(refusal(tk, sparse({1, 1}, {0.5f, -1.0f}, 2), 10).find("out of order"), std::string::npos);
  EXPECT_NE(refusal(tk, sparse({1, 10}, {0.5f, -1.0f}, 2), 10).find("past its 10"), std::string::npos);
  EXPECT_NE(refusal(tk, sparse({1, 5}, {0.5f, NAN}, 2), 10).find("NaN"), std::string::npos);
  EXPECT_NE(refusal(tk, sparse({1, 5}, {0.5f, -1.0f}, 3), 10).find("bytes, not"), std::string::npos);
  EXPECT_NE(refusal(tk, sparse({}, {}, 4000000000u), 10).find("keeps"), std::string::npos);
  EXPECT_NE(refusal(tk, "ab", 10).find("no count"), std::string::npos);
}

TEST(Compression, TheReceiverRefusesChunksThatDoNotMatchTheRoundsScheme) {
  Model m;
  m.add("w", {100});
  auto x = gaussian(100, 2);
  std::copy(x.begin(), x.end(), m.flat().begin());
  const auto q8 = scheme(C::QUANTIZE, 8, 32);
  std::vector<float> into(100);
  auto encode = [&](const C& c) {
    auto u = x;
    return compress_update(c, u, {}, m.tensors(), 1000, 1).chunks.at(0);
  };
  TensorReceiver rx;
  // A dense chunk when the round compresses, and a compressed one when it does not.
  rx.reset(into, m.tensors(), true, q8);
  wire::TensorChunk dense;
  dense.set_name("w");
  dense.set_dtype(wire::F32);
  dense.set_data(std::string(400, '\0'));
  auto st = rx.add(dense);
  EXPECT_FALSE(st);
  EXPECT_NE(error_text(st).find("not compressed"), std::string::npos) << error_text(st);
  rx.reset(into, m.tensors(), true);
  st = rx.add(encode(q8));
  EXPECT_FALSE(st);
  EXPECT_NE(error_text(st).find("compressed but the round's scheme is none"), std::string::npos) << error_text(st);
  // Another scheme's parameters: the sizes do not match.
  rx.reset(into, m.tensors(), true, scheme(C::QUANTIZE, 4, 32));
  st = rx.add(encode(q8));
  EXPECT_FALSE(st);
  EXPECT_NE(error_text(st).find("bytes, not"), std::string::npos) << error_text(st);
  // A count past the tensor, and zero.
  rx.reset(into, m.tensors(), true, q8);
  auto ch = encode(q8);
  ch.set_count(101);
  EXPECT_FALSE(rx.add(ch));
  ch.set_count(0);
  EXPECT_FALSE(rx.add(ch));
  // More kept coordinates than the round's k, over the whole upload.
  const auto tk = scheme(C::TOP_K, 0, 0, 0.05);
  rx.reset(into, m.tensors(), true, tk);
  auto big = encode(scheme(C::TOP_K, 0, 0, 0.5));
  st = rx.add(big);
  EXPECT_FALSE(st);
  EXPECT_NE(error_text(st).find("more than the 5"), std::string::npos) << error_text(st);
}

TEST(Compression, SchemesAreCheckedAndDescribed) {
  EXPECT_EQ(error_text(check_compression(scheme(C::QUANTIZE, 8, 256))), "");
  EXPECT_NE(error_text(check_compression(scheme(C::QUANTIZE, 5, 256))), "");
  EXPECT_NE(error_text(check_compression(scheme(C::SIGN, 0, 4))), "");
  EXPECT_NE(error_text(check_compression(scheme(C::TOP_K, 0, 0, 0))), "");
  EXPECT_NE(error_text(check_compression(scheme(C::RANDOM_K, 0, 0, 1.5))), "");
  EXPECT_NE(error_text(check_compression(scheme(C::POWER_SGD))), "");  // rank 0
  EXPECT_EQ(describe(scheme(C::TOP_K, 0, 0, 0.01)), "top-k 1%+ef");
  EXPECT_EQ(describe(scheme(C::RANDOM_K, 0, 0, 0.125, false)), "random-k 12.5%");
  EXPECT_EQ(describe(scheme(C::QUANTIZE, 4, 128)), "quantize-4/128+ef");
  EXPECT_EQ(kept_count(scheme(C::TOP_K, 0, 0, 0.01), 50), 1u);
  EXPECT_EQ(kept_count(scheme(C::TOP_K, 0, 0, 0.01), 1000), 10u);
}

TEST(Compression, PowerSgdSendsTwoDimensionalTensorsAsFactorsDecodedToTheSilosBits) {
  C c;
  c.set_scheme(C::POWER_SGD);
  c.set_rank(2);
  c.set_error_feedback(true);
  c.set_seed(99);
  Model m;
  m.add("w", {60, 40});   // factors: 2 x (60 + 40) values, a twelfth of the tensor
  m.add("b", {40});       // 1-D: sent dense
  m.add("t", {3, 2});     // too small to factor: dense
  // A rank-1 matrix (plus nothing else) is reproduced almost exactly by one power iteration.
  auto w = m.tensor("w");
  for (std::size_t i = 0; i < 60; ++i) {
    for (std::size_t j = 0; j < 40; ++j) w[i * 40 + j] = 0.01f * float(i + 1) * (j % 2 ? 1.0f : -0.5f);
  }
  auto b = gaussian(40, 3);
  std::copy(b.begin(), b.end(), m.tensor("b").begin());
  const Model before = m;
  std::vector<float> residual(m.size(), 0.0f);
  auto enc = compress_update(c, m.flat(), residual, m.tensors(), 400, 0);  // 10 rows a chunk
  EXPECT_TRUE(low_rank(m.tensors()[0], 2));
  EXPECT_FALSE(low_rank(m.tensors()[2], 2));
  for (std::size_t i = 0; i < 2400; ++i) EXPECT_NEAR(m.flat()[i], before.flat()[i], 1e-5) << i;
  for (std::size_t i = 2400; i < m.size(); ++i) EXPECT_EQ(m.flat()[i], before.flat()[i]) << i;
  for (std::size_t i = 0; i < m.size(); ++i) EXPECT_NEAR(m.flat()[i] + residual[i], before.flat()[i], 1e-6);
  std::vector<float> into(m.size());
  TensorReceiver rx;
  rx.reset(into, m.tensors(), true, c);
  for (const auto& ch : enc.chunks) ASSERT_TRUE(rx.add(ch)) << ch.name() << " at " << ch.offset();
  ASSERT_TRUE(rx.complete());
  EXPECT_EQ(rx.finish_sha256(), crypto::sha256_hex(m.flat()));
  EXPECT_EQ(enc.bytes, 6u * 4 * (10 + 40) * 2 + 40 * 4 + 6 * 4);
  // The same round seed gives the same factors: a reference can replay a silo.
  Model again = before;
  std::vector<float> r2(m.size(), 0.0f);
  compress_update(c, again.flat(), r2, again.tensors(), 400, 12345);
  EXPECT_EQ(std::memcmp(again.flat().data(), m.flat().data(), m.bytes()), 0);

  // Refused: rows cut in the middle, a size that does not match the rank, a NaN factor.
  auto bad = enc.chunks.at(1);
  rx.reset(into, m.tensors(), true, c);
  ASSERT_TRUE(rx.add(enc.chunks.at(0)));
  bad.set_count(bad.count() - 1);
  auto st = rx.add(bad);
  EXPECT_NE(error_text(st).find("whole rows"), std::string::npos) << error_text(st);
  bad = enc.chunks.at(1);
  bad.mutable_data()->pop_back();
  st = rx.add(bad);
  EXPECT_NE(error_text(st).find("rank 2"), std::string::npos) << error_text(st);
  bad = enc.chunks.at(1);
  const float nan = NAN;
  std::memcpy(bad.mutable_data()->data() + 8, &nan, 4);
  st = rx.add(bad);
  EXPECT_NE(error_text(st).find("NaN"), std::string::npos) << error_text(st);
}

TEST(Compression, ABlockTooSmallToScaleIsSentAsZerosAndKeptByTheErrorFeedback) {
  const auto c = scheme(C::QUANTIZE, 8, 16);
  std::vector<TensorInfo> layout{{"w", {32}, 0}};
  std::vector<float> u(32, 0.0f), residual(32, 0.0f);
  u[3] = 1e-39f;  // levels / max |x| overflows float
  for (std::size_t i = 16; i < 32; ++i) u[i] = 0.5f;
  const auto before = u;
  auto enc = compress_update(c, u, residual, layout, 1024, 3);
  for (std::size_t i = 0; i < 16; ++i) EXPECT_EQ(u[i], 0.0f) << i;
  EXPECT_EQ(residual[3], before[3]);
  for (float r : residual) EXPECT_TRUE(std::isfinite(r));
  std::vector<float> back(32);
  std::size_t kept = 0;
  ASSERT_TRUE(succeeded(decode_chunk(c, enc.chunks.at(0).data(), back, kept)));
  EXPECT_EQ(std::memcmp(back.data(), u.data(), 32 * 4), 0);
}

TEST(Compression, NegativeZerosAndSparseChunksStayWithinTheirBytes) {
  // A kept -0.0 decodes to the same bits the silo hashed; a sparse chunk never needs more bytes
  // than its span of dense float32 would.
  Model m;
  m.add("w", {1000});
  auto x = gaussian(1000, 8);
  x[5] = -0.0f;
  std::copy(x.begin(), x.end(), m.flat().begin());
  const auto c = scheme(C::TOP_K, 0, 0, 1.0);
  auto enc = compress_update(c, m.flat(), {}, m.tensors(), 256, 1);
  std::vector<float> into(1000);
  TensorReceiver rx;
  rx.reset(into, m.tensors(), true, c);
  for (const auto& ch : enc.chunks) {
    EXPECT_LE(ch.data().size(), 256u * 4 + 4);
    ASSERT_TRUE(rx.add(ch));
  }
  EXPECT_EQ(rx.finish_sha256(), crypto::sha256_hex(m.flat()));
  // A chunk that claims more elements than any chunk may stand for is refused before decoding.
  Model big;
  big.add("w", {kMaxChunkCount + 10});
  std::vector<float> space(big.size());
  rx.reset(space, big.tensors(), false, c);
  wire::TensorChunk huge;
  huge.set_name("w");
  huge.set_dtype(wire::F32);
  huge.set_encoding(C::TOP_K);
  huge.set_count(kMaxChunkCount + 1);
  huge.set_data(std::string(4, '\0'));
  auto st = rx.add(huge);
  EXPECT_FALSE(st);
  EXPECT_NE(error_text(st).find("at most"), std::string::npos) << error_text(st);
}

TEST(Compression, ANonFiniteUpdateGivesAScaleEveryReceiverRefuses) {
  // A silo that skips the finiteness check (or lies) cannot slip NaN through a scale.
  auto x = gaussian(64, 4);
  x[10] = NAN;
  std::vector<float> dec(64);
  for (const auto& c : {scheme(C::QUANTIZE, 8, 64), scheme(C::QUANTIZE, 4, 64), scheme(C::SIGN, 0, 64)}) {
    const auto data = encode_chunk(c, x, 1, dec);
    EXPECT_NE(refusal(c, data, 64), "") << describe(c);
  }
}

// ---- the model broadcast as a delta -----------------------------------------------------------

Model broadcast_layout() {
  Model m;
  m.add("fc.weight", {40, 25});
  m.add("bn.running_var", {7});
  m.add("fc.bias", {3});
  return m;
}

C broadcast_scheme(std::uint32_t bits) {
  C c = scheme(C::QUANTIZE, bits, 64, 0, /*ef=*/false);
  for (const auto& p : default_dense_patterns()) c.add_dense(p);
  return c;
}

// What the server commits is what a receiver holding the base rebuilds, bit for bit, from
// chunks a quarter (8-bit) or an eighth (4-bit) of the model, plus the dense tensors' values;
// the step it rounds moves by less than one quantization step per coordinate.
TEST(Compression, ABroadcastDeltaRebuildsTheServersModelBitForBitFromTheBase) {
  for (std::uint32_t bits : {8u, 4u}) {
    const C c = broadcast_scheme(bits);
    ASSERT_EQ(error_text(check_broadcast(c)), "");
    Model base = broadcast_layout(), next = broadcast_layout();
    const auto b = gaussian(base.size(), 1), step = gaussian(base.size(), 2, 0.01f);
    for (std::size_t i = 0; i < base.size(); ++i) {
      base.flat()[i] = b[i];
      next.flat()[i] = b[i] + step[i];
    }
    for (std::size_t i = 0; i < 7; ++i) next.flat()[1000 + i] = 0.001f * static_cast<float>(i);  // small variances
    const Model exact = next;
    const auto enc = encode_model_delta(c, base.flat(), next.flat(), next.tensors(), 300, 9);
    // fc.weight in chunks of 300 (4 of them), then the variances as values, then fc.bias.
    ASSERT_EQ(enc.chunks.size(), 6u);
    EXPECT_EQ(enc.chunks[4].name(), "bn.running_var");
    EXPECT_EQ(enc.chunks[4].encoding(), C::NONE);
    EXPECT_EQ(enc.chunks[0].encoding(), C::QUANTIZE);
    const double ratio = double(enc.bytes) / double(4 * base.size());
    EXPECT_LT(ratio, bits == 8 ? 0.29 : 0.16) << bits;
    // The dense tensor's new values exactly; the others within a step (max |step| / levels of its block).
    for (std::size_t i = 0; i < 7; ++i) EXPECT_EQ(next.flat()[1000 + i], exact.flat()[1000 + i]);
    const float levels = bits == 8 ? 127.0f : 7.0f;
    for (std::size_t i = 0; i < 1000; ++i) {
      // Blocks of 64 from each chunk's start; the last chunk of fc.weight's 1,000 holds 100.
      const std::size_t chunk_end = std::min<std::size_t>((i / 300) * 300 + 300, 1000);
      const std::size_t first = (i / 300) * 300 + ((i % 300) / 64) * 64;
      float m = 0;
      for (std::size_t j = first; j < std::min<std::size_t>(first + 64, chunk_end); ++j) {
        m = std::max(m, std::fabs(step[j]));
      }
      ASSERT_LE(std::fabs(next.flat()[i] - exact.flat()[i]), m / levels * 1.0001f + 1e-7f) << i;
    }

    Model held = base;
    TensorReceiver rx;
    rx.reset_model(held.flat(), held.tensors(), c, /*have_base=*/true, /*hash=*/true);
    for (const auto& ch : enc.chunks) ASSERT_TRUE(rx.add(ch)) << ch.name();
    ASSERT_TRUE(rx.complete());
    EXPECT_EQ(std::memcmp(held.flat().data(), next.flat().data(), 4 * next.size()), 0) << bits;
    EXPECT_EQ(rx.finish_sha256(), crypto::sha256_hex(next.flat()));
    EXPECT_EQ(rx.bytes(), enc.bytes);

    // A receiver without the base takes the whole model (values), and refuses a delta with the reason.
    Model fresh = broadcast_layout();
    rx.reset_model(fresh.flat(), fresh.tensors(), c, /*have_base=*/false, /*hash=*/true);
    ChunkSource whole(nullptr, next.flat(), next.tensors(), "fed", 2, 1200);
    while (auto e = whole.next()) ASSERT_TRUE(rx.add(e->tensor_chunk()));
    EXPECT_EQ(rx.finish_sha256(), crypto::sha256_hex(next.flat()));
    rx.reset_model(fresh.flat(), fresh.tensors(), c, /*have_base=*/false);
    const auto st = rx.add(enc.chunks[0]);
    ASSERT_FALSE(st);
    EXPECT_NE(error_text(st).find("does not hold"), std::string::npos) << error_text(st);
  }
}

// After an aborted round the model did not change: receivers that hold it get it as a step of
// zeros (codes and scales, the dense tensors' values), which rebuilds it bit for bit, for a
// quarter (8-bit) or an eighth (4-bit) of the bytes. A delta-coded -0.0 would come back +0.0, so
// such a model has no such chunks; a dense tensor's -0.0 travels as its value and is kept.
TEST(Compression, AModelTheReceiverHoldsAlreadyGoesAsAStepOfZerosThatRebuildsItBitForBit) {
  for (std::uint32_t bits : {8u, 4u}) {
    const C c = broadcast_scheme(bits);
    Model model = broadcast_layout();
    const auto v = gaussian(model.size(), 3);
    std::copy(v.begin(), v.end(), model.flat().begin());
    model.flat()[1003] = -0.0f;  // bn.running_var: dense
    const auto enc = encode_same_model(c, model.flat(), model.tensors(), 300, 5);
    ASSERT_TRUE(enc.has_value()) << bits;
    EXPECT_LT(double(enc->bytes) / double(4 * model.size()), bits == 8 ? 0.29 : 0.16) << bits;
    Model held = model;
    TensorReceiver rx;
    rx.reset_model(held.flat(), held.tensors(), c, /*have_base=*/true, /*hash=*/true);
    for (const auto& ch : enc->chunks) ASSERT_TRUE(rx.add(ch)) << ch.name();
    ASSERT_TRUE(rx.complete());
    EXPECT_EQ(std::memcmp(held.flat().data(), model.flat().data(), 4 * model.size()), 0) << bits;
    EXPECT_EQ(rx.finish_sha256(), crypto::sha256_hex(model.flat()));

    model.flat()[17] = -0.0f;  // fc.weight: delta-coded
    EXPECT_FALSE(encode_same_model(c, model.flat(), model.tensors(), 300, 5).has_value()) << bits;
  }
}

TEST(Compression, ABroadcastReceiverRefusesDeltasOfDenseTensorsOtherSchemesAndBadScales) {
  const C c = broadcast_scheme(8);
  Model base = broadcast_layout(), next = broadcast_layout();
  for (std::size_t i = 0; i < base.size(); ++i) next.flat()[i] = 0.5f;
  const auto enc = encode_model_delta(c, base.flat(), next.flat(), next.tensors(), 1000, 3);
  auto refused = [&](const std::vector<wire::TensorChunk>& chunks, const std::string& why) {
    Model held = base;
    TensorReceiver rx;
    rx.reset_model(held.flat(), held.tensors(), c, true);
    for (const auto& ch : chunks) {
      const auto st = rx.add(ch);
      if (!st) {
        EXPECT_NE(error_text(st).find(why), std::string::npos) << error_text(st);
        return;
      }
    }
    ADD_FAILURE() << "accepted; wanted: " << why;
  };
  auto chunks = enc.chunks;
  // The variances as a delta: a dense tensor must come as its values.
  chunks[1] = encode_model_delta(scheme(C::QUANTIZE, 8, 64, 0, false), base.flat(), next.flat(), next.tensors(), 1000, 3)
                  .chunks[1];
  refused(chunks, "travels as float32 values");
  chunks = enc.chunks;
  chunks[0].set_encoding(C::SIGN);
  refused(chunks, "but the broadcast is quantize-8/64");
  chunks = enc.chunks;
  const float nan = std::nanf("");
  std::memcpy(chunks[0].mutable_data()->data(), &nan, 4);  // the first block's scale
  refused(chunks, "NaN");
  chunks = enc.chunks;
  chunks[0].set_count(2000);
  refused(chunks, "count 2000");
  // A broadcast scheme is quantization without error feedback.
  EXPECT_NE(error_text(check_broadcast(scheme(C::TOP_K, 0, 0, 0.1, false))), "");
  EXPECT_NE(error_text(check_broadcast(scheme(C::QUANTIZE, 8, 64, 0, true))), "");
  EXPECT_NE(error_text(check_broadcast(scheme(C::QUANTIZE, 5, 64, 0, false))), "");
}

// A step past float's range (finite models whose difference overflows) has no codes: that chunk
// goes as its values, and the receiver still rebuilds the model exactly.
TEST(Compression, ABroadcastStepPastFloatsRangeGoesAsValues) {
  const C c = broadcast_scheme(8);
  Model base = broadcast_layout(), next = broadcast_layout();
  for (std::size_t i = 0; i < base.size(); ++i) next.flat()[i] = 0.25f;
  base.flat()[5] = -3e38f;
  next.flat()[5] = 3e38f;
  const auto enc = encode_model_delta(c, base.flat(), next.flat(), next.tensors(), 300, 1);
  EXPECT_EQ(enc.chunks[0].encoding(), C::NONE);      // fc.weight[0, 300): the step overflows
  EXPECT_EQ(enc.chunks[1].encoding(), C::QUANTIZE);  // the next chunk is a delta as usual
  EXPECT_EQ(next.flat()[5], 3e38f);
  Model held = base;
  TensorReceiver rx;
  rx.reset_model(held.flat(), held.tensors(), c, true);
  for (const auto& ch : enc.chunks) ASSERT_TRUE(rx.add(ch));
  EXPECT_EQ(std::memcmp(held.flat().data(), next.flat().data(), 4 * next.size()), 0);
}


// The codec seam (protocol/codec.h): every scheme is one codec in the table, found by its value
// and its name, configured from its own keys with defaults its check accepts, and each chunk it
// encodes decodes, through the same entry points the roles call, to what it computed.
TEST(Codecs, EveryCodecInTheTableIsFoundByNameConfiguresItsDefaultsAndRoundTripsAChunk) {
  const auto& table = codecs();
  ASSERT_EQ(table.size(), static_cast<std::size_t>(C::Scheme_ARRAYSIZE));
  std::set<std::string> keys_seen;
  for (std::size_t s = 0; s < table.size(); ++s) {
    const Codec* codec = table[s];
    ASSERT_TRUE(codec) << "scheme " << s << " has no codec";
    const auto scheme = static_cast<C::Scheme>(s);
    EXPECT_EQ(find_codec(scheme), codec);
    EXPECT_EQ(scheme_of_name(codec->name()), scheme) << codec->name();
    C c;
    c.set_scheme(scheme);
    codec->configure(ConfigNode(nlohmann::json::object(), "test.json", "compression"), c);
    EXPECT_EQ(error_text(check_compression(c)), "") << codec->name() << " defaults: " << describe(c);
    for (const auto& k : codec->keys()) keys_seen.insert(k);
    if (scheme == C::NONE) continue;
    const TensorInfo t{"w", {257}, 0};
    auto x = gaussian(257, 7);
    for (std::size_t i = 0; i < x.size(); i += 3) x[i] = 0;
    std::vector<float> decoded(x.size()), back(x.size(), -1.0f);
    const auto data = encode_chunk(c, x, 5, decoded);
    std::size_t kept = 0;
    ASSERT_TRUE(succeeded(decode_chunk(c, data, back, kept, &t, 0))) << codec->name();
    EXPECT_EQ(std::memcmp(decoded.data(), back.data(), 4 * x.size()), 0) << codec->name();
    EXPECT_EQ(data.size(), encoded_bytes(c, x.size(), kept)) << codec->name();
  }
  EXPECT_EQ(keys_seen, (std::set<std::string>{"bits", "block", "fraction", "rank"}));
  EXPECT_EQ(find_codec(static_cast<C::Scheme>(C::Scheme_ARRAYSIZE)), nullptr);
  C unknown;
  unknown.set_scheme(static_cast<C::Scheme>(99));
  EXPECT_EQ(error_text(check_compression(unknown)), "unknown compression scheme 99");
  std::vector<float> out(4);
  std::size_t kept = 0;
  EXPECT_EQ(error_text(decode_chunk(unknown, "abcd", out, kept)), "unknown compression scheme 99");
}

}  // namespace
}  // namespace xsilo::protocol
