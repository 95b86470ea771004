// The frame decoder: any byte stream, cut into pieces anywhere, from a peer that has passed TLS.
#include "fuzz/fuzz_input.h"
#include "proto/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
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
