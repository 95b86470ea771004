// Models on disk as safetensors: an 8-byte little-endian header length, a JSON header
// (dtype, shape, data_offsets per tensor, plus string metadata), then raw little-endian data.
// PyTorch's and numpy's readers open these files without xsilo.
//
// Reading checks every size before it is used: the header length against the file, each
// shape's product (no overflow) against its byte range, the ranges against the data area, and
// that the tensors tile the data exactly (no overlap, gap or trailing bytes). Files are read
// through a read-only mapping: no copy of the data is made until a tensor is converted.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/model.h"

namespace xsilo {

using Metadata = std::map<std::string, std::string>;

// One tensor of a parsed file: a view of its bytes.
struct TensorView {
  std::string name;
  std::string dtype;                  // "F32", "F16", "BF16", "F64", "I64", ... as in the file
  std::vector<std::uint64_t> shape;
  std::uint64_t elements = 0;
  std::span<const std::uint8_t> bytes;
  bool is_float() const { return dtype == "F32" || dtype == "F16" || dtype == "BF16" || dtype == "F64"; }
};

// The tensors of a safetensors byte image, in file order; throws std::runtime_error naming
// what is wrong (and which tensor).
struct SafetensorsView {
  std::vector<TensorView> tensors;
  Metadata metadata;
  const TensorView* find(const std::string& name) const;
};
SafetensorsView parse_safetensors(std::span<const std::uint8_t> bytes);

// Writes a floating-point tensor's elements as float32 into `out` (t.elements values).
void to_float32(const TensorView& t, std::span<float> out);

// A regular file (not a FIFO, not through a symlink) mapped read-only for as long as this lives.
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);  // throws std::runtime_error
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::span<const std::uint8_t> bytes() const { return {data_, size_}; }
  std::uint64_t links() const { return links_; }  // hard links to the file

 private:
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  std::uint64_t links_ = 0;
};

std::string encode_safetensors(const Model& model, const Metadata& metadata = {});
// The float tensors of the image as a float32 Model (F16, BF16 and F64 converted), in file
// order. Throws std::runtime_error for integer tensors and anything malformed.
Model decode_safetensors(std::span<const std::uint8_t> bytes, Metadata* metadata = nullptr);
Model decode_safetensors(const std::string& bytes, Metadata* metadata = nullptr);

// Durable save (write, fsync, rename) and load.
void save_safetensors(const std::filesystem::path& path, const Model& model, const Metadata& metadata = {});
// The same without fsync, for files that need not survive a crash (exchange with a trainer).
void write_safetensors(const std::filesystem::path& path, const Model& model, const Metadata& metadata = {});
Model load_safetensors(const std::filesystem::path& path, Metadata* metadata = nullptr);

}  // namespace xsilo
