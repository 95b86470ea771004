#include "server/secure/settled_group.h"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace xsilo::server::secure {

namespace secagg = crypto::secagg;

void SettledGroup::masked_from(const std::string& silo) {
  if (!failed().empty()) return;
  if (auto added = settlement().on_masked_input(silo); !added)
    spdlog::warn("round {}: {}", ctx_.round, added.error().message());
}

std::vector<std::string> SettledGroup::survivors() const {
  return {settlement().u3().begin(), settlement().u3().end()};
}

std::vector<secagg::Blame> SettledGroup::excluded() const { return settlement().blamed(); }

bool SettledGroup::close() {
  if (stage_ == Stage::Setup) {
    switch (phase_) {
      case Phase::Keys: close_keys(); return true;
      case Phase::Shares: close_shares(); return true;
      case Phase::Receipts: close_receipts(); return true;
    }
  }
  if (stage_ == Stage::Confirm) {
    close_confirmations();
    return true;
  }
  return false;  // Masking and Unmask end by the coordinator's decision
}

void SettledGroup::ask_survivors() {
  auto u3 = settlement().close_masked();
  if (!u3) return fail(u3.error().message());
  wire::SecureAggregation m;
  put_survivors(m, *u3, settlement().survivors_signature());
  ask(*u3, m, Stage::Confirm);
}

std::vector<secagg::Blame> SettledGroup::new_blames() {
  const auto& blamed = settlement().blamed();
  std::vector<secagg::Blame> out(blamed.begin() + static_cast<std::ptrdiff_t>(blames_reported_), blamed.end());
  blames_reported_ = blamed.size();
  return out;
}

void SettledGroup::delivered(const secagg::Result<std::map<std::string, secagg::Inbox>>& boxes) {
  if (!boxes) return fail(boxes.error().message());
  for (const auto& silo : waiting_) drop(silo, DropReason::NoShares, label() + ": no valid signed shares from it in time");
  waiting_.clear();
  for (const auto& [recipient, inbox] : *boxes) {
    wire::SecureAggregation m;
    put_delivery(m, inbox);
    waiting_.insert(recipient);
    send(recipient, std::move(m));
  }
  phase_ = Phase::Receipts;
}

void SettledGroup::close_receipts() {
  auto& server = settlement();
  auto settled = server.settle();
  report_blame();
  if (!settled) return fail(settled.error().message());
  wire::SecureAggregation m;
  put_settled(m, *settled);
  // Every member that shared learns the outcome; one left out stops there. Those in it may
  // upload from now (an edge lets them).
  for (const auto& silo : server.u2()) {
    m.set_admits_upload(server.settled_member(silo));
    send(silo, m);
  }
  // Members that shared but sent no receipt are out of the group now.
  const auto& blamed = server.blamed();
  for (const auto& silo : server.u2()) {
    if (!server.settled_member(silo) &&
        std::none_of(blamed.begin(), blamed.end(), [&](const auto& b) { return b.silo == silo; })) {
      drop(silo, DropReason::NoReceipt, label() + ": sent no receipt for its shares");
    }
  }
  waiting_.clear();
  stage_ = Stage::Masking;
}

void SettledGroup::close_confirmations() {
  auto request = settlement().close_confirmations();
  if (!request) return fail(request.error().message());
  wire::SecureAggregation m;
  put_unmask_request(m, *request);
  // Every survivor that confirmed answers.
  ask(settlement().confirmed(), m, Stage::Unmask);
}

}  // namespace xsilo::server::secure
