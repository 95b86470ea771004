#include "protocol/tensor_stream.h"

#include <algorithm>
#include <cstring>

namespace xsilo::protocol {

namespace {
std::size_t elem_size(wire::DType t) { return t == wire::U64 ? 8 : 4; }
}  // namespace

ChunkSource::ChunkSource(std::shared_ptr<const void> keep_alive, std::span<const float> values,
                         std::vector<TensorInfo> layout, std::string federation,
                         std::uint64_t round, std::size_t chunk_bytes)
    : ChunkSource(std::move(keep_alive),
                  {reinterpret_cast<const std::uint8_t*>(values.data()), values.size() * sizeof(float)},
                  wire::F32, std::move(layout), std::move(federation), round, chunk_bytes) {}

ChunkSource::ChunkSource(std::shared_ptr<const void> keep_alive, std::span<const std::uint8_t> bytes,
                         wire::DType dtype, std::vector<TensorInfo> layout, std::string federation,
                         std::uint64_t round, std::size_t chunk_bytes)
    : keep_alive_(std::move(keep_alive)), base_(bytes.data()), elem_(elem_size(dtype)), dtype_(dtype),
      layout_(std::move(layout)), federation_(std::move(federation)), round_(round),
      chunk_elems_(std::max<std::size_t>(1, chunk_bytes / elem_size(dtype))) {}

std::optional<std::pair<wire::Envelope, std::span<const std::uint8_t>>> ChunkSource::advance() {
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
  std::span<const std::uint8_t> data(base_ + (t.offset + offset_) * elem_, n * elem_);
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
  if (!f) throw std::runtime_error(f.status().message);
  return std::move(*f);
}

void TensorReceiver::reset(std::span<float> into, std::vector<TensorInfo> layout, bool hash) {
  reset_words({reinterpret_cast<std::uint8_t*>(into.data()), into.size() * sizeof(float)}, std::move(layout),
              wire::F32, hash);
}

void TensorReceiver::reset_words(std::span<std::uint8_t> into, std::vector<TensorInfo> layout,
                                 wire::DType dtype, bool hash) {
  base_ = into.data();
  dtype_ = dtype;
  elem_ = elem_size(dtype);
  layout_ = std::move(layout);
  tensor_ = offset_ = received_ = last_first_ = last_count_ = 0;
  bytes_ = 0;
  hash_ = hash ? std::make_unique<crypto::Sha256>() : nullptr;
  skip_empty();
}

void TensorReceiver::skip_empty() {
  while (tensor_ < layout_.size() && layout_[tensor_].size() == 0) ++tensor_;
}

proto::Status TensorReceiver::add(const wire::TensorChunk& c) {
  auto bad = [](std::string why) { return proto::error(wire::BAD_UPDATE, std::move(why)); };
  if (complete()) return bad("more chunks than the model has elements");
  const auto& t = layout_[tensor_];
  if (c.name() != t.name) return bad("expected a chunk of " + t.name + ", got " + c.name());
  if (c.dtype() != dtype_) return bad("tensor " + t.name + " must be " + wire::DType_Name(dtype_));
  if (c.offset() != offset_) {
    return bad("chunk of " + t.name + " at offset " + std::to_string(c.offset()) + ", expected " +
               std::to_string(offset_));
  }
  if (c.data().empty() || c.data().size() % elem_ != 0) {
    return bad("chunk of " + t.name + " has " + std::to_string(c.data().size()) +
               " bytes, not a positive multiple of " + std::to_string(elem_));
  }
  const std::size_t n = c.data().size() / elem_;
  if (offset_ + n > t.size()) {
    return bad("chunk of " + t.name + " runs past its " + std::to_string(t.size()) + " elements");
  }
  std::memcpy(base_ + (t.offset + offset_) * elem_, c.data().data(), c.data().size());
  if (hash_) hash_->update(c.data());
  last_first_ = t.offset + offset_;
  last_count_ = n;
  offset_ += n;
  received_ += n;
  bytes_ += c.data().size();
  if (offset_ == t.size()) {
    ++tensor_;
    offset_ = 0;
    skip_empty();
  }
  return proto::Status::ok();
}

std::string TensorReceiver::finish_sha256() {
  return hash_ ? crypto::to_hex(hash_->finish()) : std::string();
}

}  // namespace xsilo::protocol
