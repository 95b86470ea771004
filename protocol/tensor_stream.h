// Models and updates travel as TensorChunks of at most one chunk size each, tensor by tensor
// in model order. The sender produces them lazily (one chunk in memory per connection); the
// receiver checks every chunk against the expected layout and copies it into place.
// No I/O here: both sides are plain objects that the network code drives.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/model.h"
#include "crypto/hash.h"
#include "proto/frame.h"
#include "proto/status.h"
#include "proto/xsilo.pb.h"

namespace xsilo::protocol {

// The bytes of one element on the wire: 4 for F32, a ring word's 1, 2, 4 or 8 for U8, U16,
// U32, U64 (masked inputs); 0 for anything else.
std::size_t element_bytes(wire::DType dtype);

// Yields the chunks of `values` (laid out as `layout`) one by one, then nullopt.
class ChunkSource {
 public:
  ChunkSource(std::shared_ptr<const void> keep_alive, std::span<const float> values,
              std::vector<TensorInfo> layout, std::string federation, std::uint64_t round,
              std::size_t chunk_bytes);
  // Chunks encoded already (a compressed upload: protocol/compression.h), sent as they are.
  ChunkSource(std::shared_ptr<const std::vector<wire::TensorChunk>> encoded, std::string federation,
              std::uint64_t round);
  // Ring words (masked inputs): `bytes` holds layout-many elements of element_bytes(dtype) each.
  // With `packed_bits` (the setup's wire_bits) each chunk carries its words' low packed_bits
  // bits, packed (dtype PACKED, count = its words: protocol/packed.h).
  ChunkSource(std::shared_ptr<const void> keep_alive, std::span<const std::uint8_t> bytes,
              wire::DType dtype, std::vector<TensorInfo> layout, std::string federation,
              std::uint64_t round, std::size_t chunk_bytes, std::uint32_t packed_bits = 0);
  // Float elements made as they are sent: `fill(first, out)` writes elements [first, first +
  // out.size()) of the flat model. One chunk is in memory at a time (the next call of next()
  // or next_frame() overwrites the last one's data).
  using Fill = std::function<void(std::size_t first, std::span<float> out)>;
  ChunkSource(Fill fill, std::vector<TensorInfo> layout, std::string federation, std::uint64_t round,
              std::size_t chunk_bytes);
  // The next chunk as an envelope (a copy of the data: for tests and in-process use).
  std::optional<wire::Envelope> next();
  // The next chunk as a frame whose payload is read in place from the model.
  std::optional<proto::SplitFrame> next_frame(std::size_t max_frame_bytes);

