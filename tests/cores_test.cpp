// The server's coordinator and the silos' sessions, the real protocol cores, wired together in
// one process: every message is delivered by the harness, every job runs when it is posted,
// and time moves only when a test says so. What the multi-process tests reach only by timing
// (a silo hung while its peers advertise keys; a silo gone after its upload, while its group
// unmasks; dropouts in every secure group), here happens at a chosen instant, every run.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include "crypto/fixed_point.h"
#include "crypto/hash.h"
#include "crypto/sign.h"
#include "privacy/accountant.h"
#include "protocol/audit_key.h"
#include "protocol/secagg_wire.h"
#include "protocol/tensor_stream.h"
#include "server/audit.h"
#include "server/coordinator.h"
#include "server/distributed_dp.h"
#include "silo_agent/session.h"
#include "tests/testlib.h"

namespace xsilo {
namespace {

using namespace std::chrono_literals;

// The records in memory, each under a head signed with a real audit key (the silos check the
// head of a distributed-DP round's unmask_begun before they release their unmask shares).
class MemoryStore : public server::Store {
 public:
  server::AuditHead commit(std::uint64_t, const Model&, const Model&, const nlohmann::json& rec,
                           const server::MetricsRow&) override {
    return record(rec, nullptr);
  }
  server::AuditHead record(const nlohmann::json& rec, const server::MetricsRow*) override {
    records.push_back(rec);
    records.back()["seq"] = records.size();  // as the audit log seals it
    std::string line = records.back().dump();
    const std::string sha = crypto::sha256_hex(line);
    heads.push_back(sha);
    const std::string sig = key_.sign(protocol::audit_head_statement(records.size(), sha));
    return {.seq = records.size(),
            .sha256 = sha,
            .signature = crypto::to_hex(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(sig.data()), sig.size())),
            .line = std::move(line)};
  }
  std::vector<server::AuditKeySpan> audit_keys() const override {
    return {server::AuditKeySpan{.public_key = key_.public_key(), .from_seq = 1, .rotation_signature = ""}};
  }
  std::vector<nlohmann::json> rounds() const {
    std::vector<nlohmann::json> out;
    for (const auto& r : records) {
      if (r.value("event", "") == "round") out.push_back(r);
    }
    return out;
  }
  std::vector<nlohmann::json> records;
  std::vector<std::string> heads;  // each record's hash, record 1 first

 private:
  crypto::SigningKey key_ = crypto::SigningKey::generate();
};

// local = global + 0.01 (i + 1): each silo's delta is its own.
class SiloTrainer final : public agent::Trainer {
 public:
  explicit SiloTrainer(float step) : step_(step) {}
  wire::TrainMetrics evaluate(const Model&, const agent::TrainTask&) override { return {}; }
  agent::TrainResult train(const Model& global, const agent::TrainTask&, Model& local) override {
    for (std::size_t i = 0; i < local.size(); ++i) local.flat()[i] = global.flat()[i] + step_;
    agent::TrainResult r;
    r.num_samples = 10;
    return r;
  }

 private:
  float step_;
};

// A silo's simulated faults: its process dies right after it sends the message of a secure
// step; or it is Byzantine inside secure aggregation: it scales its update and skips its own
// clipping, or claims an unclipped count of 7 where an honest member adds 0 or 1.
class DieAfter final : public agent::FaultHook {
 public:
  bool after_sent(agent::SecureStep step, std::uint64_t) override {
    fired = fired || (die_after && *die_after == step);
    return fired;
  }
  bool tampers() const override { return skip_clipping > 0; }
  void tamper(const agent::TrainTask&, const Model&, std::span<float> update, double) override {
    if (skip_clipping > 0) {
      for (auto& v : update) v *= static_cast<float>(skip_clipping);
    }
  }
  void encoding(crypto::FixedPointParams& codec) override {
    if (skip_clipping > 0) codec.clip_norm = std::numeric_limits<double>::max();
  }
  void encoded(protocol::MaskedVector& words, const crypto::FixedPointParams& codec) override {
    if (!lies_in_count || !codec.unclipped_bit) return;
    words.visit([&](auto w) {
      using T = typename decltype(w)::element_type;
      w[w.size() - 1] = static_cast<T>(T{7} << codec.fraction_bits);
    });
  }
  std::optional<agent::SecureStep> die_after;
  bool fired = false;
  double skip_clipping = 0;  // > 0: the factor the update is scaled by
  bool lies_in_count = false;
};

Model small_model() {
  Model m;
  m.add("w", {6});
  for (std::size_t i = 0; i < m.size(); ++i) m.flat()[i] = 0.1f * static_cast<float>(i);
  return m;
}

// A federation of `n` silos straight to the server, as one process.
class Cores {
 public:
  Cores(server::RoundConfig cfg, std::size_t n) : initial_(small_model()) {
    cfg.federation = "fed";
    cfg.any_silo = false;  // an allow-list of the n: the round starts once all have joined
    for (std::size_t i = 0; i < n; ++i) cfg.expected_silos.insert(name(i));
    cfg.ca = test::verifier();
    cfg.signer = test::signer(wire::SERVER, "server");
    coord_ = std::make_unique<server::Coordinator>(cfg, initial_, server::ServerOptimizer({}, initial_), store, 1);
    for (std::size_t i = 0; i < n; ++i) {
      trainers_.push_back(std::make_unique<SiloTrainer>(0.01f * static_cast<float>(i + 1)));
      agent::SessionConfig sc;
      sc.federation = "fed";
      sc.chunk_bytes = 64;
      sc.signer = test::signer(wire::SILO, name(i));
      sc.ca = test::verifier();
      hooks_.push_back(std::make_unique<DieAfter>());
      sessions_.push_back(std::make_unique<agent::Session>(sc, *trainers_.back(), *hooks_.back()));
    }
  }
  static std::string name(std::size_t i) { return "silo-" + std::to_string(i); }

