// Models on disk as safetensors: an 8-byte little-endian header length, a JSON header
// (dtype, shape, data_offsets per tensor, plus string metadata), then raw little-endian data.
// PyTorch's and numpy's readers open these files without xsilo.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "common/model.h"

namespace xsilo {

using Metadata = std::map<std::string, std::string>;

std::string encode_safetensors(const Model& model, const Metadata& metadata = {});
// Throws std::runtime_error naming what is wrong with the bytes.
Model decode_safetensors(const std::string& bytes, Metadata* metadata = nullptr);

// Durable save (write, fsync, rename) and load.
void save_safetensors(const std::filesystem::path& path, const Model& model,
                      const Metadata& metadata = {});
Model load_safetensors(const std::filesystem::path& path, Metadata* metadata = nullptr);

}  // namespace xsilo