 private:
  std::shared_ptr<const void> keep_alive_;
  const std::uint8_t* base_;
  std::size_t elem_ = sizeof(float);
  wire::DType dtype_ = wire::F32;
  std::vector<TensorInfo> layout_;
  std::string federation_;
  std::uint64_t round_;
  std::size_t chunk_elems_;
  std::size_t tensor_ = 0, offset_ = 0;
  std::shared_ptr<const std::vector<wire::TensorChunk>> encoded_;
  std::size_t next_encoded_ = 0;
  Fill fill_;
  std::vector<float> made_;  // the chunk `fill_` made last
  std::uint32_t packed_bits_ = 0;
  std::vector<std::uint8_t> packed_;  // the chunk packed last
  // The envelope of the next chunk with an empty data field, and where its data lies.
  std::optional<std::pair<wire::Envelope, std::span<const std::uint8_t>>> advance();
};

class TensorReceiver {
 public:
  // Expect `layout`, writing into `into` (which must hold every element of the layout). With
  // `hash` false the caller hashes the written regions itself (off the network thread). With a
  // `scheme`, every chunk must be encoded with it and is decoded into place (the bytes counted
  // are the encoded ones; a sparse scheme's kept elements, all chunks together, at most its k),
  // but for the scheme's dense tensors (dense_tensors()), which come as float32, encoding NONE.
  void reset(std::span<float> into, std::vector<TensorInfo> layout, bool hash = true,
             const wire::Compression& scheme = {});
  // A model broadcast (RoundStart.broadcast set): `into` holds the model of the round's
  // base_sha256 when `have_base`. Each chunk is either float32 values (encoding NONE), which
  // replace those in place, or, for a tensor that is not one of the broadcast's dense tensors and
  // only with the base held, a delta encoded with `broadcast`, added in place. With `hash` the
  // values in place after each chunk are hashed (finish_sha256: the model's SHA-256).
  void reset_model(std::span<float> into, std::vector<TensorInfo> layout, const wire::Compression& broadcast,
                   bool have_base, bool hash = true);
  // The same for vectors of ring words (masked inputs: U8, U16, U32 or U64); `layout` counts
  // words, and a chunk whose bytes are not whole words of the ring is refused before any copy.
  // With `packed_bits` (the signed setup's wire_bits) chunks must be PACKED words of that many
  // bits, exactly packed_bytes(count, packed_bits) bytes, unpacked into place (each word below
  // 2^packed_bits); the hash is of the words in place, as the sender hashed them.
  void reset_words(std::span<std::uint8_t> into, std::vector<TensorInfo> layout, wire::DType dtype,
                   bool hash = true, std::uint32_t packed_bits = 0);
  // Checks name, dtype, offset (chunks arrive in order), size and bounds, then copies.
  proto::Status add(const wire::TensorChunk& chunk) { return add(chunk, proto::bytes_of(chunk.data())); }
  // The same for a chunk whose data lies elsewhere (a view of the frame it came in:
  // proto::Message): `chunk`'s own data field is not read.
  proto::Status add(const wire::TensorChunk& chunk, std::span<const std::uint8_t> data);
  // The elements the last successful add() wrote: [first, first + count) of `into` (in elements).
  std::size_t last_first() const { return last_first_; }
  std::size_t last_count() const { return last_count_; }
  // Whether the elements the last successful add() wrote are all finite, when it found out
  // while copying them (float32 values sent as they are); nullopt when it did not look (encoded
  // or delta chunks, ring words).
  std::optional<bool> last_finite() const { return last_finite_; }
  bool complete() const { return tensor_ >= layout_.size(); }
  std::size_t received() const { return received_; }
  std::uint64_t bytes() const { return bytes_; }
  // SHA-256 (hex) of every chunk's data in order; call once, when complete.
  std::string finish_sha256();

 private:
  void skip_empty();
  proto::Status add_encoded(const wire::TensorChunk& chunk, std::span<const std::uint8_t> data, const TensorInfo& t);
  proto::Status add_delta(const wire::TensorChunk& chunk, std::span<const std::uint8_t> data, const TensorInfo& t);
  proto::Status add_packed(const wire::TensorChunk& chunk, std::span<const std::uint8_t> data, const TensorInfo& t);
  // Success when an encoded chunk of `n` elements fits what is left of tensor `t`, else why not.
  Status check_count(std::uint64_t n, const TensorInfo& t) const;
  void advance(std::size_t n, std::size_t bytes);  // n elements (bytes on the wire) are in place
  std::uint8_t* base_ = nullptr;
  std::size_t elem_ = sizeof(float);
  wire::DType dtype_ = wire::F32;
  std::uint32_t packed_bits_ = 0;  // reset_words(): the packed wire's bits a word, 0 for none
  std::vector<TensorInfo> layout_;
  std::size_t tensor_ = 0, offset_ = 0, received_ = 0, last_first_ = 0, last_count_ = 0;
  std::uint64_t bytes_ = 0;
  std::optional<bool> last_finite_;
  std::unique_ptr<crypto::Sha256> hash_;
  wire::Compression scheme_;
  std::size_t kept_ = 0, budget_ = 0;  // sparse schemes: elements kept so far, and at most
  std::vector<bool> dense_;             // per tensor of layout_: it comes as float32 under scheme_
  bool model_ = false, have_base_ = false;  // reset_model(): a broadcast, and whether deltas apply
  std::vector<float> delta_;                // a decoded delta chunk, before it is added
};

}  // namespace xsilo::protocol
