#include "common/npz.h"

#include <zlib.h>

#include <cstring>
#include <fstream>
#include <stdexcept>

namespace xsilo {

namespace {

void le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

// An .npy file, format 1.0: magic, version, header length, a Python dict literal padded with
// spaces and a newline to a multiple of 64 bytes, then the data.
std::string npy(const NpyArray& a) {
  std::string shape = "(";
  for (auto s : a.shape) shape += std::to_string(s) + ", ";
  if (a.shape.size() > 1) shape.resize(shape.size() - 1);  // (3, 4) but (3,)
  else if (a.shape.size() == 1) shape.pop_back();
  shape += ")";
  std::string header = "{'descr': '" + a.dtype + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  le(out, header.size(), 2);
  return out + header + a.bytes;
}

}  // namespace

void save_npz(const std::filesystem::path& path, const std::vector<NpyArray>& arrays) {
  // A zip of stored members: per member a local header and its bytes, then the central
  // directory and its end record (PKWARE APPNOTE 4.3; no zip64, hence the 4 GiB limit).
  std::string body, central;
  constexpr std::uint16_t kTime = 0, kDate = (1 << 5) | 1;  // 1980-01-01: the files are data, not dated
  for (const auto& a : arrays) {
    const std::string data = npy(a);
    const std::string name = a.name + ".npy";
    if (body.size() + data.size() > 0xffffffffull - 65536) {
      throw std::runtime_error("cannot write " + path.string() + ": over 4 GiB, which a zip without zip64 cannot hold");
    }
    const auto crc = static_cast<std::uint32_t>(::crc32(0, reinterpret_cast<const Bytef*>(data.data()),
                                                        static_cast<uInt>(data.size())));
    const std::uint64_t offset = body.size();
    std::string local;
    le(local, 0x04034b50, 4);
    le(local, 20, 2);  // version needed
    le(local, 0, 2);   // flags
    le(local, 0, 2);   // stored
    le(local, kTime, 2);
    le(local, kDate, 2);
    le(local, crc, 4);
    le(local, data.size(), 4);
    le(local, data.size(), 4);
    le(local, name.size(), 2);
    le(local, 0, 2);
    body += local + name + data;
    le(central, 0x02014b50, 4);
    le(central, 20, 2);  // made by
    le(central, 20, 2);  // needed
    le(central, 0, 2);
    le(central, 0, 2);
    le(central, kTime, 2);
    le(central, kDate, 2);
    le(central, crc, 4);
    le(central, data.size(), 4);
    le(central, data.size(), 4);
    le(central, name.size(), 2);
    le(central, 0, 2);  // extra
    le(central, 0, 2);  // comment
    le(central, 0, 2);  // disk
    le(central, 0, 2);  // internal attributes
    le(central, 0, 4);  // external attributes
    le(central, offset, 4);
    central += name;
  }
  std::string end;
  le(end, 0x06054b50, 4);
  le(end, 0, 2);
  le(end, 0, 2);
  le(end, arrays.size(), 2);
  le(end, arrays.size(), 2);
  le(end, central.size(), 4);
  le(end, body.size(), 4);
  le(end, 0, 2);
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << body << central << end;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

void save_npz(const std::filesystem::path& path, const Dataset& d) {
  NpyArray x{"x", "<f4", {d.rows, d.features}, {}};
  x.bytes.resize(d.x.size() * sizeof(float));
  if (!d.x.empty()) std::memcpy(x.bytes.data(), d.x.data(), x.bytes.size());
  NpyArray y{"y", "<i8", {d.rows}, {}};
  for (int label : d.y) le(y.bytes, static_cast<std::uint64_t>(static_cast<std::int64_t>(label)), 8);
  save_npz(path, {x, y});
}

}  // namespace xsilo
