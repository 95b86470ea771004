// A daemon's operational metrics in the Prometheus text format (version 0.0.4): counters,
// gauges and summaries (a _sum and a _count, no quantiles), each family declared once with its
// help text, each series named by its labels. Thread-safe: the network thread and the worker
// may both record.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xsilo {

using Labels = std::vector<std::pair<std::string, std::string>>;

class MetricRegistry {
 public:
  enum class Type { Counter, Gauge, Summary };
  // Declares a family; recording into an undeclared name throws std::logic_error (a typo in a
  // metric name is a bug, not a new metric). Names follow Prometheus conventions: counters end
  // in _total, units are base units (_seconds, _bytes).
  // `labeled`: its series carry labels (an unlabeled family shows 0 before its first value).
  void declare(const std::string& name, Type type, const std::string& help, bool labeled = false);

  void add(const std::string& name, double value = 1, const Labels& labels = {});   // counter
  void set(const std::string& name, double value, const Labels& labels = {});       // gauge (or a counter kept elsewhere)
  void observe(const std::string& name, double value, const Labels& labels = {});   // summary
  void set_summary(const std::string& name, double sum, std::uint64_t count, const Labels& labels = {});  // kept elsewhere
  // The current value of a counter or gauge series (0 when it has none yet); for tests.
  double value(const std::string& name, const Labels& labels = {}) const;

  // The exposition: families in declaration order, series in label order.
  std::string text() const;

 private:
  struct Series {
    double value = 0;  // counter, gauge; a summary's sum
    std::uint64_t count = 0;
  };
  struct Family {
    Type type;
    std::string help;
    bool labeled = false;
    std::map<std::string, Series> series;  // by rendered label set ("" or {a="b",...})
  };
  Family& family(const std::string& name, Type type);
  mutable std::mutex mu_;
  std::vector<std::string> order_;
  std::map<std::string, Family> families_;
};

// {a="b",c="d"} with the values escaped as the format asks; "" for no labels.
std::string render_labels(const Labels& labels);

}  // namespace xsilo
