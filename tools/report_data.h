// What the report (tools/report.h) knows of a run, folded from the files the run left: each round
// audit record as it is read (records are not kept: a log of 2,000 rounds of 400 silos is tens
// of megabytes of JSON, its fold a few), then metrics.csv and events.jsonl by round number.
// Nothing here is guessed: a field that no file carries stays unset, and the page says so.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/audit.h"

namespace xsilo::tools::report {

// What happened to a silo in a round, as the round's record says (participants, dropouts,
// surplus). Byzantine: dropped for cause `non_finite` or `excluded` (caught misbehaving).
enum class Outcome : std::uint8_t { NotSelected, Committed, Surplus, Dropped, Byzantine };
// What the robust rule did with a silo's update, or with the mean of its secure group.
enum class Decision : std::uint8_t { None, Kept, Clipped, Filtered };

struct SiloRound {
  std::uint32_t silo = 0;           // Run::silos
  Outcome outcome = Outcome::NotSelected;
  Decision decision = Decision::None;
  std::uint32_t edge = 0;           // Run::edges; 0: straight to the server
  std::uint32_t why = 0;            // Run::notes: the drop reason; 0: none
  std::uint32_t decided = 0;        // Run::notes: the robust decision in words; 0: none
  float score = NAN, norm = NAN;    // the decision's numbers (kept apart: the words repeat, they do not)
  float eval_accuracy = NAN;        // participants[].metrics.eval_accuracy, when recorded
  // Its timeline (the record's participants[] or dropouts[] "timeline"), in seconds since the
  // round started; "train" is the silo's own report. NAN where the record has none.
  struct Times {
    float model_sent = NAN, train = NAN, ready = NAN, granted = NAN, received = NAN;
  } times;
};

struct Round {
  std::uint64_t round = 0;
  bool has_record = false, committed = false, verified = false, secure = false;
  std::string reason;               // why it aborted
  std::int64_t started_ms = -1, ended_ms = -1;  // the record's started_at, ended_at
  // events.jsonl (the server's progress events; the last start of the round wins after a restart)
  std::int64_t ev_started = -1, ev_first_grant = -1, ev_closed = -1, ev_done = -1;
  std::uint64_t uploads = 0;        // upload_granted events: uploads of silos or edges' partial sums
  std::optional<std::uint64_t> upload_bytes, broadcast_bytes, broadcast_delta_bytes;
  std::string compression, broadcast;  // the schemes in words ("" when none)
  std::string rule;                 // the rule applied, with a fallback's reason
  // The round's privacy spend (docs/audit.md): under silo-level DP the federation's (its record's
  // privacy.epsilon so far, and its growth since the round before); under record-level DP alone,
  // the largest silo's; else the record's privacy.epsilon_spent and epsilon_total.
  std::optional<double> epsilon_spent, epsilon_total, delta;
  std::string privacy_mode;         // "silo-level central DP", "silo-level distributed DP", "record-level DP" or ""
  // Under silo-level DP, the largest silo's own record-level epsilon so far, where silos carry one.
  std::optional<double> record_level_total;
  // metrics.csv: held-out accuracy and loss (xsilo sim's file), the federated evaluation
  double accuracy = NAN, loss = NAN, fed_eval_accuracy = NAN, fed_eval_loss = NAN;
  std::vector<SiloRound> silos;
};

struct AuditCheck {
  // The server's own verifier's answer: the whole chain, or where it breaks and what verified
  // before it. Empty when there was no log or no key to check it with (why_not says which).
  std::optional<server::AuditVerifyResult> verified;
  std::string why_not;
  std::string key_hex;              // the key it was checked with
};

struct Run {
  std::string title;
  std::vector<std::string> silos, edges{""}, notes{""};
  std::map<std::uint64_t, Round> rounds;
  AuditCheck audit;
  std::vector<std::string> read;    // the files drawn from, for the page
  std::vector<std::string> problems;  // what could not be read, and why
  std::vector<std::string> admin;   // operators' commands from the log
  std::uint64_t records = 0;        // audit records read
  double baseline_accuracy = -1;    // summary.json: centralized training on the pooled data
  std::uint64_t model_parameters = 0;  // model.safetensors: for the float32 size of an upload
  // The epsilon spent in the rounds read so far: the federation's (silo level, either mode) and
  // the largest silo's (record level).
  double silo_epsilon = 0, record_epsilon = 0;

  std::uint32_t silo_id(const std::string& name);
  std::uint32_t edge_id(const std::string& name);
  std::uint32_t note_id(const std::string& text);
  Round& at(std::uint64_t round);

 private:
  std::unordered_map<std::string, std::uint32_t> silo_ids_, edge_ids_, note_ids_;
};

// Folds one audit record (any event) into the run. `verified`: the record is in the part of the
// log that verified.
void fold_record(Run& run, const nlohmann::json& record, bool verified);
// Reads the log a line at a time: a line that is not JSON is skipped and named in problems.
void read_audit(Run& run, const std::filesystem::path& log, std::uint64_t verified_records);
// Checks the chain with the server's own verifier; never throws (a missing key is a why_not).
AuditCheck check_audit(const std::filesystem::path& log, const std::filesystem::path& key);
void read_metrics(Run& run, const std::filesystem::path& csv);
void read_events(Run& run, const std::filesystem::path& events);
void read_summary(Run& run, const std::filesystem::path& summary);
void read_model_size(Run& run, const std::filesystem::path& safetensors);

// "2026-11-30T08:26:33.123Z" -> unix ms; nullopt for anything else.
std::optional<std::int64_t> parse_time(const std::string& iso);

}  // namespace xsilo::tools::report