  void start() {
    coord_->start(now_);
    for (std::size_t i = 0; i < sessions_.size(); ++i) connect(i);
    settle();
  }
  void connect(std::size_t i) {
    sessions_[i]->on_connected(name(i), "server:1", "server", "server server");
    coord_->on_connect(id(i), name(i), now_);
  }
  // The silo's process is gone: its connection closes, and it says nothing more.
  void kill(std::size_t i) {
    dead_.insert(i);
    coord_->on_disconnect(id(i), now_);
    settle();
  }
  // Frozen (SIGSTOP): whatever reaches it waits, and it sends nothing.
  void hang(std::size_t i) { hung_.insert(i); }
  void unhang(std::size_t i) {
    hung_.erase(i);
    settle();
  }
  void die_after(std::size_t i, agent::SecureStep step) { hooks_[i]->die_after = step; }
  DieAfter& hook(std::size_t i) { return *hooks_[i]; }
  // Silo i freezes as a message of this kind reaches it (the message waits, unread).
  void hang_on(std::size_t i, wire::SecureAggregation::StepCase step) { hang_on_[i] = step; }
  // The secure group the server put silo i in (from the RoundStart waiting for it or handled).
  std::uint32_t group_of(std::size_t i) const { return groups_.count(i) ? groups_.at(i) : 0; }
  // Moves time on by `dt`, firing every timer that falls due on the way, in order.
  void advance(std::chrono::milliseconds dt) {
    const auto until = now_ + dt.count();
    for (;;) {
      auto next = std::min_element(timers_.begin(), timers_.end(), [](auto& a, auto& b) { return a.second < b.second; });
      if (next == timers_.end() || next->second > until) break;
      now_ = next->second;
      const auto t = next->first;
      timers_.erase(next);
      coord_->on_timer(t, now_);
      settle();
    }
    now_ = until;
  }
  // Delivers and runs everything queued until nothing moves (no time passes).
  void settle() {
    for (int guard = 0; guard < 100000; ++guard) {
      bool moved = false;
      for (auto& a : coord_->take_actions()) {
        moved = true;
        std::visit([this](auto& x) { apply(x); }, a);
      }
      for (std::size_t i = 0; i < sessions_.size(); ++i) {
        if (dead_.count(i) || hung_.count(i)) continue;
        while (!inbox_[i].empty()) {
          if (hang_on_.count(i) && inbox_[i].front().secure().step_case() == hang_on_[i]) {
            hung_.insert(i);
            break;
          }
          moved = true;
          auto e = std::move(inbox_[i].front());
          inbox_[i].pop_front();
          sessions_[i]->on_message(e);
        }
        for (auto& a : sessions_[i]->take_actions()) {
          moved = true;
          apply_silo(i, a);
        }
        if (hooks_[i]->fired) {  // its process died after the step it sent
          dead_.insert(i);
          coord_->on_disconnect(id(i), now_);
          moved = true;
        }
      }
      if (!moved) return;
    }
    FAIL() << "the cores never settled";
  }
  std::int64_t now() const { return now_; }
  server::Coordinator& coord() { return *coord_; }
  // The packed wire's width the last secure setup signed (0: whole words).
  std::uint32_t wire_bits() const { return wire_bits_; }
  MemoryStore store;

 private:
  server::SessionId id(std::size_t i) const { return i + 1; }
  void apply(server::action::Send& a) {
    if (a.env.has_round_start() && a.env.round_start().has_secagg()) {
      groups_[a.to - 1] = a.env.round_start().secagg().group();
      wire_bits_ = a.env.round_start().secagg().wire_bits();
    }
    inbox_[a.to - 1].push_back(std::move(a.env));
  }
  void apply(server::action::SendModel& a) {
    auto src = a.delta ? protocol::ChunkSource(a.delta, "fed", a.round)
                       : protocol::ChunkSource(a.model, a.model->flat(), a.model->tensors(), "fed", a.round, 64);
    while (auto c = src.next()) inbox_[a.to - 1].push_back(*c);
  }
  void apply(server::action::Close&) {}
  void apply(server::action::StartTimer& a) { timers_[a.timer] = now_ + a.after.count(); }
  void apply(server::action::CancelTimer& a) { timers_.erase(a.timer); }
  void apply(server::action::Job& a) { coord_->on_job_done(a.id, a.work(), now_); }
  void apply(server::action::Background& a) { a.work(); }
  void apply(server::action::Finished&) { finished_ = true; }
 public:
  bool finished() const { return finished_; }
 private:
  void apply(server::action::Event&) {}
  void apply(server::action::Stop& a) { ADD_FAILURE() << "the server stopped: " << a.reason; }
  void apply_silo(std::size_t i, agent::Action& a) {
    if (auto* s = std::get_if<agent::action::Send>(&a)) coord_->on_message(id(i), s->env, now_);
    if (auto* s = std::get_if<agent::action::SendStream>(&a)) {
      while (auto e = s->source->next()) coord_->on_message(id(i), *e, now_);
    }
    if (auto* j = std::get_if<agent::action::Job>(&a)) sessions_[i]->on_job_done(j->id, j->work());
    if (auto* r = std::get_if<agent::action::Record>(&a); r && r->log == "sent.jsonl") sent_[i].push_back(r->entry);
  }

