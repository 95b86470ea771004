// Models and updates travel as TensorChunks of at most one chunk size each, tensor by tensor
// in model order. The sender produces them lazily (one chunk in memory per connection); the
// receiver checks every chunk against the expected layout and copies it into place.
// No I/O here: both sides are plain objects that the network code drives.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/model.h"
#include "crypto/hash.h"
#include "proto/status.h"

namespace xsilo::transport {

// Yields the chunks of `values` (laid out as `layout`) one by one, then nullopt.
class ChunkSource {
 public:
  ChunkSource(std::shared_ptr<const void> keep_alive, std::span<const float> values,
              std::vector<TensorInfo> layout, std::string federation, std::uint64_t round,
              std::size_t chunk_bytes);
  std::optional<wire::Envelope> next();

 private:
  std::shared_ptr<const void> keep_alive_;
  std::span<const float> values_;
  std::vector<TensorInfo> layout_;
  std::string federation_;
  std::uint64_t round_;
  std::size_t chunk_elems_;
  std::size_t tensor_ = 0, offset_ = 0;
};

class TensorReceiver {
 public:
  // Expect `layout`, writing into `into` (which must hold every element of the layout).
  void reset(std::span<float> into, std::vector<TensorInfo> layout);
  // Checks name, dtype, offset (chunks arrive in order), size and bounds, then copies.
  proto::Status add(const wire::TensorChunk& chunk);
  bool complete() const { return tensor_ >= layout_.size(); }
  std::size_t received() const { return received_; }
  std::uint64_t bytes() const { return bytes_; }
  // SHA-256 (hex) of every chunk's data in order; call once, when complete.
  std::string finish_sha256();

 private:
  void skip_empty();
  std::span<float> into_;
  std::vector<TensorInfo> layout_;
  std::size_t tensor_ = 0, offset_ = 0, received_ = 0;
  std::uint64_t bytes_ = 0;
  std::unique_ptr<crypto::Sha256> hash_;
};

}  // namespace xsilo::transport
