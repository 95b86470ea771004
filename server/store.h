// What the coordinator persists when a round ends. The coordinator calls these from jobs
// that run off the network thread; ServerState writes them to disk, tests keep them in memory.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/model.h"
#include "common/result.h"
#include "server/audit.h"
#include "server/metrics.h"

namespace xsilo::server {

class Store {
 public:
  virtual ~Store() = default;
  // A committed round: the checkpoint first (durable, with the audit record as signed), then the
  // audit record and metrics. Returns the audit log's signed head after the record.
  virtual AuditHead commit(std::uint64_t round, const Model& model, const Model& optimizer_state,
                           const nlohmann::json& audit_record, const MetricsRow& row) = 0;
  // Any other audited event (aborted round, start, end); `row` may be null.
  virtual AuditHead record(const nlohmann::json& audit_record, const MetricsRow* row) = 0;
  // Success when the log holds record `seq` with line hash `sha256` under one of its keys (raw
  // `public_key`), as silo `silo` witnessed; otherwise why not (the log is not the history the
  // silo saw: cut, forked, or another one). A store that keeps no log has nothing to check.
  virtual Status check_witness(const std::string& /*silo*/, std::uint64_t /*seq*/, const std::string& /*sha256*/,
                               const std::string& /*public_key*/) const {
    return {};
  }
  // The log's keys, the first one first (the last signs now): silos get them in each RoundStart
  // and accept heads only under a key they can reach from the one they witnessed first.
  virtual std::vector<AuditKeySpan> audit_keys() const { return {}; }
};

}  // namespace xsilo::server