 public:
  // Silo i's sent.jsonl, as its agent would have written it, in a file of `dir`.
  std::filesystem::path sent_log(std::size_t i, const std::filesystem::path& dir) const {
    std::string text;
    if (const auto it = sent_.find(i); it != sent_.end()) {
      for (const auto& line : it->second) text += line.dump() + "\n";
    }
    const auto path = dir / (name(i) + ".sent.jsonl");
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  // How many unmask releases silo i logged.
  std::size_t releases(std::size_t i) const {
    const auto it = sent_.find(i);
    if (it == sent_.end()) return 0;
    return static_cast<std::size_t>(std::count_if(it->second.begin(), it->second.end(), [](const auto& l) {
      return l.value("kind", "") == protocol::kUnmaskSharesReleased;
    }));
  }

 private:

  Model initial_;
  std::unique_ptr<server::Coordinator> coord_;
  std::vector<std::unique_ptr<DieAfter>> hooks_;
  std::map<std::size_t, std::uint32_t> groups_;
  std::uint32_t wire_bits_ = 0;
  std::map<std::size_t, wire::SecureAggregation::StepCase> hang_on_;
  std::vector<std::unique_ptr<SiloTrainer>> trainers_;
  std::vector<std::unique_ptr<agent::Session>> sessions_;
  std::map<std::size_t, std::deque<wire::Envelope>> inbox_;
  std::map<std::size_t, std::vector<nlohmann::json>> sent_;  // each silo's sent.jsonl lines
  std::map<server::Timer, std::int64_t> timers_;
  std::set<std::size_t> dead_, hung_;
  std::int64_t now_ = 1'700'000'000'000;
  bool finished_ = false;
};

server::RoundConfig secure_config(server::SecureMode mode, std::size_t silos) {
  server::RoundConfig c;
  c.rounds = 1;
  c.plan.set_train(true);
  c.selection.min_silos = silos;
  c.selection.min_updates = 3;
  c.deadlines.join = 5s;
  c.deadlines.train = 20s;
  c.deadlines.upload = 20s;
  c.secure.mode = mode;
  c.secure.min_group = 3;
  c.secure.bits = 64;
  c.secure.fraction_bits = 24;
  c.secure.clip_norm = 100;
  c.secure.keys_deadline = 30s;
  c.secure.unmask_deadline = 30s;
  return c;
}

std::set<std::string> names_of(const nlohmann::json& list) {
  std::set<std::string> out;
  for (const auto& p : list) out.insert(p["silo"].get<std::string>());
  return out;
}

// Found by the 2026-12-04 operator's run (issue 37): with secure.keys_s at or above
// deadlines.train_s, one hung silo held every group's key phase past the training deadline, and
// the server blamed every silo for missing it (three rounds aborted). The deadline now waits for
// the groups to settle: the hung silo is the only dropout, whatever the two deadlines are.
TEST(Cores, OneHungSiloCostsOnlyItselfWhenTheKeyDeadlineOutlastsTraining) {
  Cores fed(secure_config(server::SecureMode::Global, 5), 5);
  fed.hang(4);
  fed.start();
  fed.advance(20s);  // the training deadline: the key phase still waits for silo-4
  EXPECT_TRUE(fed.store.rounds().empty());
  fed.advance(40s);  // keys close at 30 s without it; the others settle, mask and upload
  fed.advance(60s);
  const auto rounds = fed.store.rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0]["status"], "committed") << rounds[0].dump(2);
  EXPECT_EQ(names_of(rounds[0]["participants"]), (std::set<std::string>{"silo-0", "silo-1", "silo-2", "silo-3"}));
  ASSERT_EQ(rounds[0]["dropouts"].size(), 1u) << rounds[0].dump(2);
  EXPECT_EQ(rounds[0]["dropouts"][0]["silo"], "silo-4");
  EXPECT_EQ(rounds[0]["dropouts"][0]["cause"], "secure_no_keys");  // the step it missed, not just "its group"
}

// Issue 37: a survivor whose connection closed after its upload made the server wait the whole
// unmask_s for its answer. A silo known to be gone is not waited for: the others' answers
// unmask the sum at once.
TEST(Cores, ASurvivorGoneWhileItsGroupUnmasksIsNotWaitedFor) {
  auto cfg = secure_config(server::SecureMode::Global, 5);
  cfg.selection.min_updates = 5;  // the round closes once all five uploaded
  Cores fed(cfg, 5);
  fed.hang_on(2, wire::SecureAggregation::kSecaggSurvivors);  // uploaded, then stops as the unmasking starts
  fed.start();
  ASSERT_EQ(fed.coord().phase(), server::Phase::Unmasking);  // the others confirmed; silo-2's answer is awaited
  EXPECT_TRUE(fed.store.rounds().empty());
  fed.kill(2);
  const auto t0 = fed.now();
  fed.advance(1ms);
  const auto rounds = fed.store.rounds();
  ASSERT_EQ(rounds.size(), 1u) << "still waiting on the gone silo";
  EXPECT_EQ(rounds[0]["status"], "committed") << rounds[0].dump(2);
  EXPECT_EQ(rounds[0]["participants"].size(), 5u);  // its masked input is in the sum
  EXPECT_LT(fed.now() - t0, 1000);
}

// Issue 37: groups drawn at exactly min_group failed whole with one dropout (one kill cost four
// silos; two aborted a twelve-silo round). With the default secure.group_dropouts = 1, twelve
// silos make three groups of four, and a silo of each group dying right after it dealt its
// shares costs each group only that silo.
TEST(Cores, OneDropoutInEverySecureGroupCostsOnlyThatSilo) {
  auto cfg = secure_config(server::SecureMode::Grouped, 12);
  cfg.selection.min_updates = 9;
  Cores fed(cfg, 12);
  for (std::size_t i = 0; i < 12; ++i) fed.hang(i);
  fed.start();  // the RoundStarts wait in the silos' inboxes: whose group is whose
  std::map<std::uint32_t, std::size_t> victim;
  for (std::size_t i = 0; i < 12; ++i) victim.emplace(fed.group_of(i), i);
  ASSERT_EQ(victim.size(), 3u);
  std::set<std::string> dead;
  for (const auto& [group, i] : victim) {
    fed.die_after(i, agent::SecureStep::SharesSent);
    dead.insert(Cores::name(i));
  }
  for (std::size_t i = 0; i < 12; ++i) fed.unhang(i);
  fed.advance(61s);  // the receipt phase waits out its deadline for the dead
  fed.advance(61s);
  const auto rounds = fed.store.rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0]["status"], "committed") << rounds[0].dump(2);
  ASSERT_EQ(rounds[0]["secure"]["groups"].size(), 3u) << rounds[0].dump(2);
  for (const auto& group : rounds[0]["secure"]["groups"]) EXPECT_EQ(group["members"].size(), 4u);
  for (const auto& o : rounds[0]["secure"]["groups_outcome"]) EXPECT_TRUE(o["ok"].get<bool>()) << rounds[0].dump(2);
  EXPECT_EQ(rounds[0]["participants"].size(), 9u);
  EXPECT_EQ(names_of(rounds[0]["dropouts"]), dead);
  // Dead, not merely silent: the cause is the closed connection, seen before any step was missed.
  for (const auto& d : rounds[0]["dropouts"]) EXPECT_EQ(d["cause"], "disconnected") << d.dump();
}

