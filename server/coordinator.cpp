#include "server/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <random>

#include "proto/frame.h"
#include "robust/robust.h"

namespace xsilo::server {

namespace {

const char* state_name(MemberState s) {
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

}  // namespace

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

CoordinatorConfig CoordinatorConfig::from(const ServerConfig& c) {
  CoordinatorConfig k;
  k.federation = c.federation;
  k.config_sha256 = c.config_sha256;
  k.rounds = c.rounds;
  k.seed = c.seed;
  k.selection = c.selection;
  k.deadlines = c.deadlines;
  k.plan = c.plan;
  k.expected_silos = c.expected_silos;
  k.any_silo = c.expected_silos.empty();
  k.optimizer = c.optimizer.kind;
  k.aggregation = c.aggregation;
  k.secure = c.secure;
  return k;
}

Coordinator::Coordinator(CoordinatorConfig cfg, Model initial, ServerOptimizer optimizer,
                         Store& store, std::uint64_t first_round)
    : cfg_(std::move(cfg)), optimizer_(std::move(optimizer)), store_(store), round_(first_round) {
  current_ = initial.zeros_like();
  global_sha_ = crypto::sha256_hex(initial.flat());
  global_ = std::make_shared<const Model>(std::move(initial));
}

wire::Envelope Coordinator::env() const {
  wire::Envelope e;
  e.set_federation(cfg_.federation);
  e.set_round(round_);
  return e;
}

void Coordinator::send_error(SessionId to, wire::ErrorCode code, const std::string& msg) {
  auto e = env();
  e.mutable_error()->set_code(code);
  e.mutable_error()->set_message(msg);
  send(to, std::move(e));
}

std::optional<std::size_t> Coordinator::member_of(SessionId id) const {
  for (std::size_t i = 0; i < members_.size(); ++i) {
    if (members_[i].session == id) return i;
  }
  return std::nullopt;
}

std::optional<std::size_t> Coordinator::member_named(const std::string& silo) const {
  for (std::size_t i = 0; i < members_.size(); ++i) {
    if (members_[i].silo == silo) return i;
  }
  return std::nullopt;
}

void Coordinator::send_to_member(std::size_t m, wire::Envelope e) {
  const auto& mb = members_[m];
  if (!mb.session || !sessions_.count(mb.session)) return;
  if (mb.relayed) e.set_silo(mb.silo);
  send(mb.session, std::move(e));
}

void Coordinator::start(std::int64_t now_ms) {
  if (round_ > cfg_.rounds) {
    finish_round(false, now_ms);  // nothing left to do: resumed after the last round
    return;
  }
  phase_ = Phase::Joining;
  join_elapsed_ = false;
  actions_.push_back(action::StartTimer{Timer::Join, cfg_.deadlines.join});
  try_start_round(now_ms);
}

void Coordinator::on_connect(SessionId id, const std::string& silo, std::int64_t now_ms) {
  sessions_[id] = Peer{silo, false, {}};
  silo_joined(silo, id, now_ms);
}

void Coordinator::on_edge_connect(SessionId id, const std::string& edge, std::int64_t now_ms) {
  sessions_[id] = Peer{edge, true, {}};
  spdlog::info("edge {} connected", edge);
  if (phase_ == Phase::Finished) {
    auto e = env();
    e.mutable_finished()->set_reason("the federation has finished");
    e.mutable_finished()->set_rounds(cfg_.rounds);
    send(id, std::move(e));
  }
  (void)now_ms;
}

void Coordinator::silo_joined(const std::string& silo, SessionId link, std::int64_t now_ms) {
  auto old = routes_.find(silo);
  if (old != routes_.end() && old->second != link) {
    // The silo is back through another connection (it reconnected, or failed over to
    // another upstream) before the old one was noticed gone.
    const SessionId prev = old->second;
    auto p = sessions_.find(prev);
    if (p != sessions_.end() && !p->second.edge) {
      actions_.push_back(action::Close{prev, wire::UNEXPECTED, "replaced by a newer connection"});
      on_disconnect(prev, now_ms);
    } else {
      if (p != sessions_.end()) p->second.region.erase(silo);
      silo_gone(silo, prev, "moved to another upstream", now_ms);
    }
  }
  routes_[silo] = link;
  seen_.insert(silo);
  const bool via_edge = sessions_.count(link) && sessions_[link].edge;
  if (auto m = member_named(silo); m && members_[*m].state == MemberState::Done && secure_) {
    // Its masked input is in the sum but its edge went away: it still holds shares for the
    // unmasking, so reach it through the new route (and ask again if it missed the request).
    auto& mb = members_[*m];
    mb.session = link;
    mb.relayed = via_edge;  // the record keeps the edge that carried its input
    if (phase_ == Phase::Unmasking) {
      if (auto req = secure_->unmask_request(silo)) send_to_member(*m, std::move(*req));
    }
  }
  spdlog::info("silo {} joined{} ({} connected)", silo, via_edge ? " via edge " + sessions_[link].name : "",
               routes_.size());
  if (phase_ == Phase::Finished) {
    if (!via_edge) {
      auto e = env();
      e.mutable_finished()->set_reason("the federation has finished");
      e.mutable_finished()->set_rounds(cfg_.rounds);
      send(link, std::move(e));
    }
    return;
  }
  try_start_round(now_ms);
}

void Coordinator::silo_gone(const std::string& silo, SessionId link, const std::string& why,
                            std::int64_t now_ms) {
  auto it = routes_.find(silo);
  if (it == routes_.end() || it->second != link) return;
  routes_.erase(it);
  spdlog::info("silo {} left: {} ({} connected)", silo, why, routes_.size());
  if (secure_) {
    secure_->silo_gone(silo);
    drain_secure();
  }
  if (auto m = member_named(silo)) {
    auto& mb = members_[*m];
    if (mb.session == link) {
      if (mb.state == MemberState::Training) {
        drop(*m, "train", why + " while training", false);
      } else if (mb.state == MemberState::Ready ||
                 (mb.state == MemberState::Uploading && !(upload_ && upload_->complete))) {
        drop(*m, "upload", why + " before its update arrived", false);
      }
      if (!mb.relayed) mb.session = 0;
    }
    pump(now_ms);
  }
}

void Coordinator::on_disconnect(SessionId id, std::int64_t now_ms) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  const Peer peer = it->second;
  sessions_.erase(it);
  if (!peer.edge) {
    silo_gone(peer.name, id, "disconnected", now_ms);
    return;
  }
  spdlog::warn("edge {} disconnected; its {} silos are gone with it", peer.name, peer.region.size());
  if (upload_ && upload_->edge == id && !upload_->complete) abandon_upload();
  for (const auto& silo : peer.region) silo_gone(silo, id, "its edge " + peer.name + " disconnected", now_ms);
  for (auto& mb : members_) {
    if (mb.session == id) mb.session = 0;
  }
  pump(now_ms);
}

void Coordinator::on_timer(Timer timer, std::int64_t now_ms) {
  switch (timer) {
    case Timer::Join:
      join_elapsed_ = true;
      if (phase_ == Phase::Joining) {
        if (routes_.size() < cfg_.selection.min_silos) {
          spdlog::warn("round {}: {} of the {} silos needed are connected; waiting", round_,
                       routes_.size(), cfg_.selection.min_silos);
        }
        try_start_round(now_ms);
      }
      break;
    case Timer::Train:
      if (phase_ != Phase::Collecting) break;
      train_elapsed_ = true;
      for (std::size_t i = 0; i < members_.size(); ++i) {
        if (members_[i].state == MemberState::Training) {
          drop(i, "train", "missed the training deadline");
        }
      }
      // Edges still collecting are told to upload what they have now.
      for (const auto& [id, peer] : sessions_) {
        if (peer.edge && edge_pending(id) && !edge_queued_.count(id)) {
          edge_queued_.insert(id);
          ready_.push_back(Uploader{kNone, id});
        }
      }
      pump(now_ms);
      break;
    case Timer::SecAgg:
      if (phase_ != Phase::Collecting || !secure_) break;
      secure_->keys_deadline();
      drain_secure();
      if (!secure_->shared()) actions_.push_back(action::StartTimer{Timer::SecAgg, cfg_.secure.keys_deadline});
      pump(now_ms);
      break;
    case Timer::Unmask:
      finish_unmask();
      break;
    case Timer::Upload:
      if (phase_ != Phase::Collecting || !upload_ || job_ != JobKind::None) break;
      if (upload_->edge) {
        for (std::size_t i = 0; i < members_.size(); ++i) {
          if (members_[i].session == upload_->edge && members_[i].state != MemberState::Done) {
            drop(i, "upload", "its edge missed the upload deadline", false);
          }
        }
        abandon_upload();
      } else {
        drop(upload_->member, "upload", "missed the upload deadline");
      }
      upload_.reset();
      pump(now_ms);
      break;
  }
}

void Coordinator::try_start_round(std::int64_t now_ms) {
  if (phase_ != Phase::Joining || job_ != JobKind::None) return;
  if (routes_.size() < cfg_.selection.min_silos) return;
  // Only silos never seen are worth the join wait: one that was connected and has left joins
  // the next round when it comes back, and does not hold this one back.
  bool all_accounted = !cfg_.expected_silos.empty();
  for (const auto& s : cfg_.expected_silos) all_accounted = all_accounted && (routes_.count(s) || seen_.count(s));
  if (all_accounted || join_elapsed_) start_round(now_ms);
}

void Coordinator::start_round(std::int64_t now_ms) {
  actions_.push_back(action::CancelTimer{Timer::Join});
  std::vector<std::pair<std::string, SessionId>> candidates(routes_.begin(), routes_.end());
  std::mt19937_64 rng(cfg_.seed ^ (round_ * 0x9e3779b97f4a7c15ull));
  std::shuffle(candidates.begin(), candidates.end(), rng);
  const auto& sel = cfg_.selection;
  std::size_t n_select = candidates.size();
  target_ = n_select;
  if (sel.silos_per_round > 0) {
    const auto want = static_cast<std::size_t>(
        std::ceil(static_cast<double>(sel.silos_per_round) * (1.0 + sel.over_selection)));
    n_select = std::min(n_select, want);
    target_ = std::min(sel.silos_per_round, n_select);
  }
  candidates.resize(n_select);
  std::sort(candidates.begin(), candidates.end());

  phase_ = Phase::Collecting;
  round_started_ms_ = now_ms;
  train_elapsed_ = false;
  members_.clear();
  ready_.clear();
  edge_queued_.clear();
  upload_.reset();
  completed_ = 0;
  nonfinite_rejected_ = 0;
  total_weight_ = 0;
  upload_bytes_ = 0;
  abort_reason_.clear();
  acc_ = std::make_unique<Model>(global_->zeros_like());

  wire::Envelope start = env();
  auto* rs = start.mutable_round_start();
  rs->set_round(round_);
  *rs->mutable_plan() = cfg_.plan;
  for (const auto& t : global_->tensors()) {
    auto* spec = rs->add_tensors();
    spec->set_name(t.name);
    spec->set_dtype(wire::F32);
    for (auto d : t.shape) spec->add_shape(d);
  }
  rs->set_model_sha256(global_sha_);
  secure_.reset();
  group_results_.clear();
  if (cfg_.secure.on()) {
    std::vector<std::string> names;
    for (const auto& c : candidates) names.push_back(c.first);
    secure_ = std::make_unique<SecureRound>(cfg_.secure, cfg_.federation, round_, cfg_.seed, names, global_->size());
    masked_buf_.assign((global_->size() + 1) * secure_->word_bytes(), 0);
  }
  std::set<SessionId> edges;
  for (const auto& [silo, session] : candidates) {
    Member mb;
    mb.silo = silo;
    mb.session = session;
    const auto& peer = sessions_.at(session);
    if (peer.edge) {
      mb.via_edge = mb.relayed = true;
      mb.edge = peer.name;
      edges.insert(session);
    }
    members_.push_back(std::move(mb));
    wire::Envelope mine = start;
    if (secure_) *mine.mutable_round_start()->mutable_secagg() = secure_->setup(secure_->group_of(silo));
    send_to_member(members_.size() - 1, std::move(mine));
    if (!peer.edge) actions_.push_back(action::SendModel{session, global_, round_});
  }
  // An edge receives the model once and passes it to its selected silos.
  for (auto edge : edges) actions_.push_back(action::SendModel{edge, global_, round_});
  if (secure_) {
    actions_.push_back(action::StartTimer{Timer::SecAgg, cfg_.secure.keys_deadline});
    drain_secure();
  }
  actions_.push_back(action::StartTimer{Timer::Train, cfg_.deadlines.train});
  spdlog::info("round {}/{}: {} silos selected, closing at {}", round_, cfg_.rounds,
               members_.size(), target_);
}

void Coordinator::on_message(SessionId id, const wire::Envelope& e, std::int64_t now_ms) {
  if (!sessions_.count(id)) return;
  if (sessions_[id].edge) return on_edge_message(id, e, now_ms);
  using B = wire::Envelope::BodyCase;
  const auto body = e.body_case();
  if (body == B::kError) {
    spdlog::warn("silo {} reports an error: {}", sessions_[id].name, e.error().message());
    return;
  }
  const bool secure_body = body == B::kSecaggKeys || body == B::kSecaggShares || body == B::kSecaggUnmaskShares;
  if (body != B::kUpdateReady && body != B::kTensorChunk && body != B::kUpdateEnd && !secure_body) {
    send_error(id, wire::UNEXPECTED, "a silo may not send " + proto::body_name(e));
    return;
  }
  const auto m = member_of(id);
  if (secure_body && m && e.round() == round_) return on_secure_message(*m, e, now_ms);
  if (e.round() != round_ || phase_ != Phase::Collecting || !m) {
    send_error(id, wire::WRONG_ROUND,
               proto::body_name(e) + " for round " + std::to_string(e.round()) + ", but round " +
                   std::to_string(round_) + (m && phase_ == Phase::Collecting
                                                  ? " is collecting"
                                                  : " does not expect it from you"));
    return;
  }
  switch (body) {
    case B::kUpdateReady: on_update_ready(*m, e, now_ms); break;
    case B::kTensorChunk: on_chunk(*m, e, now_ms); break;
    case B::kUpdateEnd: on_update_end(*m, e, now_ms); break;
    default: break;
  }
}

void Coordinator::on_update_ready(std::size_t m, const wire::Envelope& e, std::int64_t now_ms) {
  auto& mb = members_[m];
  auto error = [&](wire::ErrorCode code, const std::string& msg) {
    auto err = env();
    err.mutable_error()->set_code(code);
    err.mutable_error()->set_message(msg);
    send_to_member(m, std::move(err));
  };
  if (mb.state != MemberState::Training) {
    error(wire::UNEXPECTED, std::string("UpdateReady while ") + state_name(mb.state));
    return;
  }
  if (e.update_ready().num_samples() == 0) {
    error(wire::BAD_UPDATE, "an update must come from at least one sample");
    drop(m, "train", "reported zero samples", false);
    pump(now_ms);
    return;
  }
  mb.state = MemberState::Ready;
  mb.num_samples = e.update_ready().num_samples();
  mb.metrics = e.update_ready().metrics();
  if (!mb.via_edge) ready_.push_back(Uploader{m, 0});  // an edge uploads for its silos
  pump(now_ms);
}

bool Coordinator::edge_pending(SessionId edge) const {
  return std::any_of(members_.begin(), members_.end(), [&](const Member& mb) {
    return mb.via_edge && mb.session == edge &&
           (mb.state == MemberState::Training || mb.state == MemberState::Ready);
  });
}

void Coordinator::on_edge_message(SessionId id, const wire::Envelope& e, std::int64_t now_ms) {
  using B = wire::Envelope::BodyCase;
  auto& peer = sessions_[id];
  const auto body = e.body_case();
  if (body == B::kError) {
    spdlog::warn("edge {} reports{}: {}", peer.name, e.silo().empty() ? "" : " for silo " + e.silo(),
                 e.error().message());
    return;
  }
  if (body == B::kRegionStatus) {
    std::set<std::string> now(e.region_status().silos().begin(), e.region_status().silos().end());
    const std::set<std::string> before = peer.region;
    for (const auto& silo : before) {
      if (!now.count(silo)) {
        sessions_[id].region.erase(silo);
        silo_gone(silo, id, "left edge " + peer.name, now_ms);
      }
    }
    for (const auto& silo : now) {
      if (before.count(silo)) continue;
      if (!cfg_.any_silo && !cfg_.expected_silos.count(silo)) {
        send_error(id, wire::NOT_ALLOWED, "silo " + silo + " is not on the server's allow-list");
        continue;
      }
      sessions_[id].region.insert(silo);
      silo_joined(silo, id, now_ms);
    }
    return;
  }
  if (!e.silo().empty()) {
    // Relayed from one of its silos: only UpdateReady (its uploads go into the region's sum).
    const auto m = member_named(e.silo());
    const bool secure_body = body == B::kSecaggKeys || body == B::kSecaggShares || body == B::kSecaggUnmaskShares;
    if (secure_body && m && members_[*m].session == id && e.round() == round_) {
      return on_secure_message(*m, e, now_ms);
    }
    if (!peer.region.count(e.silo()) || !m || members_[*m].session != id || body != B::kUpdateReady ||
        e.round() != round_ || phase_ != Phase::Collecting) {
      auto err = env();
      err.set_silo(e.silo());
      err.mutable_error()->set_code(e.round() != round_ ? wire::WRONG_ROUND : wire::UNEXPECTED);
      err.mutable_error()->set_message(proto::body_name(e) + " from " + e.silo() + " via edge " +
                                       peer.name + " is not expected in round " + std::to_string(round_));
      send(id, std::move(err));
      return;
    }
    on_update_ready(*m, e, now_ms);
    return;
  }
  if (e.round() != round_ || phase_ != Phase::Collecting) {
    send_error(id, wire::WRONG_ROUND, proto::body_name(e) + " for round " + std::to_string(e.round()) +
                                          " but round " + std::to_string(round_) + " is not collecting");
    return;
  }
  switch (body) {
    case B::kUpdateReady:
      if (!edge_queued_.count(id)) {
        edge_queued_.insert(id);
        ready_.push_back(Uploader{kNone, id});
        pump(now_ms);
      }
      break;
    case B::kTensorChunk: {
      if (!upload_ || upload_->edge != id || upload_->complete) {
        send_error(id, wire::UNEXPECTED, "TensorChunk without an open UploadGrant");
        return;
      }
      auto st = upload_->rx.add(e.tensor_chunk());
      if (!st) {
        send_error(id, st.code, st.message);
        for (std::size_t i = 0; i < members_.size(); ++i) {
          if (members_[i].session == id && members_[i].state != MemberState::Done) {
            drop(i, "upload", "its edge sent a bad partial sum: " + st.message, false);
          }
        }
        abandon_upload();
        pump(now_ms);
        return;
      }
      arm_receiver();
      break;
    }
    case B::kUpdateEnd: on_region_end(id, e, now_ms); break;
    default: send_error(id, wire::UNEXPECTED, "an edge may not send " + proto::body_name(e));
  }
}

void Coordinator::on_region_end(SessionId id, const wire::Envelope& e, std::int64_t now_ms) {
  if (!upload_ || upload_->edge != id || upload_->complete) {
    send_error(id, wire::UNEXPECTED, "UpdateEnd without an open UploadGrant");
    return;
  }
  const auto& u = e.update_end();
  const std::string edge = sessions_[id].name;
  auto drop_rest = [&](const std::string& why) {
    for (std::size_t i = 0; i < members_.size(); ++i) {
      if (members_[i].session == id && members_[i].state != MemberState::Done) drop(i, "upload", why, false);
    }
  };
  actions_.push_back(action::CancelTimer{Timer::Upload});
  // Contributors must be this edge's members of the round; their weights must add up.
  std::vector<std::size_t> who;
  double weight = 0;
  std::string why;
  for (const auto& c : u.contributors()) {
    const auto m = member_named(c.silo());
    if (!m || !members_[*m].via_edge || members_[*m].edge != edge || members_[*m].state == MemberState::Done) {
      why = "edge " + edge + " lists " + c.silo() + ", which is not one of its silos in this round";
      break;
    }
    if (secure_) {
      if (secure_->group_of(c.silo()) != u.group() || u.group() == 0) {
        why = "edge " + edge + " put " + c.silo() + " into the partial sum of secure group " +
              std::to_string(u.group()) + ", which is not its group";
        break;
      }
      who.push_back(*m);
      continue;
    }
    if (!std::isfinite(c.weight()) || c.weight() <= 0) {
      why = "edge " + edge + " lists a non-positive weight for " + c.silo();
      break;
    }
    who.push_back(*m);
    weight += c.weight();
  }
  if (why.empty() && who.empty()) {
    drop_rest("its edge had no update from it");
    upload_.reset();
    pump(now_ms);
    return;
  }
  if (secure_) weight = u.weight();  // weights travel inside the masked sum
  if (why.empty() && !upload_->rx.complete()) {
    why = "partial sum has " + std::to_string(upload_->rx.received()) + " of the model's " +
          std::to_string(global_->size()) + " elements";
  }
  if (why.empty() && std::abs(weight - u.weight()) > 1e-6 * std::max(1.0, weight)) {
    why = "partial sum weight " + std::to_string(u.weight()) + " is not the sum of its contributors' " +
          std::to_string(weight);
  }
  if (!why.empty()) {
    send_error(id, wire::BAD_UPDATE, why);
    drop_rest(why);
    abandon_upload();
    pump(now_ms);
    return;
  }
  for (std::size_t k = 0; k < who.size(); ++k) {
    members_[who[k]].weight = u.contributors(static_cast<int>(k)).weight();
    members_[who[k]].num_samples = u.contributors(static_cast<int>(k)).num_samples();
  }
  upload_bytes_ += upload_->rx.bytes();
  upload_->contributors = who;
  upload_->group = u.group();
  upload_->more = u.more();
  upload_->complete = true;
  run_job(JobKind::Fold, [this, group = u.group(), check = upload_->check, declared = u.update_sha256()] {
    fold_sha_ = crypto::to_hex(check->hash.finish());
    fold_ok_ = false;
    if (!check->finite) {
      fold_error_ = "partial sum contains NaN or infinite values";
      return;
    }
    if (!declared.empty() && declared != fold_sha_) {
      fold_error_ = "partial sum does not match its SHA-256";
      return;
    }
    if (secure_) {
      secure_->fold(group, masked_buf_.data());
      fold_ok_ = true;
      return;
    }
    const auto cur = current_.flat();
    auto acc = acc_->flat();
    for (std::size_t i = 0; i < cur.size(); ++i) acc[i] += cur[i];
    fold_ok_ = true;
  });
}

void Coordinator::abandon_upload() {
  upload_.reset();
  actions_.push_back(action::CancelTimer{Timer::Upload});
  // Its chunk checks may still be queued on the worker: let them drain before the next
  // upload reuses the buffer.
  if (job_ == JobKind::None) run_job(JobKind::Barrier, [] {});
}

void Coordinator::on_chunk(std::size_t m, const wire::Envelope& e, std::int64_t now_ms) {
  auto& mb = members_[m];
  if (mb.state != MemberState::Uploading || !upload_ || upload_->member != m || upload_->complete) {
    send_error(mb.session, wire::UNEXPECTED, "TensorChunk without an open UploadGrant");
    return;
  }
  auto st = upload_->rx.add(e.tensor_chunk());
  if (!st) {
    send_error(mb.session, st.code, st.message);
    drop(m, "upload", st.message, false);
    pump(now_ms);
    return;
  }
  arm_receiver();
}

// Hashes (and, for plain updates, checks) the elements the last chunk wrote, on the worker
// while the next chunk arrives.
void Coordinator::arm_receiver() {
  const std::size_t count = upload_->rx.last_count();
  if (secure_) {
    const std::uint8_t* first = masked_buf_.data() + upload_->rx.last_first() * secure_->word_bytes();
    const std::size_t bytes = count * secure_->word_bytes();
    actions_.push_back(action::Background{[check = upload_->check, first, bytes] {
      check->hash.update(std::span<const std::uint8_t>(first, bytes));
    }});
    return;
  }
  const float* first = current_.flat().data() + upload_->rx.last_first();
  actions_.push_back(action::Background{[check = upload_->check, first, count] {
    check->hash.update(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(first),
                                                     count * sizeof(float)));
    for (std::size_t i = 0; i < count; ++i) check->finite = check->finite && std::isfinite(first[i]);
  }});
}

