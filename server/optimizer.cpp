#include "server/optimizer.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

namespace xsilo::server {

ServerOptimizer::ServerOptimizer(OptimizerConfig cfg, const Model& layout) : cfg_(std::move(cfg)), size_(layout.size()) {
  if (cfg_.kind == "fedavgm" || cfg_.kind == "fedadam") m_.assign(layout.size(), 0.0f);
  if (cfg_.kind == "fedadam") v_.assign(layout.size(), 0.0f);
  if (cfg_.kind != "fedavg" && cfg_.kind != "fedavgm" && cfg_.kind != "fedadam") {
    throw std::invalid_argument("unknown server optimizer " + cfg_.kind);
  }
}

void ServerOptimizer::step_into(std::span<const float> model, std::span<float> d) {
  const std::size_t n = model.size();
  if (cfg_.keep_last_step) last_.assign(d.begin(), d.end());
  if (cfg_.kind == "fedavg") {
    for (std::size_t i = 0; i < n; ++i) d[i] = model[i] + cfg_.lr * d[i];
  } else if (cfg_.kind == "fedavgm") {
    for (std::size_t i = 0; i < n; ++i) {
      m_[i] = cfg_.momentum * m_[i] + d[i];
      d[i] = model[i] + cfg_.lr * m_[i];
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      m_[i] = cfg_.beta1 * m_[i] + (1.0f - cfg_.beta1) * d[i];
      v_[i] = cfg_.beta2 * v_[i] + (1.0f - cfg_.beta2) * d[i] * d[i];
      d[i] = model[i] + cfg_.lr * m_[i] / (std::sqrt(v_[i]) + cfg_.tau);
    }
  }
}

void ServerOptimizer::step(std::span<float> model, std::span<const float> delta) {
  std::vector<float> tmp(delta.begin(), delta.end());
  step_into(model, tmp);
  std::memcpy(model.data(), tmp.data(), tmp.size() * sizeof(float));
}

Model ServerOptimizer::state() const {
  Model s;
  if (!m_.empty()) {
    s.add("m", {m_.size()});
    std::memcpy(s.tensor("m").data(), m_.data(), m_.size() * sizeof(float));
  }
  if (!v_.empty()) {
    s.add("v", {v_.size()});
    std::memcpy(s.tensor("v").data(), v_.data(), v_.size() * sizeof(float));
  }
  if (!last_.empty()) {
    s.add("last_step", {last_.size()});
    std::memcpy(s.tensor("last_step").data(), last_.data(), last_.size() * sizeof(float));
  }
  return s;
}

void ServerOptimizer::load_state(const Model& state) {
  auto load = [&](const char* name, std::vector<float>& into) {
    if (into.empty()) return;
    const auto* t = state.find(name);
    if (!t) return;  // written by another optimizer (changed since): from zeros, as a first step
    if (t->size() != into.size()) {
      throw std::runtime_error(std::string("optimizer state's tensor ") + name + " is not of the model's size");
    }
    auto src = state.tensor(name);
    std::memcpy(into.data(), src.data(), into.size() * sizeof(float));
  };
  load("m", m_);
  load("v", v_);
  if (const auto* t = state.find("last_step"); cfg_.keep_last_step && t) {
    if (t->size() != size_) throw std::runtime_error("optimizer state's last_step is not of the model's size");
    const auto src = state.tensor("last_step");
    last_.assign(src.begin(), src.end());
  }
}

}  // namespace xsilo::server