// Issue 38: a Byzantine silo inside secure aggregation that skips its own clipping (its update
// scaled by 10^4), or lies in its unclipped count (7 where a member may add 0 or 1). The server
// never sees either update, only its group's sum, which no honest group could make: the group
// is rejected with the reason (the culprit cannot be named, docs/security.md), the other groups
// commit the round.
TEST(Cores, AGroupWithAMemberWhoSkippedClippingOrLiedInItsCountIsRejectedAndTheOthersCommit) {
  // The count is in the sums under adaptive clipping, and without it in any round without
  // silo-level DP (secure.clipped).
  for (const int kind : {0, 1, 2}) {
    const bool lie = kind > 0;
    SCOPED_TRACE(!lie ? "skips its clipping" : kind == 1 ? "lies in its count (adaptive)" : "lies in its count");
    auto cfg = secure_config(server::SecureMode::Grouped, 12);
    cfg.selection.min_updates = 6;
    cfg.secure.clip_norm = 1;
    if (kind == 1) {  // adaptive clipping: the masked sums count the members within the round's norm
      cfg.aggregation.adaptive_clip.quantile = 0.5;
      cfg.aggregation.adaptive_clip.initial = 0.5;
    }
    Cores fed(cfg, 12);
    if (lie) {
      fed.hook(3).lies_in_count = true;
    } else {
      fed.hook(3).skip_clipping = 1e4;
    }
    fed.start();
    fed.advance(1s);
    const auto rounds = fed.store.rounds();
    ASSERT_EQ(rounds.size(), 1u);
    EXPECT_EQ(rounds[0]["status"], "committed") << rounds[0].dump(2);
    std::size_t rejected = 0;
    for (const auto& o : rounds[0]["secure"]["groups_outcome"]) {
      if (o["ok"].get<bool>()) continue;
      ++rejected;
      const std::string why = o["reason"];
      EXPECT_NE(why.find(lie ? "a member sent a bit other than 0 or 1" : "a member skipped clipping"), std::string::npos)
          << why;
    }
    EXPECT_EQ(rejected, 1u) << rounds[0].dump(2);
    // The rejected group's silos are dropouts with that reason; silo-3 among them.
    bool named = false;
    for (const auto& d : rounds[0]["dropouts"]) named = named || d["silo"] == "silo-3";
    EXPECT_TRUE(named) << rounds[0].dump(2);
  }
}

// Issue 41: LightSecAgg behind the secure seam, in the same federation as SecAgg. With a silo
// of every group dying right after it dealt its shares (one in a global group of five; one in
// each of three groups of four), both protocols commit the mean of exactly the survivors'
// updates (to the fixed-point codec's rounding), and the round's record names the protocol.
TEST(Cores, LightSecAggCommitsTheSurvivorsMeanAsSecAggDoesWithADropoutInEveryGroup) {
  for (const auto protocol : {server::SecureProtocol::SecAgg, server::SecureProtocol::LightSecAgg}) {
    for (const auto mode : {server::SecureMode::Global, server::SecureMode::Grouped}) {
      const std::size_t n = mode == server::SecureMode::Global ? 5 : 12;
      SCOPED_TRACE(std::string(server::name(protocol)) + " " + std::string(server::name(mode)));
      auto cfg = secure_config(mode, n);
      cfg.secure.protocol = protocol;
      cfg.secure.bits = 32;  // LightSecAgg's field words; SecAgg in the same ring for the comparison
      cfg.secure.fraction_bits = 16;
      cfg.selection.min_updates = 3;
      Cores fed(cfg, n);
      for (std::size_t i = 0; i < n; ++i) fed.hang(i);
      fed.start();
      std::map<std::uint32_t, std::size_t> victim;
      for (std::size_t i = 0; i < n; ++i) victim.emplace(fed.group_of(i), i);
      std::set<std::string> dead;
      for (const auto& [group, i] : victim) {
        fed.die_after(i, agent::SecureStep::SharesSent);
        dead.insert(Cores::name(i));
      }
      for (std::size_t i = 0; i < n; ++i) fed.unhang(i);
      fed.advance(61s);
      fed.advance(61s);
      const auto rounds = fed.store.rounds();
      ASSERT_EQ(rounds.size(), 1u);
      ASSERT_EQ(rounds[0]["status"], "committed") << rounds[0].dump(2);
      EXPECT_EQ(names_of(rounds[0]["dropouts"]), dead);
      ASSERT_EQ(rounds[0]["participants"].size(), n - dead.size());
      if (protocol == server::SecureProtocol::LightSecAgg) {
        EXPECT_EQ(rounds[0]["secure"]["protocol"], "lightsecagg") << rounds[0]["secure"].dump(2);
        for (const auto& g : rounds[0]["secure"]["groups"]) EXPECT_EQ(g["protocol"], "lightsecagg");
      }
      // Every silo trained 10 samples; silo i's delta is 0.01 (i + 1) in every coordinate.
      double mean = 0;
      for (const auto& p : rounds[0]["participants"]) {
        const std::string silo = p["silo"];
        mean += 0.01 * (std::stod(silo.substr(silo.find('-') + 1)) + 1);
      }
      mean /= static_cast<double>(rounds[0]["participants"].size());
      const Model initial = small_model();
      const auto model = fed.coord().model();
      for (std::size_t j = 0; j < initial.size(); ++j) {
        EXPECT_NEAR(model->flat()[j] - initial.flat()[j], mean, 1e-4) << "coordinate " << j;
      }
    }
  }
}


