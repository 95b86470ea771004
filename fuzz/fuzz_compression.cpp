// Compressed uploads as a receiver takes them (protocol/compression.h): a round's scheme, then
// chunks of any encoding, count and bytes into a small model, as the server's or the edge's
// TensorReceiver decodes them. A chunk either decodes within its tensor or is refused; what
// QUANTIZE and SIGN decode must be finite (their scales are checked). Raw float32 values (a
// dense chunk or tensor, sparse values, PowerSGD's dense tensors) pass as sent, as in an uncompressed
// upload: the upload's own check refuses a value that is not finite (protocol/upload_slot).
// A broadcast receiver (reset_model) takes float32 values or, only with its base held, deltas
// added to the base (zeros here): what it adds must be finite too.
#include <cmath>
#include <stdexcept>

#include "fuzz/fuzz_input.h"
#include "protocol/compression.h"
#include "protocol/tensor_stream.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using xsilo::wire::Compression;
  xsilo::fuzz::Input in(data, size);
  Compression c;
  c.set_scheme(static_cast<Compression::Scheme>(in.u8() % 5));
  c.set_bits(in.u8() % 2 ? 8 : 4);
  c.set_block(8 + in.u16() % 300);
  c.set_fraction((1 + in.u8()) / 256.0);
  const std::uint8_t flags = in.u8();
  if (flags & 1) c.add_dense("b");  // "b" travels dense: float32 chunks of encoding NONE
  // A model broadcast (RoundStart.broadcast): values, or quantized deltas added to the base a
  // receiver holds (and refused when it holds none).
  const bool broadcast = flags & 2, have_base = flags & 4;
  if (broadcast) c.set_scheme(Compression::QUANTIZE);
  xsilo::Model m;
  m.add("w", {1 + in.u16() % 700u});
  m.add("b", {in.u8() % 40u});
  std::vector<float> into(m.size(), 0.0f);
  xsilo::protocol::TensorReceiver rx;
  if (broadcast) {
    rx.reset_model(into, m.tensors(), c, have_base, true);
  } else {
    rx.reset(into, m.tensors(), true, c);
  }
  while (in.more() && !rx.complete()) {
    xsilo::wire::TensorChunk ch;
    const std::uint8_t how = in.u8();
    ch.set_name(how & 1 ? "b" : "w");
    ch.set_dtype(xsilo::wire::F32);
    ch.set_encoding(static_cast<Compression::Scheme>(how & 2 ? c.scheme() : (how >> 2) % 5));
    ch.set_offset(how & 16 ? in.u16() : rx.received());
    ch.set_count(in.u16() % 900);
    ch.set_data(in.bytes(in.u16() % 8192));
    if (!rx.add(ch)) break;
    if (broadcast && !have_base && ch.encoding() != Compression::NONE) {
      throw std::logic_error("a delta was added to a base the receiver does not hold");
    }
    if (ch.encoding() != Compression::QUANTIZE && ch.encoding() != Compression::SIGN) continue;
    for (std::size_t i = rx.last_first(); i < rx.last_first() + rx.last_count(); ++i) {
      if (!std::isfinite(into[i])) throw std::logic_error("a decoded element is not finite");
    }
  }
  return 0;
}
