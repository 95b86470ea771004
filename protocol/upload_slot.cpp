#include "protocol/upload_slot.h"

#include <cmath>
#include <vector>

#include "protocol/tensor_stream.h"

namespace xsilo::protocol {

std::function<void()> check_work(std::shared_ptr<UploadCheck> check, const std::uint8_t* first,
                                 std::size_t count, wire::DType dtype, bool hash,
                                 std::shared_ptr<const void> keep, std::shared_ptr<UploadSink> sink,
                                 std::uint64_t at, std::string put_error) {
  return [check = std::move(check), first, count, dtype, hash, keep = std::move(keep), sink = std::move(sink), at,
          put_error = std::move(put_error)] {
    const std::size_t bytes = count * element_bytes(dtype);
    const std::uint8_t* data = first;
    if (sink) {
      if (!check->sink_error.empty()) return;  // the upload is refused already
      check->sink_error = put_error;
      if (!put_error.empty()) return;
      thread_local std::vector<std::uint8_t> copy;  // one chunk, reused
      copy.resize(bytes);
      check->sink_error = sink->get(at, copy);
      if (!check->sink_error.empty()) return;
      data = copy.data();
    }
    if (hash) check->hash.update(std::span<const std::uint8_t>(data, bytes));
    if (dtype != wire::F32) return;  // masked words: any value is valid
    const float* v = reinterpret_cast<const float*>(data);  // the buffer's, or the copy's (aligned)
    bool finite = true;
    for (std::size_t i = 0; i < count; ++i) finite = finite && std::isfinite(v[i]);
    check->finite = check->finite && finite;
  };
}

}  // namespace xsilo::protocol