// Distributed DP for the Cores' model: a fixed noise multiplier, W the `silos`, the masking ring
// of `cfg` (32 bits).
void distributed_dp(server::RoundConfig& cfg, std::size_t silos, double denominator = 0) {
  cfg.secure.bits = 32;
  server::DistributedDpConfig dp;
  dp.epsilon = 40;
  dp.noise_multiplier = 1.0;
  dp.denominator = denominator > 0 ? denominator : static_cast<double>(silos);
  dp.max_group = silos;
  dp.ring = cfg.secure.bits;
  cfg.distributed_dp = dp;
}

// The round aborted after its unmasking began: the coordinator wrote the round's "unmask_begun"
// record before asking any silo for unmask shares, and charges the round once (its record, and
// its own ledger that `xsilo status` shows), as the audit check counts it.
void expect_charged_once_after_its_unmask_begun_record(Cores& fed, std::uint64_t revealed) {
  const auto& records = fed.store.records;
  const auto begun = std::find_if(records.begin(), records.end(), [](const auto& r) { return r["event"] == "unmask_begun"; });
  const auto round = std::find_if(records.begin(), records.end(), [](const auto& r) { return r["event"] == "round"; });
  ASSERT_NE(begun, records.end());
  ASSERT_NE(round, records.end());
  EXPECT_LT(begun - records.begin(), round - records.begin()) << "written before any sum was unmasked";
  ASSERT_EQ((*round)["status"], "aborted") << round->dump(2);
  const auto& p = (*round)["privacy"];
  EXPECT_EQ(p["sums_revealed"], revealed) << round->dump(2);
  EXPECT_EQ(p["rounds_spent"], 1u);
  EXPECT_EQ((*begun)["round"], 1u);
  EXPECT_EQ((*begun)["privacy"]["setup_sha256"], p["setup_sha256"]);
  EXPECT_EQ((*begun)["privacy"]["epsilon"], p["epsilon"]);
  EXPECT_FALSE((*begun)["privacy"].contains("sums_revealed"));
  const auto status = fed.coord().status(fed.now());
  EXPECT_NEAR(status["distributed_dp"]["epsilon"].get<double>(), p["epsilon"].get<double>(), 1e-12);
  EXPECT_GT(p["epsilon"].get<double>(), 0);
  const auto claims = server::check_privacy_claims(records);
  ASSERT_TRUE(claims.has_value()) << claims.error().message();
  EXPECT_EQ(claims->silo_rounds(), 1u);
}

// Issue 42, the abort recorded apart from a commit (Coordinator::record_abort): distributed DP in
// two secure groups of four; two members of one group upload and then are gone before the
// unmasking, so that group's sum cannot be unmasked while the other's is, and too few updates are
// left.
TEST(Cores, ADistributedDpRoundAbortedAfterUnmaskingIsChargedOnceAndItsUnmaskingWasRecordedFirst) {
  auto cfg = secure_config(server::SecureMode::Grouped, 8);
  cfg.selection.min_updates = 8;  // the round closes once all eight uploaded
  distributed_dp(cfg, 8);
  Cores fed(cfg, 8);
  for (std::size_t i = 0; i < 8; ++i) fed.hang(i);
  fed.start();
  std::map<std::uint32_t, std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < 8; ++i) groups[fed.group_of(i)].push_back(i);
  ASSERT_EQ(groups.size(), 2u);
  const auto& lost = groups.begin()->second;  // two of its four: fewer survivors than its threshold of 3
  for (std::size_t k = 0; k < 2; ++k) fed.hang_on(lost[k], wire::SecureAggregation::kSecaggSurvivors);
  for (std::size_t i = 0; i < 8; ++i) fed.unhang(i);
  ASSERT_EQ(fed.coord().phase(), server::Phase::Unmasking);
  fed.kill(lost[0]);
  fed.kill(lost[1]);
  fed.advance(1ms);
  expect_charged_once_after_its_unmask_begun_record(fed, 1);
}

// Issue 42, the abort of a commit that fails after the sums were unmasked (the Commit job): one
// global group of five, every sum unmasked, and a step that overflows float (an absurd
// denominator W of 1e-300 makes it infinite): the round aborts, charged once.
TEST(Cores, ADistributedDpRoundWhoseCommitFailsAfterUnmaskingIsChargedOnce) {
  auto cfg = secure_config(server::SecureMode::Global, 5);
  cfg.selection.min_updates = 5;
  distributed_dp(cfg, 5, 1e-300);
  Cores fed(cfg, 5);
  fed.start();
  fed.advance(1s);
  const auto rounds = fed.store.rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_NE(rounds[0].value("reason", "").find("NaN or infinite"), std::string::npos) << rounds[0].dump(2);
  expect_charged_once_after_its_unmask_begun_record(fed, 1);
}

// Issue 42, the packed wire: distributed DP at bits 20 in the ring of 2^32, one global group of
// five, silo-2 gone right after it sent its shares (the others mask with its pairwise masks,
// which the server removes mod 2^32 from words that travelled mod 2^20). Every setup signs
// wire_bits 20 and the uploads travel in chunks of 64 bytes, 20 bits a word; the same round
// with secure.packed_wire off signs none and sends whole words. Both commit the mean of the four
// survivors' deltas within the (small) noise, and the packed uploads are 32/20 smaller.
TEST(Cores, ADistributedDpRoundTravelsPackedInItsBitsAndDecodesAsWholeWordsDoWithADropout) {
  std::map<bool, std::vector<float>> step;
  std::map<bool, std::uint64_t> bytes;
  for (const bool packed : {true, false}) {
    auto cfg = secure_config(server::SecureMode::Global, 5);
    cfg.selection.min_updates = 4;
    distributed_dp(cfg, 5);
    cfg.distributed_dp->epsilon = 1e9;
    cfg.distributed_dp->noise_multiplier = 0.01;  // noise of about 0.002 a coordinate of the mean
    cfg.secure.packed_wire = packed;
    Cores fed(cfg, 5);
    fed.die_after(2, agent::SecureStep::SharesSent);
    fed.start();
    fed.advance(60s);
    fed.advance(60s);
    const auto rounds = fed.store.rounds();
    ASSERT_EQ(rounds.size(), 1u);
    ASSERT_EQ(rounds[0]["status"], "committed") << rounds[0].dump(2);
    EXPECT_EQ(rounds[0]["distributed_dp"]["updates"], 4.0) << rounds[0].dump(2);
    EXPECT_EQ(rounds[0]["privacy"]["bits"], 20);
    EXPECT_EQ(fed.wire_bits(), packed ? 20u : 0u);
    bytes[packed] = rounds[0]["upload_bytes"].get<std::uint64_t>();
    const auto before = small_model(), after = *fed.coord().model();
    for (std::size_t i = 0; i < after.size(); ++i) step[packed].push_back(after.flat()[i] - before.flat()[i]);
  }
  // Four uploads of 9 words (8 rotated coordinates and the contributor word): 23 bytes packed, 36 whole.
  EXPECT_EQ(bytes[true], 4u * 23);
  EXPECT_EQ(bytes[false], 4u * 36);
  const float mean = (0.01f + 0.02f + 0.04f + 0.05f) / 5;  // silos 0, 1, 3, 4 over W = 5
  for (std::size_t i = 0; i < step[true].size(); ++i) {
    EXPECT_NEAR(step[true][i], mean, 0.012) << i;
    EXPECT_NEAR(step[false][i], mean, 0.012) << i;
  }
}

