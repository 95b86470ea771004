// The packed wire of masked words (protocol/packed.h, issue 42): pack and unpack, the chunk
// stream that carries them, and the setup rule every party checks. Links the protocol library
// alone; the rounds are in cores_test.cpp (sans-I/O) and federation_test.cpp (real processes).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "crypto/hash.h"
#include "protocol/compression.h"
#include "protocol/masked.h"
#include "protocol/packed.h"
#include "protocol/round_start.h"
#include "protocol/tensor_stream.h"
#include "result_util.h"

namespace xsilo::protocol {
namespace {

template <class W>
std::vector<W> random_words(std::size_t n, std::uint32_t bits, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<W> w(n);
  const std::uint64_t mask = bits >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1;
  for (auto& x : w) x = static_cast<W>(rng() & mask);
  return w;
}

template <class W>
void expect_round_trip(std::uint32_t bits) {
  for (const std::size_t n : {0, 1, 3, 7, 8, 9, 31, 33, 100, 1001}) {
    // Whole words in: only the low `bits` bits travel.
    const auto in = random_words<W>(n, sizeof(W) * 8, bits * 1000 + n);
    std::vector<std::uint8_t> packed(packed_bytes(n, bits), 0xAA);
    pack_words(std::span<const W>(in), bits, packed);
    std::vector<W> out(n, W{0x5A});
    ASSERT_TRUE(unpack_words(packed, bits, std::span<W>(out))) << bits << " bits, " << n << " words";
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], static_cast<W>(in[i] & static_cast<W>((std::uint64_t{1} << bits) - 1)))
          << bits << " bits, word " << i << " of " << n;
    }
  }
}

TEST(PackedWire, TakesTheBitsOfItsWordsRoundedUpToWholeBytes) {
  EXPECT_EQ(packed_bytes(0, 20), 0u);
  EXPECT_EQ(packed_bytes(1, 20), 3u);
  EXPECT_EQ(packed_bytes(5, 20), 13u);
  EXPECT_EQ(packed_bytes(8, 20), 20u);
  EXPECT_EQ(packed_bytes(9, 1), 2u);
  EXPECT_EQ(packed_bytes(1000, 20), 2500u);  // 32/20 fewer bytes than 1000 32-bit words
  EXPECT_EQ(packed_bytes(std::size_t{1} << 40, 31), (std::size_t{1} << 40) / 8 * 31);
}

TEST(PackedWire, RoundTripsEveryWidthBelowTheWordForLengthsThatAreNotWholeBytes) {
  for (std::uint32_t b = 1; b < 8; ++b) expect_round_trip<std::uint8_t>(b);
  for (std::uint32_t b = 1; b < 16; ++b) expect_round_trip<std::uint16_t>(b);
  for (std::uint32_t b = 1; b < 32; ++b) expect_round_trip<std::uint32_t>(b);
  for (std::uint32_t b : {1u, 20u, 33u, 47u, 56u, 57u, 63u}) expect_round_trip<std::uint64_t>(b);
}

TEST(PackedWire, LaysWordsOutLeastSignificantBitFirst) {
  const std::vector<std::uint32_t> in = {0xFFFFF, 0x00001};  // two 20-bit words
  std::vector<std::uint8_t> packed(packed_bytes(2, 20));
  pack_words(std::span<const std::uint32_t>(in), 20, packed);
  EXPECT_EQ(packed, (std::vector<std::uint8_t>{0xFF, 0xFF, 0x1F, 0x00, 0x00}));
}

TEST(PackedWire, RefusesAWrongLengthAndPaddingBitsThatAreNotZero) {
  std::vector<std::uint32_t> out(5);
  std::vector<std::uint8_t> packed(packed_bytes(5, 20), 0);
  EXPECT_TRUE(unpack_words(packed, 20, std::span<std::uint32_t>(out)));
  packed.back() = 0x10;  // bit 100: past the fifth word
  EXPECT_NE(error_text(unpack_words(packed, 20, std::span<std::uint32_t>(out))).find("padding"), std::string::npos);
  packed.back() = 0;
  packed.push_back(0);
  EXPECT_NE(error_text(unpack_words(packed, 20, std::span<std::uint32_t>(out))).find("14 bytes of packed words, not the 13"),
            std::string::npos);
  packed.resize(12);
  EXPECT_FALSE(unpack_words(packed, 20, std::span<std::uint32_t>(out)));
}

// A masked vector streamed in chunks of a few hundred bytes, the last one not whole bytes.
struct Stream {
  std::shared_ptr<MaskedVector> sent = std::make_shared<MaskedVector>(32, 1001);
  std::vector<wire::Envelope> chunks;
  Stream(std::uint32_t wire_bits, std::size_t chunk_bytes) {
    auto w = sent->u32();
    const auto r = random_words<std::uint32_t>(w.size(), 32, 7);
    std::copy(r.begin(), r.end(), w.begin());
    sent->set_wire_bits(wire_bits);
    sent->reduce_to_wire();
    ChunkSource src(sent, sent->bytes(), sent->dtype(), {{"masked", {sent->words()}, 0}}, "fed", 3, chunk_bytes,
                    sent->wire_bits());
    while (auto e = src.next()) chunks.push_back(std::move(*e));
  }
};

