#include "server/schedule.h"

#include <cmath>

namespace xsilo::server {

std::string_view name(ScheduleMode m) { return m == ScheduleMode::Buffered ? "buffered" : "synchronous"; }

std::string_view name(Staleness s) {
  switch (s) {
    case Staleness::Polynomial: return "polynomial";
    case Staleness::Constant: return "constant";
    case Staleness::Hinge: return "hinge";
  }
  return "polynomial";
}

double staleness_weight(const ScheduleConfig& c, std::uint64_t tau) {
  const auto t = static_cast<double>(tau);
  switch (c.staleness) {
    case Staleness::Constant: return 1.0;
    case Staleness::Polynomial: return std::pow(1.0 + t, -c.a);
    case Staleness::Hinge: return tau <= c.b ? 1.0 : 1.0 / (c.a * (t - static_cast<double>(c.b)) + 1.0);
  }
  return 1.0;
}

Admission admit(const ScheduleConfig& c, std::uint64_t base, std::uint64_t newest) {
  if (base > newest) {
    return {false, 0, "its base model version " + std::to_string(base) + " is newer than the newest committed (" +
                          std::to_string(newest) + ")"};
  }
  const std::uint64_t tau = newest - base;
  if (tau > c.max_staleness) {
    return {false, tau, "too stale: trained on version " + std::to_string(base) + ", " + std::to_string(tau) +
                            " versions behind the newest (" + std::to_string(newest) + "), schedule.max_staleness is " +
                            std::to_string(c.max_staleness)};
  }
  return {true, tau, ""};
}

nlohmann::json to_json(const ScheduleConfig& c) {
  if (!c.buffered()) return nlohmann::json::object();
  nlohmann::json j = {{"mode", name(c.mode)},
                      {"k", c.k},
                      {"max_staleness", c.max_staleness},
                      {"staleness", {{"kind", name(c.staleness)}, {"a", c.a}}}};
  if (c.staleness == Staleness::Hinge) j["staleness"]["b"] = c.b;
  if (c.staleness == Staleness::Constant) j["staleness"].erase("a");
  return j;
}

}  // namespace xsilo::server
