// The built-in models: logistic regression and a softmax MLP with ReLU hidden layers, as a
// stack of dense layers "layers.{i}.weight" [out, in] and "layers.{i}.bias" [out]. A binary
// task has one output unit (sigmoid, cross-entropy); k > 2 classes have k (softmax).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/dataset.h"
#include "common/model.h"

namespace xsilo {

struct ModelSpec {
  std::string kind = "logistic";  // "logistic", "mlp", "synthetic" (benchmarks: one flat tensor), or
                                  // "file" (a user's own model as safetensors)
  std::size_t inputs = 0;
  std::size_t classes = 2;
  std::vector<std::size_t> hidden;  // mlp only
  std::uint64_t seed = 1;
  std::size_t parameters = 0;  // synthetic only
  std::filesystem::path file;  // file only
};

// Weights uniform in +-1/sqrt(fan_in) from `seed`; biases zero.
Model init_model(const ModelSpec& spec);

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
  std::size_t samples = 0;
};

// Called after the gradient of one layer is complete, last layer first: the span of the
// flat gradient that is final. Data-parallel training starts reducing it at once.
using GradReady = std::function<void(std::size_t offset, std::size_t length)>;

class Network {
 public:
  // Reads the layer structure from a model's tensors; throws std::invalid_argument when the
  // tensors are not a dense stack.
  explicit Network(const Model& layout);

  std::size_t inputs() const { return layers_.front().in; }
  std::size_t outputs() const { return layers_.back().out; }
  int classes() const { return outputs() == 1 ? 2 : static_cast<int>(outputs()); }
  std::size_t parameters() const { return params_; }

  // Mean loss over rows [x, x + n*inputs); writes d(mean loss)/d(params) into grad.
  double loss_and_grad(std::span<const float> params, const float* x, const int* y,
                       std::size_t n, std::span<float> grad, const GradReady& ready = {}) const;
  EvalResult evaluate(std::span<const float> params, const Dataset& data) const;

 private:
  void check_label(int label) const;  // std::invalid_argument outside 0..classes()-1
  struct Layer {
    std::size_t in, out, w_offset, b_offset;
  };
  std::vector<Layer> layers_;
  std::size_t params_ = 0;
};

}  // namespace xsilo