TEST(PackedWire, ChunksCarryThePackedWordsAndTheReceiverRestoresTheReducedWords) {
  Stream s(20, 256);
  ASSERT_GT(s.chunks.size(), 1u);
  std::uint64_t words = 0;
  for (const auto& e : s.chunks) {
    EXPECT_EQ(e.tensor_chunk().dtype(), wire::PACKED);
    EXPECT_EQ(e.tensor_chunk().data().size(), packed_bytes(e.tensor_chunk().count(), 20));
    words += e.tensor_chunk().count();
  }
  EXPECT_EQ(words, 1001u);
  MaskedVector got(32, 1001);
  TensorReceiver rx;
  rx.reset_words(got.bytes(), {{"masked", {1001}, 0}}, wire::U32, /*hash=*/true, 20);
  for (const auto& e : s.chunks) ASSERT_EQ(error_text(rx.add(e.tensor_chunk())), "");
  ASSERT_TRUE(rx.complete());
  EXPECT_EQ(std::vector<std::uint32_t>(got.u32().begin(), got.u32().end()),
            std::vector<std::uint32_t>(s.sent->u32().begin(), s.sent->u32().end()));
  for (const auto w : got.u32()) ASSERT_LT(w, 1u << 20);
  // The bytes on the wire: 20 bits a word (32/20 fewer than whole words), and the hash is of the
  // reduced words in place, which the sender hashes too.
  EXPECT_EQ(rx.bytes(), 2503u);  // 1001 words in chunks of 102 (255 bytes each) and a last one of 83
  const auto b = s.sent->bytes();
  EXPECT_EQ(rx.finish_sha256(), crypto::sha256_hex(std::string_view(reinterpret_cast<const char*>(b.data()), b.size())));
}

TEST(PackedWire, TheReceiverRefusesWholeWordsAWrongLengthAndAWrongCountAndStaysUsable) {
  Stream s(20, 256);
  MaskedVector got(32, 1001);
  TensorReceiver rx;
  rx.reset_words(got.bytes(), {{"masked", {1001}, 0}}, wire::U32, true, 20);
  auto c = s.chunks.front().tensor_chunk();
  auto whole = c;
  whole.set_dtype(wire::U32);
  EXPECT_NE(error_text(rx.add(whole)).find("must be PACKED words of 20 bits"), std::string::npos);
  auto shorter = c;
  shorter.mutable_data()->pop_back();
  EXPECT_NE(error_text(rx.add(shorter)).find("bytes for 102 words packed 20 bits each"), std::string::npos);
  auto more = c;
  more.set_count(2000);
  EXPECT_NE(error_text(rx.add(more)).find("count 2000"), std::string::npos);
  // A receiver that expects whole words refuses packed ones by their dtype.
  TensorReceiver plain;
  plain.reset_words(got.bytes(), {{"masked", {1001}, 0}}, wire::U32, true);
  EXPECT_NE(error_text(plain.add(c)).find("must be U32"), std::string::npos);
  // The refusals leave the receiver usable: the good chunks still go in, whole.
  for (const auto& e : s.chunks) ASSERT_EQ(error_text(rx.add(e.tensor_chunk())), "");
  EXPECT_TRUE(rx.complete());
  // Padding bits that are not zero: refused too (found while unpacking).
  TensorReceiver again;
  again.reset_words(got.bytes(), {{"masked", {1001}, 0}}, wire::U32, true, 20);
  auto last = s.chunks.back().tensor_chunk();
  ASSERT_NE(last.count() % 2, 0u) << "the last chunk must end in half a byte";
  (*last.mutable_data())[last.data().size() - 1] = static_cast<char>(0xF0);
  for (std::size_t k = 0; k + 1 < s.chunks.size(); ++k) ASSERT_EQ(error_text(again.add(s.chunks[k].tensor_chunk())), "");
  const auto said = error_text(again.add(last));
  EXPECT_NE(said.find("padding"), std::string::npos) << said;
  EXPECT_FALSE(again.complete());
}

// However large the chunk size (1 GiB: at 20 bits that would be 429 million words a chunk), a
// packed chunk holds no more words than a receiver takes (kMaxChunkCount), and a width that does
// not fit in the words is refused where the stream is made.
TEST(PackedWire, ChunksNeverHoldMoreWordsThanAReceiverTakesWhateverTheChunkSize) {
  const std::size_t n = kMaxChunkCount + 1000;
  auto sent = std::make_shared<MaskedVector>(32, n);
  sent->set_wire_bits(20);
  const std::vector<TensorInfo> layout{{"masked", {n}, 0}};
  ChunkSource src(sent, sent->bytes(), sent->dtype(), layout, "fed", 3, std::size_t{1} << 30, 20);
  MaskedVector got(32, n);
  TensorReceiver rx;
  rx.reset_words(got.bytes(), layout, wire::U32, false, 20);
  int chunks = 0;
  while (auto e = src.next()) {
    ASSERT_EQ(error_text(rx.add(e->tensor_chunk())), "");
    ++chunks;
  }
  EXPECT_EQ(chunks, 2);
  EXPECT_TRUE(rx.complete());
  EXPECT_THROW(ChunkSource(sent, sent->bytes(), sent->dtype(), layout, "fed", 3, 256, 32), std::invalid_argument);
}