// Issue 42, the false alarm mended: the coordinator writes unmask_begun before it asks for unmask
// shares, so a round that aborts after some silos released theirs but before any sum could be
// unmasked (fewer than the threshold answered) is charged, and the silos' sent.jsonl, which
// logged the releases, passes `audit verify --sent`. One global group of five (threshold 3):
// all confirm the survivor set, two answer the unmask request, three freeze as it reaches them.
TEST(Cores, ADistributedDpRoundAbortedWithTooFewUnmaskAnswersIsChargedAndTheReleasesPassSent) {
  auto cfg = secure_config(server::SecureMode::Global, 5);
  cfg.selection.min_updates = 5;
  distributed_dp(cfg, 5);
  Cores fed(cfg, 5);
  for (std::size_t i = 2; i < 5; ++i) fed.hang_on(i, wire::SecureAggregation::kSecaggUnmaskRequest);
  fed.start();
  ASSERT_EQ(fed.coord().phase(), server::Phase::Unmasking);
  EXPECT_TRUE(fed.store.rounds().empty());
  // The unmask_begun record is on the log before any share left a silo.
  ASSERT_FALSE(fed.store.records.empty());
  EXPECT_EQ(fed.store.records.back()["event"], "unmask_begun");
  EXPECT_EQ(fed.releases(0), 1u);
  EXPECT_EQ(fed.releases(1), 1u);
  EXPECT_EQ(fed.releases(2), 0u);
  fed.advance(31s);  // the unmask deadline: two shares of a threshold of three, no sum
  const auto rounds = fed.store.rounds();
  ASSERT_EQ(rounds.size(), 1u);
  expect_charged_once_after_its_unmask_begun_record(fed, 0);
  test::TempDir dir;
  for (std::size_t i = 0; i < 5; ++i) {
    const auto sent = server::check_sent_setups(fed.store.records, fed.sent_log(i, dir.path()),
                                                {.log_may_be_stale = false, .line_sha256 = fed.store.heads});
    ASSERT_TRUE(sent.has_value()) << Cores::name(i) << ": " << sent.error().message();
    EXPECT_EQ(sent->releases, fed.releases(i)) << Cores::name(i);
    EXPECT_EQ(sent->compared, 1u) << Cores::name(i);  // its upload, under the round's setup
  }
  // The log without the unmask_begun record (as the server wrote it before the mend of
  // 2026-12-06: unmask_begun after the shares were collected, so never for this round): the
  // releases name the record they were shown, which the log does not hold.
  auto before = fed.store.records;
  before.erase(std::remove_if(before.begin(), before.end(), [](const auto& r) { return r["event"] == "unmask_begun"; }),
               before.end());
  const auto unmended = server::check_sent_setups(before, fed.sent_log(0, dir.path()));
  ASSERT_FALSE(unmended.has_value());
  EXPECT_NE(unmended.error().message().find("which the log does not hold"), std::string::npos)
      << unmended.error().message();
}