void Coordinator::on_update_end(std::size_t m, const wire::Envelope& e, std::int64_t now_ms) {
  auto& mb = members_[m];
  if (mb.state != MemberState::Uploading || !upload_ || upload_->member != m || upload_->complete) {
    send_error(mb.session, wire::UNEXPECTED, "UpdateEnd without an open UploadGrant");
    return;
  }
  const auto& u = e.update_end();
  std::string why;
  if (!upload_->rx.complete()) {
    why = "update has " + std::to_string(upload_->rx.received()) + " of the model's " +
          std::to_string(global_->size()) + " elements";
  } else if (!secure_ && (!std::isfinite(u.weight()) || u.weight() <= 0)) {
    why = "update weight must be a positive number";
  }
  actions_.push_back(action::CancelTimer{Timer::Upload});
  if (!why.empty()) {
    send_error(mb.session, wire::BAD_UPDATE, why);
    drop(m, "upload", why, false);
    upload_.reset();
    pump(now_ms);
    return;
  }
  mb.weight = u.weight();
  upload_bytes_ += upload_->rx.bytes();
  upload_->declared_sha256 = u.update_sha256();
  upload_->complete = true;
  // Check and fold into the running sum off the network thread (after the chunks' checks,
  // which the worker runs first: its queue is in order).
  const std::uint32_t group = secure_ ? secure_->group_of(mb.silo) : 0;
  run_job(JobKind::Fold, [this, group, label = mb.silo, check = upload_->check,
                          declared = upload_->declared_sha256, weight = mb.weight] {
    fold_sha_ = crypto::to_hex(check->hash.finish());
    fold_ok_ = false;
    if (!check->finite) {
      fold_error_ = "update contains NaN or infinite values";
      return;
    }
    if (!declared.empty() && declared != fold_sha_) {
      fold_error_ = "update does not match its SHA-256 (sent " + declared + ", received " + fold_sha_ + ")";
      return;
    }
    if (secure_) {  // masked words: nothing to check, add into the group's sum mod 2^bits
      secure_->fold(group, masked_buf_.data());
      fold_ok_ = true;
      return;
    }
    const auto cur = current_.flat();
    if (cfg_.aggregation.needs_all_updates()) {
      // Keep this silo's delta (the upload is weight * delta), clipped if configured.
      const std::size_t d = cur.size(), at = rows_.size();
      rows_.resize(at + d);
      const float inv = static_cast<float>(1.0 / weight);
      for (std::size_t i = 0; i < d; ++i) rows_[at + i] = cur[i] * inv;
      double norm = 0;
      if (cfg_.aggregation.clip_norm > 0) {
        norm = robust::clip_l2(std::span<float>(rows_).subspan(at, d), 1, d, cfg_.aggregation.clip_norm)[0].score;
      }
      row_label_.push_back(label);
      row_weight_.push_back(weight);
      row_norm_.push_back(norm);
    } else {
      auto acc = acc_->flat();
      for (std::size_t i = 0; i < cur.size(); ++i) acc[i] += cur[i];
    }
    fold_ok_ = true;
  });
}

