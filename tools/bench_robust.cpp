// xsilo bench robust: time per rule on n x d matrices, beside the numpy reference of the same
// definitions (bench/robust_reference.py, run in the same command) and the memory bound of one
// pass over the matrix.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "robust/robust.h"
#include "tools/bench.h"

namespace xsilo::tools {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

void save_npy(const std::filesystem::path& p, const float* data, std::size_t n, std::size_t d) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(n) +
                       (d ? ", " + std::to_string(d) : std::string(",")) + "), }";
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(p, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const auto len = static_cast<std::uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&len), 2);
  out << header;
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * (d ? d : 1) * sizeof(float)));
}

std::vector<float> load_npy_vector(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  char magic[8];
  in.read(magic, 8);
  std::uint16_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 2);
  std::string header(len, '\0');
  in.read(header.data(), len);
  std::vector<float> v;
  float x;
  while (in.read(reinterpret_cast<char*>(&x), sizeof x)) v.push_back(x);
  return v;
}

bool have_numpy() {
  return std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

using RuleRuns = std::map<std::string, std::pair<double, std::vector<float>>>;  // seconds, aggregate

// The input: n x d normal values, the first 2^20 drawn and the rest mixed from them (quick to make).
std::vector<float> bench_matrix(std::size_t n, std::size_t d) {
  std::vector<float> x(n * d);
  std::mt19937_64 rng(n * 1000003 + d);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (std::size_t k = 0; k < std::min<std::size_t>(x.size(), 1 << 20); ++k) x[k] = g(rng);
  for (std::size_t k = 1 << 20; k < x.size(); ++k) x[k] = x[k % (1 << 20)] * 0.999f + x[(k * 7919) % (1 << 20)] * 0.01f;
  return x;
}

// Our rules, each timed, with its aggregate for the comparison with numpy.
RuleRuns time_rules(const robust::MatrixView& view, std::size_t f) {
  const std::size_t n = view.n;
  RuleRuns ours;
  auto time_rule = [&](const std::string& name, auto fn) {
    const auto t0 = Clock::now();
    auto r = fn();
    ours[name] = {std::chrono::duration<double>(Clock::now() - t0).count(), std::move(r.aggregate)};
  };
  time_rule("median", [&] { return robust::median(view); });
  time_rule("trimmed_mean", [&] { return robust::trimmed_mean(view, f); });
  time_rule("krum", [&] { return robust::krum(view, f); });
  time_rule("multi_krum", [&] { return robust::multi_krum(view, f, n - f); });
  if (robust::check_bulyan(n, f)) time_rule("bulyan", [&] { return robust::bulyan(view, f); });
  time_rule("centered_clip", [&] { return robust::centered_clip(view, 1.0, 1); });
  return ours;
}

// The pre-aggregation steps alone (docs/robust.md): what they add in front of any rule. `ok`
// turns false when a step mixes nothing.
std::map<std::string, double> time_steps(const robust::MatrixView& view, std::size_t f, bool& ok) {
  std::map<std::string, double> steps;
  auto time_step = [&](const std::string& name, auto fn) {
    const auto t0 = Clock::now();
    const auto mixed = fn();
    steps[name] = std::chrono::duration<double>(Clock::now() - t0).count();
    if (mixed.sources.empty()) ok = false;
  };
  time_step("nnm (step)", [&] { return robust::nearest_neighbour_mixing(view, f); });
  time_step("bucketing s=2 (step)", [&] { return robust::bucketing(view, 2, 1); });
  return steps;
}

// numpy's seconds per rule, and the largest difference of its aggregate from ours.
struct NumpyRef {
  std::map<std::string, double> seconds, diff;
};

// Runs bench/robust_reference.py on x (freed first: numpy gets the memory).
NumpyRef numpy_reference(std::vector<float>& x, std::size_t n, std::size_t d, std::size_t f,
                         const std::filesystem::path& dir, const std::filesystem::path& script,
                         const std::string& rules, RuleRuns& ours) {
  NumpyRef ref;
  const auto npy = dir / "x.npy";
  save_npy(npy, x.data(), n, d);
  std::vector<float>().swap(x);  // numpy gets the memory
  const std::string cmd = "/usr/bin/python3 " + script.string() + " " + npy.string() + " " +
                          std::to_string(f) + " " + rules;
  FILE* p = ::popen(cmd.c_str(), "r");
  char line[4096];
  while (p && std::fgets(line, sizeof line, p)) {
    auto j = json::parse(line);
    const std::string rule = j["rule"];
    ref.seconds[rule] = j["seconds"];
    const auto theirs = load_npy_vector(j["aggregate"].get<std::string>());
    double diff = 0;
    for (std::size_t k = 0; k < theirs.size() && k < ours[rule].second.size(); ++k) {
      diff = std::max(diff, static_cast<double>(std::abs(theirs[k] - ours[rule].second[k])));
    }
    ref.diff[rule] = theirs.size() == d ? diff : INFINITY;
    std::filesystem::remove(j["aggregate"].get<std::string>());
  }
  if (p) ::pclose(p);
  std::filesystem::remove(npy);
  return ref;
}

// A row per step, against one pass over the matrix.
void report_steps(const std::map<std::string, double>& steps, std::size_t n, std::size_t d, std::size_t f,
                  double pass_s, const RobustBenchOptions& opts, std::vector<std::vector<std::string>>& rows, bool& ok) {
  for (const auto& [step, s] : steps) {
    // Bucketing reads the matrix once and writes n/2 rows; mixing adds the Gram matrix
    // (the dot products Krum needs) to one mixing pass.
    std::string target;
    if (step.rfind("bucketing", 0) == 0) {
      const bool met = s <= 2 * pass_s;
      target = (met ? "met" : "missed") + std::string(" (<=2x pass)");
      ok = ok && met;
    }
    if (opts.json) {
      std::cout << json{{"bench", "robust"}, {"step", step}, {"n", n}, {"d", d}, {"f", f}, {"seconds", s},
                        {"one_pass_seconds", pass_s}}
                       .dump()
                << std::endl;
    }
    rows.push_back({step, std::to_string(n), std::to_string(d), fmt(s, 3), fmt(s / pass_s, 1) + "x", "-", "-", "-",
                    target});
  }
}

// A row per rule, against one pass and numpy.
void report_rules(const RuleRuns& ours, NumpyRef& ref, std::size_t n, std::size_t d, std::size_t f, double pass_s,
                  const RobustBenchOptions& opts, std::vector<std::vector<std::string>>& rows, bool& ok) {
  for (const auto& [rule, res] : ours) {
    const double s = res.first;
    const bool has_ref = ref.seconds.count(rule) > 0;
    const double speedup = has_ref ? ref.seconds[rule] / s : 0;
    std::string target;
    if (rule == "median" || rule == "trimmed_mean") {
      const bool met = s <= 3 * pass_s && (!has_ref || speedup >= 5);
      target = (met ? "met" : "missed") + std::string(" (>=5x numpy, <=3x pass)");
      ok = ok && met;
    } else if (rule == "krum") {
      const bool met = !has_ref || speedup >= 10;
      target = (met ? "met" : "missed") + std::string(" (>=10x numpy)");
      ok = ok && met;
    }
    if (opts.json) {
      json j = {{"bench", "robust"}, {"rule", rule}, {"n", n}, {"d", d}, {"f", f}, {"seconds", s},
                {"one_pass_seconds", pass_s}};
      if (has_ref) {
        j["numpy_seconds"] = ref.seconds[rule];
        j["speedup"] = speedup;
        j["max_abs_diff_vs_numpy"] = ref.diff[rule];
      }
      std::cout << j.dump() << std::endl;
    }
    rows.push_back({rule, std::to_string(n), std::to_string(d), fmt(s, 3), fmt(s / pass_s, 1) + "x",
                    has_ref ? fmt(ref.seconds[rule], 3) : "-", has_ref ? fmt(speedup, 1) + "x" : "-",
                    has_ref ? fmt(ref.diff[rule], 6) : "-", target});
  }
}

}  // namespace

