#include "proto/message.h"

#include <limits>
#include <optional>
#include <string>

namespace xsilo::proto {

namespace {

using Bytes = std::span<const std::uint8_t>;

// One field of a serialized message: its number and wire type, where it starts (its tag), where
// a length-delimited field's value starts, and where it ends.
struct Field {
  std::uint64_t number = 0;
  unsigned wire = 0;
  std::size_t begin = 0, value = 0, end = 0;
  bool shortest = false;  // its tag (and length) in their shortest encoding
};

// Reads the varint at `at` (`len` of its bytes); false when it runs past the input or ten bytes.
bool varint(Bytes b, std::size_t& at, std::uint64_t& v, std::size_t& len) {
  v = 0;
  const std::size_t start = at;
  for (unsigned shift = 0; shift < 70; shift += 7) {
    if (at == b.size()) return false;
    const std::uint8_t byte = b[at++];
    if (shift < 64) v |= std::uint64_t{byte & 0x7fu} << shift;
    if (!(byte & 0x80)) {
      len = at - start;
      return true;
    }
  }
  return false;
}

// Steps over the field at `at`. False for anything but a well-formed field of wire type 0, 1,
// 2 or 5 (a group, a field numbered 0, a truncated one): such input is left to protobuf whole.
bool next_field(Bytes b, std::size_t& at, Field& f) {
  f.begin = at;
  std::uint64_t tag = 0, n = 0;
  std::size_t tag_len = 0, len_len = 0;
  if (!varint(b, at, tag, tag_len) || tag > 0xffffffffu || (tag >> 3) == 0) return false;
  f.number = tag >> 3;
  f.wire = static_cast<unsigned>(tag & 7);
  f.shortest = tag_len == varint_size(tag);
  switch (f.wire) {
    case 0:
      if (!varint(b, at, n, len_len)) return false;
      break;
    case 1:
      if (b.size() - at < 8) return false;
      at += 8;
      break;
    case 2:
      if (!varint(b, at, n, len_len) || n > b.size() - at) return false;
      // The shortest forms are what keeps the two parsers equal, not a matter of taste:
      // protobuf reads a tag or a length of at most 5 bytes and refuses a padded one of 6 or
      // more, which is still a valid varint here. Taking padded forms would accept frames that
      // decode_envelope refuses (Frame.ChunksLaidOutOtherwise... has both).
      f.shortest = f.shortest && len_len == varint_size(n);
      f.value = at;
      at += static_cast<std::size_t>(n);
      break;
    case 5:
      if (b.size() - at < 4) return false;
      at += 4;
      break;
    default:
      return false;
  }
  f.end = at;
  return true;
}

// The one field numbered `number` in `b` (length-delimited, tag and length in their shortest
// form), with every other field's bytes, in order, appended to `rest`. Nothing when a field is
// not well formed or `number` is not there exactly once in that form.
std::optional<Field> split_out(Bytes b, std::uint64_t number, std::string& rest) {
  std::optional<Field> found;
  std::size_t at = 0, from = 0;
  while (at < b.size()) {
    Field f;
    if (!next_field(b, at, f)) return std::nullopt;
    if (f.number != number) continue;
    if (found || f.wire != 2 || !f.shortest) return std::nullopt;
    found = f;
    rest.append(reinterpret_cast<const char*>(b.data() + from), f.begin - from);
    from = f.end;
  }
  if (found) rest.append(reinterpret_cast<const char*>(b.data() + from), b.size() - from);
  return found;
}

// A chunk's frame as a view, or nothing when the payload is not laid out as message.h says (it
// is then parsed whole). Parsing the fields around the two taken out equals parsing the whole:
// a message is the concatenation of its fields, and neither field taken out affects the others.
std::optional<Message> chunk_view(Bytes payload) {
  if (payload.size() > static_cast<std::size_t>(std::numeric_limits<int>::max())) return std::nullopt;
  std::string outer, inner;
  const auto chunk = split_out(payload, wire::Envelope::kTensorChunkFieldNumber, outer);
  if (!chunk) return std::nullopt;
  const Bytes chunk_bytes = payload.subspan(chunk->value, chunk->end - chunk->value);
  const auto data = split_out(chunk_bytes, wire::TensorChunk::kDataFieldNumber, inner);
  if (!data) return std::nullopt;
  Message m;
  // Another body beside the chunk: protobuf keeps whichever came last; leave that to it.
  if (!m.env.ParseFromString(outer) || m.env.body_case() != wire::Envelope::BODY_NOT_SET) return std::nullopt;
  if (!m.env.mutable_tensor_chunk()->ParseFromString(inner)) return std::nullopt;
  m.viewed = true;
  m.view = chunk_bytes.subspan(data->value, data->end - data->value);
  return m;
}

}  // namespace

std::span<const std::uint8_t> Message::chunk_data() const {
  return viewed ? view : bytes_of(env.tensor_chunk().data());
}

wire::Envelope Message::owned() const {
  wire::Envelope e = env;
  if (viewed) e.mutable_tensor_chunk()->set_data(reinterpret_cast<const char*>(view.data()), view.size());
  return e;
}

Result<Message> decode_message(std::span<const std::uint8_t> payload, std::shared_ptr<const void> keep) {
  if (auto m = chunk_view(payload)) {
    m->keep = std::move(keep);
    return std::move(*m);
  }
  auto env = decode_envelope(payload);
  if (!env) return env.error();
  Message m;
  m.env = std::move(*env);
  return m;
}

Result<Message> as_read(const wire::Envelope& env, std::size_t max_frame_bytes) {
  auto frame = encode_frame(env, max_frame_bytes);
  if (!frame) return frame.error();
  const auto held = std::make_shared<const std::string>(std::move(*frame));
  return decode_message(bytes_of(*held).subspan(kFrameHeaderBytes), held);
}

}  // namespace xsilo::proto
