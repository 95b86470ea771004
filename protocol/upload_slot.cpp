#include "protocol/upload_slot.h"

#include <vector>

#include "common/finite.h"
#include "protocol/tensor_stream.h"

namespace xsilo::protocol {

UploadVerdict verify_upload(UploadCheck& check, const std::string& declared, const std::string& what) {
  UploadVerdict v;
  v.sha256 = crypto::to_hex(check.hash.finish());
  if (!check.finite) {
    v.problem = UploadVerdict::Problem::NonFinite;
    v.why = what + " contains NaN or infinite values";
  } else if (declared.empty()) {
    v.problem = UploadVerdict::Problem::HashMismatch;
    v.why = what + " declares no SHA-256 (UpdateEnd.update_sha256 is required)";
  } else if (declared != v.sha256) {
    v.problem = UploadVerdict::Problem::HashMismatch;
    v.why = what + " does not match its SHA-256 (sent " + proto::printable(declared, 80) + ", received " + v.sha256 + ")";
  }
  return v;
}

namespace {

// Hashes `count` elements at `data` into the check, and for F32 checks that they are finite
// (or records `finite`, when the receiver found it out while copying them).
void check_elements(UploadCheck& check, const std::uint8_t* data, std::size_t count, wire::DType dtype, bool hash,
                    std::optional<bool> finite) {
  if (hash) check.hash.update(std::span<const std::uint8_t>(data, count * element_bytes(dtype)));
  if (dtype != wire::F32) return;  // masked words: any value is valid
  if (!finite) {
    const float* v = reinterpret_cast<const float*>(data);  // the buffer's, or a copy's (aligned)
    finite = all_finite({v, count});
  }
  check.finite = check.finite && *finite;
}

}  // namespace

std::function<void()> check_work(std::shared_ptr<UploadCheck> check, const std::uint8_t* first, std::size_t count,
                                 wire::DType dtype, bool hash, std::shared_ptr<const void> keep,
                                 std::optional<bool> finite) {
  return [check = std::move(check), first, count, dtype, hash, keep = std::move(keep), finite] {
    check_elements(*check, first, count, dtype, hash, finite);
  };
}

std::function<void()> staged_check_work(std::shared_ptr<UploadCheck> check, std::shared_ptr<UploadSink> sink,
                                        std::uint64_t at, std::size_t count, wire::DType dtype, bool hash, Status put,
                                        std::optional<bool> finite) {
  return [check = std::move(check), sink = std::move(sink), at, count, dtype, hash, put = std::move(put), finite] {
    if (!check->sink_status) return;  // the upload is refused already
    check->sink_status = put;
    if (!put) return;
    thread_local std::vector<std::uint8_t> copy;  // one chunk, reused
    copy.resize(count * element_bytes(dtype));
    check->sink_status = sink->get(at, copy);
    if (!check->sink_status) return;
    check_elements(*check, copy.data(), count, dtype, hash, finite);
  };
}

}  // namespace xsilo::protocol
