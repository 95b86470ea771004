// A round's members as the coordinator tracks them, and what a finished round turns into:
// its audit record and its metrics row, as pure functions of a summary.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/xsilo.pb.h"
#include "server/membership.h"
#include "server/metrics.h"

namespace xsilo::server {

enum class MemberState { Training, Ready, Uploading, Done, Dropped, Surplus };
inline constexpr std::size_t kMemberStates = static_cast<std::size_t>(MemberState::Surplus) + 1;  // the last
std::string_view name(MemberState s);

// Where in the round a member was lost, and why (the record says both; `detail` adds the
// sentence for people).
enum class DropPhase { Train, Upload, Validation, Secure, Unmask };
enum class DropCause {
  Disconnected,      // its connection (or its edge) went away
  Deadline,          // missed the phase's deadline
  StillPending,      // had not finished when the round closed
  ZeroSamples,       // reported no training samples
  TrainingFailed,    // the silo reported that its training failed (its trainer's error)
  BadUpload,         // an upload that does not match the model (layout, size, weight)
  NonFinite,         // NaN or infinite values: Byzantine, and counted against f
  HashMismatch,      // the bytes do not match the declared SHA-256
  EdgeRejected,      // its edge's partial sum was refused
  NotInPartialSum,   // its edge's partial sum left it out
  SecureGroupFailed, // its secure group fell below the threshold or failed its checks
  SecureNoKeys,      // sent no valid signed keys to its secure group in time
  SecureNoShares,    // sent no valid signed shares to its secure group in time
  SecureNoReceipt,   // sent no receipt for the shares it was dealt
  Excluded,          // excluded from its secure group with proof of misbehaviour (Byzantine)
};
std::string_view name(DropPhase p);
std::string_view name(DropCause c);

struct Member {
  std::string silo;
  SessionId session = 0;       // its own connection, or its edge's; 0 once gone
  bool relayed = false;        // `session` is an edge's: messages to it name the silo
  std::string edge;            // the edge that carried it this round, if any
  MemberState state = MemberState::Training;
  DropPhase drop_phase = DropPhase::Train;
  DropCause drop_cause = DropCause::Disconnected;
  std::string drop_reason;
  std::uint64_t num_samples = 0;
  double weight = 0;
  wire::TrainMetrics metrics;
  wire::PrivacySpend privacy;  // record-level privacy: the silo's own account (mechanism empty: none)
  std::string update_sha256;   // of the bytes the silo sent (behind an edge: its own signed word)
  bool update_signed = false;  // behind an edge: the silo's signature on it was checked
  // The round of the RoundStart this member trains on: the round itself, except in buffered
  // rounds, where a silo still training when a round commits goes on into the next (its base
  // model version is base_version). Its staleness and s(staleness) once its upload is granted.
  std::uint64_t base_round = 0;
  // Buffered rounds: the model version its start was sent with (the number of commits before
  // it; aborted rounds commit nothing) and that model's SHA-256, stored when the start is sent.
  std::uint64_t base_version = 0;
  std::string base_sha256;
  // Buffered rounds: the training deadlines it has been training through since its start
  // (carried across commits); at max_staleness + 1 it is dropped (docs/buffered.md).
  std::uint64_t deadlines = 0;
  std::uint64_t staleness = 0;
  double staleness_weight = 1;
  // When the server saw each step of this member's round, in ms since the round started (-1:
  // not seen): the model's last byte written to it (behind an edge: to its edge), its
  // UpdateReady, the grant of the upload that carried it, that upload whole, and folded.
  struct Times {
    std::int64_t model_sent = -1, ready = -1, granted = -1, received = -1, folded = -1;
  } times;
  bool via_edge() const { return !edge.empty(); }
};

struct RoundSummary {
  std::string federation;
  std::uint64_t round = 0;
  bool committed = false;
  std::string reason;                 // why it aborted
  std::int64_t started_ms = 0, ended_ms = 0;
  const std::vector<Member>* members = nullptr;
  std::size_t target = 0;
  std::string rule, optimizer;
  double silo_momentum = 0;  // the plan's: silos uploaded their momentum, not their deltas
  double total_weight = 0;
  std::uint64_t upload_bytes = 0;
  nlohmann::json compression;         // the round's scheme (protocol::to_json), null when none
  std::uint64_t broadcast_bytes = 0;  // model data sent to silos and edges at the round's start
  nlohmann::json broadcast;           // a compressed broadcast: its scheme, deltas and wholes sent, base
  bool secure = false;                // sample counts and weights stay inside the masked sums
  nlohmann::json secure_groups;       // secure: the groups as set up (SecureRound::describe)
  nlohmann::json regions;             // edges: each partial sum folded (edge, its SHA-256, its silos)
  std::string model_sha256_before, model_sha256_after;
  std::string config_sha256;
  // Buffered rounds: the schedule (to_json(ScheduleConfig)) and the updates refused since the
  // last commit (silo, base_version, staleness, reason); null in synchronous rounds.
  nlohmann::json schedule, refused;
  // Buffered rounds: drops of members that rejoined the round since (their entries in
  // `members` are the rejoined ones); each goes into the record's dropouts.
  nlohmann::json rejoined;
  // When each phase after collection began, in ms since the round started ("unmask", "commit").
  std::vector<std::pair<std::string, std::int64_t>> phases;
};

// A member's timeline for its record: seconds since the round started for each step the server
// saw, and the training time the silo reported ("train"); empty when nothing was seen.
nlohmann::json member_timeline(const Member& m);
// A participant's idle seconds in a round, from its timeline (seconds since the round started):
// waiting for its upload slot (ready to granted) and, its upload received, for the round to
// close at `closed`. Negative stretches (clock steps, a restart) count as none.
double idle_seconds(double ready, double granted, double received, double closed);

nlohmann::json round_record(const RoundSummary& s);
MetricsRow metrics_row(const RoundSummary& s);
// "2026-11-30T08:26:33.000Z"
std::string iso_time(std::int64_t unix_ms);

}  // namespace xsilo::server