void Coordinator::run_job(JobKind kind, std::function<void()> work) {
  job_ = kind;
  actions_.push_back(action::Job{++job_id_, std::move(work)});
}

void Coordinator::on_job_done(std::uint64_t job, std::int64_t now_ms) {
  if (job != job_id_ || job_ == JobKind::None) return;
  const JobKind kind = std::exchange(job_, JobKind::None);
  switch (kind) {
    case JobKind::Fold: {
      const Upload up = std::move(*upload_);
      upload_.reset();
      if (up.edge) {
        const std::string edge = sessions_.count(up.edge) ? sessions_[up.edge].name : "?";
        if (!fold_ok_) {
          send_error(up.edge, wire::BAD_UPDATE, fold_error_);
          for (std::size_t i = 0; i < members_.size(); ++i) {
            if (members_[i].via_edge && members_[i].edge == edge && members_[i].state != MemberState::Done) {
              drop(i, "validation", "its edge's partial sum was rejected: " + fold_error_, false);
            }
          }
        } else {
          for (auto m : up.contributors) {
            members_[m].state = MemberState::Done;
            members_[m].update_sha256 = fold_sha_;
            ++completed_;
            total_weight_ += members_[m].weight;
            if (secure_) secure_->masked_from(members_[m].silo);
          }
          if (up.more && sessions_.count(up.edge)) {
            // The edge has another secure group's partial sum: grant it the slot again.
            grant(Uploader{kNone, up.edge});
            break;
          }
          for (std::size_t i = 0; i < members_.size(); ++i) {
            if (members_[i].via_edge && members_[i].edge == edge &&
                (members_[i].state == MemberState::Training || members_[i].state == MemberState::Ready)) {
              drop(i, "upload", "its edge's partial sum did not include it", false);
            }
          }
        }
      } else if (!fold_ok_) {
        if (fold_error_.find("NaN") != std::string::npos) ++nonfinite_rejected_;
        send_error(members_[up.member].session, wire::BAD_UPDATE, fold_error_);
        drop(up.member, "validation", fold_error_, false);
      } else {
        members_[up.member].state = MemberState::Done;
        members_[up.member].update_sha256 = fold_sha_;
        ++completed_;
        total_weight_ += members_[up.member].weight;
        if (secure_) secure_->masked_from(members_[up.member].silo);
      }
      pump(now_ms);
      break;
    }
    case JobKind::Unmask:
      check_groups();
      decide(now_ms);
      break;
    case JobKind::Commit:
      if (commit_aborted_) {
        ++aborted_;
        abort_reason_ = "the robust rule could not run and the fallback is abort";
        finish_round(false, now_ms);
        break;
      }
      global_ = std::move(next_global_);
      global_sha_ = next_sha_;
      ++committed_;
      finish_round(true, now_ms);
      break;
    case JobKind::Record:
      ++aborted_;
      finish_round(false, now_ms);
      break;
    case JobKind::Barrier:
      pump(now_ms);
      break;
    case JobKind::None: break;
  }
}

