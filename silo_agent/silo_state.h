// The silo's state folder (the agent's `state_dir`): its own logs, and the state it carries from
// one round to the next.
//
//   sent.jsonl                     one line per upload: round, hashes, weight (never data); under
//                                  distributed DP also one per release of unmask shares (kind
//                                  "unmask_shares_released": round and setup hash), written
//                                  durably before the shares leave
//   audit_heads.jsonl              the server's signed audit heads this silo witnessed
//   momentum.safetensors           silo momentum (TrainingPlan.silo_momentum)
//   error_feedback.safetensors     what compression left out of the uploads so far
//   error_feedback.staged.safetensors
//                                  the error feedback after the upload in flight, written by the
//                                  training job; it becomes the silo's once that upload's line of
//                                  sent.jsonl is durable, before a byte of the upload leaves
//
// The rule that makes a crash at any instant harmless: a line of sent.jsonl is written (fsync)
// before the upload it names leaves, and error feedback moves on exactly with those lines (the
// line carries the hash of the residual after it). So every update the server counts is in the
// silo's log, and after any crash the residual on disk is the one the log's last line names.
// repair_state() restores that at start, whatever instant the last run ended at.
#pragma once

#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/xsilo.pb.h"

namespace xsilo::agent {

// The staged error feedback beside `residual_file` (error_feedback.staged.safetensors).
std::filesystem::path staged_path(const std::filesystem::path& residual_file);

// Appends `entry` as one line of `log` (durably: fsync); then, when `staged` is not empty,
// renames it onto `onto` (and syncs the folder). A line is never appended to a torn one.
void commit_record(const std::filesystem::path& log, const nlohmann::json& entry,
                   const std::filesystem::path& staged = {}, const std::filesystem::path& onto = {});

// Brings the state folder back to a state a run can end in, and says what it changed (one
// sentence each, for the log):
// - a torn last line of sent.jsonl or audit_heads.jsonl (a crash or a full disk while it was
//   appended) is cut, keeping the lines before it;
// - temporary files of interrupted writes (NAME.tmpNNN) are removed;
// - staged error feedback is promoted when the last line of sent.jsonl names it (the crash
//   came between that line and the rename) and removed otherwise (its upload never left).
std::vector<std::string> repair_state(const std::filesystem::path& dir);

// The last head of audit_heads.jsonl that names the key it was checked under, if any.
std::optional<wire::Witness> last_witnessed(const std::filesystem::path& dir);

// The audit records (as "SEQ:SHA256" of their signed heads) sent.jsonl says this silo released
// its unmask shares against in `federation`: a silo releases against each record once (one run of
// a round per charge, docs/privacy.md). Lines of other federations, and damaged lines, name none.
std::set<std::string> unmask_releases(const std::filesystem::path& dir, const std::string& federation);

// The hash sent.jsonl records for a residual (SHA-256 of its float32 values).
std::string residual_sha256(const std::filesystem::path& file);

}  // namespace xsilo::agent
