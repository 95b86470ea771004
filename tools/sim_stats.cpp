// The federation's feature statistics before round 1 (docs/bring-your-own-model.md, "Feature
// statistics").
#include <cmath>

#include "tools/sim.h"

namespace xsilo::tools {

FeatureStats federation_feature_stats(const std::vector<std::filesystem::path>& silo_train_files) {
  // Each silo's sufficient statistics: its row count, the sum of its rows and the sum of their
  // squares, each about the first silo's first row (a shift keeps the squares small, so that
  // the variance's subtraction loses nothing). Their totals give the mean and the variance.
  std::vector<double> shift, sum, sq;
  double n = 0;
  for (const auto& file : silo_train_files) {
    const Dataset d = load_csv(file);
    if (shift.empty()) {
      shift.assign(d.row(0), d.row(0) + d.features);
      sum.assign(d.features, 0);
      sq.assign(d.features, 0);
    }
    if (d.features != shift.size()) {
      throw std::runtime_error(file.string() + " has " + std::to_string(d.features) + " features, " +
                               silo_train_files[0].string() + " has " + std::to_string(shift.size()));
    }
    for (std::size_t i = 0; i < d.rows; ++i) {
      for (std::size_t j = 0; j < d.features; ++j) {
        const double c = d.row(i)[j] - shift[j];
        sum[j] += c;
        sq[j] += c * c;
      }
    }
    n += static_cast<double>(d.rows);
  }
  FeatureStats s;
  s.count = static_cast<std::uint64_t>(n);
  for (std::size_t j = 0; j < shift.size(); ++j) {
    const double m = sum[j] / n;
    s.mean.push_back(shift[j] + m);
    s.var.push_back(std::max(0.0, sq[j] / n - m * m));
  }
  return s;
}

}  // namespace xsilo::tools