void Coordinator::grant(const Uploader& u) {
  spdlog::info("round {}: upload slot to {}", round_,
               u.edge ? "edge " + sessions_[u.edge].name : "silo " + members_[u.member].silo);
  upload_.emplace();
  upload_->member = u.member;
  upload_->edge = u.edge;
  if (secure_) {
    upload_->rx.reset_words(masked_buf_, {{"masked", {global_->size() + 1}, 0}},
                            cfg_.secure.bits == 64 ? wire::U64 : wire::U32, /*hash=*/false);
  } else {
    upload_->rx.reset(current_.flat(), global_->tensors(), /*hash=*/false);
  }
  auto e = env();
  e.mutable_upload_grant();
  if (u.edge) {
    send(u.edge, std::move(e));
  } else {
    members_[u.member].state = MemberState::Uploading;
    send(members_[u.member].session, std::move(e));
  }
  actions_.push_back(action::StartTimer{Timer::Upload, cfg_.deadlines.upload});
}

void Coordinator::pump(std::int64_t now_ms) {
  if (phase_ != Phase::Collecting || job_ != JobKind::None || upload_) return;
  if (completed_ >= target_) return close_round(now_ms);
  while (!ready_.empty()) {
    const Uploader u = ready_.front();
    ready_.pop_front();
    if (u.edge && sessions_.count(u.edge) && edge_pending(u.edge)) return grant(u);
    if (!u.edge && members_[u.member].state == MemberState::Ready) return grant(u);
  }
  const bool anyone_left = std::any_of(members_.begin(), members_.end(), [](const Member& mb) {
    return mb.state == MemberState::Training || mb.state == MemberState::Ready;
  });
  if (!anyone_left || train_elapsed_) close_round(now_ms);
}

