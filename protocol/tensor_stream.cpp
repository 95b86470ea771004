#include "protocol/tensor_stream.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "common/finite.h"
#include "protocol/compression.h"
#include "protocol/masked.h"
#include "protocol/packed.h"

namespace xsilo::protocol {

std::size_t element_bytes(wire::DType dtype) { return dtype == wire::F32 ? sizeof(float) : ring_word_bytes(dtype); }

namespace {
std::size_t elem_size(wire::DType t) {
  const std::size_t n = element_bytes(t);
  if (n == 0) throw std::invalid_argument("tensor elements of dtype " + wire::DType_Name(t) + " are not sent");
  return n;
}
// A packed wire (0: none) of `dtype`'s elements: ring words only, by packed.h's width rule.
void check_packed(std::uint32_t packed_bits, wire::DType dtype) {
  if (packed_bits == 0) return;
  if (dtype == wire::F32) throw std::invalid_argument("float32 elements are not packed");
  check_packed_width(packed_bits, elem_size(dtype));
}
}  // namespace

ChunkSource::ChunkSource(std::shared_ptr<const void> keep_alive, std::span<const float> values,
                         std::vector<TensorInfo> layout, std::string federation,
                         std::uint64_t round, std::size_t chunk_bytes)
    : ChunkSource(std::move(keep_alive),
                  {reinterpret_cast<const std::uint8_t*>(values.data()), values.size() * sizeof(float)},
                  wire::F32, std::move(layout), std::move(federation), round, chunk_bytes) {}

ChunkSource::ChunkSource(std::shared_ptr<const void> keep_alive, std::span<const std::uint8_t> bytes,
                         wire::DType dtype, std::vector<TensorInfo> layout, std::string federation,
                         std::uint64_t round, std::size_t chunk_bytes, std::uint32_t packed_bits)
    : keep_alive_(std::move(keep_alive)), base_(bytes.data()), elem_(elem_size(dtype)), dtype_(dtype),
      layout_(std::move(layout)), federation_(std::move(federation)), round_(round),
      // A packed chunk holds 8 / bits words a byte: no more than a receiver takes (kMaxChunkCount),
      // whatever chunk_bytes is (the compressed chunks are bounded so too).
      chunk_elems_(packed_bits ? std::clamp<std::size_t>(chunk_bytes * 8 / packed_bits, 1, kMaxChunkCount)
                               : std::max<std::size_t>(1, chunk_bytes / elem_size(dtype))),
      packed_bits_(packed_bits) {
  check_packed(packed_bits_, dtype_);
}

ChunkSource::ChunkSource(std::shared_ptr<const std::vector<wire::TensorChunk>> encoded, std::string federation,
                         std::uint64_t round)
    : base_(nullptr), federation_(std::move(federation)), round_(round), chunk_elems_(1), encoded_(std::move(encoded)) {}

ChunkSource::ChunkSource(Fill fill, std::vector<TensorInfo> layout, std::string federation, std::uint64_t round,
                         std::size_t chunk_bytes)
    : base_(nullptr), layout_(std::move(layout)), federation_(std::move(federation)), round_(round),
      chunk_elems_(std::max<std::size_t>(1, chunk_bytes / sizeof(float))), fill_(std::move(fill)) {}

std::optional<std::pair<wire::Envelope, std::span<const std::uint8_t>>> ChunkSource::advance() {
  if (encoded_) {
    if (next_encoded_ >= encoded_->size()) return std::nullopt;
    const auto& src = (*encoded_)[next_encoded_++];
    wire::Envelope env;
    env.set_federation(federation_);
    env.set_round(round_);
    auto* c = env.mutable_tensor_chunk();
    *c = src;
    c->clear_data();
    return std::make_pair(std::move(env), std::span<const std::uint8_t>(
                                              reinterpret_cast<const std::uint8_t*>(src.data().data()), src.data().size()));
  }
  while (tensor_ < layout_.size() && layout_[tensor_].size() == 0) ++tensor_;
  if (tensor_ >= layout_.size()) return std::nullopt;
  const auto& t = layout_[tensor_];
  const std::size_t n = std::min(chunk_elems_, t.size() - offset_);
  wire::Envelope env;
  env.set_federation(federation_);
  env.set_round(round_);
  auto* c = env.mutable_tensor_chunk();
  c->set_name(t.name);
  c->set_dtype(dtype_);
  for (auto d : t.shape) c->add_shape(d);
  c->set_offset(offset_);
  std::span<const std::uint8_t> data;
  if (fill_) {
    made_.resize(n);
    fill_(t.offset + offset_, made_);
    data = {reinterpret_cast<const std::uint8_t*>(made_.data()), n * sizeof(float)};
  } else {
    data = {base_ + (t.offset + offset_) * elem_, n * elem_};
  }
  if (packed_bits_ != 0) {
    packed_.resize(packed_bytes(n, packed_bits_));
    visit_ring_words(dtype_, data, [&](auto words) { pack_words(words, packed_bits_, packed_); });
    data = packed_;
    c->set_dtype(wire::PACKED);
    c->set_count(n);
  }
  offset_ += n;
  if (offset_ == t.size()) {
    ++tensor_;
    offset_ = 0;
  }
  return std::make_pair(std::move(env), data);
}

std::optional<wire::Envelope> ChunkSource::next() {
  auto a = advance();
  if (!a) return std::nullopt;
  a->first.mutable_tensor_chunk()->set_data(reinterpret_cast<const char*>(a->second.data()),
                                             a->second.size());
  return std::move(a->first);
}

std::optional<proto::SplitFrame> ChunkSource::next_frame(std::size_t max_frame_bytes) {
  auto a = advance();
  if (!a) return std::nullopt;
  auto f = proto::encode_chunk_frame(a->first, a->second, max_frame_bytes);
  if (!f) throw std::runtime_error(f.error().message());
  return std::move(*f);
}

void TensorReceiver::reset(std::span<float> into, std::vector<TensorInfo> layout, bool hash,
                           const wire::Compression& scheme) {
  reset_words({reinterpret_cast<std::uint8_t*>(into.data()), into.size() * sizeof(float)}, std::move(layout),
              wire::F32, hash);
  scheme_ = scheme;
  dense_ = dense_tensors(scheme_, layout_);
  budget_ = kept_count(scheme_, compressible(layout_, dense_));
}

void TensorReceiver::reset_model(std::span<float> into, std::vector<TensorInfo> layout,
                                 const wire::Compression& broadcast, bool have_base, bool hash) {
  reset(into, std::move(layout), hash, broadcast);
  model_ = true;
  have_base_ = have_base;
}

void TensorReceiver::reset_words(std::span<std::uint8_t> into, std::vector<TensorInfo> layout,
                                 wire::DType dtype, bool hash, std::uint32_t packed_bits) {
  base_ = into.data();
  dtype_ = dtype;
  elem_ = elem_size(dtype);
  check_packed(packed_bits, dtype);
  packed_bits_ = packed_bits;
  layout_ = std::move(layout);
  scheme_.Clear();
  dense_.assign(layout_.size(), false);
  model_ = have_base_ = false;
  tensor_ = offset_ = received_ = last_first_ = last_count_ = kept_ = budget_ = 0;
  bytes_ = 0;
  last_finite_.reset();
  hash_ = hash ? std::make_unique<crypto::Sha256>() : nullptr;
  skip_empty();
}

void TensorReceiver::skip_empty() {
  while (tensor_ < layout_.size() && layout_[tensor_].size() == 0) ++tensor_;
}

namespace {
std::string_view as_chars(std::span<const std::uint8_t> b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }
}  // namespace

proto::Status TensorReceiver::add(const wire::TensorChunk& c, std::span<const std::uint8_t> data) {
  auto bad = [](std::string why) { return proto::error(wire::BAD_UPDATE, std::move(why)); };
  if (complete()) return bad("more chunks than the model has elements");
  const auto& t = layout_[tensor_];
  if (c.name() != t.name) return bad("expected a chunk of " + t.name + ", got " + c.name());
  if (packed_bits_ != 0) {
    if (c.dtype() != wire::PACKED || c.encoding() != wire::Compression::NONE) {
      return bad("tensor " + t.name + " must be PACKED words of " + std::to_string(packed_bits_) +
                 " bits (the secure setup's wire_bits), got " + wire::DType_Name(c.dtype()));
    }
    if (c.offset() != offset_) {
      return bad("chunk of " + t.name + " at offset " + std::to_string(c.offset()) + ", expected " +
                 std::to_string(offset_));
    }
    return add_packed(c, data, t);
  }
  if (c.dtype() != dtype_) return bad("tensor " + t.name + " must be " + wire::DType_Name(dtype_));
  if (c.offset() != offset_) {
    return bad("chunk of " + t.name + " at offset " + std::to_string(c.offset()) + ", expected " +
               std::to_string(offset_));
  }
  const bool dense = dense_[tensor_];
  if (model_ && c.encoding() != wire::Compression::NONE) return add_delta(c, data, t);
  if (!model_ && c.encoding() != (dense ? wire::Compression::NONE : scheme_.scheme())) {
    return bad("chunk of " + t.name + " is " + (c.encoding() == wire::Compression::NONE ? "not compressed" : "compressed") +
               " but the round's scheme is " + describe(scheme_) +
               (dense ? " and this tensor travels dense" : ""));
  }
  if (compressed(scheme_) && !dense && !model_) return add_encoded(c, data, t);
  if (data.empty() || data.size() % elem_ != 0) {
    return bad("chunk of " + t.name + " has " + std::to_string(data.size()) +
               " bytes, not a positive multiple of " + std::to_string(elem_));
  }
  const std::size_t n = data.size() / elem_;
  if (offset_ + n > t.size()) {
    return bad("chunk of " + t.name + " runs past its " + std::to_string(t.size()) + " elements");
  }
  std::uint8_t* out = base_ + (t.offset + offset_) * elem_;
  std::optional<bool> finite;
  if (dtype_ == wire::F32) {
    // Floats are copied and scanned in one pass: an upload's check need not read them again.
    finite = copy_all_finite(reinterpret_cast<float*>(out), data.data(), n);
  } else {
    std::memcpy(out, data.data(), data.size());
  }
  if (hash_) hash_->update(data);
  advance(n, data.size());
  last_finite_ = finite;
  return proto::Status();
}

Status TensorReceiver::check_count(std::uint64_t n, const TensorInfo& t) const {
  if (n != 0 && n <= t.size() - offset_ && n <= kMaxChunkCount) return {};
  return Error("count " + std::to_string(n) + " is not within its " + std::to_string(t.size() - offset_) +
               " remaining elements (and at most " + std::to_string(kMaxChunkCount) + " a chunk)");
}

proto::Status TensorReceiver::add_encoded(const wire::TensorChunk& c, std::span<const std::uint8_t> data,
                                        const TensorInfo& t) {
  auto bad = [&](std::string why) { return proto::error(wire::BAD_UPDATE, "chunk of " + t.name + ": " + std::move(why)); };
  const std::uint64_t n = c.count();
  if (auto fits = check_count(n, t); !fits) return bad(fits.error().message());
  std::span<float> out(reinterpret_cast<float*>(base_) + t.offset + offset_, n);
  std::size_t kept = 0;
  if (auto decoded = decode_chunk(scheme_, as_chars(data), out, kept, &t, offset_); !decoded) {
    return bad(decoded.error().message());
  }
  kept_ += kept;
  if (kept_ > budget_) {
    return bad("keeps " + std::to_string(kept_) + " elements so far, more than the " + std::to_string(budget_) +
               " of " + describe(scheme_));
  }
  if (hash_) hash_->update(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(out.data()), n * 4));
  advance(n, data.size());
  return proto::Status();
}

