#include "common/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <stdexcept>

namespace xsilo {

namespace {

constexpr std::array<std::uint32_t, 256> crc32c_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // the reflected Castagnoli polynomial
    t[i] = c;
  }
  return t;
}
constexpr auto kCrc32c = crc32c_table();

// TFRecord's masking: the CRC rotated right by 15 bits plus a constant, so that a CRC of data
// that itself holds CRCs does not degenerate.
std::uint32_t masked(std::uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

void varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

// Field `field` with wire type 2 (bytes): key, length, bytes.
void bytes_field(std::string& out, int field, std::string_view bytes) {
  varint(out, static_cast<std::uint64_t>(field) << 3 | 2);
  varint(out, bytes.size());
  out.append(bytes);
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
// summary = 5 (Summary).
std::string event_head(double wall, std::int64_t step) {
  std::string e;
  e += static_cast<char>(1 << 3 | 1);  // fixed64
  std::uint64_t bits;
  std::memcpy(&bits, &wall, sizeof bits);
  put_le(e, bits, 8);
  if (step != 0) {
    e += static_cast<char>(2 << 3 | 0);  // varint
    varint(e, static_cast<std::uint64_t>(step));
  }
  return e;
}

}  // namespace

std::uint32_t crc32c(std::string_view bytes) {
  std::uint32_t c = 0xffffffffu;
  for (unsigned char b : bytes) c = kCrc32c[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const auto secs = static_cast<long long>(wall_time());
  file_ = dir / ("events.out.tfevents." + std::to_string(secs) + "." + host + "." + std::to_string(::getpid()) + ".xsilo");
  out_.open(file_, std::ios::binary | std::ios::app);
  if (!out_) throw std::runtime_error("cannot write TensorBoard events to " + file_.string());
  std::string e = event_head(wall_time(), 0);
  bytes_field(e, 3, "brain.Event:2");
  record(e);
}

void TensorBoardWriter::write(std::int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  // Summary: repeated Value value = 1; Value: tag = 1 (string), simple_value = 2 (float).
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    bytes_field(v, 1, tag);
    v += static_cast<char>(2 << 3 | 5);  // fixed32
    const float f = static_cast<float>(value);
    std::uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    put_le(v, bits, 4);
    bytes_field(summary, 1, v);
  }
  std::string e = event_head(wall_time(), step);
  bytes_field(e, 5, summary);
  record(e);
}

void TensorBoardWriter::record(const std::string& event) {
  std::string len;
  put_le(len, event.size(), 8);
  std::string frame = len;
  put_le(frame, masked(crc32c(len)), 4);
  frame += event;
  put_le(frame, masked(crc32c(event)), 4);
  out_.write(frame.data(), static_cast<std::streamsize>(frame.size()));
  out_.flush();
  if (!out_) throw std::runtime_error("cannot write TensorBoard events to " + file_.string());
}

}  // namespace xsilo
