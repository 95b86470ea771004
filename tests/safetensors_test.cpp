#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/safetensors.h"
#include "tests/testlib.h"

namespace xsilo {
namespace {

Model two_tensors() {
  Model m;
  m.add("layers.0.weight", {2, 3});
  m.add("layers.0.bias", {2});
  for (std::size_t i = 0; i < m.size(); ++i) m.flat()[i] = static_cast<float>(i) * 0.5f;
  return m;
}

TEST(Safetensors, RoundTripsTensorsInOrderWithMetadata) {
  test::TempDir dir;
  save_safetensors(dir / "m.safetensors", two_tensors(), {{"round", "3"}});
  Metadata meta;
  Model back = load_safetensors(dir / "m.safetensors", &meta);
  EXPECT_TRUE(back.same_layout(two_tensors()));
  EXPECT_EQ(back.tensors()[0].name, "layers.0.weight");
  EXPECT_EQ(meta.at("round"), "3");
  for (std::size_t i = 0; i < back.size(); ++i) EXPECT_EQ(back.flat()[i], two_tensors().flat()[i]);
}

TEST(Safetensors, HeaderIsTheDocumentedFormat) {
  const std::string bytes = encode_safetensors(two_tensors());
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["layers.0.bias"]["dtype"], "F32");
  EXPECT_EQ(header["layers.0.bias"]["data_offsets"][0], 24);
  EXPECT_EQ(header["layers.0.bias"]["data_offsets"][1], 32);
  EXPECT_EQ(bytes.size(), 8 + n + 32);
}

TEST(Safetensors, RefusesCorruptFiles) {
  std::string bytes = encode_safetensors(two_tensors());
  EXPECT_THROW(decode_safetensors(bytes.substr(0, bytes.size() - 4)), std::runtime_error);
  EXPECT_THROW(decode_safetensors("abc"), std::runtime_error);
  std::string huge = bytes;
  huge[7] = '\x7f';
  EXPECT_THROW(decode_safetensors(huge), std::runtime_error);
  // Bytes flipped inside the header: the error says where, and quotes none of them (it once put
  // a thousand raw bytes of the file into a one-line error).
  std::string flipped = bytes;
  for (std::size_t i = 12; i < 16; ++i) flipped[i] = '\xff';
  try {
    (void)decode_safetensors(flipped);
    ADD_FAILURE() << "a header with bytes 0xff was read";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("header is not valid JSON (at byte "), std::string::npos) << what;
    EXPECT_EQ(what.find('\xff'), std::string::npos) << what;
    EXPECT_LT(what.size(), 200u) << what;
  }
}

// A file of the given header JSON and data bytes.
std::string file_of(const std::string& header, const std::string& data) {
  std::string f(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(f.data(), &n, 8);
  return f + header + data;
}

TEST(Safetensors, HalfAndBfloat16TensorsBecomeFloat32) {
  // F16: 1.0 = 0x3c00, -2.5 = 0xc100, the smallest subnormal 2^-24 = 0x0001; BF16: 3.0 = 0x4040.
  std::string data("\x00\x3c\x00\xc1\x01\x00\x40\x40", 8);
  const auto m = decode_safetensors(file_of(
      R"({"h":{"dtype":"F16","shape":[3],"data_offsets":[0,6]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[6,8]}})",
      data));
  EXPECT_EQ(m.tensor("h")[0], 1.0f);
  EXPECT_EQ(m.tensor("h")[1], -2.5f);
  EXPECT_EQ(m.tensor("h")[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(m.tensor("b")[0], 3.0f);
}

// Every size a file states is checked before it is used: a hostile file names its problem.
TEST(Safetensors, MalformedFilesAreRefusedNamingTheProblem) {
  auto error = [](const std::string& bytes) {
    try {
      decode_safetensors(bytes);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error("abc").find("shorter than its header"), std::string::npos);
  std::string huge(8, '\xff');
  EXPECT_NE(error(huge).find("does not fit the file"), std::string::npos);
  // A shape whose product overflows 64 bits.
  EXPECT_NE(error(file_of(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})",
                          std::string(4, '\0')))
                .find("overflows"),
            std::string::npos);
  EXPECT_NE(error(file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", std::string(4, '\0'))).find("t has"),
            std::string::npos);
  EXPECT_NE(error(file_of(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,400]}})", std::string(4, '\0')))
                .find("do not hold"),
            std::string::npos);
  EXPECT_NE(error(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                          std::string(8, '\0')))
                .find("overlap or leave a gap"),
            std::string::npos);
  EXPECT_NE(error(file_of(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(8, '\0'))).find("after the last"),
            std::string::npos);
  EXPECT_NE(error(file_of(R"({"t":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'))).find("unknown dtype"),
            std::string::npos);
  EXPECT_NE(error(file_of(R"({"t":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'))).find("only floating-point"),
            std::string::npos);
  // A zero-size tensor may share its offset with the next one.
  EXPECT_EQ(error(file_of(R"({"z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                          std::string(4, '\0'))),
            "");
}

}  // namespace
}  // namespace xsilo
