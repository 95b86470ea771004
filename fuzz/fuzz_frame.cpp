// The frame decoder: any byte stream, cut into pieces anywhere, from a peer that has passed TLS.
// And the input whole as one frame's payload, parsed both ways the server may parse it: the
// chunk read as a view of the frame (proto/message.h) must be the Envelope parsed whole, or be
// refused as it is.
#include "fuzz/fuzz_input.h"
#include "proto/frame.h"
#include "proto/message.h"

namespace {

void views_agree(std::span<const std::uint8_t> payload) {
  using namespace xsilo::proto;
  const auto whole = decode_envelope(payload);
  const auto msg = decode_message(payload, nullptr);
  if (whole.has_value() != msg.has_value()) __builtin_trap();
  if (!whole) {
    if (whole.error().code() != msg.error().code() || whole.error().message() != msg.error().message()) __builtin_trap();
    return;
  }
  if (msg->viewed) {
    // The view lies in the payload, and the Envelope holds no copy of it.
    if (!msg->env.tensor_chunk().data().empty()) __builtin_trap();
    if (!msg->view.empty() && (msg->view.data() < payload.data() ||
                               msg->view.data() + msg->view.size() > payload.data() + payload.size())) {
      __builtin_trap();
    }
  }
  const std::string& d = whole->tensor_chunk().data();
  const auto data = msg->chunk_data();
  if (data.size() != d.size() || (!d.empty() && std::memcmp(data.data(), d.data(), d.size()) != 0)) __builtin_trap();
  if (msg->owned().SerializeAsString() != whole->SerializeAsString()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 0) views_agree({data, size});
  xsilo::fuzz::Input in(data, size);
  const std::size_t max_frame = 64 + in.u16();  // small limits reach the oversize checks
  xsilo::proto::FrameDecoder d(max_frame);
  while (in.more()) {
    const std::string piece = in.bytes(1 + in.u8());
    const auto st = d.feed({reinterpret_cast<const std::uint8_t*>(piece.data()), piece.size()});
    while (d.has_envelope()) {
      const auto e = d.pop();
      (void)xsilo::proto::body_name(e);
    }
    if (!st.has_value() && !d.failed()) __builtin_trap();  // an error must leave the decoder failed
  }
  return 0;
}