void Coordinator::drop(std::size_t m, const std::string& phase, const std::string& reason,
                       bool notify) {
  auto& mb = members_[m];
  if (mb.state == MemberState::Dropped) return;
  mb.state = MemberState::Dropped;
  if (upload_ && upload_->member == m && !upload_->complete) {
    abandon_upload();  // the half-received update is simply never folded in
  }
  mb.drop_phase = phase;
  mb.drop_reason = reason;
  spdlog::warn("round {}: silo {} dropped in phase {}: {}", round_, mb.silo, phase, reason);
  if (notify) send_round_end(m, false, "you were dropped from this round: " + reason);
}

void Coordinator::send_round_end(std::size_t m, bool committed, const std::string& reason) {
  auto e = env();
  auto* re = e.mutable_round_end();
  re->set_committed(committed);
  re->set_reason(reason);
  re->set_model_sha256(committed ? next_sha_ : global_sha_);
  send_to_member(m, std::move(e));
}

void Coordinator::close_round(std::int64_t now_ms) {
  phase_ = Phase::Closing;
  actions_.push_back(action::CancelTimer{Timer::Train});
  actions_.push_back(action::CancelTimer{Timer::Upload});
  actions_.push_back(action::CancelTimer{Timer::SecAgg});
  const bool enough = completed_ >= target_;
  for (std::size_t i = 0; i < members_.size(); ++i) {
    auto& mb = members_[i];
    if (mb.state == MemberState::Training || mb.state == MemberState::Ready) {
      if (enough) {
        mb.state = MemberState::Surplus;
        send_round_end(i, false, "the round closed with enough updates; yours was not needed");
      } else {
        drop(i, mb.state == MemberState::Training ? "train" : "upload",
             "still pending when the round closed");
      }
    }
  }
  if (secure_) {
    // Ask each group's survivors for the shares that remove the masks.
    phase_ = Phase::Unmasking;
    secure_->begin_unmask();
    drain_secure();
    actions_.push_back(action::StartTimer{Timer::Unmask, cfg_.secure.unmask_deadline});
    if (secure_->unmask_complete()) finish_unmask();
    return;
  }
  decide(now_ms);
}

