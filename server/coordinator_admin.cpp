// The coordinator's operator facade: admin commands (pause, resume, stop, each audited) and the
// federation's status for `xsilo status` and the metrics endpoint.
#include <spdlog/spdlog.h>

#include "server/coordinator_round.h"

namespace xsilo::server {

std::string_view name(Phase p) {
  switch (p) {
    case Phase::Joining: return "join";
    case Phase::Collecting: return "collect";
    case Phase::Unmasking: return "unmask";
    case Phase::Closing: return "commit";
    case Phase::Finished: return "finished";
  }
  return "?";
}

void Coordinator::audit_admin(const std::string& command, const std::string& admin, std::int64_t now_ms) {
  ++totals_.admin_commands;
  nlohmann::json rec = {{"event", "admin"},     {"command", command},        {"admin", admin},
                        {"round", round_},      {"phase", name(phase_)},     {"time", iso_time(now_ms)}};
  // In order with the round's jobs on the worker, which write the same log.
  actions_.push_back(action::Background{[&store = store_, rec] { store.record(rec, nullptr); }});
  event("admin_" + command, admin);  // for whoever follows events.jsonl
}

std::pair<bool, std::string> Coordinator::admin(wire::AdminRequest::Command command, const std::string& admin,
                                                std::int64_t now_ms) {
  if (phase_ == Phase::Finished) return {false, "the federation has finished"};
  if (fetch_) {
    // Nothing may be signed before the last committed model is back (await_model): a stop
    // ends the wait as a refusal would, with nothing written to the audit log.
    if (command != wire::AdminRequest::STOP) {
      return {false, "the server is waiting for the silos to send the model of committed round " +
                         std::to_string(fetch_->round) + "; only stop applies"};
    }
    if (!std::exchange(fetch_->stopped, true)) {
      actions_.push_back(action::Stop{"stopped by admin " + admin + " while waiting for the model of committed round " +
                                      std::to_string(fetch_->round) + ": " + fetch_->refusal});
    }
    return {true, "stopping: nothing was signed; the server exits with code 2"};
  }
  const bool between = phase_ == Phase::Joining && job_ == JobKind::None;
  switch (command) {
    case wire::AdminRequest::PAUSE:
      if (paused_) return {false, "already paused (by " + paused_by_ + ")"};
      if (stop_requested_) return {false, "the federation is stopping"};
      paused_ = true;
      paused_by_ = admin;
      audit_admin("pause", admin, now_ms);
      spdlog::warn("admin {} paused the federation: {}", admin,
                   between ? "no round starts until resumed" : "round " + std::to_string(round_) + " finishes, then none starts until resumed");
      return {true, between ? "paused before round " + std::to_string(round_)
                            : "pausing: round " + std::to_string(round_) + " finishes first"};
    case wire::AdminRequest::RESUME:
      if (!paused_) return {false, "not paused"};
      paused_ = false;
      audit_admin("resume", admin, now_ms);
      spdlog::warn("admin {} resumed the federation", admin);
      try_start_round(now_ms);
      return {true, "resumed at round " + std::to_string(round_)};
    case wire::AdminRequest::STOP:
      if (stop_requested_) return {false, "already stopping (asked by " + stopped_by_ + ")"};
      stop_requested_ = true;
      stopped_by_ = admin;
      audit_admin("stop", admin, now_ms);
      spdlog::warn("admin {} stopped the federation{}", admin,
                   between ? "" : ": round " + std::to_string(round_) + " finishes first");
      if (between) end_federation("stopped by admin " + admin, now_ms);
      return {true, between ? "stopped before round " + std::to_string(round_)
                            : "stopping: round " + std::to_string(round_) + " finishes first"};
    default:
      return {false, "unknown command"};
  }
}

std::optional<std::int64_t> Coordinator::relayed_not_after(const std::string& silo) const {
  auto it = relayed_not_after_.find(silo);
  if (it == relayed_not_after_.end()) return std::nullopt;
  return it->second;
}

nlohmann::json Coordinator::status(std::int64_t now_ms) const {
  nlohmann::json j = {{"federation", cfg_.federation},
                      {"round", round_},
                      {"rounds", cfg_.rounds},
                      {"phase", name(phase_)},
                      {"phase_seconds", static_cast<double>(now_ms - phase_since_ms_) / 1000.0},
                      {"paused", paused_},
                      {"stopping", stop_requested_},
                      {"committed", committed_},
                      {"aborted", aborted_},
                      {"model_sha256", global_sha_}};
  if (paused_) j["paused_by"] = paused_by_;
  if (stop_requested_) j["stopped_by"] = stopped_by_;
  if (fetch_) {
    // The model in memory is a placeholder until a silo's copy of the committed one is in: the
    // model is the one the audit log names.
    j["model_sha256"] = fetch_->sha256;
    nlohmann::json a = {{"round", fetch_->round}, {"model_sha256", fetch_->sha256}, {"answered", fetch_->answers}};
    if (fetch_->asking) a["asking"] = fetch_->asking->first;
    j["awaiting_model"] = std::move(a);
  }
  nlohmann::json round_members = nlohmann::json::array();
  for (const auto& m : members()) {
    nlohmann::json e = {{"silo", m.silo}, {"state", name(m.state)}};
    if (m.via_edge()) e["edge"] = m.edge;
    if (m.state == MemberState::Dropped) e["reason"] = m.drop_reason;
    round_members.push_back(std::move(e));
  }
  j["members"] = std::move(round_members);
  nlohmann::json silos = nlohmann::json::array();
  for (const auto& [silo, session] : membership_.routes()) {
    nlohmann::json e = {{"silo", silo}};
    if (const Peer* p = membership_.peer(session); p && p->edge) e["edge"] = p->name;
    silos.push_back(std::move(e));
  }
  // Record-level privacy as each silo accounts it, from its last counted update.
  if (!privacy_.empty()) {
    nlohmann::json spent = nlohmann::json::object();
    for (const auto& [silo, p] : privacy_) {
      spent[silo] = {{"epsilon", p.epsilon()}, {"max_epsilon", p.max_epsilon()}, {"delta", p.delta()}};
    }
    j["privacy"] = std::move(spent);
  }
  // Silo-level central DP: the federation's own spend, from the audit chain and the rounds since.
  if (cfg_.central_dp) {
    const std::uint64_t rounds = central_spent_.count();
    j["central_dp"] = {{"epsilon", epsilon_of(central_spent_, cfg_.central_dp->delta)},
                       {"max_epsilon", cfg_.central_dp->epsilon},
                       {"delta", cfg_.central_dp->delta},
                       {"noise_multiplier",
                        round_noise_multiplier(cfg_.central_dp->noise_multiplier, cfg_.central_dp->count_stddev)},
                       {"rounds_spent", rounds}};
    if (cfg_.central_dp->count_stddev > 0) {  // adaptive clipping: the count's noise and the next round's C
      // noise_multiplier is the round's, as in the records; the update's is beside it, named alike.
      j["central_dp"]["update_noise_multiplier"] = cfg_.central_dp->noise_multiplier;
      j["central_dp"]["count_stddev"] = cfg_.central_dp->count_stddev;
      if (clip_norm_) j["central_dp"]["clip_norm"] = *clip_norm_;
    }
  }
  if (cfg_.distributed_dp) {
    const auto& dp = *cfg_.distributed_dp;
    j["distributed_dp"] = {{"epsilon", epsilon_of(central_spent_, dp.delta)}, {"max_epsilon", dp.epsilon},
                           {"delta", dp.delta}, {"noise_multiplier", round_noise_multiplier(dp)}, {"gamma", dp.gamma},
                           {"bits", dp.bits}};
    if (dp.count_scale > 0) {  // adaptive clipping: the count word's scale and noise, and the next round's C
      // noise_multiplier is the round's, as in the records; the update's is beside it, named alike.
      j["distributed_dp"]["update_noise_multiplier"] = dp.noise_multiplier;
      j["distributed_dp"]["count_scale"] = dp.count_scale;
      j["distributed_dp"]["count_stddev"] = count_noise_stddev(dp);
      if (clip_norm_) j["distributed_dp"]["clip_norm"] = *clip_norm_;
    }
  }
  j["silos"] = std::move(silos);
  nlohmann::json recent = nlohmann::json::array();
  for (const auto& o : recent_) {
    nlohmann::json e = {{"round", o.round},         {"status", o.committed ? "committed" : "aborted"},
                        {"seconds", static_cast<double>(o.ended_ms - o.started_ms) / 1000.0},
                        {"selected", o.selected},   {"updates", o.updates},
                        {"ended_at", iso_time(o.ended_ms)}};
    if (!o.reason.empty()) e["reason"] = o.reason;
    if (o.robust_rejected) e["robust_rejected"] = o.robust_rejected;
    nlohmann::json drops = nlohmann::json::array();
    for (const auto& d : o.dropouts) {
      drops.push_back({{"silo", d.silo}, {"phase", d.phase}, {"cause", d.cause}, {"reason", d.reason}});
    }
    e["dropouts"] = std::move(drops);
    recent.push_back(std::move(e));
  }
  j["recent_rounds"] = std::move(recent);
  return j;
}

}  // namespace xsilo::server
