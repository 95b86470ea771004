#include "proto/frame.h"

#include <algorithm>

#include <limits>

namespace xsilo::proto {

Result<std::string> encode_frame(const wire::Envelope& env, std::size_t max_frame_bytes) {
  const std::size_t size = env.ByteSizeLong();
  if (size == 0) return error(wire::BAD_FRAME, "refusing to send an empty envelope");
  if (size > max_frame_bytes || size > std::numeric_limits<std::uint32_t>::max()) {
    return error(wire::BAD_FRAME, "envelope of " + std::to_string(size) +
                                      " bytes exceeds the maximum frame size of " +
                                      std::to_string(max_frame_bytes) + " bytes");
  }
  std::string out(kFrameHeaderBytes + size, '\0');
  const auto n = static_cast<std::uint32_t>(size);
  out[0] = static_cast<char>(n >> 24);
  out[1] = static_cast<char>(n >> 16);
  out[2] = static_cast<char>(n >> 8);
  out[3] = static_cast<char>(n);
  if (!env.SerializeToArray(out.data() + kFrameHeaderBytes, static_cast<int>(size))) {
    return error(wire::INTERNAL, "protobuf serialization failed");
  }
  return out;
}

namespace {
void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
}  // namespace

std::size_t varint_size(std::uint64_t v) {
  std::size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

Result<SplitFrame> encode_chunk_frame(const wire::Envelope& env, std::span<const std::uint8_t> tail,
                                      std::size_t max_frame_bytes) {
  if (!env.has_tensor_chunk() || !env.tensor_chunk().data().empty()) {
    return error(wire::INTERNAL, "encode_chunk_frame needs a TensorChunk with empty data");
  }
  // Protobuf accepts fields in any order, so the chunk's data field (5) can go last and the
  // chunk message (Envelope field 21) after the envelope's other fields.
  wire::Envelope outer = env;
  outer.clear_tensor_chunk();
  const std::string chunk = env.tensor_chunk().SerializeAsString();
  const std::size_t data_field = tail.empty() ? 0 : 1 + varint_size(tail.size()) + tail.size();
  const std::size_t chunk_len = chunk.size() + data_field;
  const std::size_t payload = outer.ByteSizeLong() + 2 + varint_size(chunk_len) + chunk_len;
  if (payload > max_frame_bytes || payload > std::numeric_limits<std::uint32_t>::max()) {
    return error(wire::BAD_FRAME, "chunk frame of " + std::to_string(payload) +
                                      " bytes exceeds the maximum frame size of " +
                                      std::to_string(max_frame_bytes) + " bytes");
  }
  SplitFrame f;
  f.head.reserve(payload - tail.size() + kFrameHeaderBytes);
  const auto n = static_cast<std::uint32_t>(payload);
  f.head.push_back(static_cast<char>(n >> 24));
  f.head.push_back(static_cast<char>(n >> 16));
  f.head.push_back(static_cast<char>(n >> 8));
  f.head.push_back(static_cast<char>(n));
  f.head += outer.SerializeAsString();
  f.head.push_back(static_cast<char>(0xaa));  // field 21, length-delimited: varint 170
  f.head.push_back(static_cast<char>(0x01));
  put_varint(f.head, chunk_len);
  f.head += chunk;
  if (!tail.empty()) {
    f.head.push_back(static_cast<char>(0x2a));  // field 5, length-delimited
    put_varint(f.head, tail.size());
  }
  f.tail = tail;
  return f;
}

Result<std::size_t> decode_frame_length(std::span<const std::uint8_t, kFrameHeaderBytes> h,
                                        std::size_t max_frame_bytes) {
  const std::uint64_t n = (std::uint64_t{h[0]} << 24) | (std::uint64_t{h[1]} << 16) |
                          (std::uint64_t{h[2]} << 8) | std::uint64_t{h[3]};
  if (n == 0) return error(wire::BAD_FRAME, "zero-length frame");
  if (n > max_frame_bytes) {
    return error(wire::BAD_FRAME, "frame length " + std::to_string(n) +
                                      " exceeds the maximum of " + std::to_string(max_frame_bytes));
  }
  return static_cast<std::size_t>(n);
}

Result<wire::Envelope> decode_envelope(std::span<const std::uint8_t> payload) {
  wire::Envelope env;
  if (payload.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
      !env.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return error(wire::BAD_FRAME, "frame of " + std::to_string(payload.size()) +
                                      " bytes is not a valid Envelope");
  }
  if (env.body_case() == wire::Envelope::BODY_NOT_SET) {
    return error(wire::BAD_FRAME, "envelope carries no message");
  }
  return env;
}

Status FrameDecoder::feed(std::span<const std::uint8_t> bytes) {
  if (failed()) return error_;
  pending_.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::size_t pos = 0;
  while (pending_.size() - pos >= kFrameHeaderBytes) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(pending_.data() + pos);
    auto len = decode_frame_length(std::span<const std::uint8_t, kFrameHeaderBytes>(p, 4),
                                   max_frame_bytes_);
    if (!len) {
      error_ = len.error();
      break;
    }
    if (pending_.size() - pos - kFrameHeaderBytes < *len) break;
    auto env = decode_envelope({p + kFrameHeaderBytes, *len});
    if (!env) {
      error_ = env.error();
      break;
    }
    ready_.push_back(std::move(*env));
    pos += kFrameHeaderBytes + *len;
  }
  pending_.erase(0, pos);
  if (failed()) pending_.clear();
  return error_;
}

wire::Envelope FrameDecoder::pop() {
  wire::Envelope env = std::move(ready_.front());
  ready_.pop_front();
  return env;
}

std::string printable(std::string_view text, std::size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 3);
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    // The length of the UTF-8 sequence this byte starts, and the smallest value it may encode.
    std::size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    bool ok = len > 0 && i + len <= text.size();
    std::uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (std::size_t k = 1; ok && k < len; ++k) {
      const auto cc = static_cast<unsigned char>(text[i + k]);
      ok = (cc & 0xC0) == 0x80;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (!ok) len = 1;
    if (out.size() + len > max_bytes) {
      out += "...";
      break;
    }
    if (!ok || (len == 1 && (c < 0x20 || c == 0x7F))) {
      out += '?';
    } else {
      out.append(text.substr(i, len));
    }
    i += len;
  }
  return out;
}

std::string body_name(const wire::Envelope& env) {
  if (env.has_secure()) {
    const auto* step = wire::SecureAggregation::descriptor()->FindFieldByNumber(env.secure().step_case());
    return step ? step->name() : "secure";
  }
  const auto* field = wire::Envelope::descriptor()->FindFieldByNumber(env.body_case());
  return field ? field->name() : "empty";
}

}  // namespace xsilo::proto
