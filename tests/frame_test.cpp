#include <gtest/gtest.h>

#include <random>

#include "common/build_info.h"
#include "proto/frame.h"
#include "proto/message.h"

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

// ---- upload chunks read as views of their frame (proto/message.h) ----

namespace xsilo::proto {
namespace {

std::string varint(std::uint64_t v) {
  std::string out;
  for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>((v & 0x7f) | 0x80));
  out.push_back(static_cast<char>(v));
  return out;
}
// A length-delimited field, its tag and length in their shortest form.
std::string field(std::uint32_t number, const std::string& value) {
  return varint(std::uint64_t{number} << 3 | 2) + varint(value.size()) + value;
}
// Both parsers on one payload: the same message (the view's data copied in) or the same refusal.
Result<Message> both(const std::string& payload) {
  auto whole = decode_envelope(bytes(payload));
  auto msg = decode_message(bytes(payload), nullptr);
  EXPECT_EQ(whole.has_value(), msg.has_value());
  if (whole && msg) {
    EXPECT_EQ(msg->owned().SerializeAsString(), whole->SerializeAsString());
  } else if (!whole && !msg) {
    EXPECT_EQ(msg.error().message(), whole.error().message());
    EXPECT_EQ(msg.error().code(), whole.error().code());
  }
  return msg;
}

TEST(Frame, AnUploadChunkReadAsAViewOfItsFrameEqualsTheEnvelopeParsedWhole) {
  for (std::size_t n : {4u, 200u, 70000u}) {
    auto env = sample();
    env.set_silo("silo-3");
    std::string data(n, '\0');
    for (std::size_t k = 0; k < n; ++k) data[k] = static_cast<char>(k * 7);
    env.mutable_tensor_chunk()->set_data(data);
    env.mutable_tensor_chunk()->set_encoding(wire::Compression::TOP_K);
    env.mutable_tensor_chunk()->set_count(n / 4);  // after the data field: the view is not at the end
    const auto frame = std::make_shared<const std::string>(*encode_frame(env, kDefaultMaxFrameBytes));
    const auto payload = bytes(*frame).subspan(kFrameHeaderBytes);
    auto msg = decode_message(payload, frame);
    ASSERT_TRUE(msg) << msg.error().message();
    EXPECT_TRUE(msg->viewed);
    EXPECT_TRUE(msg->env.tensor_chunk().data().empty());  // no copy of the data in the Envelope
    EXPECT_GE(msg->view.data(), payload.data());          // the data where it lies in the frame
    EXPECT_LE(msg->view.data() + msg->view.size(), payload.data() + payload.size());
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(msg->chunk_data().data()), msg->chunk_data().size()), data);
    EXPECT_EQ(msg->keep, frame);
    EXPECT_EQ(msg->env.silo(), "silo-3");
    EXPECT_EQ(msg->env.tensor_chunk().count(), n / 4);
    EXPECT_EQ(msg->owned().SerializeAsString(), env.SerializeAsString());
    EXPECT_TRUE(both(std::string(reinterpret_cast<const char*>(payload.data()), payload.size())));
  }
  // Every other message is the Envelope parsed whole.
  wire::Envelope hb;
  hb.set_federation("fed");
  hb.mutable_heartbeat()->set_sent_unix_ms(5);
  auto msg = both(hb.SerializeAsString());
  ASSERT_TRUE(msg);
  EXPECT_FALSE(msg->viewed);
  EXPECT_TRUE(msg->env.has_heartbeat());
}

