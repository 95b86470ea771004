// What the coordinator persists when a round ends. The coordinator calls these from jobs
// that run off the network thread; ServerState writes them to disk, tests keep them in memory.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/model.h"
#include "server/metrics.h"

namespace xsilo::server {


class Store {
 public:
  virtual ~Store() = default;
  // A committed round: the checkpoint first (durable), then its audit record and metrics.
  virtual void commit(std::uint64_t round, const Model& model, const Model& optimizer_state,
                      const nlohmann::json& audit_record, const MetricsRow& row) = 0;
  // Any other audited event (aborted round, start, end); `row` may be null.
  virtual void record(const nlohmann::json& audit_record, const MetricsRow* row) = 0;
};

}  // namespace xsilo::server
