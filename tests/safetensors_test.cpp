#include <gtest/gtest.h>

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
}

}  // namespace
}  // namespace xsilo
