// A message as the server (and an edge, from its silos) reads it off a connection: an Envelope
// and, for a TensorChunk, the chunk's data where it lies. decode_message parses a TensorChunk's frame without copying the
// data out of it: protobuf parses every other field, and the data stays a view of the frame
// (the payload decrypted into the connection's read buffer), which the message holds. So an
// upload's bytes go from the frame into their lane in one copy (TensorReceiver::add), not two.
//
// Only the one layout encode_chunk_frame writes and protobuf reads as a chunk takes the view:
// one Envelope field 21 (TensorChunk), holding one data field (5), both their tags and lengths in
// their shortest form, and no other body field. Any other frame (another message, a chunk laid
// out otherwise, anything malformed) is parsed by decode_envelope as it always was, so that the
// two agree on every input: the same message, or the same refusal (fuzz/fuzz_frame.cpp holds
// them to it).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "proto/frame.h"

namespace xsilo::proto {

struct Message {
  Message() = default;
  // Move-only: a copy kept in a job or an action would pin the connection's whole read buffer
  // and make every later read on it allocate a fresh one.
  Message(Message&&) = default;
  Message& operator=(Message&&) = default;
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;

  wire::Envelope env;
  // Set for a TensorChunk read as a view: its data lies in `view` (env's own data field is
  // empty), in the frame that `keep` holds.
  bool viewed = false;
  std::span<const std::uint8_t> view;
  std::shared_ptr<const void> keep;

  // The data of env's TensorChunk, wherever it lies.
  std::span<const std::uint8_t> chunk_data() const;
  // The Envelope with its chunk's data in it (a copy of the view, when viewed).
  wire::Envelope owned() const;
};

// Parses a payload whose length decode_frame_length accepted, as decode_envelope does, leaving
// a TensorChunk's data in `payload`: `keep` must hold `payload`'s bytes for as long as the
// message is used.
Result<Message> decode_message(std::span<const std::uint8_t> payload, std::shared_ptr<const void> keep);

// `env` framed and read back as a daemon reads it (the message holds its own frame): how the
// tests and fuzz targets hand a core what a connection would. An error when no frame of
// `max_frame_bytes` can carry it.
Result<Message> as_read(const wire::Envelope& env, std::size_t max_frame_bytes = kDefaultMaxFrameBytes);

}  // namespace xsilo::proto
