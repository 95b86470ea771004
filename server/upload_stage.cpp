#include "server/upload_stage.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace xsilo::server {

namespace {

constexpr std::size_t kPieceFloats = std::size_t{1} << 20;  // 4 MiB read back at a time

std::string errno_text() { return std::strerror(errno); }

}  // namespace

StagedUpload::StagedUpload(const std::filesystem::path& dir, std::uint64_t bytes)
    : dir_(dir.empty() ? std::filesystem::temp_directory_path() : dir), bytes_(bytes), window_(bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  std::string name = (dir_ / ("upload-stage-" + std::to_string(::getpid()) + ".XXXXXX")).string();
  fd_ = ::mkstemp(name.data());
  if (fd_ < 0) throw std::runtime_error("cannot create an upload staging file in " + dir_.string() + ": " + errno_text());
  ::unlink(name.c_str());  // nameless from here on: it goes when the process does
}

StagedUpload::~StagedUpload() {
  if (fd_ >= 0) ::close(fd_);
}

Status StagedUpload::put(std::uint64_t at, std::span<const std::uint8_t> bytes) {
  if (at > bytes_ || bytes.size() > bytes_ - at) return Error("upload staging: bytes past the end of the upload");
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Error("cannot write the upload staging file in " + dir_.string() + ": " + errno_text());
    done += static_cast<std::size_t>(n);
  }
  window_.release(at, at + bytes.size());
  return {};
}

Status StagedUpload::get(std::uint64_t at, std::span<std::uint8_t> into) {
  if (at > bytes_ || into.size() > bytes_ - at) return Error("upload staging: bytes past the end of the upload");
  std::size_t got = 0;
  while (got < into.size()) {
    const ssize_t r = ::pread(fd_, into.data() + got, into.size() - got, static_cast<off_t>(at + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      return Error("cannot read back the upload staging file in " + dir_.string() + ": " +
                   (r == 0 ? std::string("it ends early") : errno_text()));
    }
    got += static_cast<std::size_t>(r);
  }
  return {};
}

Status StagedUpload::add_to(std::span<float> sum, double scale) {
  if (sum.size() * sizeof(float) != bytes_) return Error("upload staging: the sum is not the size of the upload");
  piece_.resize(std::min<std::size_t>(kPieceFloats, sum.size()));
  for (std::size_t i = 0; i < sum.size();) {
    const std::size_t n = std::min(piece_.size(), sum.size() - i);
    auto read = get(i * sizeof(float), {reinterpret_cast<std::uint8_t*>(piece_.data()), n * sizeof(float)});
    if (!read) return read;
    if (scale == 1) {
      for (std::size_t k = 0; k < n; ++k) sum[i + k] += piece_[k];
    } else {
      for (std::size_t k = 0; k < n; ++k) sum[i + k] += static_cast<float>(piece_[k] * scale);
    }
    i += n;
  }
  // The file's pages are read: the page cache may drop them (the next upload rewrites them).
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
  return {};
}

}  // namespace xsilo::server