TEST(PackedWire, ASetupPacksOnlyInDistributedDpsBitsBelowAPowerOfTwoRing) {
  wire::SecAggSetup s;
  s.set_modulus_bits(32);
  EXPECT_TRUE(check_wire_bits(s));  // none
  s.set_wire_bits(20);
  EXPECT_NE(error_text(check_wire_bits(s)).find("only distributed DP"), std::string::npos);
  s.mutable_skellam()->set_bits(20);
  EXPECT_EQ(error_text(check_wire_bits(s)), "");
  s.set_wire_bits(16);  // a server that claims another width than the one decoded
  EXPECT_NE(error_text(check_wire_bits(s)).find("not the 20 bits"), std::string::npos);
  s.set_wire_bits(20);
  s.mutable_skellam()->set_count_scale(40);
  EXPECT_NE(error_text(check_wire_bits(s)).find("count word is read in the whole ring"), std::string::npos);
  s.mutable_skellam()->set_count_scale(0);
  s.set_protocol(wire::LIGHTSECAGG);
  EXPECT_NE(error_text(check_wire_bits(s)).find("prime field"), std::string::npos);
  s.set_protocol(wire::SECAGG);
  s.set_modulus_bits(16);
  s.set_wire_bits(20);
  EXPECT_FALSE(check_wire_bits(s));
  EXPECT_THROW(MaskedVector::field(4).set_wire_bits(20), std::invalid_argument);
}

TEST(PackedWire, MaskedWordsSummedAfterReductionAgreeWithTheSumOfWholeWordsModTwoToTheBits) {
  // Three silos' words with masks that cancel mod 2^32: reduced mod 2^20 each, summed (in 32-bit
  // words, as the server and edges add), the masks still cancel mod 2^20.
  const auto x = random_words<std::uint32_t>(300, 20, 1), y = random_words<std::uint32_t>(300, 20, 2);
  const auto m = random_words<std::uint32_t>(300, 32, 3), n = random_words<std::uint32_t>(300, 32, 4);
  MaskedVector a(32, 300), b(32, 300), c(32, 300), whole(32, 300), packed(32, 300);
  for (std::size_t i = 0; i < 300; ++i) {
    a.u32()[i] = x[i] + m[i];
    b.u32()[i] = y[i] - m[i] + n[i];
    c.u32()[i] = 5 - n[i];
  }
  whole.add(a);
  whole.add(b);
  whole.add(c);
  for (auto* v : {&a, &b, &c}) {
    v->set_wire_bits(20);
    v->reduce_to_wire();
    packed.add(*v);
  }
  for (std::size_t i = 0; i < 300; ++i) {
    ASSERT_EQ(packed.u32()[i] & 0xFFFFF, whole.u32()[i] & 0xFFFFF);
    ASSERT_EQ(packed.u32()[i] & 0xFFFFF, (x[i] + y[i] + 5) & 0xFFFFF);
  }
}

// One visit of a ring's words for every size: the words of the dtype in place, and bytes that
// are not whole aligned words refused rather than read as a shorter or misaligned span.
TEST(PackedWire, RingWordsAreVisitedInPlaceOnlyOverWholeAlignedWords) {
  std::vector<std::uint64_t> storage = {0x0102030405060708ull, 0x1112131415161718ull};
  const std::span<std::uint8_t> bytes(reinterpret_cast<std::uint8_t*>(storage.data()), 16);
  std::size_t words = 0;
  visit_ring_words(wire::U16, bytes, [&](auto w) {
    words = w.size();
    w[0] = static_cast<typename decltype(w)::value_type>(0xbeef);  // U16 here; every size compiles
  });
  EXPECT_EQ(words, 8u);
  EXPECT_EQ(storage[0] & 0xffff, 0xbeefu);
  visit_ring_words(wire::U64, std::span<const std::uint8_t>(bytes), [&](auto w) { words = w.size(); });
  EXPECT_EQ(words, 2u);
  EXPECT_THROW(visit_ring_words(wire::U32, bytes.first(10), [](auto) {}), std::invalid_argument);
  EXPECT_THROW(visit_ring_words(wire::U64, bytes.subspan(4, 8), [](auto) {}), std::invalid_argument);
  EXPECT_THROW(visit_ring_words(wire::F32, bytes, [](auto) {}), std::invalid_argument);
}

}  // namespace
}  // namespace xsilo::protocol