int bench_robust(const RobustBenchOptions& opts) {
  const bool numpy = have_numpy();
  if (!numpy) {
    std::cerr << "numpy reference skipped: /usr/bin/python3 has no numpy (apt-get install python3-numpy)\n";
  }
  const auto script = std::filesystem::path(XSILO_SOURCE_DIR) / "bench" / "robust_reference.py";
  const auto dir = std::filesystem::temp_directory_path() / ("xsilo-bench-robust-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<std::vector<std::string>> rows;
  bool ok = true;
  for (std::size_t n : opts.n) {
    for (std::size_t d : opts.d) {
      const std::size_t f = std::max<std::size_t>(1, n / 10);
      if (!opts.json) std::cerr << "n = " << n << ", d = " << d << " ..." << std::endl;
      auto x = bench_matrix(n, d);
      const robust::MatrixView view{x.data(), n, d};
      const double pass_s = static_cast<double>(n * d * sizeof(float)) / (kMemcpyGBps * 1e9);
      auto ours = time_rules(view, f);
      const auto steps = time_steps(view, f, ok);
      NumpyRef ref;
      if (numpy) ref = numpy_reference(x, n, d, f, dir, script, opts.numpy_rules, ours);
      report_steps(steps, n, d, f, pass_s, opts, rows, ok);
      report_rules(ours, ref, n, d, f, pass_s, opts, rows, ok);
    }
  }
  std::filesystem::remove_all(dir);
  if (!opts.json) {
    print_table({"rule", "n", "d", "seconds", "of one pass", "numpy s", "speed-up", "max |diff|", "target"}, rows);
    std::cout << "one pass = n x d x 4 bytes at " << kMemcpyGBps << " GB/s (DESIGN §11)\n";
  }
  return ok ? 0 : 1;
}

}  // namespace xsilo::tools
