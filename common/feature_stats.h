// The federation's feature statistics: the mean and variance of every feature over all silos'
// training rows (docs/bring-your-own-model.md, "Feature statistics"). Silos standardize with
// them instead of with their own rows' statistics, which differ from silo to silo under skew.
// On disk a JSON file: {"mean": [...], "var": [...], "count": N}.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/dataset.h"

namespace xsilo {

struct FeatureStats {
  std::vector<double> mean, var;  // one value per feature; var is the population variance
  std::uint64_t count = 0;        // training rows over all silos

  bool empty() const { return mean.empty(); }
  // (x - mean) / sqrt(var), a constant feature (var 0) only centred.
  Standardizer standardizer() const;
  nlohmann::json to_json() const;
  // Throws std::runtime_error saying what is wrong (lengths differ, a negative variance, ...).
  static FeatureStats from_json(const nlohmann::json& j);
};

FeatureStats load_feature_stats(const std::filesystem::path& file);  // throws, naming the file
void save_feature_stats(const std::filesystem::path& file, const FeatureStats& s);

}  // namespace xsilo