// Issue 42 item 5: a robust rule across secure groups under distributed DP is post-processing of
// the noisy group sums the round releases anyway. Twenty silos in five groups of four, two
// rounds, silo-0 sending 100 times its delta (within C: an outlier that clipping lets through),
// with fedavg and with median, trimmed mean and Multi-Krum across the groups: every rule commits
// the step it computes from the groups' noisy means (each sum over its members), the noise small
// enough (z = 0.0002) that the step can be checked against the clean means; the spend is the
// accountant's two SkellamSum rounds, the same for every rule; the audit check and each silo's
// --sent check pass.
TEST(Cores, ARobustRuleAcrossDistributedDpGroupsCommitsItsStepAndSpendsWhatFedAvgSpends) {
  std::optional<double> fedavg_epsilon;
  for (const auto rule : {robust::Rule::FedAvg, robust::Rule::Median, robust::Rule::TrimmedMean, robust::Rule::MultiKrum}) {
    SCOPED_TRACE(std::string(robust::name(rule)));
    auto cfg = secure_config(server::SecureMode::Grouped, 20);
    cfg.rounds = 2;
    cfg.selection.min_updates = 20;
    cfg.aggregation.rule.rule = rule;
    cfg.aggregation.rule.f = rule == robust::Rule::FedAvg ? 0 : 1;
    cfg.aggregation.rule.m = 3;
    distributed_dp(cfg, 20);
    cfg.distributed_dp->noise_multiplier = 0.0002;
    cfg.distributed_dp->epsilon = 1e9;
    cfg.distributed_dp->clip_norm = 5;  // above every silo's delta: silo-0's is 1.0 x sqrt(6) = 2.45
    Cores fed(cfg, 20);
    fed.hook(0).skip_clipping = 100;  // scales its update; the Skellam encoding still clips to C
    // Silo i's delta in every coordinate: 0.01 (i + 1), silo-0's 100 times that.
    const auto delta = [](const nlohmann::json& silo) {
      const auto i = std::stoul(silo.get<std::string>().substr(5));
      return i == 0 ? 1.0 : 0.01 * static_cast<double>(i + 1);
    };
    fed.start();
    for (int i = 0; i < 4 && fed.store.rounds().size() < 2; ++i) fed.advance(1s);
    const auto rounds = fed.store.rounds();
    ASSERT_EQ(rounds.size(), 2u);
    double step = 0;  // the two rounds' steps, every coordinate alike
    for (const auto& r : rounds) {
      ASSERT_EQ(r["status"], "committed") << r.dump(2);
      // Each group's clean mean.
      std::vector<double> means;
      for (const auto& g : r["secure"]["groups"]) {
        double sum = 0;
        for (const auto& m : g["members"]) sum += delta(m);
        means.push_back(sum / static_cast<double>(g["members"].size()));
      }
      ASSERT_EQ(means.size(), 5u) << r.dump(2);
      std::sort(means.begin(), means.end());
      EXPECT_EQ(r["distributed_dp"]["updates"], 20.0) << r.dump(2);
      if (rule == robust::Rule::FedAvg) {
        step += 3.09 / 20;  // 0.02 + ... + 0.20 and silo-0's 1.0, over W = 20
        EXPECT_EQ(r["distributed_dp"]["denominator"], 20.0) << r.dump(2);
        EXPECT_FALSE(r.contains("robust")) << r.dump(2);
        continue;
      }
      EXPECT_FALSE(r["distributed_dp"].contains("denominator")) << r.dump(2);
      EXPECT_EQ(r["robust"]["applied"], std::string(robust::name(rule))) << r.dump(2);
      EXPECT_EQ(r["robust"]["inputs"], 5u) << r.dump(2);
      if (rule == robust::Rule::Median) step += means[2];
      if (rule == robust::Rule::TrimmedMean) step += (means[1] + means[2] + means[3]) / 3;
      if (rule == robust::Rule::MultiKrum) {
        // The mean of the three groups it kept.
        double sum = 0;
        std::size_t selected = 0;
        for (const auto& d : r["robust"]["decisions"]) {
          if (!d.value("kept", false)) continue;
          const auto group = d["group"].get<std::string>();
          for (const auto& g : r["secure"]["groups"]) {
            if (std::to_string(g["group"].get<std::uint32_t>()) != group) continue;
            double s = 0;
            for (const auto& m : g["members"]) s += delta(m);
            sum += s / static_cast<double>(g["members"].size());
          }
          ++selected;
        }
        ASSERT_EQ(selected, 3u) << r["robust"].dump(2);
        step += sum / 3;
      }
    }
    // The noise of a group's mean is about z C / 4 = 0.00025 a coordinate (and the rounding's
    // 1 / gamma less): far below how much silo-0 moves fedavg's step and not the rules'.
    constexpr double tolerance = 0.003;
    if (rule != robust::Rule::FedAvg) {
      EXPECT_GT(std::abs(step - 2 * 3.09 / 20), 10 * tolerance) << step;
    }
    const Model initial = small_model();
    const auto model = fed.coord().model();
    for (std::size_t j = 0; j < initial.size(); ++j) {
      EXPECT_NEAR(model->flat()[j] - initial.flat()[j], step, tolerance) << "coordinate " << j;
    }
    // The spend: two rounds of the SkellamSum the records' signed parameters state, nothing else.
    privacy::Accountant a;
    for (const auto& r : rounds) a.compose(*server::recorded_skellam_mechanism(r));
    const double epsilon = a.epsilon(cfg.distributed_dp->delta).epsilon;
    EXPECT_NEAR(rounds[1]["privacy"]["epsilon"].get<double>(), epsilon, 1e-9 * epsilon);
    EXPECT_EQ(rounds[1]["privacy"]["rounds_spent"], 2u);
    if (!fedavg_epsilon) fedavg_epsilon = epsilon;
    EXPECT_EQ(epsilon, *fedavg_epsilon) << "a rule changed the spend";
    const auto claims = server::check_privacy_claims(fed.store.records);
    ASSERT_TRUE(claims.has_value()) << claims.error().message();
    EXPECT_EQ(claims->silo_rounds(), 2u);
    test::TempDir dir;
    for (std::size_t i = 0; i < 20; i += 7) {
      const auto sent = server::check_sent_setups(fed.store.records, fed.sent_log(i, dir.path()),
                                                  {.log_may_be_stale = false, .line_sha256 = fed.store.heads});
      ASSERT_TRUE(sent.has_value()) << Cores::name(i) << ": " << sent.error().message();
      EXPECT_EQ(sent->compared, 2u) << Cores::name(i);
      EXPECT_EQ(sent->releases, 2u) << Cores::name(i);
    }
  }
}

