// The frame codec: a 4-byte big-endian length followed by one serialized Envelope.
// The length is checked against the maximum frame size before anything is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>

#include "proto/status.h"
#include "proto/xsilo.pb.h"

namespace xsilo::proto {

// 2: secure aggregation against active adversaries; 3: its steps inside one SecureAggregation;
// 4: distributed DP's masked words packed in their bits (SecAggSetup.wire_bits, PACKED chunks);
// 5: SecAgg's session bound to its setup's digest, as LightSecAgg's is (protocol/secagg_wire.cpp).
inline constexpr std::uint32_t kProtocolVersion = 5;
inline constexpr std::size_t kFrameHeaderBytes = 4;
inline constexpr std::size_t kDefaultMaxFrameBytes = 4u << 20;

// Serializes `env` as one frame (header + payload). Fails when the payload would exceed
// `max_frame_bytes` or is empty.
Result<std::string> encode_frame(const wire::Envelope& env, std::size_t max_frame_bytes);

// A frame in two pieces: `head` (length prefix and every byte of the Envelope up to the
// payload) and `tail` (the payload bytes themselves, written from where they lie).
struct SplitFrame {
  std::string head;
  std::span<const std::uint8_t> tail;
  std::size_t size() const { return head.size() + tail.size(); }
};

// Frames a TensorChunk whose `data` is `tail` without copying it: `env` carries the chunk with
// an empty data field. The bytes are exactly those of encode_frame on the full envelope.
Result<SplitFrame> encode_chunk_frame(const wire::Envelope& env, std::span<const std::uint8_t> tail,
                                      std::size_t max_frame_bytes);

// The bytes protobuf's shortest encoding of `v` as a varint takes (1 to 10).
std::size_t varint_size(std::uint64_t v);

// A string's bytes (a protobuf `bytes` field's, say) as the span the decoders take.
inline std::span<const std::uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

// Reads the length prefix; refuses zero and anything above `max_frame_bytes`.
Result<std::size_t> decode_frame_length(std::span<const std::uint8_t, kFrameHeaderBytes> header,
                                        std::size_t max_frame_bytes);

// Parses a payload whose length was accepted by decode_frame_length.
Result<wire::Envelope> decode_envelope(std::span<const std::uint8_t> payload);

// Incremental decoder for byte streams that arrive in arbitrary pieces. After the first
// error it stays failed: a stream that lost framing cannot be resynchronised.
class FrameDecoder {
 public:
  explicit FrameDecoder(std::size_t max_frame_bytes = kDefaultMaxFrameBytes)
      : max_frame_bytes_(max_frame_bytes) {}

  // Appends bytes; returns the first error met, or ok.
  Status feed(std::span<const std::uint8_t> bytes);
  bool has_envelope() const { return !ready_.empty(); }
  wire::Envelope pop();
  bool failed() const { return !error_.has_value(); }

 private:
  std::size_t max_frame_bytes_;
  std::string pending_;
  std::deque<wire::Envelope> ready_;
  Status error_;
};

// A peer's free text (an error message, a reason) made safe to log and to put in JSON records:
// bytes that are not valid UTF-8 and control characters become '?', and at most `max_bytes`
// are kept (then "..."). Protobuf does not guarantee that a string field holds UTF-8.
std::string printable(std::string_view text, std::size_t max_bytes = 512);

// Names the Envelope's body for logs ("round_start", "tensor_chunk", ...); a secure-aggregation
// step by its own name ("secagg_keys"), "secure" when it holds none.
std::string body_name(const wire::Envelope& env);

}  // namespace xsilo::proto