void Coordinator::on_secure_message(std::size_t m, const wire::Envelope& e, std::int64_t now_ms) {
  if (!secure_) {
    auto err = env();
    err.mutable_error()->set_code(wire::UNEXPECTED);
    err.mutable_error()->set_message("this round is not securely aggregated");
    send_to_member(m, std::move(err));
    return;
  }
  const std::string& silo = members_[m].silo;
  if (e.has_secagg_keys() && phase_ == Phase::Collecting) secure_->on_keys(silo, e.secagg_keys());
  if (e.has_secagg_shares() && phase_ == Phase::Collecting) secure_->on_shares(silo, e.secagg_shares());
  if (e.has_secagg_unmask_shares() && phase_ == Phase::Unmasking) {
    secure_->on_unmask(silo, e.secagg_unmask_shares());
  }
  drain_secure();
  if (phase_ == Phase::Unmasking && job_ == JobKind::None && secure_->unmask_complete()) finish_unmask();
  pump(now_ms);
}

void Coordinator::drain_secure() {
  if (!secure_) return;
  for (auto& [silo, e] : secure_->take_out()) {
    if (auto m = member_named(silo)) send_to_member(*m, std::move(e));
  }
  for (const auto& [silo, why] : secure_->take_failed()) {
    if (auto m = member_named(silo); m && members_[*m].state != MemberState::Dropped) {
      drop(*m, phase_ == Phase::Unmasking ? "unmask" : "secure", why);
    }
  }
}

void Coordinator::finish_unmask() {
  if (phase_ != Phase::Unmasking || job_ != JobKind::None) return;
  actions_.push_back(action::CancelTimer{Timer::Unmask});
  run_job(JobKind::Unmask, [this] { group_results_ = secure_->finish(); });
}

