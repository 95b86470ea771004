#include "common/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>

namespace xsilo {

namespace {

std::string read_maybe_gzip(const std::filesystem::path& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files unchanged
  if (!f) throw std::runtime_error("cannot open data file " + path.string());
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  const bool bad = n < 0;
  gzclose(f);
  if (bad) throw std::runtime_error("cannot read data file " + path.string() + " (corrupt gzip?)");
  return out;
}

bool parse_fields(const std::string& line, std::vector<double>& out) {
  out.clear();
  std::size_t pos = 0;
  while (pos <= line.size()) {
    std::size_t comma = line.find(',', pos);
    if (comma == std::string::npos) comma = line.size();
    const std::string tok = line.substr(pos, comma - pos);
    char* end = nullptr;
    const double v = std::strtod(tok.c_str(), &end);
    if (tok.empty() || end == tok.c_str() || *end != '\0') return false;
    out.push_back(v);
    pos = comma + 1;
  }
  return true;
}

}  // namespace

Dataset load_csv(const std::filesystem::path& path) {
  const std::string text = read_maybe_gzip(path);
  std::istringstream in(text);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) lines.push_back(std::move(line));
  }
  if (lines.empty()) throw std::runtime_error(path.string() + ": no data");
  std::vector<double> first, second;
  const bool first_ok = parse_fields(lines[0], first);
  const bool second_ok = lines.size() > 1 && parse_fields(lines[1], second);
  std::size_t start = 0;
  if (!first_ok || (second_ok && first.size() != second.size())) start = 1;

  Dataset d;
  std::vector<double> fields;
  for (std::size_t i = start; i < lines.size(); ++i) {
    if (!parse_fields(lines[i], fields) || fields.size() < 2) {
      throw std::runtime_error(path.string() + ":" + std::to_string(i + 1) +
                               ": expected comma-separated numbers with the label last");
    }
    if (d.rows == 0) d.features = fields.size() - 1;
    if (fields.size() - 1 != d.features) {
      throw std::runtime_error(path.string() + ":" + std::to_string(i + 1) + ": " +
                               std::to_string(fields.size()) + " fields, expected " +
                               std::to_string(d.features + 1));
    }
    const double label = fields.back();
    if (label < 0 || label != std::floor(label) || label > 1e6) {
      throw std::runtime_error(path.string() + ":" + std::to_string(i + 1) +
                               ": label must be a non-negative integer");
    }
    for (std::size_t j = 0; j < d.features; ++j) {
      if (!std::isfinite(fields[j])) {
        throw std::runtime_error(path.string() + ":" + std::to_string(i + 1) + ": non-finite value");
      }
      d.x.push_back(static_cast<float>(fields[j]));
    }
    d.y.push_back(static_cast<int>(label));
    d.classes = std::max(d.classes, static_cast<int>(label) + 1);
    ++d.rows;
  }
  d.classes = std::max(d.classes, 2);
  return d;
}

void save_csv(const std::filesystem::path& path, const Dataset& d, bool header) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path);
  out.precision(9);
  if (header) {
    for (std::size_t j = 0; j < d.features; ++j) out << 'x' << j << ',';
    out << "label\n";
  }
  for (std::size_t i = 0; i < d.rows; ++i) {
    for (std::size_t j = 0; j < d.features; ++j) out << d.x[i * d.features + j] << ',';
    out << d.y[i] << '\n';
  }
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

Dataset subset(const Dataset& d, const std::vector<std::size_t>& rows) {
  Dataset s;
  s.features = d.features;
  s.classes = d.classes;
  s.rows = rows.size();
  s.x.reserve(rows.size() * d.features);
  for (auto r : rows) {
    s.x.insert(s.x.end(), d.row(r), d.row(r) + d.features);
    s.y.push_back(d.y[r]);
  }
  return s;
}

Standardizer Standardizer::fit(const Dataset& d) {
  Standardizer s;
  s.mean.assign(d.features, 0.0f);
  s.stddev.assign(d.features, 1.0f);
  for (std::size_t j = 0; j < d.features; ++j) {
    double sum = 0, sq = 0;
    for (std::size_t i = 0; i < d.rows; ++i) sum += d.x[i * d.features + j];
    const double m = d.rows ? sum / static_cast<double>(d.rows) : 0.0;
    for (std::size_t i = 0; i < d.rows; ++i) {
      const double c = d.x[i * d.features + j] - m;
      sq += c * c;
    }
    const double sd = d.rows ? std::sqrt(sq / static_cast<double>(d.rows)) : 0.0;
    s.mean[j] = static_cast<float>(m);
    s.stddev[j] = sd > 1e-12 ? static_cast<float>(sd) : 1.0f;
  }
  return s;
}

