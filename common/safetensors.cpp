#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "common/fs.h"

static_assert(std::endian::native == std::endian::little, "xsilo assumes a little-endian host");

namespace xsilo {

namespace {

constexpr std::uint64_t kMaxHeader = 100u << 20;

std::size_t dtype_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  return 0;
}

[[noreturn]] void bad(const std::string& why) { throw std::runtime_error("safetensors: " + why); }

// The 8-byte length and the JSON header, padded so that the data starts 8-byte aligned.
std::string header_bytes(const Model& model, const Metadata& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const auto& t : model.tensors()) {
    const std::size_t begin = t.offset * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {begin, begin + t.size() * sizeof(float)}}};
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  std::string out(8, '\0');
  const std::uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  return out + h;
}

std::string_view data_of(const Model& model) {
  const auto flat = model.flat();
  return {reinterpret_cast<const char*>(flat.data()), flat.size() * sizeof(float)};
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;  // +-0
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | (static_cast<std::uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf or NaN
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

}  // namespace

const TensorView* SafetensorsView::find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

SafetensorsView parse_safetensors(std::span<const std::uint8_t> bytes) {
  if (bytes.size() < 8) bad("file of " + std::to_string(bytes.size()) + " bytes is shorter than its header length");
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > bytes.size() - 8 || n > kMaxHeader) {
    bad("header length " + std::to_string(n) + " does not fit the file of " + std::to_string(bytes.size()) + " bytes");
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
  } catch (const nlohmann::json::parse_error& e) {
    // Not the parser's own message: it quotes what it last read, raw bytes of a damaged file.
    bad("header is not valid JSON (at byte " + std::to_string(e.byte) + " of its " + std::to_string(n) + ")");
  } catch (const nlohmann::json::exception&) {
    bad("header is not valid JSON");
  }
  if (!header.is_object()) bad("header is not a JSON object");
  const auto data = bytes.subspan(8 + n);
  SafetensorsView view;
  struct Range {
    std::uint64_t begin, end;
    std::size_t index;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) bad("__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) bad("__metadata__ value of " + m.key() + " is not a string");
        view.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const auto& v = *it;
    const auto* dtype = v.is_object() && v.contains("dtype") && v["dtype"].is_string() ? &v["dtype"] : nullptr;
    if (!dtype) bad("tensor " + name + " has no dtype");
    TensorView t;
    t.name = name;
    t.dtype = dtype->get<std::string>();
    const std::size_t elem = dtype_size(t.dtype);
    if (!elem) bad("tensor " + name + " has an unknown dtype " + t.dtype);
    if (!v.contains("shape") || !v["shape"].is_array()) bad("tensor " + name + " has no shape");
    t.elements = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) bad("tensor " + name + " has a shape that is not a list of sizes");
      const auto dim = d.get<std::uint64_t>();
      t.shape.push_back(dim);
      if (__builtin_mul_overflow(t.elements, dim, &t.elements)) bad("tensor " + name + "'s shape overflows");
    }
    const auto& off = v.contains("data_offsets") ? v["data_offsets"] : nlohmann::json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      bad("tensor " + name + " has no [begin, end] data_offsets");
    }
    const auto begin = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
    std::uint64_t nbytes = 0;
    if (__builtin_mul_overflow(t.elements, static_cast<std::uint64_t>(elem), &nbytes) || end < begin ||
        end > data.size() || end - begin != nbytes) {
      bad("tensor " + name + " has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
          "] that do not hold its " + std::to_string(t.elements) + " " + t.dtype + " elements in " +
          std::to_string(data.size()) + " bytes of data");
    }
    t.bytes = data.subspan(begin, end - begin);
    ranges.push_back({begin, end, view.tensors.size()});
    view.tensors.push_back(std::move(t));
  }
  // The tensors tile the data area exactly, in file order.
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  std::uint64_t expected = 0;
  std::vector<TensorView> ordered;
  for (const auto& r : ranges) {
    if (r.begin != expected) bad("tensors overlap or leave a gap at " + view.tensors[r.index].name);
    expected = r.end;
    ordered.push_back(std::move(view.tensors[r.index]));
  }
  if (expected != data.size()) bad(std::to_string(data.size() - expected) + " bytes after the last tensor");
  view.tensors = std::move(ordered);
  return view;
}

void to_float32(const TensorView& t, std::span<float> out) {
  if (out.size() != t.elements) throw std::logic_error("to_float32: output size mismatch");
  const std::uint8_t* p = t.bytes.data();
  if (t.dtype == "F32") {
    std::memcpy(out.data(), p, t.bytes.size());
  } else if (t.dtype == "F16" || t.dtype == "BF16") {
    const bool bf = t.dtype == "BF16";
    for (std::size_t i = 0; i < out.size(); ++i) {
      std::uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = bf ? std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16) : half_to_float(h);
    }
  } else if (t.dtype == "F64") {
    for (std::size_t i = 0; i < out.size(); ++i) {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      out[i] = static_cast<float>(d);
    }
  } else {
    throw std::runtime_error("safetensors: tensor " + t.name + " is " + t.dtype + ", not a floating-point tensor");
  }
}

MappedFile::MappedFile(const std::filesystem::path& path) {
  // Non-blocking and not through a final symlink: a FIFO or a link put where a file should be
  // is refused instead of blocking or leading elsewhere.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) throw std::runtime_error("cannot open " + path.string() + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error(path.string() + " is not a regular file");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  links_ = static_cast<std::uint64_t>(st.st_nlink);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw std::runtime_error("cannot map " + path.string() + ": " + std::strerror(err));
    }
    data_ = static_cast<const std::uint8_t*>(m);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::uint8_t*>(data_), size_);
}

std::string encode_safetensors(const Model& model, const Metadata& metadata) {
  std::string out = header_bytes(model, metadata);
  out.append(data_of(model));
  return out;
}

Model decode_safetensors(std::span<const std::uint8_t> bytes, Metadata* metadata) {
  const auto view = parse_safetensors(bytes);
  Model model;
  for (const auto& t : view.tensors) {
    if (!t.is_float()) {
      bad("tensor " + t.name + " is " + t.dtype + ": only floating-point tensors are federated (integer buffers such "
          "as BatchNorm's num_batches_tracked stay with each silo; xsilo_client.save_initial leaves them out)");
    }
    model.add(t.name, t.shape);
  }
  for (const auto& t : view.tensors) to_float32(t, model.tensor(t.name));
  if (metadata) *metadata = view.metadata;
  return model;
}

Model decode_safetensors(const std::string& bytes, Metadata* metadata) {
  return decode_safetensors({reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()}, metadata);
}

void save_safetensors(const std::filesystem::path& path, const Model& model, const Metadata& metadata) {
  atomic_write_parts(path, {header_bytes(model, metadata), data_of(model)});
}

void write_safetensors(const std::filesystem::path& path, const Model& model, const Metadata& metadata) {
  const auto tmp = std::filesystem::path(path.string() + ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    const std::string h = header_bytes(model, metadata);
    const auto d = data_of(model);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    out.write(d.data(), static_cast<std::streamsize>(d.size()));
    if (!out) throw std::runtime_error("cannot write " + tmp.string());
  }
  std::filesystem::rename(tmp, path);
}

Model load_safetensors(const std::filesystem::path& path, Metadata* metadata) {
  try {
    MappedFile file(path);
    return decode_safetensors(file.bytes(), metadata);
  } catch (const std::exception& e) {
    throw std::runtime_error(path.string() + ": " + e.what());
  }
}

}  // namespace xsilo
