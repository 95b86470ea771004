#include "common/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "common/fs.h"

static_assert(std::endian::native == std::endian::little, "xsilo assumes a little-endian host");

namespace xsilo {

namespace {
// The 8-byte length and the JSON header, padded so that the data starts 8-byte aligned.
std::string header_bytes(const Model& model, const Metadata& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const auto& t : model.tensors()) {
    const std::size_t begin = t.offset * sizeof(float);
    header[t.name] = {{"dtype", "F32"},
                      {"shape", t.shape},
                      {"data_offsets", {begin, begin + t.size() * sizeof(float)}}};
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  std::string out(8, '\0');
  const std::uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  return out + h;
}
}  // namespace

std::string encode_safetensors(const Model& model, const Metadata& metadata) {
  std::string out = header_bytes(model, metadata);
  const auto flat = model.flat();
  out.append(reinterpret_cast<const char*>(flat.data()), flat.size() * sizeof(float));
  return out;
}

Model decode_safetensors(const std::string& bytes, Metadata* metadata) {
  if (bytes.size() < 8) throw std::runtime_error("safetensors: file shorter than its header");
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > bytes.size() - 8 || n > (100u << 20)) {
    throw std::runtime_error("safetensors: header length " + std::to_string(n) +
                             " does not fit the file of " + std::to_string(bytes.size()) +
                             " bytes");
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("safetensors: header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw std::runtime_error("safetensors: header is not an object");
  const std::size_t data_size = bytes.size() - 8 - n;
  struct Entry {
    std::string name;
    std::vector<std::uint64_t> shape;
    std::size_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (metadata) *metadata = it->get<Metadata>();
      continue;
    }
    const auto& v = *it;
    if (!v.is_object() || v.value("dtype", "") != "F32") {
      throw std::runtime_error("safetensors: tensor " + it.key() + " is not F32");
    }
    Entry e{it.key(), v.at("shape").get<std::vector<std::uint64_t>>(),
            v.at("data_offsets").at(0).get<std::size_t>(),
            v.at("data_offsets").at(1).get<std::size_t>()};
    std::size_t elems = 1;
    for (auto d : e.shape) elems *= d;
    if (e.end < e.begin || e.end > data_size || e.end - e.begin != elems * sizeof(float) ||
        e.begin % sizeof(float) != 0) {
      throw std::runtime_error("safetensors: tensor " + e.name + " has bad data_offsets");
    }
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  Model model;
  std::size_t expected = 0;
  for (auto& e : entries) {
    if (e.begin != expected) {
      throw std::runtime_error("safetensors: tensors overlap or leave gaps at " + e.name);
    }
    expected = e.end;
    model.add(e.name, e.shape);
  }
  if (expected != data_size) throw std::runtime_error("safetensors: trailing bytes after data");
  if (data_size) std::memcpy(model.flat().data(), bytes.data() + 8 + n, data_size);
  return model;
}

void save_safetensors(const std::filesystem::path& path, const Model& model,
                      const Metadata& metadata) {
  const auto flat = model.flat();
  atomic_write_parts(path, {header_bytes(model, metadata),
                            std::string_view(reinterpret_cast<const char*>(flat.data()),
                                             flat.size() * sizeof(float))});
}

Model load_safetensors(const std::filesystem::path& path, Metadata* metadata) {
  try {
    return decode_safetensors(read_file(path), metadata);
  } catch (const std::exception& e) {
    throw std::runtime_error(path.string() + ": " + e.what());
  }
}

}  // namespace xsilo