void Standardizer::apply(Dataset& d) const {
  if (mean.size() != d.features || stddev.size() != d.features) {
    throw std::runtime_error("standardization has " + std::to_string(mean.size()) +
                             " features, the data has " + std::to_string(d.features));
  }
  for (std::size_t i = 0; i < d.rows; ++i) {
    for (std::size_t j = 0; j < d.features; ++j) {
      float& v = d.x[i * d.features + j];
      v = (v - mean[j]) / stddev[j];
    }
  }
}

std::pair<std::vector<std::size_t>, std::vector<std::size_t>> train_test_split(
    const Dataset& d, double test_fraction, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<std::size_t>> by_class(static_cast<std::size_t>(d.classes));
  for (std::size_t i = 0; i < d.rows; ++i) by_class[static_cast<std::size_t>(d.y[i])].push_back(i);
  std::vector<std::size_t> train, test;
  for (auto& rows : by_class) {
    std::shuffle(rows.begin(), rows.end(), rng);
    const auto n_test = static_cast<std::size_t>(std::round(test_fraction * static_cast<double>(rows.size())));
    test.insert(test.end(), rows.begin(), rows.begin() + static_cast<long>(n_test));
    train.insert(train.end(), rows.begin() + static_cast<long>(n_test), rows.end());
  }
  std::sort(train.begin(), train.end());
  std::sort(test.begin(), test.end());
  return {train, test};
}

std::vector<std::vector<std::size_t>> split_iid(const std::vector<std::size_t>& rows,
                                                std::size_t parts, std::uint64_t seed) {
  std::vector<std::size_t> shuffled = rows;
  std::mt19937_64 rng(seed);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  std::vector<std::vector<std::size_t>> out(parts);
  for (std::size_t i = 0; i < shuffled.size(); ++i) out[i % parts].push_back(shuffled[i]);
  for (auto& p : out) std::sort(p.begin(), p.end());
  return out;
}

std::vector<std::vector<std::size_t>> split_dirichlet(const Dataset& d,
                                                      const std::vector<std::size_t>& rows,
                                                      std::size_t parts, double alpha,
                                                      std::uint64_t seed, std::size_t min_rows) {
  if (parts == 0) throw std::invalid_argument("split_dirichlet: zero parts");
  if (rows.size() < parts * min_rows) {
    throw std::runtime_error("cannot give " + std::to_string(parts) + " silos " +
                             std::to_string(min_rows) + " rows each from " +
                             std::to_string(rows.size()) + " rows");
  }
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gamma(alpha, 1.0);
  std::vector<std::vector<std::size_t>> by_class(static_cast<std::size_t>(d.classes));
  for (auto r : rows) by_class[static_cast<std::size_t>(d.y[r])].push_back(r);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    std::vector<std::vector<std::size_t>> out(parts);
    for (auto cls : by_class) {
      std::shuffle(cls.begin(), cls.end(), rng);
      std::vector<double> p(parts);
      double total = 0;
      for (auto& v : p) total += (v = gamma(rng));
      std::size_t start = 0;
      double cum = 0;
      for (std::size_t k = 0; k < parts; ++k) {
        cum += p[k] / total;
        const std::size_t end = k + 1 == parts
                                    ? cls.size()
                                    : static_cast<std::size_t>(std::round(cum * static_cast<double>(cls.size())));
        for (std::size_t i = start; i < std::max(start, end); ++i) out[k].push_back(cls[i]);
        start = std::max(start, end);
      }
    }
    bool ok = true;
    for (const auto& part : out) ok = ok && part.size() >= min_rows;
    if (ok) {
      for (auto& part : out) std::sort(part.begin(), part.end());
      return out;
    }
  }
  throw std::runtime_error("Dirichlet split with alpha " + std::to_string(alpha) +
                           " left a silo with fewer than " + std::to_string(min_rows) +
                           " rows 1000 times; raise alpha or use fewer silos");
}

}  // namespace xsilo