// A broadcast's delta chunk: checked and decoded aside, then added to the base in place.
proto::Status TensorReceiver::add_delta(const wire::TensorChunk& c, std::span<const std::uint8_t> data,
                                        const TensorInfo& t) {
  auto bad = [&](std::string why) { return proto::error(wire::BAD_UPDATE, "model chunk of " + t.name + ": " + std::move(why)); };
  if (c.encoding() != scheme_.scheme() || !compressed(scheme_)) {
    return bad("encoded as " + wire::Compression::Scheme_Name(c.encoding()) + ", but the broadcast is " +
               describe(scheme_) + " (or float32)");
  }
  if (dense_[tensor_]) return bad("is a delta, but this tensor travels as float32 values under " + describe(scheme_));
  if (!have_base_) {
    return bad("is a delta against the round's base model, which this receiver does not hold (the sender "
               "should have sent the whole model)");
  }
  const std::uint64_t n = c.count();
  if (auto fits = check_count(n, t); !fits) return bad(fits.error().message());
  delta_.resize(n);
  std::size_t kept = 0;
  if (auto decoded = decode_chunk(scheme_, as_chars(data), delta_, kept, &t, offset_); !decoded) {
    return bad(decoded.error().message());
  }
  float* out = reinterpret_cast<float*>(base_) + t.offset + offset_;
  for (std::size_t i = 0; i < n; ++i) out[i] = out[i] + delta_[i];  // as encode_model_delta made it
  if (hash_) hash_->update(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(out), n * 4));
  advance(n, data.size());
  return proto::Status();
}

