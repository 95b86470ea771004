#include "common/model.h"

#include <algorithm>

#include <stdexcept>

namespace xsilo {

std::size_t TensorInfo::size() const {
  std::size_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::size_t elements(std::span<const TensorInfo> layout) {
  std::size_t n = 0;
  for (const auto& t : layout) n += t.size();
  return n;
}

void Model::add(std::string name, std::vector<std::uint64_t> shape) {
  if (find(name)) throw std::invalid_argument("tensor " + name + " already exists");
  TensorInfo t{std::move(name), std::move(shape), data_.size()};
  data_.resize(data_.size() + t.size(), 0.0f);
  tensors_.push_back(std::move(t));
}

void Model::add_layout(std::string name, std::vector<std::uint64_t> shape) {
  TensorInfo t{std::move(name), std::move(shape), 0};
  t.offset = tensors_.empty() ? 0 : tensors_.back().offset + tensors_.back().size();
  tensors_.push_back(std::move(t));
}

const TensorInfo* Model::find(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::span<float> Model::tensor(const std::string& name) {
  const auto* t = find(name);
  if (!t) throw std::out_of_range("no tensor named " + name);
  return std::span<float>(data_).subspan(t->offset, t->size());
}

std::span<const float> Model::tensor(const std::string& name) const {
  const auto* t = find(name);
  if (!t) throw std::out_of_range("no tensor named " + name);
  return std::span<const float>(data_).subspan(t->offset, t->size());
}

bool Model::same_layout(const Model& other) const {
  if (tensors_.size() != other.tensors_.size()) return false;
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].name != other.tensors_[i].name ||
        tensors_[i].shape != other.tensors_[i].shape) {
      return false;
    }
  }
  return true;
}

std::string layout_difference(const Model& a, const Model& b) {
  const auto& x = a.tensors();
  const auto& y = b.tensors();
  for (std::size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    if (x[i].name != y[i].name || x[i].shape != y[i].shape) return describe(x[i]) + " against " + describe(y[i]);
  }
  if (x.size() != y.size()) return std::to_string(x.size()) + " tensors against " + std::to_string(y.size());
  return "";
}

Model Model::zeros_like() const {
  Model m;
  m.data_.reserve(data_.size());  // one allocation: growing tensor by tensor copied what was made
  for (const auto& t : tensors_) m.add(t.name, t.shape);
  return m;
}

std::string describe(const TensorInfo& t) {
  std::string s = t.name + " [";
  for (std::size_t i = 0; i < t.shape.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(t.shape[i]);
  }
  return s + "]";
}

}  // namespace xsilo
