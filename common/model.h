// A model is an ordered set of named float32 tensors stored in one contiguous buffer, so
// that updates, masks and robust rules can treat it as a single vector without copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace xsilo {

struct TensorInfo {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::size_t offset = 0;  // in elements, into Model::data
  std::size_t size() const;
};

// The number of elements in all of a layout's tensors.
std::size_t elements(std::span<const TensorInfo> layout);

class Model {
 public:
  Model() = default;
  void add(std::string name, std::vector<std::uint64_t> shape);  // zero-filled
  // Adds the tensor to the layout only, without storage (for comparing layouts).
  void add_layout(std::string name, std::vector<std::uint64_t> shape);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  std::span<float> tensor(const std::string& name);
  std::span<const float> tensor(const std::string& name) const;

  std::span<float> flat() { return data_; }
  std::span<const float> flat() const { return data_; }
  std::size_t size() const { return data_.size(); }
  std::size_t bytes() const { return data_.size() * sizeof(float); }

  // Same names, shapes and order.
  bool same_layout(const Model& other) const;
  // An empty model with this one's layout.
  Model zeros_like() const;

 private:
  std::vector<TensorInfo> tensors_;
  std::vector<float> data_;
};

// "name [2, 3]" for logs and errors.
std::string describe(const TensorInfo& t);

// Where two layouts part, for an error: "3 tensors against 4", or the first tensor that
// differs on each side ("w0 [30, 64] against w0 [31, 64]"); "" when they are the same.
std::string layout_difference(const Model& a, const Model& b);

}  // namespace xsilo