// Issue 42, adaptive clipping under distributed DP: each member adds its share of the Skellam
// noise to its +-h count word in the ring; the server moves C from the groups' noised counts
// (b: the fraction left unclipped, as central mode's estimate), and the next round's signed
// setup carries the new C (gamma C unchanged, so the mechanism is too). The noise is chosen so
// that the planned rounds, the count included, spend the budget: the federation ends there, the
// records' spend is just within it and the audit check recomputes it.
TEST(Cores, DistributedDpWithAdaptiveClippingMovesTheClipNormTowardTheQuantileAndSpendsExactlyItsBudget) {
  constexpr std::size_t n = 20;
  constexpr std::uint64_t planned = 6;
  auto cfg = secure_config(server::SecureMode::Grouped, n);
  cfg.rounds = planned + 3;  // the budget ends it first
  cfg.selection.min_updates = n;
  cfg.aggregation.adaptive_clip = {.quantile = 0.5, .lr = 1.0, .initial = 0.03, .min = 1e-4};
  distributed_dp(cfg, n);
  // A count noise small enough to see C move in six rounds (each of the 5 groups' counts carries
  // it whole), and a budget that leaves the round's multiplier below 2 sigma_b.
  cfg.distributed_dp->epsilon = 100;
  cfg.distributed_dp->count_stddev = 0.2;
  cfg.distributed_dp->rounds = planned;
  cfg.distributed_dp->noise_multiplier = 0;
  cfg.distributed_dp->counts_unclipped = true;
  cfg.distributed_dp->clip_norm = 0.03;
  Cores fed(cfg, n);
  fed.start();
  for (int i = 0; i < 40 && !fed.finished(); ++i) fed.advance(1s);
  const auto rounds = fed.store.rounds();
  ASSERT_EQ(rounds.size(), planned);
  EXPECT_TRUE(fed.finished());
  // Silo i's delta is 0.01 (i + 1) in each of 6 coordinates: its norm 0.01 (i + 1) sqrt(6).
  std::vector<double> norms;
  for (std::size_t i = 0; i < n; ++i) norms.push_back(0.01 * static_cast<double>(i + 1) * std::sqrt(6.0));
  const double median = (norms[9] + norms[10]) / 2;
  const Model initial = small_model();
  std::vector<float> before(initial.flat().begin(), initial.flat().end());
  double c = 0.03;
  for (std::size_t r = 0; r < rounds.size(); ++r) {
    SCOPED_TRACE("round " + std::to_string(r + 1));
    const auto& rec = rounds[r];
    ASSERT_EQ(rec["status"], "committed") << rec.dump(2);
    const auto& p = rec["privacy"];
    const auto& ac = rec["robust"]["adaptive_clip"];
    ASSERT_TRUE(ac.is_object()) << rec.dump(2);
    // The round's C: the one its signed setup (and its record) states, the last round's next.
    EXPECT_NEAR(p["clip_norm"].get<double>(), c, 1e-12 * c);
    EXPECT_NEAR(ac["clip_norm"].get<double>(), c, 1e-12 * c);
    EXPECT_GT(p["count_scale"].get<std::uint64_t>(), 0u);
    // Whatever C the noised counts led to, the round costs no more than the first, at the planned
    // gamma C (at_clip_norm never rounds gamma' C above it): the planned rounds all fit.
    EXPECT_LE(p["l2"].get<double>(), rounds.front()["privacy"]["l2"].get<double>());
    EXPECT_EQ(p["variance"], rounds.front()["privacy"]["variance"]);
    // The count's noise is the configured sigma_b (h rounded down: never less), and the round's multiplier
    // is the update's and the count's together, central mode's formula.
    const double h = static_cast<double>(p["count_scale"].get<std::uint64_t>());
    EXPECT_GE(p["count_stddev"].get<double>(), 0.2);
    EXPECT_LT(p["count_stddev"].get<double>(), 0.2 * (h + 1) / h);
    const double z = p["update_noise_multiplier"].get<double>();
    const double z_round = 1 / std::sqrt(1 / (z * z) + 1 / (4 * 0.2 * 0.2));
    EXPECT_NEAR(p["noise_multiplier"].get<double>(), z_round, 2 * z_round / h);
    // The noised fraction is the true one within six deviations of the count's noise over W.
    const double truth =
        static_cast<double>(std::count_if(norms.begin(), norms.end(), [&](double v) { return v <= c; })) / n;
    const double b = ac["unclipped_fraction"].get<double>();
    const double spread = 6 * std::sqrt(5 * 2.0) * p["count_stddev"].get<double>() / n;  // 5 groups, n / n_min < 2
    EXPECT_NEAR(b, truth, spread + 1e-9);
    EXPECT_NEAR(ac["next"].get<double>(), c * std::exp(-1.0 * (b - 0.5)), 1e-12 * c);
    c = ac["next"].get<double>();
  }
  // C rose from below every norm but one toward their median.
  EXPECT_GT(c, 0.03 * 2);
  EXPECT_LT(std::abs(std::log(c / median)), std::abs(std::log(0.03 / median)) / 2) << c << " vs " << median;
  // The budget: six rounds of the whole vector (count word included) just fit, a seventh would not.
  const double spent = rounds.back()["privacy"]["epsilon"].get<double>();
  EXPECT_LE(spent, 100.0);
  EXPECT_GT(spent, 0.99 * 100.0);
  privacy::Accountant a;
  for (const auto& r : rounds) a.compose(*server::recorded_skellam_mechanism(r));
  EXPECT_NEAR(a.epsilon(cfg.distributed_dp->delta).epsilon, spent, 1e-9 * spent);
  // Without the count word, the same records would claim less: the count is accounted.
  auto uncounted = rounds.front();
  uncounted["privacy"].erase("count_scale");
  try {
    server::recorded_skellam_mechanism(uncounted);
    ADD_FAILURE() << "a record that adapted C without its count scale was read";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "its clip norm adapted to a count of unclipped updates (robust.adaptive_clip) but its "
                           "privacy part states no count_scale: the count's release is not accounted");
  }
  // Without robust.adaptive_clip too, its parameters no longer hash to the setup it names.
  uncounted.erase("robust");
  EXPECT_THROW(server::recorded_skellam_mechanism(uncounted), server::SetupMismatch);
  const auto claims = server::check_privacy_claims(fed.store.records);
  ASSERT_TRUE(claims.has_value()) << claims.error().message();
  EXPECT_EQ(claims->silo_rounds(), planned);
  EXPECT_NEAR(claims->silo_epsilon, spent, 1e-12);
  // xsilo status names the multipliers as the records do: noise_multiplier the round's, and the
  // update's as update_noise_multiplier.
  const auto status = fed.coord().status(fed.now())["distributed_dp"];
  const auto& last = rounds.back()["privacy"];
  EXPECT_NEAR(status["noise_multiplier"].get<double>(), last["noise_multiplier"].get<double>(),
              1e-12 * last["noise_multiplier"].get<double>());
  EXPECT_NEAR(status["update_noise_multiplier"].get<double>(), last["update_noise_multiplier"].get<double>(),
              1e-12 * last["update_noise_multiplier"].get<double>());
  EXPECT_EQ(status["count_scale"], last["count_scale"]);
}

}  // namespace
}  // namespace xsilo
