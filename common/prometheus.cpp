#include "common/prometheus.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace xsilo {

namespace {

std::string_view type_name(MetricRegistry::Type t) {
  switch (t) {
    case MetricRegistry::Type::Counter: return "counter";
    case MetricRegistry::Type::Gauge: return "gauge";
    case MetricRegistry::Type::Summary: return "summary";
  }
  return "untyped";
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// HELP text escapes backslash and newline; label values also the double quote.
std::string escape(std::string_view s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string render_labels(const Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (i) out += ',';
    out += labels[i].first + "=\"" + escape(labels[i].second, true) + "\"";
  }
  return out + "}";
}

void MetricRegistry::declare(const std::string& name, Type type, const std::string& help, bool labeled) {
  std::lock_guard lock(mu_);
  if (families_.count(name)) throw std::logic_error("metric " + name + " declared twice");
  families_.emplace(name, Family{.type = type, .help = help, .labeled = labeled, .series = {}});
  order_.push_back(name);
}

MetricRegistry::Family& MetricRegistry::family(const std::string& name, Type type) {
  auto it = families_.find(name);
  if (it == families_.end()) throw std::logic_error("metric " + name + " was never declared");
  if (it->second.type != type) throw std::logic_error("metric " + name + " is a " + std::string(type_name(it->second.type)));
  return it->second;
}

void MetricRegistry::add(const std::string& name, double value, const Labels& labels) {
  std::lock_guard lock(mu_);
  family(name, Type::Counter).series[render_labels(labels)].value += value;
}

void MetricRegistry::set(const std::string& name, double value, const Labels& labels) {
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second.type == Type::Summary) {
    throw std::logic_error("metric " + name + " is not a declared counter or gauge");
  }
  it->second.series[render_labels(labels)].value = value;
}

void MetricRegistry::observe(const std::string& name, double value, const Labels& labels) {
  std::lock_guard lock(mu_);
  auto& s = family(name, Type::Summary).series[render_labels(labels)];
  s.value += value;
  ++s.count;
}

void MetricRegistry::set_summary(const std::string& name, double sum, std::uint64_t count, const Labels& labels) {
  std::lock_guard lock(mu_);
  auto& s = family(name, Type::Summary).series[render_labels(labels)];
  s.value = sum;
  s.count = count;
}

double MetricRegistry::value(const std::string& name, const Labels& labels) const {
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) throw std::logic_error("metric " + name + " was never declared");
  auto s = it->second.series.find(render_labels(labels));
  return s == it->second.series.end() ? 0.0 : s->second.value;
}

std::string MetricRegistry::text() const {
  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& name : order_) {
    const auto& f = families_.at(name);
    out += "# HELP " + name + " " + escape(f.help, false) + "\n";
    out += "# TYPE " + name + " " + std::string(type_name(f.type)) + "\n";
    // A counter or gauge without labels is shown at 0 before its first event, so that a
    // dashboard sees the series from the start.
    if (f.series.empty() && !f.labeled && f.type != Type::Summary) out += name + " 0\n";
    for (const auto& [labels, s] : f.series) {
      if (f.type == Type::Summary) {
        out += name + "_sum" + labels + " " + number(s.value) + "\n";
        out += name + "_count" + labels + " " + std::to_string(s.count) + "\n";
      } else {
        out += name + labels + " " + number(s.value) + "\n";
      }
    }
  }
  return out;
}

}  // namespace xsilo