void Coordinator::check_groups() {
  const auto& sc = cfg_.secure;
  for (auto& r : group_results_) {
    std::string why = r.why;
    if (r.ok) {
      const std::size_t d = r.sum.size() - 1;
      const double w = r.sum[d];
      double sq = 0;
      for (std::size_t k = 0; k < d; ++k) sq += r.sum[k] * r.sum[k];
      // Each member adds w x with ||x|| <= clip_norm and w <= max_weight; rounding adds at most
      // one step per coordinate and member.
      const double step = std::ldexp(1.0, -static_cast<int>(sc.fraction_bits)) * static_cast<double>(r.survivors.size());
      const double bound = w * sc.clip_norm * 1.001 + step * std::sqrt(static_cast<double>(d));
      if (!(w > 0) || w > static_cast<double>(r.survivors.size()) * sc.max_weight * 1.001 + step) {
        why = "summed weight " + std::to_string(w) + " is impossible for " + std::to_string(r.survivors.size()) +
              " silos of max_weight " + std::to_string(sc.max_weight);
      } else if (std::sqrt(sq) > bound) {
        why = "group sum norm " + std::to_string(std::sqrt(sq)) + " exceeds summed weight x clip_norm = " +
              std::to_string(w * sc.clip_norm) + ": a member skipped clipping";
      }
      r.ok = why.empty();
      r.why = why;
    }
    if (!r.ok) {
      spdlog::warn("round {}: secure group {} rejected: {}", round_, r.group, r.why);
      for (const auto& silo : r.members) {
        auto m = member_named(silo);
        if (m && members_[*m].state == MemberState::Done) {
          members_[*m].state = MemberState::Training;  // let drop() record it
          drop(*m, "unmask", "secure group " + std::to_string(r.group) + ": " + r.why);
        }
      }
    }
  }
}

void Coordinator::decide(std::int64_t now_ms) {
  phase_ = Phase::Closing;
  completed_ = static_cast<std::size_t>(std::count_if(
      members_.begin(), members_.end(), [](const Member& mb) { return mb.state == MemberState::Done; }));
  const std::size_t need = std::max<std::size_t>(1, cfg_.selection.min_updates);
  if (completed_ < need) {
    abort_reason_ = "only " + std::to_string(completed_) + " updates arrived, " +
                    std::to_string(need) + " needed";
    spdlog::warn("round {} aborted: {}", round_, abort_reason_);
    auto rec = round_record(false, abort_reason_, now_ms);
    auto row = metrics_row(false, now_ms);
    run_job(JobKind::Record, [this, rec = std::move(rec), row] { store_.record(rec, &row); });
    return;
  }
  auto row = metrics_row(true, now_ms);
  auto rec = round_record(true, "", now_ms);
  run_job(JobKind::Commit, [this, row, rec = std::move(rec)]() mutable {
    commit_aborted_ = false;
    auto acc = acc_->flat();
    const bool robust_ok = secure_ ? aggregate_groups(rec)
                                   : !cfg_.aggregation.needs_all_updates() || aggregate_robust(rec);
    if (!robust_ok) {
      rec["status"] = "aborted";
      rec["model_sha256_after"] = rec["model_sha256_before"];
      auto abort_row = row;
      abort_row.committed = false;
      store_.record(rec, &abort_row);
      commit_aborted_ = true;
      return;
    }
    if (!secure_ && !cfg_.aggregation.needs_all_updates()) {
      // acc holds sum(w_i * delta_i); the mean delta is acc / W.
      const float inv = static_cast<float>(1.0 / total_weight_);
      for (auto& v : acc) v *= inv;
    }
    // The optimizer writes the new model into the same buffer, which becomes the global model.
    optimizer_.step_into(global_->flat(), acc);
    next_sha_ = crypto::sha256_hex(acc_->flat());
    rec["model_sha256_after"] = next_sha_;
    store_.commit(round_, *acc_, optimizer_.state(), rec, row);
    next_global_ = std::shared_ptr<const Model>(std::move(acc_));
  });
}

bool Coordinator::aggregate_groups(nlohmann::json& rec) {
  const std::size_t d = global_->size();
  nlohmann::json outcome = nlohmann::json::array();
  std::vector<double> total(d + 1, 0.0);
  rows_.clear();
  row_label_.clear();
  row_weight_.clear();
  row_norm_.clear();
  for (const auto& r : group_results_) {
    nlohmann::json o = {{"group", r.group}, {"survivors", r.survivors}, {"ok", r.ok}};
    if (!r.ok) o["reason"] = r.why;
    else o["weight"] = r.sum[d];
    outcome.push_back(o);
    if (!r.ok) continue;
    for (std::size_t k = 0; k <= d; ++k) total[k] += r.sum[k];
    // The group's mean: one row for a robust rule across groups.
    const double inv = 1.0 / r.sum[d];
    for (std::size_t k = 0; k < d; ++k) rows_.push_back(static_cast<float>(r.sum[k] * inv));
    row_label_.push_back(std::to_string(r.group));
    row_weight_.push_back(r.sum[d]);
    row_norm_.push_back(0);
  }
  rec["secure"]["groups_outcome"] = outcome;
  if (cfg_.aggregation.rule != "fedavg") return aggregate_robust(rec);
  auto acc = acc_->flat();
  for (std::size_t k = 0; k < d; ++k) acc[k] = static_cast<float>(total[k] / total[d]);
  return true;
}

void Coordinator::finish_round(bool committed, std::int64_t now_ms) {
  if (phase_ == Phase::Closing) {
    for (std::size_t i = 0; i < members_.size(); ++i) {
      if (members_[i].state == MemberState::Done) {
        send_round_end(i, committed, committed ? "committed" : abort_reason_);
      }
    }
    spdlog::info("round {} {}: {} updates, model {}", round_, committed ? "committed" : "aborted",
                 completed_, global_sha_.substr(0, 12));
    ++round_;
  }
  acc_.reset();
  members_.clear();
  std::vector<float>().swap(rows_);
  row_label_.clear();
  row_weight_.clear();
  row_norm_.clear();
  secure_.reset();
  group_results_.clear();
  std::vector<std::uint8_t>().swap(masked_buf_);
  if (round_ > cfg_.rounds) {
    phase_ = Phase::Finished;
    for (const auto& [id, peer] : sessions_) {
      auto e = env();
      e.mutable_finished()->set_reason("all rounds done");
      e.mutable_finished()->set_rounds(cfg_.rounds);
      send(id, std::move(e));
    }
    actions_.push_back(action::Finished{committed_, aborted_});
    return;
  }
  phase_ = Phase::Joining;
  join_elapsed_ = false;
  actions_.push_back(action::StartTimer{Timer::Join, cfg_.deadlines.join});
  try_start_round(now_ms);
}

