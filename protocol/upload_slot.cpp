#include "protocol/upload_slot.h"

#include <cmath>

#include "protocol/tensor_stream.h"

namespace xsilo::protocol {

std::function<void()> check_work(std::shared_ptr<UploadCheck> check, const std::uint8_t* first,
                                 std::size_t count, wire::DType dtype, bool hash,
                                 std::shared_ptr<const void> keep, std::shared_ptr<UploadSink> sink,
                                 std::uint64_t at) {
  return [check = std::move(check), first, count, dtype, hash, keep = std::move(keep), sink = std::move(sink), at] {
    const std::size_t bytes = count * element_bytes(dtype);
    const std::span<const std::uint8_t> data(first, bytes);
    if (hash) check->hash.update(data);
    if (dtype == wire::F32) {  // masked words: any value is valid
      const float* v = reinterpret_cast<const float*>(first);
      bool finite = true;
      for (std::size_t i = 0; i < count; ++i) finite = finite && std::isfinite(v[i]);
      check->finite = check->finite && finite;
    }
    if (sink && check->sink_error.empty()) check->sink_error = sink->put(at, data);
  };
}

}  // namespace xsilo::protocol