// A chunk laid out other than as one data field in one chunk field, in their shortest form, and
// nothing else in the body, is parsed whole: protobuf's rules (the last data field wins, chunk
// fields merge, the last body wins) decide, as they always did.
TEST(Frame, ChunksLaidOutOtherwiseAreParsedWholeWithProtobufsRules) {
  auto meta = sample();
  meta.mutable_tensor_chunk()->clear_data();
  const std::string head = "\x0a\x03"
                           "fed";  // federation
  const std::string chunk = meta.tensor_chunk().SerializeAsString();
  struct Case {
    std::string what, payload, data;
    wire::Envelope::BodyCase body = wire::Envelope::kTensorChunk;
  };
  const std::vector<Case> cases = {
      {"two data fields", head + field(21, chunk + field(5, "aaaa") + field(5, "bbbbbbbb")), "bbbbbbbb"},
      {"a data length not in its shortest form", head + field(21, chunk + std::string("\x2a\x84\x00", 3) + "cccc"), "cccc"},
      {"a chunk field twice", head + field(21, chunk + field(5, "dddd")) + field(21, field(5, "eeee")), "eeee"},
      {"no data field", head + field(21, chunk), ""},
      {"a body after the chunk", head + field(21, chunk + field(5, "ffff")) + field(13, ""), "",
       wire::Envelope::kHeartbeat},
      {"a body before the chunk", head + field(13, "") + field(21, chunk + field(5, "gggg")), "gggg"},
  };
  for (const auto& c : cases) {
    auto msg = both(c.payload);
    ASSERT_TRUE(msg) << c.what << ": " << msg.error().message();
    EXPECT_EQ(msg->env.body_case(), c.body) << c.what;
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(msg->chunk_data().data()), msg->chunk_data().size()), c.data)
        << c.what;
    EXPECT_FALSE(msg->viewed) << c.what;
  }
}

TEST(Frame, ATruncatedOrOverlongUploadChunkIsRefusedAsTheWholeParseRefusesIt) {
  const std::string payload = *encode_frame(sample(), kDefaultMaxFrameBytes);
  const std::string whole = payload.substr(kFrameHeaderBytes);
  for (std::size_t cut : {whole.size() - 1, whole.size() - 10, std::size_t{9}}) {
    auto msg = both(whole.substr(0, cut));
    ASSERT_FALSE(msg) << cut;
    EXPECT_EQ(msg.error().code(), wire::BAD_FRAME);
    EXPECT_EQ(msg.error().message(), "frame of " + std::to_string(cut) + " bytes is not a valid Envelope");
  }
  // A data field claiming more bytes than its chunk holds, and a chunk claiming more than the frame.
  auto meta = sample();
  meta.mutable_tensor_chunk()->clear_data();
  const std::string chunk = meta.tensor_chunk().SerializeAsString();
  for (const std::string& bad : {field(21, chunk + "\x2a\x10" + "abcd"),
                                 "\xaa\x01\x7f" + chunk + field(5, "abcd"),
                                 field(21, chunk + field(5, "abcd")) + "\x80"}) {
    auto msg = both(bad);
    ASSERT_FALSE(msg);
    EXPECT_EQ(msg.error().code(), wire::BAD_FRAME);
  }
  // A tag or a length padded to 6 bytes: a valid varint, which protobuf refuses (it reads at most
  // 5 bytes of either). The fast path must refuse them too; it takes only shortest forms, and
  // without that rule these two would be accepted as views.
  const std::string data_field = field(5, "abcd");
  ASSERT_LT(chunk.size() + data_field.size(), 128u);  // one byte of length when not padded
  for (const std::string& padded :
       {std::string("\xaa\x81\x80\x80\x80\x00", 6) + static_cast<char>(chunk.size() + data_field.size()) + chunk + data_field,
        std::string("\xaa\x01", 2) + static_cast<char>(0x80 | ((chunk.size() + data_field.size()) & 0x7f)) +
            std::string("\x80\x80\x80\x80\x00", 5) + chunk + data_field}) {
    auto msg = both(padded);
    EXPECT_FALSE(msg) << "a padded tag or length was accepted";
  }
  // A chunk whose name is not UTF-8: proto3 strings are checked, the view's as the whole's.
  auto latin = sample();
  latin.mutable_tensor_chunk()->set_name("caf\xe9");
  EXPECT_FALSE(both(latin.SerializeAsString()));
}

}  // namespace
}  // namespace xsilo::proto
