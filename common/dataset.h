// Tabular data for the built-in trainers: numeric CSV (optionally gzip), label in the last
// column, and the splits a simulation needs (train/test, IID, Dirichlet label skew).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace xsilo {

struct Dataset {
  std::size_t rows = 0, features = 0;
  std::vector<float> x;  // row-major rows x features
  std::vector<int> y;    // labels 0..classes-1
  int classes = 0;       // 1 + the largest label seen (at least 2)

  const float* row(std::size_t i) const { return x.data() + i * features; }
};

// Reads "f1,f2,...,label" lines; gzip is detected by content. A first line that is not all
// numbers or has another field count (scikit-learn's "569,30,malignant,benign") is a header.
// Throws std::runtime_error naming the file and line on malformed data.
Dataset load_csv(const std::filesystem::path& path);
// With `header`, a first line "x0,x1,...,label" names the columns (load_csv skips it).
void save_csv(const std::filesystem::path& path, const Dataset& d, bool header = false);

Dataset subset(const Dataset& d, const std::vector<std::size_t>& rows);

// Per-feature mean and standard deviation (std 1 where a feature is constant).
struct Standardizer {
  std::vector<float> mean, stddev;
  static Standardizer fit(const Dataset& d);
  void apply(Dataset& d) const;  // throws if the feature count differs
};

// Stratified split: returns {train rows, test rows}.
std::pair<std::vector<std::size_t>, std::vector<std::size_t>> train_test_split(
    const Dataset& d, double test_fraction, std::uint64_t seed);
// Rows (a subset of d) dealt to `parts` silos uniformly at random.
std::vector<std::vector<std::size_t>> split_iid(const std::vector<std::size_t>& rows,
                                                std::size_t parts, std::uint64_t seed);
// Label skew: each class's rows are divided by proportions drawn from Dirichlet(alpha);
// redrawn until every part has at least `min_rows` rows (throws after 1000 tries).
std::vector<std::vector<std::size_t>> split_dirichlet(const Dataset& d,
                                                      const std::vector<std::size_t>& rows,
                                                      std::size_t parts, double alpha,
                                                      std::uint64_t seed,
                                                      std::size_t min_rows = 8);

}  // namespace xsilo
