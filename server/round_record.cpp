#include "server/round_record.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <set>

#include "protocol/privacy.h"

namespace xsilo::server {

std::string_view name(MemberState s) {
  switch (s) {
    case MemberState::Training: return "training";
    case MemberState::Ready: return "ready";
    case MemberState::Uploading: return "uploading";
    case MemberState::Done: return "done";
    case MemberState::Dropped: return "dropped";
    case MemberState::Surplus: return "surplus";
  }
  return "?";
}

std::string_view name(DropPhase p) {
  switch (p) {
    case DropPhase::Train: return "train";
    case DropPhase::Upload: return "upload";
    case DropPhase::Validation: return "validation";
    case DropPhase::Secure: return "secure";
    case DropPhase::Unmask: return "unmask";
  }
  return "?";
}

std::string_view name(DropCause c) {
  switch (c) {
    case DropCause::Disconnected: return "disconnected";
    case DropCause::Deadline: return "deadline";
    case DropCause::StillPending: return "still_pending";
    case DropCause::ZeroSamples: return "zero_samples";
    case DropCause::TrainingFailed: return "training_failed";
    case DropCause::BadUpload: return "bad_upload";
    case DropCause::NonFinite: return "non_finite";
    case DropCause::HashMismatch: return "hash_mismatch";
    case DropCause::EdgeRejected: return "edge_rejected";
    case DropCause::NotInPartialSum: return "not_in_partial_sum";
    case DropCause::SecureGroupFailed: return "secure_group_failed";
    case DropCause::SecureNoKeys: return "secure_no_keys";
    case DropCause::SecureNoShares: return "secure_no_shares";
    case DropCause::SecureNoReceipt: return "secure_no_receipt";
    case DropCause::Excluded: return "excluded";
  }
  return "?";
}

std::string iso_time(std::int64_t unix_ms) {
  const std::time_t secs = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[48];
  std::snprintf(out, sizeof out, "%s.%03dZ", buf, static_cast<int>(unix_ms % 1000));
  return out;
}

double idle_seconds(double ready, double granted, double received, double closed) {
  return std::max(0.0, granted - ready) + std::max(0.0, closed - received);
}

nlohmann::json member_timeline(const Member& m) {
  nlohmann::json t = nlohmann::json::object();
  const auto at = [&](const char* key, std::int64_t ms) {
    if (ms >= 0) t[key] = static_cast<double>(ms) / 1000.0;
  };
  at("model_sent", m.times.model_sent);
  if (m.metrics.train_seconds() > 0) t["train"] = m.metrics.train_seconds();
  at("ready", m.times.ready);
  at("granted", m.times.granted);
  at("received", m.times.received);
  at("folded", m.times.folded);
  return t;
}

nlohmann::json round_record(const RoundSummary& s) {
  using json = nlohmann::json;
  json participants = json::array(), dropouts = json::array(), surplus = json::array(), selected = json::array(),
       training = json::array();
  for (const auto& mb : *s.members) {
    selected.push_back(mb.silo);
    if (mb.state == MemberState::Done) {
      // With secure aggregation a silo's sample count and weight stay inside the masked sum.
      participants.push_back(s.secure ? json{{"silo", mb.silo}, {"update_sha256", mb.update_sha256}}
                                      : json{{"silo", mb.silo},
                                             {"num_samples", mb.num_samples},
                                             {"weight", mb.weight},
                                             {"update_sha256", mb.update_sha256}});
      if (mb.via_edge()) participants.back()["edge"] = mb.edge;
      if (!s.schedule.is_null()) {
        // Model version v is the model of the v-th commit, as sent with the member's start.
        participants.back()["base_version"] = mb.base_version;
        if (!mb.base_sha256.empty()) participants.back()["base_model_sha256"] = mb.base_sha256;
        participants.back()["staleness"] = mb.staleness;
        participants.back()["staleness_weight"] = mb.staleness_weight;
      }
      if (mb.update_signed) participants.back()["update_signed"] = true;
      // Its record-level privacy as it accounts it: the parameters let an auditor recompute the
      // epsilon (xsilo audit verify).
      if (!mb.privacy.mechanism().empty()) participants.back()["privacy"] = protocol::privacy_json(mb.privacy);
      // Its evaluation of the round's model on its own test rows, which the server receives in
      // UpdateReady: a silo doing badly stays visible behind a good mean (the report draws it).
      if (mb.metrics.eval_samples() > 0) {
        participants.back()["metrics"] = {{"eval_accuracy", mb.metrics.eval_accuracy()},
                                          {"eval_loss", mb.metrics.eval_loss()},
                                          {"eval_samples", mb.metrics.eval_samples()}};
      }
      if (auto t = member_timeline(mb); !t.empty()) participants.back()["timeline"] = std::move(t);
    } else if (mb.state == MemberState::Dropped) {
      dropouts.push_back({{"silo", mb.silo},
                          {"phase", std::string(name(mb.drop_phase))},
                          {"cause", std::string(name(mb.drop_cause))},
                          {"reason", mb.drop_reason}});
      if (mb.via_edge()) dropouts.back()["edge"] = mb.edge;
      if (auto t = member_timeline(mb); !t.empty()) dropouts.back()["timeline"] = std::move(t);
    } else if (mb.state == MemberState::Surplus) {
      surplus.push_back(mb.silo);
    } else if (!s.schedule.is_null()) {
      training.push_back(mb.silo);  // buffered: still training, its update goes into a later commit
    }
  }
  if (s.rejoined.is_array()) {
    for (const auto& d : s.rejoined) dropouts.push_back(d);
  }
  json r = {{"event", "round"},
            {"federation", s.federation},
            {"round", s.round},
            {"status", s.committed ? "committed" : "aborted"},
            {"started_at", iso_time(s.started_ms)},
            {"ended_at", iso_time(s.ended_ms)},
            {"selected", selected},
            {"target", s.target},
            {"participants", participants},
            {"dropouts", dropouts},
            {"surplus", surplus},
            {"aggregation", {{"rule", s.rule}, {"optimizer", s.optimizer}, {"total_weight", s.total_weight}}},
            {"model_sha256_before", s.model_sha256_before},
            {"model_sha256_after", s.model_sha256_after},
            {"config_sha256", s.config_sha256}};
  if (!s.committed) r["reason"] = s.reason;
  if (s.secure) r["secure"] = s.secure_groups;
  if (!s.schedule.is_null()) {
    r["schedule"] = s.schedule;
    r["refused"] = s.refused.is_null() ? json::array() : s.refused;
    r["training"] = std::move(training);
  }
  if (s.regions.is_array() && !s.regions.empty()) r["regions"] = s.regions;
  if (s.silo_momentum > 0) r["aggregation"]["silo_momentum"] = s.silo_momentum;
  if (!s.compression.is_null()) r["compression"] = s.compression;
  r["upload_bytes"] = s.upload_bytes;
  r["broadcast_bytes"] = s.broadcast_bytes;
  if (!s.broadcast.is_null()) r["broadcast"] = s.broadcast;
  if (!s.phases.empty()) {
    json phases = json::object();
    for (const auto& [phase, ms] : s.phases) phases[phase] = static_cast<double>(ms) / 1000.0;
    r["phases"] = std::move(phases);
  }
  return r;
}

MetricsRow metrics_row(const RoundSummary& s) {
  MetricsRow row;
  row.round = s.round;
  row.committed = s.committed;
  row.selected = s.members->size();
  double train_w = 0, eval_w = 0;
  std::set<std::string> edges;
  for (const auto& mb : *s.members) {
    if (mb.state == MemberState::Dropped) ++row.dropped;
    if (mb.state == MemberState::Done) {
      ++row.reported;
      row.train_loss += mb.metrics.train_loss() * static_cast<double>(mb.num_samples);
      train_w += static_cast<double>(mb.num_samples);
      if (mb.via_edge()) edges.insert(mb.edge);
    }
    if (mb.metrics.eval_samples() > 0) {
      const auto w = static_cast<double>(mb.metrics.eval_samples());
      row.fed_eval_loss += mb.metrics.eval_loss() * w;
      row.fed_eval_accuracy += mb.metrics.eval_accuracy() * w;
      eval_w += w;
    }
  }
  if (train_w > 0) row.train_loss /= train_w;
  if (eval_w > 0) {
    row.fed_eval_loss /= eval_w;
    row.fed_eval_accuracy /= eval_w;
  }
  row.seconds = static_cast<double>(s.ended_ms - s.started_ms) / 1000.0;
  row.upload_bytes = s.upload_bytes;
  row.edges = edges.size();
  return row;
}

}  // namespace xsilo::server
