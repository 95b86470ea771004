#include "common/mlp.h"

#include "common/eigen.h"
#include "common/safetensors.h"
#include <cmath>
#include <random>
#include <stdexcept>

namespace xsilo {

namespace {
using MatR = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapC = Eigen::Map<const MatR>;
using Map = Eigen::Map<MatR>;
using VecMapC = Eigen::Map<const Eigen::RowVectorXf>;
using VecMap = Eigen::Map<Eigen::RowVectorXf>;
}  // namespace

Model init_model(const ModelSpec& spec) {
  if (spec.kind == "file") return load_safetensors(spec.file);
  if (spec.kind == "synthetic") {
    if (spec.parameters == 0) throw std::invalid_argument("synthetic model needs parameters > 0");
    Model m;
    m.add("weights", {spec.parameters});
    return m;
  }
  if (spec.inputs == 0) throw std::invalid_argument("model needs at least one input feature");
  if (spec.classes < 2) throw std::invalid_argument("model needs at least two classes");
  std::vector<std::size_t> sizes{spec.inputs};
  if (spec.kind == "mlp") {
    sizes.insert(sizes.end(), spec.hidden.begin(), spec.hidden.end());
  } else if (spec.kind != "logistic") {
    throw std::invalid_argument("model kind must be logistic or mlp, got " + spec.kind);
  }
  sizes.push_back(spec.classes == 2 ? 1 : spec.classes);
  Model m;
  for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
    m.add("layers." + std::to_string(l) + ".weight", {sizes[l + 1], sizes[l]});
    m.add("layers." + std::to_string(l) + ".bias", {sizes[l + 1]});
  }
  std::mt19937_64 rng(spec.seed);
  for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(sizes[l]));
    std::uniform_real_distribution<float> u(-bound, bound);
    for (auto& w : m.tensor("layers." + std::to_string(l) + ".weight")) w = u(rng);
  }
  return m;
}

Network::Network(const Model& layout) {
  const auto& t = layout.tensors();
  if (t.empty() || t.size() % 2) throw std::invalid_argument("model is not a stack of dense layers");
  for (std::size_t l = 0; l < t.size() / 2; ++l) {
    const auto& w = t[2 * l];
    const auto& b = t[2 * l + 1];
    const std::string p = "layers." + std::to_string(l);
    if (w.name != p + ".weight" || b.name != p + ".bias" || w.shape.size() != 2 ||
        b.shape.size() != 1 || b.shape[0] != w.shape[0]) {
      throw std::invalid_argument("model tensor " + w.name + " / " + b.name +
                                  " is not layer " + std::to_string(l) + " of a dense stack");
    }
    if (l > 0 && w.shape[1] != layers_.back().out) {
      throw std::invalid_argument("layer " + std::to_string(l) + " takes " +
                                  std::to_string(w.shape[1]) + " inputs but the previous layer has " +
                                  std::to_string(layers_.back().out) + " outputs");
    }
    layers_.push_back({w.shape[1], w.shape[0], w.offset, b.offset});
  }
  params_ = layout.size();
}

