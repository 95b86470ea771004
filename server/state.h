// The server's state folder: checkpoints (one safetensors file per committed round, written
// with fsync + rename), the audit log and its keys, and metrics.csv. Restarting with the same
// config resumes from the last committed round; nothing committed is lost.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>

#include "server/audit.h"
#include "server/config.h"
#include "server/store.h"

namespace xsilo::server {

struct Resume {
  std::uint64_t committed_round = 0;  // 0: start from the initial model
  std::uint64_t last_round = 0;       // highest round number in the audit log
  std::optional<Model> model;
  std::optional<Model> optimizer_state;
  std::optional<double> clip_norm;    // adaptive clipping: where the last committed round left it
};

class ServerState : public Store {
 public:
  // Opens the state folder, creating the audit key on first start.
  ServerState(std::filesystem::path dir, std::size_t keep_checkpoints);

  // Loads the newest checkpoint that matches `layout` and the audit log: a checkpoint of a
  // round the log records as committed must hold the model that record names; one ahead of
  // the log (the server died between the checkpoint and its record) must carry its record as
  // signed, chaining to the log's head, naming its round and model: that exact line is then
  // appended. A checkpoint that fails these checks is skipped, with the reason.
  Resume recover(const Model& layout);

  AuditHead commit(std::uint64_t round, const Model& model, const Model& optimizer_state,
                   const nlohmann::json& audit_record, const MetricsRow& row) override;
  AuditHead record(const nlohmann::json& audit_record, const MetricsRow* row) override;

  AuditLog& audit() { return *audit_; }
  std::filesystem::path checkpoint_path(std::uint64_t round) const;
  std::filesystem::path latest_model_path() const { return dir_ / "model.safetensors"; }

 private:
  void append_metrics(const MetricsRow& row);
  void prune();

  std::filesystem::path dir_;
  std::size_t keep_;
  std::unique_ptr<AuditLog> audit_;
};

// Reads the round number stored in a checkpoint's metadata.
std::uint64_t checkpoint_round(const std::filesystem::path& path);

}  // namespace xsilo::server
