// An upload staged in a temporary file instead of a buffer in memory, for models too big to
// hold a third copy of (the global model and the running sum are the other two).
//
// The slot decodes each chunk into a window (common/window.h): an address range as large as
// the model that is reserved, not backed (anonymous, MAP_NORESERVE). put(), right after, writes
// the chunk to the file with pwrite and gives the window's pages back (MADV_DONTNEED), so only
// the chunk being decoded is ever resident; the chunk's check work (hash, finiteness) reads it
// back with get(), so a check that lags the network holds page cache, not the server's memory.
// Once the whole upload has passed its checks, add_to() reads the file back in pieces into the
// sum. An upload refused or abandoned halfway has touched the file only: the sum is as it was.
//
// The file is unlinked as soon as it is created: it holds no state that outlives the process
// (an upload in flight is never durable), and a crash leaves nothing behind. Its pages live
// in the page cache, not in the server's RSS.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "common/window.h"
#include "protocol/upload_slot.h"

namespace xsilo::server {

class StagedUpload final : public protocol::UploadSink {
 public:
  // A window and a file of `bytes` bytes in the folder `dir` (created if missing). Throws
  // std::runtime_error, naming the folder, when either cannot be had.
  StagedUpload(const std::filesystem::path& dir, std::uint64_t bytes);
  ~StagedUpload() override;
  StagedUpload(const StagedUpload&) = delete;
  StagedUpload& operator=(const StagedUpload&) = delete;

  // Where the slot decodes chunks (every byte of it is put() before it is read back).
  std::span<std::uint8_t> window() { return window_.bytes(); }
  // Network thread: the bytes at `at` go to the file; their window pages are released.
  Status put(std::uint64_t at, std::span<const std::uint8_t> bytes) override;
  // Worker: the bytes at `at` as the file holds them.
  Status get(std::uint64_t at, std::span<std::uint8_t> into) override;
  // Worker: sum[i] += scale * staged[i] for every float of the upload, read back in pieces. Returns
  // success or why the file could not be read (the sum is then partly updated: the caller must
  // treat it as lost, which the server does by failing the round).
  Status add_to(std::span<float> sum, double scale = 1);

 private:
  std::filesystem::path dir_;
  std::uint64_t bytes_ = 0;
  Window window_;
  int fd_ = -1;
  std::vector<float> piece_;
};

}  // namespace xsilo::server
