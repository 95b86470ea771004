#include <gtest/gtest.h>

#include <random>

#include "common/build_info.h"
#include "proto/frame.h"

namespace xsilo::proto {
namespace {

wire::Envelope sample() {
  wire::Envelope env;
  env.set_federation("fed");
  env.set_round(7);
  auto* c = env.mutable_tensor_chunk();
  c->set_name("layers.0.weight");
  c->set_dtype(wire::F32);
  c->add_shape(2);
  c->add_shape(3);
  c->set_offset(0);
  c->set_data(std::string(24, '\x01'));
  return env;
}

std::span<const std::uint8_t> bytes(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

// `xsilo --version` and every benchmark's head name the protocol this build speaks.
TEST(Frame, TheVersionLineNamesTheWireProtocolSpoken) {
  EXPECT_NE(build_info().find("wire protocol " + std::to_string(proto::kProtocolVersion) + ","), std::string::npos)
      << build_info();
}

TEST(Frame, RoundTripsAnEnvelope) {
  auto frame = encode_frame(sample(), kDefaultMaxFrameBytes);
  ASSERT_TRUE(frame.has_value());
  FrameDecoder dec;
  ASSERT_TRUE(dec.feed(bytes(*frame)).has_value());
  ASSERT_TRUE(dec.has_envelope());
  auto env = dec.pop();
  EXPECT_EQ(env.federation(), "fed");
  EXPECT_EQ(env.round(), 7u);
  EXPECT_EQ(env.tensor_chunk().data(), std::string(24, '\x01'));
  EXPECT_EQ(body_name(env), "tensor_chunk");
}

TEST(Frame, SplitChunkFramesAreByteIdenticalToOrdinaryFrames) {
  for (std::size_t n : {0u, 4u, 200u, 70000u}) {
    auto full = sample();
    full.mutable_tensor_chunk()->set_data(std::string(n, '\x5a'));
    auto head_only = full;
    head_only.mutable_tensor_chunk()->clear_data();
    const std::string data(n, '\x5a');
    auto split = encode_chunk_frame(
        head_only, {reinterpret_cast<const std::uint8_t*>(data.data()), data.size()}, kDefaultMaxFrameBytes);
    ASSERT_TRUE(split.has_value()) << split.error().message();
    EXPECT_EQ(split->head + data, *encode_frame(full, kDefaultMaxFrameBytes)) << n;
  }
  auto big = sample();
  big.mutable_tensor_chunk()->clear_data();
  const std::string data(2048, 'x');
  EXPECT_FALSE(encode_chunk_frame(big, {reinterpret_cast<const std::uint8_t*>(data.data()), data.size()}, 1024).has_value());
}

TEST(Frame, DecodesFramesSplitAtEveryByte) {
  auto a = encode_frame(sample(), kDefaultMaxFrameBytes);
  wire::Envelope hb;
  hb.mutable_heartbeat()->set_sent_unix_ms(5);
  auto b = encode_frame(hb, kDefaultMaxFrameBytes);
  const std::string stream = *a + *b;
  FrameDecoder dec;
  int got = 0;
  for (char c : stream) {
    ASSERT_TRUE(dec.feed(bytes(std::string(1, c))).has_value());
    while (dec.has_envelope()) {
      dec.pop();
      ++got;
    }
  }
  EXPECT_EQ(got, 2);
}

TEST(Frame, TruncatedFrameYieldsNothingUntilComplete) {
  auto frame = *encode_frame(sample(), kDefaultMaxFrameBytes);
  FrameDecoder dec;
  ASSERT_TRUE(dec.feed(bytes(frame.substr(0, frame.size() - 1))).has_value());
  EXPECT_FALSE(dec.has_envelope());
  EXPECT_FALSE(dec.failed());
}

TEST(Frame, RefusesA4GiBLengthPrefixBeforeAllocating) {
  const std::uint8_t h[4] = {0xff, 0xff, 0xff, 0xff};
  auto len = decode_frame_length(std::span<const std::uint8_t, 4>(h, 4), kDefaultMaxFrameBytes);
  ASSERT_FALSE(len.has_value());
  EXPECT_EQ(len.error().code(), wire::BAD_FRAME);
  EXPECT_NE(len.error().message().find("4294967295"), std::string::npos);
  FrameDecoder dec;
  auto st = dec.feed(std::span<const std::uint8_t>(h, 4));
  EXPECT_FALSE(st.has_value());
  EXPECT_TRUE(dec.failed());
}

TEST(Frame, RefusesZeroLengthFrames) {
  const std::uint8_t h[4] = {0, 0, 0, 0};
  auto len = decode_frame_length(std::span<const std::uint8_t, 4>(h, 4), kDefaultMaxFrameBytes);
  ASSERT_FALSE(len.has_value());
  EXPECT_NE(len.error().message().find("zero-length"), std::string::npos);
}

TEST(Frame, RefusesToEncodeAnEnvelopeOverTheLimit) {
  auto env = sample();
  env.mutable_tensor_chunk()->set_data(std::string(2048, 'x'));
  auto frame = encode_frame(env, 1024);
  ASSERT_FALSE(frame.has_value());
  EXPECT_EQ(frame.error().code(), wire::BAD_FRAME);
}

TEST(Frame, RefusesAnEnvelopeWithoutABody) {
  wire::Envelope env;
  env.set_federation("fed");
  auto payload = env.SerializeAsString();
  auto r = decode_envelope(bytes(payload));
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("no message"), std::string::npos);
}

TEST(Frame, RandomGarbageIsRefusedAndTheDecoderStaysFailed) {
  std::mt19937 rng(42);
  int refused = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::string junk(64, '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    junk[0] = 0;  // keep the length plausible so the payload parser sees the junk
    junk[1] = 0;
    junk[2] = 0;
    junk[3] = 60;
    FrameDecoder dec;
    auto st = dec.feed(bytes(junk));
    if (!st.has_value()) {
      ++refused;
      EXPECT_EQ(st.error().code(), wire::BAD_FRAME);
      EXPECT_FALSE(dec.feed(bytes(*encode_frame(sample(), kDefaultMaxFrameBytes))).has_value());
    }
  }
  // Protobuf accepts some random byte strings as valid (unknown fields); most are refused.
  EXPECT_GT(refused, 150);
}

}  // namespace
}  // namespace xsilo::proto
