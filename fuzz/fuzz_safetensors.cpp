// The safetensors reader: model files from users and trainers, checkpoints from disk.
#include <stdexcept>

#include "common/safetensors.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto view = xsilo::parse_safetensors({data, size});
    for (const auto& t : view.tensors) {
      if (!t.is_float()) continue;
      std::vector<float> out(t.elements);  // the reader checked the bytes hold them all
      xsilo::to_float32(t, out);
    }
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
  try {
    (void)xsilo::decode_safetensors(std::span<const std::uint8_t>(data, size));
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