nlohmann::json Coordinator::round_record(bool committed, const std::string& reason,
                                         std::int64_t now_ms) const {
  nlohmann::json participants = nlohmann::json::array(), dropouts = nlohmann::json::array(),
                 surplus = nlohmann::json::array(), selected = nlohmann::json::array();
  for (const auto& mb : members_) {
    selected.push_back(mb.silo);
    if (mb.state == MemberState::Done) {
      // With secure aggregation a silo's sample count and weight stay inside the masked sum.
      participants.push_back(secure_ ? nlohmann::json{{"silo", mb.silo}, {"update_sha256", mb.update_sha256}}
                                     : nlohmann::json{{"silo", mb.silo},
                                                      {"num_samples", mb.num_samples},
                                                      {"weight", mb.weight},
                                                      {"update_sha256", mb.update_sha256}});
      if (mb.via_edge) participants.back()["edge"] = mb.edge;
    } else if (mb.state == MemberState::Dropped) {
      dropouts.push_back({{"silo", mb.silo}, {"phase", mb.drop_phase}, {"reason", mb.drop_reason}});
      if (mb.via_edge) dropouts.back()["edge"] = mb.edge;
    } else if (mb.state == MemberState::Surplus) {
      surplus.push_back(mb.silo);
    }
  }
  nlohmann::json r = {{"event", "round"},
                      {"federation", cfg_.federation},
                      {"round", round_},
                      {"status", committed ? "committed" : "aborted"},
                      {"started_at", iso_time(round_started_ms_)},
                      {"ended_at", iso_time(now_ms)},
                      {"selected", selected},
                      {"target", target_},
                      {"participants", participants},
                      {"dropouts", dropouts},
                      {"surplus", surplus},
                      {"aggregation",
                       {{"rule", cfg_.aggregation.rule}, {"optimizer", cfg_.optimizer}, {"total_weight", total_weight_}}},
                      {"model_sha256_before", global_sha_},
                      {"model_sha256_after", global_sha_},
                      {"config_sha256", cfg_.config_sha256}};
  if (!committed) r["reason"] = reason;
  if (secure_) r["secure"] = secure_->describe();
  return r;
}

bool Coordinator::aggregate_robust(nlohmann::json& rec) {
  const auto& a = cfg_.aggregation;
  const std::size_t n = row_label_.size(), d = global_->size();
  const robust::MatrixView x{rows_.data(), n, d};
  // Silos caught sending NaN or infinite values were Byzantine: they used up part of the
  // budget f, so the rule guards against the f - caught that may remain among the inputs.
  const std::size_t f = a.f - std::min(a.f, nonfinite_rejected_);
  const std::size_t b = a.beta > 0 ? static_cast<std::size_t>(a.beta * static_cast<double>(n)) : f;
  const std::size_t m = a.m ? a.m : (n > f ? n - f : 1);
  std::string rule = a.rule, why;
  if (rule == "krum") why = robust::check_krum(n, f);
  if (rule == "multi_krum") why = robust::check_multi_krum(n, f, m);
  if (rule == "bulyan") why = robust::check_bulyan(n, f);
  if (rule == "trimmed_mean") why = robust::check_trimmed_mean(n, b);
  nlohmann::json info = {{"rule", a.rule}, {"f", a.f}, {"inputs", n}};
  if (nonfinite_rejected_) {
    info["nonfinite_rejected"] = nonfinite_rejected_;
    info["f_applied"] = f;
  }
  if (!why.empty()) {
    info["fallback"] = a.fallback;
    info["fallback_reason"] = why;
    rule = a.fallback;
    spdlog::warn("round {}: {}; falling back to {}", round_, why, rule);
  }
  info["applied"] = rule;
  if (a.clip_norm > 0) info["clip_norm"] = a.clip_norm;
  if (rule == "abort") {
    rec["reason"] = why + "; the configured fallback is abort";
    rec["robust"] = info;
    return false;
  }
  const std::vector<double>& weights = row_weight_;
  robust::Result r;
  if (rule == "fedavg") r = robust::mean(x, weights);
  else if (rule == "krum") r = robust::krum(x, f);
  else if (rule == "multi_krum") r = robust::multi_krum(x, f, m);
  else if (rule == "median") r = robust::median(x);
  else if (rule == "trimmed_mean") r = robust::trimmed_mean(x, b);
  else if (rule == "bulyan") r = robust::bulyan(x, f);
  else r = robust::centered_clip(x, a.tau, a.iterations);
  std::copy(r.aggregate.begin(), r.aggregate.end(), acc_->flat().begin());
  nlohmann::json inputs = nlohmann::json::array();
  for (std::size_t i = 0; i < n; ++i) {
    nlohmann::json e = {{secure_ ? "group" : "silo", row_label_[i]},
                        {"kept", r.decisions[i].kept},
                        {"score", r.decisions[i].score}};
    if (!r.decisions[i].reason.empty()) e["reason"] = r.decisions[i].reason;
    if (a.clip_norm > 0) {
      e["norm"] = row_norm_[i];
      if (row_norm_[i] > a.clip_norm) e["clipped"] = true;
    }
    inputs.push_back(e);
  }
  info["decisions"] = inputs;
  rec["robust"] = info;
  return true;
}

MetricsRow Coordinator::metrics_row(bool committed, std::int64_t now_ms) const {
  MetricsRow row;
  row.round = round_;
  row.committed = committed;
  row.selected = members_.size();
  double train_w = 0, eval_w = 0;
  for (const auto& mb : members_) {
    if (mb.state == MemberState::Dropped) ++row.dropped;
    if (mb.state == MemberState::Done) {
      ++row.reported;
      row.train_loss += mb.metrics.train_loss() * static_cast<double>(mb.num_samples);
      train_w += static_cast<double>(mb.num_samples);
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
  row.seconds = static_cast<double>(now_ms - round_started_ms_) / 1000.0;
  row.upload_bytes = upload_bytes_;
  std::set<std::string> edges;
  for (const auto& mb : members_) {
    if (mb.state == MemberState::Done && mb.via_edge) edges.insert(mb.edge);
  }
  row.edges = edges.size();
  return row;
}

}  // namespace xsilo::server