// Packed masked words: the count within the tensor, then exactly its packed bytes, unpacked into
// place. A wrong count or length is refused before anything is written; non-zero padding is
// found while unpacking, after the chunk's words are written (harmless: a refused upload is
// never folded, and its buffer is written whole again before the next one is).
proto::Status TensorReceiver::add_packed(const wire::TensorChunk& c, std::span<const std::uint8_t> in,
                                        const TensorInfo& t) {
  auto bad = [&](std::string why) { return proto::error(wire::BAD_UPDATE, "chunk of " + t.name + ": " + std::move(why)); };
  const std::uint64_t n = c.count();
  if (auto fits = check_count(n, t); !fits) return bad(fits.error().message());
  if (in.size() != packed_bytes(n, packed_bits_)) {
    return bad(std::to_string(in.size()) + " bytes for " + std::to_string(n) + " words packed " +
               std::to_string(packed_bits_) + " bits each, not " + std::to_string(packed_bytes(n, packed_bits_)));
  }
  std::span<std::uint8_t> out(base_ + (t.offset + offset_) * elem_, n * elem_);
  Status st;
  visit_ring_words(dtype_, out, [&](auto words) { st = unpack_words(in, packed_bits_, words); });
  if (!st) return bad(st.error().message());
  if (hash_) hash_->update(out);
  advance(n, in.size());
  return proto::Status();
}

void TensorReceiver::advance(std::size_t n, std::size_t bytes) {
  last_first_ = layout_[tensor_].offset + offset_;
  last_finite_.reset();
  last_count_ = n;
  offset_ += n;
  received_ += n;
  bytes_ += bytes;
  if (offset_ == layout_[tensor_].size()) {
    ++tensor_;
    offset_ = 0;
    skip_empty();
  }
}

std::string TensorReceiver::finish_sha256() {
  return hash_ ? crypto::to_hex(hash_->finish()) : std::string();
}

}  // namespace xsilo::protocol
