#include "server/secure/group.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "protocol/secagg_wire.h"
#include "server/secure/lightsecagg_group.h"
#include "server/secure/secagg_group.h"

namespace xsilo::server::secure {

const char* name(DropReason r) {
  switch (r) {
    case DropReason::GroupFailed: return "group_failed";
    case DropReason::NoKeys: return "no_keys";
    case DropReason::NoShares: return "no_shares";
    case DropReason::NoReceipt: return "no_receipt";
    case DropReason::Excluded: return "excluded";
  }
  return "?";
}

Group::Group(wire::SecAggSetup setup, GroupContext ctx) : setup_(std::move(setup)), ctx_(std::move(ctx)) {
  waiting_.insert(setup_.members().begin(), setup_.members().end());
}

void Group::fail(const std::string& why) {
  if (!failed_.empty()) return;
  failed_ = why;
  stage_ = Stage::Done;
  spdlog::warn("round {}: {} failed: {}", ctx_.round, label(), why);
  for (const auto& m : setup_.members()) drop(m, DropReason::GroupFailed, label() + ": " + why);
}

void Group::drop(const std::string& silo, DropReason reason, const std::string& why) {
  dropped_.push_back({silo, reason, why});
}

void Group::report_blame() {
  for (const auto& b : new_blames()) {
    spdlog::warn("round {}: {} excludes {}: {}", ctx_.round, label(), b.silo, b.why);
    waiting_.erase(b.silo);
    drop(b.silo, DropReason::Excluded, "excluded from " + label() + ": " + b.why);
  }
}

void Group::receive(const std::string& silo, const wire::SecureAggregation& step, const std::set<std::string>& away) {
  if (!failed_.empty()) return;
  if (handles(step) && waiting_.count(silo)) {
    if (auto handled = handle(silo, step); !handled) {
      spdlog::warn("round {}: {}: {}: {}", ctx_.round, label(), silo, handled.error().message());
    } else {
      waiting_.erase(silo);
    }
  }
  report_blame();
  advance(false, away);
}

void Group::advance(bool force, const std::set<std::string>& away) {
  auto only_away = [&] {
    return std::all_of(waiting_.begin(), waiting_.end(), [&](const std::string& s) { return away.count(s) > 0; });
  };
  while (failed_.empty() && (force || only_away())) {
    const bool moved = close();
    report_blame();
    force = false;
    if (!moved) return;
  }
}

void Group::gone(const std::string& silo, const std::set<std::string>& away) {
  if (!failed_.empty() || stage_ == Stage::Masking) return;
  if (waiting_.erase(silo)) advance(false, away);
}

void Group::begin_unmask() {
  if (!failed_.empty() || stage_ != Stage::Masking) return;
  ask_survivors();
}

std::optional<wire::SecureAggregation> Group::pending(const std::string& silo) const {
  if (!failed_.empty() || !waiting_.count(silo)) return std::nullopt;
  if (stage_ == Stage::Confirm || stage_ == Stage::Unmask) return request_;
  return std::nullopt;
}

std::unique_ptr<Group> make_group(const SecureConfig& cfg, wire::SecAggSetup setup, GroupContext ctx) {
  // The protocols, by the configuration's name for them. One line per protocol.
  switch (cfg.protocol) {
    case SecureProtocol::LightSecAgg: return make_lightsecagg_group(cfg, std::move(setup), std::move(ctx));
    case SecureProtocol::SecAgg: break;
  }
  return make_secagg_group(cfg, std::move(setup), std::move(ctx));
}

}  // namespace xsilo::server::secure
