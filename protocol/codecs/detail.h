// What the codecs share (protocol/codec.h): the block layout of QUANTIZE and SIGN, the index +
// value chunks of the sparsifiers, and small arithmetic helpers. Internal to protocol/.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "protocol/codec.h"
#include "protocol/compression.h"

namespace xsilo::protocol::detail {

__extension__ using u128 = unsigned __int128;  // exact products of two 64-bit counts

// A 32-bit integer hash (good avalanche, vectorizes): the rounding noise of element i.
inline std::uint32_t mix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

inline std::uint64_t splitmix64(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline void put_u32(std::string& out, std::size_t at, std::uint32_t v) { std::memcpy(out.data() + at, &v, 4); }

// "1%", "12.5%": a fraction as a percentage, without trailing zeros.
inline std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g%%", fraction * 100);
  return buf;
}

// The largest |x| of a block, and whether every element is finite.
std::pair<float, bool> max_abs(const float* x, std::size_t n);

// The k strata of [0, d) in order: stratum j is [floor(j d / k), floor((j + 1) d / k)), walked
// without a division per stratum (j d / k = j q + floor(j r / k), with d = q k + r).
class Strata {
 public:
  Strata(std::uint64_t d, std::uint64_t k) : q_(d / k), r_(d % k), k_(k) {}
  // The next stratum's [begin, end).
  std::pair<std::uint64_t, std::uint64_t> next() {
    const std::uint64_t b = begin_;
    begin_ += q_;
    acc_ += r_;
    if (acc_ >= k_) acc_ -= k_, ++begin_;
    return {b, begin_};
  }

 private:
  std::uint64_t q_, r_, k_, acc_ = 0, begin_ = 0;
};

// A TensorChunk of tensor `t` for elements [off, off + n), encoded with `c`'s scheme, no data yet.
wire::TensorChunk chunk_of(const wire::Compression& c, const TensorInfo& t, std::size_t off, std::size_t n);

// QUANTIZE and SIGN: per block of `c.block()` elements one float32 scale, then the codes of
// every element. A codec says how many code bytes, how to encode one block and decode them all.
class BlockCodec : public Codec {
 public:
  std::size_t bytes(const wire::Compression& c, std::size_t count, std::size_t nonzeros) const final;
  std::string encode(const wire::Compression& c, std::span<const float> x, std::uint64_t seed,
                     std::span<float> decoded) const final;
  Status decode(const wire::Compression& c, std::string_view data, std::span<float> out, std::size_t& nonzeros,
                     const TensorInfo* tensor, std::uint64_t offset) const final;

 protected:
  static std::size_t blocks(const wire::Compression& c, std::size_t count) { return (count + c.block() - 1) / c.block(); }
  virtual std::size_t code_bytes(const wire::Compression& c, std::size_t count) const = 0;
  // Encodes x[0, n), the block starting at element `first` of the chunk, into `codes` (the
  // chunk's codes) and `dec`; returns the block's scale. `key` is the chunk's rounding key.
  virtual float encode_block(const wire::Compression& c, const float* x, std::size_t n, std::uint32_t key,
                             std::size_t first, std::uint8_t* codes, float* dec) const = 0;
  // The largest scale whose product with every code stays finite.
  virtual float largest_scale(const wire::Compression& c) const = 0;
  // Decodes every code (their scales checked already): success or why not.
  virtual Status decode_codes(const wire::Compression& c, const std::uint8_t* codes, const std::vector<float>& scales,
                              std::span<float> out) const = 0;
};

// TOP_K and RANDOM_K travel alike: uint32 m, m strictly increasing uint32 indices into the
// chunk, their m float32 values. A codec says only which coordinates it keeps.
class SparseCodec : public Codec {
 public:
  std::size_t bytes(const wire::Compression& c, std::size_t count, std::size_t nonzeros) const final;
  Status check(const wire::Compression& c) const final;
  void parameters(const wire::Compression& c, nlohmann::json& j) const final { j["fraction"] = c.fraction(); }
  std::vector<std::string> keys() const final { return {"fraction"}; }
  void configure(const ConfigNode& cn, wire::Compression& c) const final {
    c.set_fraction(cn.number("fraction", 0.01, 1e-9, 1.0));
  }
  std::string encode(const wire::Compression& c, std::span<const float> x, std::uint64_t seed,
                     std::span<float> decoded) const final;
  Status decode(const wire::Compression& c, std::string_view data, std::span<float> out, std::size_t& nonzeros,
                     const TensorInfo* tensor, std::uint64_t offset) const final;
  bool sparse() const final { return true; }
};

// A sparse chunk of the kept coordinates set[first, last) (global), the chunk starting at `at`.
std::string sparse_chunk(const std::vector<std::uint64_t>& set, const std::vector<float>& vals, std::size_t first,
                         std::size_t last, std::uint64_t at);
// The sorted coordinates `set` of the concatenation of `parts`, as coordinates of the whole vector.
std::vector<std::uint64_t> to_flat(std::vector<std::uint64_t> set, const Ranges& parts);
std::size_t length(const Ranges& parts);

// The codecs, one per file (codecs/*.cpp).
const Codec& none_codec();
const Codec& quantize_codec();
const Codec& sign_codec();
const Codec& top_k_codec();
const Codec& random_k_codec();
const Codec& powersgd_codec();

}  // namespace xsilo::protocol::detail