double Network::loss_and_grad(std::span<const float> params, const float* x, const int* y,
                              std::size_t n, std::span<float> grad, const GradReady& ready) const {
  const std::size_t L = layers_.size();
  const auto rows = static_cast<Eigen::Index>(n);
  std::vector<MatR> acts(L + 1);  // acts[l] is the input of layer l; acts[L] the logits
  acts[0] = MapC(x, rows, static_cast<Eigen::Index>(inputs()));
  for (std::size_t l = 0; l < L; ++l) {
    const auto& ly = layers_[l];
    MapC W(params.data() + ly.w_offset, static_cast<Eigen::Index>(ly.out), static_cast<Eigen::Index>(ly.in));
    VecMapC b(params.data() + ly.b_offset, static_cast<Eigen::Index>(ly.out));
    acts[l + 1].noalias() = acts[l] * W.transpose();
    acts[l + 1].rowwise() += b;
    if (l + 1 < L) acts[l + 1] = acts[l + 1].cwiseMax(0.0f);
  }
  // Labels index the outputs: one past them is refused, never read or written out of bounds.
  for (std::size_t i = 0; i < n; ++i) check_label(y[i]);
  // Output gradient dZ = (p - onehot) / n and the mean loss.
  MatR dz = acts[L];
  double loss = 0;
  const float inv_n = 1.0f / static_cast<float>(n);
  if (outputs() == 1) {
    for (Eigen::Index i = 0; i < rows; ++i) {
      const float z = acts[L](i, 0);
      const float t = static_cast<float>(y[i]);
      loss += std::max(z, 0.0f) - z * t + std::log1p(std::exp(-std::abs(z)));
      const float p = 1.0f / (1.0f + std::exp(-z));
      dz(i, 0) = (p - t) * inv_n;
    }
  } else {
    for (Eigen::Index i = 0; i < rows; ++i) {
      auto zr = acts[L].row(i);
      const float m = zr.maxCoeff();
      const float lse = m + std::log((zr.array() - m).exp().sum());
      loss += lse - zr(y[i]);
      dz.row(i) = ((zr.array() - lse).exp() * inv_n).matrix();
      dz(i, y[i]) -= inv_n;
    }
  }
  for (std::size_t l = L; l-- > 0;) {
    const auto& ly = layers_[l];
    Map dW(grad.data() + ly.w_offset, static_cast<Eigen::Index>(ly.out), static_cast<Eigen::Index>(ly.in));
    VecMap db(grad.data() + ly.b_offset, static_cast<Eigen::Index>(ly.out));
    dW.noalias() = dz.transpose() * acts[l];
    db = dz.colwise().sum();
    if (ready) {
      const std::size_t lo = std::min(ly.w_offset, ly.b_offset);
      ready(lo, ly.in * ly.out + ly.out);
    }
    if (l > 0) {
      MapC W(params.data() + ly.w_offset, static_cast<Eigen::Index>(ly.out), static_cast<Eigen::Index>(ly.in));
      MatR da = dz * W;
      dz = (acts[l].array() > 0.0f).select(da, 0.0f);
    }
  }
  return loss / static_cast<double>(n);
}

void Network::check_label(int label) const {
  if (label < 0 || label >= classes()) {
    throw std::invalid_argument("label " + std::to_string(label) + " is not one of the model's " +
                                std::to_string(classes()) + " classes");
  }
}

EvalResult Network::evaluate(std::span<const float> params, const Dataset& data) const {
  EvalResult r;
  r.samples = data.rows;
  if (data.rows == 0) return r;
  if (data.features != inputs()) {
    throw std::invalid_argument("data has " + std::to_string(data.features) +
                                " features, the model takes " + std::to_string(inputs()));
  }
  const std::size_t L = layers_.size();
  MatR a = MapC(data.x.data(), static_cast<Eigen::Index>(data.rows), static_cast<Eigen::Index>(inputs()));
  for (std::size_t l = 0; l < L; ++l) {
    const auto& ly = layers_[l];
    MapC W(params.data() + ly.w_offset, static_cast<Eigen::Index>(ly.out), static_cast<Eigen::Index>(ly.in));
    VecMapC b(params.data() + ly.b_offset, static_cast<Eigen::Index>(ly.out));
    MatR z = a * W.transpose();
    z.rowwise() += b;
    a = l + 1 < L ? MatR(z.cwiseMax(0.0f)) : z;
  }
  double loss = 0;
  std::size_t correct = 0;
  for (std::size_t i = 0; i < data.rows; ++i) {
    check_label(data.y[i]);
    const auto row = static_cast<Eigen::Index>(i);
    if (outputs() == 1) {
      const float z = a(row, 0);
      const float t = static_cast<float>(data.y[i]);
      loss += std::max(z, 0.0f) - z * t + std::log1p(std::exp(-std::abs(z)));
      correct += ((z > 0) ? 1 : 0) == data.y[i];
    } else {
      auto zr = a.row(row);
      const float m = zr.maxCoeff();
      const float lse = m + std::log((zr.array() - m).exp().sum());
      loss += lse - zr(data.y[i]);
      Eigen::Index best = 0;
      zr.maxCoeff(&best);
      correct += best == data.y[i];
    }
  }
  r.loss = loss / static_cast<double>(data.rows);
  r.accuracy = static_cast<double>(correct) / static_cast<double>(data.rows);
  return r;
}

}  // namespace xsilo
