// What the coordinator persists when a round ends. The coordinator calls these from jobs
// that run off the network thread; ServerState writes them to disk, tests keep them in memory.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/model.h"

namespace xsilo::server {

struct MetricsRow {
  std::uint64_t round = 0;
  bool committed = false;
  std::size_t selected = 0, reported = 0, dropped = 0;
  double train_loss = 0, fed_eval_loss = 0, fed_eval_accuracy = 0;
  double seconds = 0;
  std::uint64_t upload_bytes = 0;
  std::size_t edges = 0;  // edges that carried at least one participant
};

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
