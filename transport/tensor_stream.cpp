#include "transport/tensor_stream.h"

#include <algorithm>
#include <cstring>

namespace xsilo::transport {

ChunkSource::ChunkSource(std::shared_ptr<const void> keep_alive, std::span<const float> values,
                         std::vector<TensorInfo> layout, std::string federation,
                         std::uint64_t round, std::size_t chunk_bytes)
    : keep_alive_(std::move(keep_alive)), values_(values), layout_(std::move(layout)),
      federation_(std::move(federation)), round_(round),
      chunk_elems_(std::max<std::size_t>(1, chunk_bytes / sizeof(float))) {}

std::optional<wire::Envelope> ChunkSource::next() {
  while (tensor_ < layout_.size() && layout_[tensor_].size() == 0) ++tensor_;
  if (tensor_ >= layout_.size()) return std::nullopt;
  const auto& t = layout_[tensor_];
  const std::size_t n = std::min(chunk_elems_, t.size() - offset_);
  wire::Envelope env;
  env.set_federation(federation_);
  env.set_round(round_);
  auto* c = env.mutable_tensor_chunk();
  c->set_name(t.name);
  c->set_dtype(wire::F32);
  for (auto d : t.shape) c->add_shape(d);
  c->set_offset(offset_);
  c->set_data(reinterpret_cast<const char*>(values_.data() + t.offset + offset_), n * sizeof(float));
  offset_ += n;
  if (offset_ == t.size()) {
    ++tensor_;
    offset_ = 0;
  }
  return env;
}

void TensorReceiver::reset(std::span<float> into, std::vector<TensorInfo> layout) {
  into_ = into;
  layout_ = std::move(layout);
  tensor_ = offset_ = received_ = 0;
  bytes_ = 0;
  hash_ = std::make_unique<crypto::Sha256>();
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
  if (c.dtype() != wire::F32) return bad("tensor " + t.name + " must be F32");
  if (c.offset() != offset_) {
    return bad("chunk of " + t.name + " at offset " + std::to_string(c.offset()) + ", expected " +
               std::to_string(offset_));
  }
  if (c.data().empty() || c.data().size() % sizeof(float) != 0) {
    return bad("chunk of " + t.name + " has " + std::to_string(c.data().size()) +
               " bytes, not a positive multiple of 4");
  }
  const std::size_t n = c.data().size() / sizeof(float);
  if (offset_ + n > t.size()) {
    return bad("chunk of " + t.name + " runs past its " + std::to_string(t.size()) + " elements");
  }
  std::memcpy(into_.data() + t.offset + offset_, c.data().data(), c.data().size());
  hash_->update(c.data());
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

std::string TensorReceiver::finish_sha256() { return crypto::to_hex(hash_->finish()); }

}  // namespace xsilo::transport
