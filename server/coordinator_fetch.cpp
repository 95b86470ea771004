// The last committed model, asked of the silos (Coordinator::await_model): the server's state
// folder lost every copy of it (docs/operations.md, "When the state folder is damaged"), but each
// silo that trained in the round after it holds it, and the audit log names its SHA-256, so a copy
// from any silo can be checked and used. Nothing else happens until a copy is in: no round starts.
#include <spdlog/spdlog.h>

#include "crypto/hash.h"
#include "proto/frame.h"
#include "protocol/tensor_stream.h"
#include "server/coordinator_round.h"

namespace xsilo::server {


void Coordinator::await_model(std::uint64_t round, std::string sha256, std::function<void(const Model&)> restore,
                              std::string refusal) {
  fetch_ = std::make_unique<Fetch>();
  fetch_->round = round;
  fetch_->sha256 = std::move(sha256);
  fetch_->restore = std::move(restore);
  fetch_->refusal = std::move(refusal);
}

void Coordinator::fetch_from(const std::string& silo, SessionId link) {
  // After the join deadline only the silos here by then are asked (and asked once).
  if (fetch_->answered.count(silo) || fetch_->expired) return;
  if (fetch_->asking && fetch_->asking->first == silo) return;
  std::erase_if(fetch_->waiting, [&](const auto& w) { return w.first == silo; });
  fetch_->waiting.emplace_back(silo, link);
  ask_next_holder();
}

void Coordinator::ask_next_holder() {
  Fetch& f = *fetch_;
  while (!f.asking && !f.restoring && !f.waiting.empty()) {
    auto [silo, link] = f.waiting.front();
    f.waiting.pop_front();
    if (membership_.route_of(silo) != link) continue;  // gone, or back through another route (queued again)
    f.asking.emplace(silo, link);
    f.copy = std::make_shared<Model>(global_->zeros_like());
    f.rx.reset(f.copy->flat(), f.copy->tensors());
    auto e = env();
    if (membership_.is_edge(link)) e.set_silo(silo);
    e.mutable_model_request()->set_model_sha256(f.sha256);
    e.mutable_model_request()->set_round(f.round);
    send(link, std::move(e));
    actions_.push_back(action::StartTimer{Timer::Upload, cfg_.deadlines.upload});  // a silo that stalls is passed over
    spdlog::info("asking silo {} for the model of committed round {} ({})", silo, f.round, f.sha256.substr(0, 12));
  }
  // After the join deadline, the silos already here are still asked; then the server gives up.
  if (f.expired && !f.asking && !f.restoring) fetch_expired();
}

void Coordinator::on_fetch_message(const std::string& silo, SessionId link, const wire::Envelope& e, ChunkData data) {
  Fetch& f = *fetch_;
  if (!f.asking || f.asking->first != silo || f.asking->second != link || f.restoring) {
    send_error(link, wire::UNEXPECTED, proto::body_name(e) + " but the server asked " + silo + " for no model");
    return;
  }
  if (e.has_tensor_chunk()) {
    if (auto st = f.rx.add(e.tensor_chunk(), data); !st) fetch_refused("sent a chunk the model cannot take: " + st.error().message());
    return;
  }
  const auto& offer = e.model_offer();
  if (!offer.held()) return fetch_refused("holds no model " + f.sha256.substr(0, 12));
  if (!f.rx.complete()) return fetch_refused("offered the model after " + std::to_string(f.rx.received()) + " elements");
  const std::string sha = f.rx.finish_sha256();
  if (sha != f.sha256) {
    return fetch_refused("sent model " + sha.substr(0, 12) + ", not " + f.sha256.substr(0, 12) + " as the log records");
  }
  // Checked against the audit log: written as the round's checkpoint, then the start's records.
  f.restoring = true;
  actions_.push_back(action::CancelTimer{Timer::Upload});
  spdlog::info("silo {} sent the model of committed round {}; it matches the audit log", silo, f.round);
  run_job(JobKind::Restore, [restore = f.restore, model = std::shared_ptr<const Model>(f.copy), sha]() -> JobResult {
    CommitOutcome out;
    try {
      restore(*model);
      out.committed = true;
      out.model = model;
      out.model_sha256 = sha;
    } catch (const std::exception& e) {
      out.reason = e.what();
    }
    return out;
  });
}

void Coordinator::fetch_refused(const std::string& why) {
  Fetch& f = *fetch_;
  const std::string silo = f.asking->first;
  spdlog::warn("silo {}: {}", silo, why);
  f.answers.push_back(silo + " " + why);
  f.answered.insert(silo);
  f.asking.reset();
  f.copy.reset();
  ask_next_holder();
}

void Coordinator::fetch_link_gone(SessionId link) {
  Fetch& f = *fetch_;
  if (!f.asking || f.asking->second != link || f.restoring) return;
  if (f.expired) return fetch_refused("left before its copy of the model arrived");  // once is enough now
  // Its copy was cut off: it is asked again if it comes back before the join deadline.
  spdlog::warn("silo {} left before its copy of the model arrived", f.asking->first);
  f.asking.reset();
  f.copy.reset();
  ask_next_holder();
}

void Coordinator::restored(CommitOutcome outcome, std::int64_t now_ms) {
  const std::string from = fetch_->asking ? fetch_->asking->first : std::string();
  if (!outcome.committed) {
    actions_.push_back(action::Stop{"the model of committed round " + std::to_string(fetch_->round) + " came from " +
                                    from + " but could not be kept: " + outcome.reason});
    return;
  }
  spdlog::warn("restored the model of committed round {} ({}) from silo {}; the rounds go on from it",
               fetch_->round, outcome.model_sha256.substr(0, 12), from);
  global_ = std::move(outcome.model);
  global_sha_ = outcome.model_sha256;
  event("model_restored", from);
  fetch_.reset();
  join_elapsed_ = false;
  actions_.push_back(action::StartTimer{Timer::Join, cfg_.deadlines.join});
  try_start_round(now_ms);
}

void Coordinator::fetch_expired() {
  if (std::exchange(fetch_->stopped, true)) return;
  std::string answers;
  for (const auto& a : fetch_->answers) answers += (answers.empty() ? "" : "; ") + a;
  actions_.push_back(action::Stop{fetch_->refusal + " (waited " + std::to_string(cfg_.deadlines.join.count() / 1000) +
                                  " s for the silos; " + (answers.empty() ? "none answered" : answers) + ")"});
}

}  // namespace xsilo::server
