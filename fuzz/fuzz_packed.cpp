// Packed masked words (protocol/packed.h) as the server's or an edge's TensorReceiver takes
// them: a ring's words (8, 16, 32 or 64 bits) received from PACKED chunks of any width, count,
// offset and bytes. A chunk is refused, or every word it wrote is below 2^bits and packing those
// words again gives its bytes (one encoding per list of words).
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "protocol/masked.h"
#include "protocol/packed.h"
#include "protocol/tensor_stream.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace xsilo;
  fuzz::Input in(data, size);
  const wire::DType dtypes[] = {wire::U8, wire::U16, wire::U32, wire::U64};
  const wire::DType dtype = dtypes[in.u8() % 4];
  const std::size_t word_bytes = protocol::ring_word_bytes(dtype);
  const std::uint32_t bits = 1 + in.u8() % (8 * word_bytes - 1);
  const std::size_t n = 1 + in.u16() % 2000;
  std::vector<std::uint64_t> storage(n);  // aligned for every word size
  const std::span<std::uint8_t> into(reinterpret_cast<std::uint8_t*>(storage.data()), n * word_bytes);
  protocol::TensorReceiver rx;
  rx.reset_words(into, {{"masked", {n}, 0}}, dtype, /*hash=*/true, bits);
  while (in.more() && !rx.complete()) {
    wire::TensorChunk ch;
    const std::uint8_t how = in.u8();
    ch.set_name(how & 1 ? "other" : "masked");
    ch.set_dtype(how & 2 ? dtype : wire::PACKED);
    ch.set_encoding(how & 4 ? wire::Compression::QUANTIZE : wire::Compression::NONE);
    ch.set_offset(how & 16 ? in.u16() : rx.received());
    ch.set_count(in.u16() % 2100);
    // Mostly the length the count packs to, so that the words themselves are exercised.
    ch.set_data(in.bytes(how & 8 ? in.u16() % 8192 : protocol::packed_bytes(ch.count(), bits)));
    if (!rx.add(ch)) break;
    const auto got = into.subspan(rx.last_first() * word_bytes, rx.last_count() * word_bytes);
    std::vector<std::uint8_t> again(protocol::packed_bytes(rx.last_count(), bits));
    protocol::visit_ring_words(dtype, std::span<const std::uint8_t>(got), [&](auto words) {
      for (const auto w : words) {
        if (bits < 64 && static_cast<std::uint64_t>(w) >> bits != 0) {
          throw std::logic_error("an unpacked word is not below 2^bits");
        }
      }
      protocol::pack_words(words, bits, again);
    });
    if (std::string(again.begin(), again.end()) != ch.data()) {
      throw std::logic_error("an accepted packed chunk is not what packing its words gives");
    }
  }
  return 0;
}
