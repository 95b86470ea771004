// The server's state folder: checkpoints (one safetensors file per committed round, written
// with fsync + rename), the audit log and its keys, and metrics.csv; optionally mirrored to a
// second folder on another disk (`state_mirror`: checkpoints, the audit log and its public key).
//
// The rule (docs/operations.md, "When the state folder is damaged"): the server never signs a
// history that contradicts what it signed before, and never continues from a model other than
// the last committed one. On start it checks the state as a whole and acts on what it finds:
//
//   the key        audit.key must be the key the log is signed with now, audit.pub its first
//                  key; a missing audit.key is never replaced while a log or a checkpoint exists,
//                  and audit.pub is never overwritten (rotation: rotate_key()).
//   the log        a torn last line (a crash or a full disk mid-append) is cut and kept aside;
//                  a log that is missing, damaged or shorter than the mirror's is restored from
//                  the mirror; two logs that disagree, a damaged log with no mirror, a log that
//                  is missing while checkpoints exist or shorter than a checkpoint's signed
//                  record shows: refused.
//   the model      the last committed round's checkpoint, by the hash its record names, from
//                  this folder or the mirror; if neither holds it, Resume::missing says so and
//                  the daemon asks the silos that connect for it and takes a copy whose hash
//                  the record names (Coordinator::await_model); if none has it within the join
//                  deadline, it refuses to start, naming the newest round an operator can resume
//                  from (`--resume-from-round N`, recorded in the log as the operator's decision).
//
// Whatever it repaired is written to the audit log (a "state_repair" record) by the daemon once
// its listener is bound: nothing is signed before the server is sure it can run.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "server/audit.h"
#include "server/config.h"
#include "server/store.h"

namespace xsilo::server {

// The state folder cannot be used as it is. One line: the folder or file, what is wrong, and
// what the operator can do. Exit code 2, as a configuration error.
class StateError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

struct StateOptions {
  std::filesystem::path dir;
  std::filesystem::path mirror;  // empty: none
  std::size_t keep_checkpoints = 5;  // 0: keep all
  // The operator's decision to go on from this committed round (`--resume-from-round`).
  std::optional<std::uint64_t> resume_from_round;
};

struct Resume {
  std::uint64_t committed_round = 0;  // 0: start from the initial model
  std::uint64_t last_round = 0;       // highest round number in the audit log
  // Committed rounds of the log up to committed_round (an operator's resume supersedes later
  // ones): buffered rounds' newest model version (Coordinator::resume_version).
  std::uint64_t commits = 0;
  std::optional<Model> model;
  std::optional<Model> optimizer_state;
  std::optional<double> clip_norm;    // adaptive clipping: where the last committed round left it
  // Silo-level central DP: what every committed round of the audit log spent (server/central_dp.h).
  privacy::Ledger central_dp;
  std::uint64_t committed_without_central_dp = 0;  // committed rounds of the log without its noise
  // The last committed round's model is in neither folder: its hashes, to fetch it by.
  struct Missing {
    std::uint64_t round = 0;
    std::string model_sha256, optimizer_sha256;
    std::string why;  // what happened to the copies
  };
  std::optional<Missing> missing;
  // What the start repaired, in sentences (the "state_repair" record), and the operator's
  // decision (the "operator_resume" record), both appended once the listener is bound.
  std::vector<std::string> repairs;
  std::optional<nlohmann::json> decision;
};

class ServerState : public Store {
 public:
  // Takes the state folder (an exclusive lock: one server per folder), checks the key and
  // settles the audit log (repairing what it safely can). Throws StateError otherwise.
  explicit ServerState(StateOptions opts);
  ~ServerState() override;
  // Tests and tools that need no mirror.
  ServerState(std::filesystem::path dir, std::size_t keep_checkpoints)
      : ServerState(StateOptions{.dir = std::move(dir), .mirror = {}, .keep_checkpoints = keep_checkpoints, .resume_from_round = {}}) {}

  // The last committed round and its model, as the rule above says. Throws StateError where the
  // state cannot go on without an operator (Resume::missing is the case a fetch may mend).
  Resume recover(const Model& layout);
  // The model a silo sent for Resume::missing, checked against its hash: written as that round's
  // checkpoint (and to the mirror) and used. Its optimizer state is gone if it had one; the
  // repair, returned for the start's "state_repair" record, says so and the optimizer starts
  // again from zero.
  std::string restore_model(const Resume::Missing& missing, const Model& model);
  // The message to refuse with when nobody could provide the missing model.
  std::string missing_model_error(const Resume::Missing& missing) const;

  AuditHead commit(std::uint64_t round, const Model& model, const Model& optimizer_state,
                   const nlohmann::json& audit_record, const MetricsRow& row) override;
  AuditHead record(const nlohmann::json& audit_record, const MetricsRow* row) override;
  Status check_witness(const std::string& silo, std::uint64_t seq, const std::string& sha256,
                       const std::string& public_key) const override;
  std::vector<AuditKeySpan> audit_keys() const override;

  // Rotates the audit key: the next key is written beside the old one, the rotation record
  // (signed by the old key) appended, then the next key takes the old one's place. A server
  // killed in between finishes the rotation at its next start.
  AuditHead rotate_key(const std::string& by);

  AuditLog& audit() { return *audit_; }
  std::filesystem::path checkpoint_path(std::uint64_t round) const;
  const std::filesystem::path& dir() const { return opts_.dir; }

 private:
  crypto::SigningKey open_key();
  void settle_log(const std::string& first_key, const std::string& signing_key);
  // recover()'s steps, in order (state_recovery.cpp).
  struct AuditHistory;
  AuditHistory read_audit_history() const;
  void append_checkpointed_records(AuditHistory& history, const Model& layout);
  std::uint64_t resume_round(const AuditHistory& history) const;
  Status load_committed_model(std::uint64_t round, const AuditHistory& history, const Model& layout, Resume& r);
  void append_missing_metrics(const AuditHistory& history);
  void append_metrics(const MetricsRow& row);
  void prune(const std::filesystem::path& dir);
  // Whatever is written to the state folder goes to the mirror too; a mirror that fails is
  // logged (an error) and left behind, never the reason a round is lost, and caught up at the
  // next write that succeeds.
  bool mirror_file(const std::filesystem::path& relative);  // whether the mirror holds it now
  void mirror_line(const std::string& line);
  // Copies to the mirror the checkpoints it lacks (never over one it has: at a start, the
  // mirror's copy may be the good one), and, when `log`, the audit log whole. Returns whether
  // the mirror holds all of it now.
  bool catch_up_mirror(bool log);
  void mirror_failed(const std::string& what, const std::exception& e);

  StateOptions opts_;
  // The folder's lock, held while this object lives (released too when its constructor throws).
  struct Lock {
    int fd = -1;
    Lock() = default;
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;
    ~Lock();
  } lock_;
  std::vector<std::string> repairs_;
  std::unique_ptr<AuditLog> audit_;
  bool mirror_behind_ = false;  // a write to the mirror failed; caught up at the next that succeeds
};

// Reads the round number stored in a checkpoint's metadata.
std::uint64_t checkpoint_round(const std::filesystem::path& path);

}  // namespace xsilo::server
