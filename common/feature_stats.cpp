#include "common/feature_stats.h"

#include <cmath>
#include <stdexcept>

#include "common/fs.h"

namespace xsilo {

Standardizer FeatureStats::standardizer() const {
  Standardizer s;
  for (std::size_t j = 0; j < mean.size(); ++j) {
    const double sd = std::sqrt(std::max(var[j], 0.0));
    s.mean.push_back(static_cast<float>(mean[j]));
    s.stddev.push_back(sd > 1e-12 ? static_cast<float>(sd) : 1.0f);
  }
  return s;
}

nlohmann::json FeatureStats::to_json() const { return {{"mean", mean}, {"var", var}, {"count", count}}; }

FeatureStats FeatureStats::from_json(const nlohmann::json& j) {
  FeatureStats s;
  if (!j.is_object() || !j.contains("mean") || !j.contains("var") || !j["mean"].is_array() || !j["var"].is_array()) {
    throw std::runtime_error("feature statistics must be an object with \"mean\" and \"var\" lists");
  }
  for (const auto& v : j["mean"]) {
    if (!v.is_number() || !std::isfinite(v.get<double>())) throw std::runtime_error("\"mean\" holds a value that is not a finite number");
    s.mean.push_back(v.get<double>());
  }
  for (const auto& v : j["var"]) {
    if (!v.is_number() || !(v.get<double>() >= 0) || !std::isfinite(v.get<double>())) {
      throw std::runtime_error("\"var\" holds a value that is not a finite number >= 0");
    }
    s.var.push_back(v.get<double>());
  }
  if (s.mean.empty() || s.mean.size() != s.var.size()) {
    throw std::runtime_error("\"mean\" and \"var\" must be lists of equal, non-zero length (" +
                             std::to_string(s.mean.size()) + " and " + std::to_string(s.var.size()) + ")");
  }
  if (j.contains("count")) {
    if (!j["count"].is_number_unsigned()) throw std::runtime_error("\"count\" must be a non-negative integer");
    s.count = j["count"].get<std::uint64_t>();
  }
  return s;
}

FeatureStats load_feature_stats(const std::filesystem::path& file) {
  try {
    return FeatureStats::from_json(nlohmann::json::parse(read_file(file)));
  } catch (const std::exception& e) {
    throw std::runtime_error(file.string() + ": " + e.what());
  }
}

void save_feature_stats(const std::filesystem::path& file, const FeatureStats& s) {
  atomic_write_file(file, s.to_json().dump() + "\n");
}

}  // namespace xsilo
