// The round coordinator in-process: every dropout timing scripted, no sockets, no threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <random>

#include "crypto/hash.h"
#include "proto/frame.h"
#include "protocol/join.h"
#include "protocol/signed_update.h"
#include "server/audit.h"
#include "server/coordinator.h"
#include "server/upload_stage.h"
#include "tests/result_util.h"
#include "tests/testlib.h"
#include "tools/admin_client.h"
#include "protocol/tensor_stream.h"

namespace xsilo::server {
namespace {

class MemoryStore : public Store {
 public:
  struct Commit {
    std::uint64_t round;
    Model model;
    nlohmann::json record;
  };
  AuditHead commit(std::uint64_t round, const Model& model, const Model&, const nlohmann::json& rec,
                   const MetricsRow& row) override {
    commits.push_back({round, model, rec});
    rows.push_back(row);
    records.push_back(rec);
    return head();
  }
  AuditHead record(const nlohmann::json& rec, const MetricsRow* row) override {
    records.push_back(rec);
    if (row) rows.push_back(*row);
    return head();
  }
  // Stands in for the log's head: seq = records so far.
  AuditHead head() const {
    return {.seq = records.size(), .sha256 = "head-" + std::to_string(records.size()), .signature = "sig", .line = {}};
  }
  std::vector<Commit> commits;
  std::vector<nlohmann::json> records;
  std::vector<MetricsRow> rows;
};

Model small_model() {
  Model m;
  m.add("a", {4});
  m.add("b", {2, 3});
  for (std::size_t i = 0; i < m.size(); ++i) m.flat()[i] = 0.1f * static_cast<float>(i);
  return m;
}

std::string name(std::size_t i) { return "silo-" + std::to_string(100 + i); }

RoundConfig three_rounds() {
  RoundConfig c;
  c.rounds = 3;
  return c;
}

// As parsing a server config sets it: centered clipping starts from the last committed step.
OptimizerConfig optimizer_for(const RoundConfig& cfg) {
  OptimizerConfig o;
  o.keep_last_step = cfg.aggregation.rule.rule == robust::Rule::CenteredClip;
  return o;
}

class Harness {
 public:
  explicit Harness(std::size_t silos, RoundConfig cfg = three_rounds(),
                   std::uint64_t first_round = 1, Model initial = small_model(),
                   const std::function<void(Coordinator&)>& before_start = nullptr)
      : initial_(std::move(initial)) {
    cfg.federation = "fed";
    cfg.ca = test::verifier();
    if (cfg.selection.min_silos == 2 && silos < 2) cfg.selection.min_silos = 1;
    if (cfg.selection.min_updates == 0) cfg.selection.min_updates = cfg.selection.min_silos;
    for (std::size_t i = 0; i < silos; ++i) cfg.expected_silos.insert(name(i));
    coord_ = std::make_unique<Coordinator>(cfg, initial_, ServerOptimizer(optimizer_for(cfg), initial_), store,
                                           first_round);
    if (before_start) before_start(*coord_);
    coord_->start(now);
    pump();
  }

  void connect(std::size_t i) {
    coord_->on_connect(session(i), name(i), now);
    pump();
  }
  void connect_all(std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) connect(i);
  }
  void disconnect(std::size_t i) {
    coord_->on_disconnect(session(i), now);
    pump();
  }
  void edge_connect(SessionId id, const std::string& edge) {
    coord_->on_edge_connect(id, edge, now);
    edges_[id] = edge;
    pump();
  }
  // The edge's region: these silos, each with its join signed for this edge session (unless
  // `unsigned_` lists it).
  // Silos 0 and 1 behind edge-1 (session 900), silos 2 and 3 connected directly.
  void edge_region_and_direct() {
    edge_connect(900, "edge-1");
    region(900, {0, 1});
    connect(2);
    connect(3);
  }
  void region(SessionId edge, const std::vector<std::size_t>& silos, const std::set<std::size_t>& unsigned_ = {}) {
    wire::Envelope e;
    e.set_federation("fed");
    e.set_round(coord_->round());
    auto* r = e.mutable_region_status();
    for (auto i : silos) {
      r->add_silos(name(i));
      if (!unsigned_.count(i)) {
        *r->add_proofs() = protocol::sign_join(test::signer(wire::SILO, name(i)), "fed", edges_.at(edge), nonce(edge));
      }
    }
    coord_->on_message(edge, e, now);
    pump();
  }
  void from_edge(SessionId edge, wire::Envelope e) {
    e.set_federation("fed");
    coord_->on_message(edge, e, now);
    pump();
  }
  // An edge's relayed UpdateReady for silo i, then its own (the region is ready).
  void edge_ready(SessionId edge, const std::vector<std::size_t>& silos, std::uint64_t samples) {
    for (auto i : silos) {
      wire::Envelope e;
      e.set_round(coord_->round());
      e.set_silo(name(i));
      e.mutable_update_ready()->set_num_samples(samples);
      from_edge(edge, e);
    }
    wire::Envelope region;
    region.set_round(coord_->round());
    region.mutable_update_ready();
    from_edge(edge, region);
  }
  // The edge's partial sum: chunks, then UpdateEnd naming `contributors` (silo, weight).
  // Each contributor's own word is signed by that silo, over an update hash of its own, unless
  // `tamper` changes it on the way (an edge altering what a silo said).
  void edge_upload(SessionId edge, const std::vector<float>& sum,
                   const std::vector<std::pair<std::string, double>>& contributors, double weight,
                   std::optional<std::string> declared = std::nullopt,
                   const std::function<void(wire::Contributor&)>& tamper = nullptr) {
    auto m = std::make_shared<Model>(initial_.zeros_like());
    std::copy(sum.begin(), sum.end(), m->flat().begin());
    protocol::ChunkSource src(m, m->flat(), m->tensors(), "fed", coord_->round(), 12);
    while (auto e = src.next()) from_edge(edge, *e);
    wire::Envelope end;
    end.set_round(coord_->round());
    auto* u = end.mutable_update_end();
    u->set_weight(weight);
    u->set_update_sha256(declared.value_or(crypto::sha256_hex(m->flat())));
    for (const auto& [silo, w] : contributors) {
      wire::UpdateEnd own;  // what the silo sent the edge, signed
      own.set_weight(w);
      own.set_num_samples(10);
      own.set_update_sha256(crypto::sha256_hex("update of " + silo));
      protocol::sign_update(own, test::signer(wire::SILO, silo), "fed", coord_->round());
      auto* c = u->add_contributors();
      c->set_silo(silo);
      c->set_weight(w);
      c->set_num_samples(10);
      protocol::copy_signed_word(own, *c);
      if (tamper) tamper(*c);
    }
    from_edge(edge, end);
  }
  // The join nonce the server gave this edge session.
  std::string nonce(SessionId edge) {
    std::string n;
    for (const auto& m : inbox[edge]) {
      if (m.has_join_challenge()) n = m.join_challenge().nonce();
    }
    return n;
  }
  void fire(Timer t) {
    ASSERT_TRUE(armed.count(t)) << "timer not armed";
    armed.erase(t);
    coord_->on_timer(t, now);
    pump();
  }
  void deliver(std::size_t i, wire::Envelope e) {
    e.set_federation("fed");
    if (views && e.has_tensor_chunk()) {
      // As the daemon reads it: the chunk's data left in its frame (proto::decode_message).
      if (auto msg = proto::as_read(e)) {
        coord_->on_message(session(i), *msg, now);
      } else {
        coord_->on_message(session(i), e, now);  // a chunk a test made that no frame could carry
      }
    } else {
      coord_->on_message(session(i), e, now);
    }
    pump();
  }
  // `holds`: the model the silo says it trained on and holds (UpdateReady.model_sha256).
  void ready(std::size_t i, std::uint64_t samples, std::uint64_t round = 0, const std::string& holds = "") {
    wire::Envelope e;
    e.set_round(round ? round : coord_->round());
    e.mutable_update_ready()->set_num_samples(samples);
    e.mutable_update_ready()->set_model_sha256(holds);
    deliver(i, e);
  }
  // Streams weight * delta in chunks of 3 elements, then UpdateEnd (unless stop_after chunks).
  // `round`: the round of the start the silo trained on (buffered rounds), else this one.
  void upload(std::size_t i, const std::vector<float>& weighted, double weight, int stop_after = -1,
              std::optional<std::string> declared = std::nullopt, std::uint64_t round = 0) {
    ++uploads_[session(i)];
    if (!round) round = coord_->round();
    auto m = std::make_shared<Model>(initial_.zeros_like());
    std::copy(weighted.begin(), weighted.end(), m->flat().begin());
    protocol::ChunkSource src(m, m->flat(), m->tensors(), "fed", round, 12);
    int sent = 0;
    while (auto e = src.next()) {
      if (stop_after >= 0 && sent == stop_after) return;
      deliver(i, *e);
      ++sent;
    }
    wire::Envelope end;
    end.set_round(round);
    end.mutable_update_end()->set_weight(weight);
    end.mutable_update_end()->set_update_sha256(declared.value_or(crypto::sha256_hex(m->flat())));
    deliver(i, end);
  }
  // Holds an UploadGrant it has not used yet.
  bool granted(std::size_t i) const {
    auto it = inbox.find(session(i));
    if (it == inbox.end()) return false;
    int grants = 0;
    for (const auto& m : it->second) grants += m.has_upload_grant();
    auto u = uploads_.find(session(i));
    return grants > (u == uploads_.end() ? 0 : u->second);
  }
  const wire::Envelope* last(std::size_t i, wire::Envelope::BodyCase body) const {
    auto it = inbox.find(session(i));
    if (it == inbox.end()) return nullptr;
    for (auto m = it->second.rbegin(); m != it->second.rend(); ++m) {
      if (m->body_case() == body) return &*m;
    }
    return nullptr;
  }
  // Every silo that holds a grant uploads its update, until nobody does.
  void serve(const std::map<std::size_t, std::pair<std::vector<float>, double>>& updates) {
    for (bool progress = true; progress;) {
      progress = false;
      for (const auto& [i, u] : updates) {
        if (granted(i)) {
          upload(i, u.first, u.second);
          progress = true;
        }
      }
    }
  }

  Coordinator& coord() { return *coord_; }
  SessionId session(std::size_t i) const { return 1000 + i; }

  MemoryStore store;
  std::int64_t now = 1'700'000'000'000;
  std::map<SessionId, std::vector<wire::Envelope>> inbox;
  std::map<SessionId, std::string> edges_;
  std::map<SessionId, int> models_sent;
  std::map<SessionId, std::vector<action::SendModel>> model_actions;
  std::set<Timer> armed;
  std::vector<SessionId> closed;
  bool finished = false;
  std::string finished_reason;  // action::Finished's
  std::optional<std::string> stopped;  // action::Stop's reason
  Model initial_;

  // Carries out the coordinator's actions (after a call the harness did not make itself).
  void pump() {
    for (;;) {
      auto actions = coord_->take_actions();
      if (actions.empty()) return;
      for (auto& a : actions) {
        if (auto* s = std::get_if<action::Send>(&a)) inbox[s->to].push_back(s->env);
        if (auto* m = std::get_if<action::SendModel>(&a)) {
          ++models_sent[m->to];
          model_actions[m->to].push_back(*m);
        }
        if (auto* t = std::get_if<action::StartTimer>(&a)) armed.insert(t->timer);
        if (auto* t = std::get_if<action::CancelTimer>(&a)) armed.erase(t->timer);
        if (auto* c = std::get_if<action::Close>(&a)) closed.push_back(c->id);
        if (auto* f = std::get_if<action::Finished>(&a)) {
          finished = true;
          finished_reason = f->reason;
        }
        if (auto* s = std::get_if<action::Stop>(&a)) stopped = s->reason;
        if (auto* b = std::get_if<action::Background>(&a)) b->work();
        if (auto* j = std::get_if<action::Job>(&a)) {
          coord_->on_job_done(j->id, j->work(), now);
        }
      }
    }
  }

 private:
  std::unique_ptr<Coordinator> coord_;
  std::map<SessionId, int> uploads_;

 public:
  // Silos' chunks delivered as the server daemon reads them, views of their frames
  // (proto::Message), so that every test's chunks (plain, packed secure words, encoded,
  // relayed by an edge, a fetched model) take that path; false: as whole Envelopes.
  bool views = true;
};

std::vector<float> constant(float v, std::size_t n = 10) { return std::vector<float>(n, v); }

// initial + sum(weighted) / sum(weights)
std::vector<float> fedavg(const Model& initial,
                          const std::vector<std::pair<std::vector<float>, double>>& ups) {
  std::vector<float> out(initial.flat().begin(), initial.flat().end());
  double w = 0;
  for (const auto& u : ups) w += u.second;
  for (std::size_t k = 0; k < out.size(); ++k) {
    double s = 0;
    for (const auto& u : ups) s += u.first[k];
    out[k] += static_cast<float>(s / w);
  }
  return out;
}

void expect_model(const Model& m, const std::vector<float>& want) {
  ASSERT_EQ(m.size(), want.size());
  for (std::size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(m.flat()[k], want[k], 1e-5) << k;
}

TEST(Coordinator, StartsWhenEveryExpectedSiloJoinedAndCommitsTheWeightedMean) {
  Harness h(3);
  h.connect(0);
  h.connect(1);
  EXPECT_EQ(h.coord().phase(), Phase::Joining);
  h.connect(2);
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  for (std::size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(h.last(i, wire::Envelope::kRoundStart));
    EXPECT_EQ(h.models_sent[h.session(i)], 1);
  }
  h.ready(0, 10);
  h.ready(1, 30);
  h.ready(2, 60);
  std::map<std::size_t, std::pair<std::vector<float>, double>> ups = {
      {0, {constant(10.0f), 10}}, {1, {constant(-30.0f), 30}}, {2, {constant(60.0f * 0.5f), 60}}};
  h.serve(ups);
  ASSERT_EQ(h.store.commits.size(), 1u);
  expect_model(h.store.commits[0].model, fedavg(h.initial_, {ups[0], ups[1], ups[2]}));
  const auto& rec = h.store.commits[0].record;
  EXPECT_EQ(rec["status"], "committed");
  EXPECT_EQ(rec["participants"].size(), 3u);
  EXPECT_EQ(rec["model_sha256_before"], crypto::sha256_hex(h.initial_.flat()));
  EXPECT_EQ(rec["model_sha256_after"], crypto::sha256_hex(h.store.commits[0].model.flat()));
  EXPECT_EQ(h.coord().round(), 2u);
  EXPECT_EQ(h.coord().phase(), Phase::Collecting);  // the next round started at once
  ASSERT_TRUE(h.last(0, wire::Envelope::kRoundEnd));
}

// The daemon hands the core each upload chunk as a view of the frame it came in (its data never
// copied into an Envelope): the round commits the same model, bit for bit, and the same record's
// hashes as when the chunks come as Envelopes; a chunk refused through a view is refused with the
// same reason.
TEST(Coordinator, UploadChunksReadAsViewsOfTheirFramesCommitWhatEnvelopesCommit) {
  std::vector<std::string> after;
  std::vector<std::string> refusals;
  for (const bool views : {false, true}) {
    Harness h(2);
    h.views = views;
    h.connect_all(2);
    h.ready(0, 10);
    h.ready(1, 30);
    h.serve({{0, {constant(10.0f), 10}}, {1, {constant(-30.0f), 30}}});
    ASSERT_EQ(h.store.commits.size(), 1u);
    expect_model(h.store.commits[0].model, fedavg(h.initial_, {{constant(10.0f), 10}, {constant(-30.0f), 30}}));
    after.push_back(h.store.commits[0].record["model_sha256_after"]);
    // Round 2: silo 0's first chunk is 7 bytes, not whole floats.
    h.ready(0, 10);
    ASSERT_TRUE(h.granted(0));
    wire::Envelope bad;
    bad.set_round(h.coord().round());
    auto* c = bad.mutable_tensor_chunk();
    c->set_name(h.initial_.tensors()[0].name);
    c->set_dtype(wire::F32);
    c->set_data(std::string(7, '\x01'));
    h.deliver(0, bad);
    const auto* err = h.last(0, wire::Envelope::kError);
    ASSERT_TRUE(err);
    EXPECT_EQ(err->error().code(), wire::BAD_UPDATE);
    refusals.push_back(err->error().message());
  }
  EXPECT_EQ(after[0], after[1]);
  EXPECT_EQ(refusals[0], refusals[1]);
  EXPECT_NE(refusals[1].find("has 7 bytes, not a positive multiple of 4"), std::string::npos) << refusals[1];
}

// Each participant's record says when the server saw each step of its round, in seconds since
// the round started: the model written whole (once, and only this round's), its UpdateReady with
// the training time it reported, its grant, its whole upload and its fold; the round's record
// says when its later phases began. With one upload at a time, silo 1 waits for silo 0's slot.
TEST(Coordinator, EachParticipantsRecordSaysWhenTheServerSawEachStepOfItsRound) {
  RoundConfig cfg = three_rounds();
  cfg.uploads_at_once = 1;
  Harness h(2, cfg);
  h.connect_all(2);
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  const std::uint64_t round = h.coord().round();
  h.now += 1500;
  h.coord().on_model_sent(h.session(0), round, h.now);
  h.coord().on_model_sent(h.session(0), round, h.now + 999);  // a second stream to it: the first counts
  h.coord().on_model_sent(h.session(1), round + 1, h.now);    // another round's: not this one's
  h.now += 2000;
  wire::Envelope e;
  e.set_round(round);
  e.mutable_update_ready()->set_num_samples(10);
  e.mutable_update_ready()->mutable_metrics()->set_train_seconds(1.25);
  h.deliver(0, e);  // ready at 3.5 s, granted at once
  ASSERT_TRUE(h.granted(0));
  h.now += 500;
  h.ready(1, 10);  // ready at 4.0 s; the one lane is silo 0's
  EXPECT_FALSE(h.granted(1));
  h.now += 1000;
  h.upload(0, constant(1.0f), 10);  // received and folded at 5.0 s; silo 1 granted then
  h.now += 250;
  h.upload(1, constant(2.0f), 10);  // 5.25 s; the round closes
  ASSERT_EQ(h.store.commits.size(), 1u);
  const auto& rec = h.store.commits[0].record;
  const auto timeline = [&](const std::string& silo) {
    for (const auto& p : rec["participants"]) {
      if (p["silo"] == silo) return p.value("timeline", nlohmann::json::object());
    }
    return nlohmann::json::object();
  };
  using json = nlohmann::json;
  EXPECT_EQ(timeline(name(0)), (json{{"model_sent", 1.5}, {"train", 1.25}, {"ready", 3.5}, {"granted", 3.5},
                                     {"received", 5.0}, {"folded", 5.0}}));
  EXPECT_EQ(timeline(name(1)), (json{{"ready", 4.0}, {"granted", 5.0}, {"received", 5.25}, {"folded", 5.25}}));
  EXPECT_EQ(rec["phases"], (json{{"commit", 5.25}}));
  // Nothing of the next round's stream reached this round's record, and late calls are harmless.
  h.coord().on_model_sent(h.session(1), round, h.now);
  h.coord().on_model_sent(0, round + 1, h.now);
}

TEST(Coordinator, WaitsForTheJoinDeadlineWhenSomeSiloIsMissing) {
  Harness h(3);
  h.connect(0);
  h.connect(1);
  EXPECT_EQ(h.coord().phase(), Phase::Joining);
  h.fire(Timer::Join);
  EXPECT_EQ(h.coord().phase(), Phase::Collecting);
  EXPECT_EQ(h.coord().members().size(), 2u);
}

// A silo that was connected and has left does not hold the next rounds back: once min_silos
// are connected and every allow-listed silo is connected or known gone, the round starts.
// When it comes back it joins the round after.
TEST(Coordinator, ASiloThatLeftDoesNotMakeLaterRoundsWaitForTheJoinDeadline) {
  Harness h(3);
  h.connect_all(3);
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  h.disconnect(2);  // dropped in round 1
  h.ready(0, 10);
  h.ready(1, 10);
  h.serve({{0, {constant(1), 10}}, {1, {constant(3), 10}}});
  ASSERT_EQ(h.store.commits.size(), 1u);
  // Round 2 started at once with the two that are here, without the join deadline.
  EXPECT_EQ(h.coord().round(), 2u);
  EXPECT_EQ(h.coord().phase(), Phase::Collecting);
  EXPECT_EQ(h.coord().members().size(), 2u);
  h.connect(2);  // back during round 2: it waits for round 3
  EXPECT_EQ(h.coord().members().size(), 2u);
  h.ready(0, 10);
  h.ready(1, 10);
  h.serve({{0, {constant(1), 10}}, {1, {constant(3), 10}}});
  ASSERT_EQ(h.store.commits.size(), 2u);
  EXPECT_EQ(h.coord().round(), 3u);
  EXPECT_EQ(h.coord().members().size(), 3u);
}

// Failback without a dropout: a silo moving to its preferred upstream asks to leave. It finishes
// the round it is in, is answered after that round's RoundStart, and no later round selects it
// on this connection; connected again, it is selected again.
TEST(Coordinator, ASiloAskingToLeaveFinishesItsRoundAndNoLaterRoundSelectsIt) {
  Harness h(3);
  h.connect_all(3);
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  ASSERT_EQ(h.coord().members().size(), 3u);
  wire::Envelope leave;
  leave.set_round(h.coord().round());
  leave.mutable_leaving();
  h.deliver(2, leave);
  const auto& in = h.inbox[h.session(2)];
  ASSERT_FALSE(in.empty());
  EXPECT_TRUE(in.back().has_leaving());
  EXPECT_TRUE(h.last(2, wire::Envelope::kRoundStart));  // its round started before the answer
  for (std::size_t i = 0; i < 3; ++i) h.ready(i, 10);
  h.serve({{0, {constant(1), 10}}, {1, {constant(3), 10}}, {2, {constant(5), 10}}});
  ASSERT_EQ(h.store.commits.size(), 1u);
  EXPECT_EQ(h.store.commits[0].record["participants"].size(), 3u);  // it finished its round
  ASSERT_EQ(h.coord().round(), 2u);
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  ASSERT_EQ(h.coord().members().size(), 2u);
  for (const auto& m : h.coord().members()) EXPECT_NE(m.silo, name(2));
  int starts = 0;
  for (const auto& m : h.inbox[h.session(2)]) starts += m.has_round_start();
  EXPECT_EQ(starts, 1);
  h.disconnect(2);  // it moves: round 2 goes on without a dropout
  h.connect(2);
  h.ready(0, 10);
  h.ready(1, 10);
  h.serve({{0, {constant(1), 10}}, {1, {constant(3), 10}}});
  ASSERT_EQ(h.store.commits.size(), 2u);
  EXPECT_EQ(h.store.commits[1].record["status"], "committed");
  EXPECT_EQ(h.coord().round(), 3u);
  EXPECT_EQ(h.coord().members().size(), 3u);  // on its new connection it is selected again
}

// Through an edge: the edge relays a silo's Leaving and the answer (named by Envelope.silo).
// An edge cannot ask it for a silo it does not carry: that one gets an error and stays.
TEST(Coordinator, AnEdgeRelaysLeavingOnlyForItsOwnSilos) {
  Harness h(3);
  h.connect(0);
  h.edge_connect(900, "edge-1");
  h.region(900, {2});
  ASSERT_EQ(h.coord().phase(), Phase::Joining);  // silo 1 is not here yet
  wire::Envelope leave;
  leave.set_round(h.coord().round());
  leave.set_silo(name(0));  // connected directly, not through this edge
  leave.mutable_leaving();
  h.from_edge(900, leave);
  ASSERT_FALSE(h.inbox[900].empty());
  EXPECT_TRUE(h.inbox[900].back().has_error());
  EXPECT_EQ(h.inbox[900].back().silo(), name(0));
  leave.set_silo(name(2));
  h.from_edge(900, leave);
  EXPECT_TRUE(h.inbox[900].back().has_leaving());
  EXPECT_EQ(h.inbox[900].back().silo(), name(2));
  h.connect(1);  // every silo accounted for: the round starts, without silo 2
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  ASSERT_EQ(h.coord().members().size(), 2u);
  for (const auto& m : h.coord().members()) EXPECT_NE(m.silo, name(2));
}

// An edge's word does not replace a silo's own live connection: an edge announcing a silo that
// is connected directly does not take it over (its sessions and messages stay the silo's);
// when the direct connection ends, the edge carries it (a silo moving to its preferred edge).
TEST(Coordinator, AnEdgeCannotTakeOverADirectlyConnectedSilo) {
  Harness h(3);
  h.connect_all(2);
  h.edge_connect(900, "edge-1");
  h.region(900, {0, 2});
  EXPECT_TRUE(h.closed.empty());   // silo 0's own connection was not closed
  EXPECT_EQ(h.coord().connected(), 3u);  // silo 2 joined through the edge
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  for (const auto& m : h.coord().members()) {
    if (m.silo == name(0)) {
      EXPECT_EQ(m.session, h.session(0));
      EXPECT_TRUE(m.edge.empty());
    }
  }
  h.disconnect(0);  // silo 0 leaves its direct connection: the edge's claim takes effect
  EXPECT_EQ(h.coord().connected(), 3u);
}

// Four silos, every one selected, two updates enough: silos 0 and 1 behind edge-1 (session
// 900), 2 and 3 connected directly (Harness::edge_region_and_direct()).
RoundConfig edge_and_direct(std::uint64_t rounds) {
  RoundConfig cfg = three_rounds();
  cfg.rounds = rounds;
  cfg.selection.min_silos = 4;
  cfg.selection.min_updates = 2;
  return cfg;
}

// The server admits a silo behind an edge only with the silo's own signature over its join
// through that edge session: an edge naming a silo with no proof, a proof from another CA, a
// proof made for another edge or another session, or another silo's proof, gets the silo
// refused with the reason; a second session under one edge name replaces the first.
// The server checks an edge's partial sum before it folds it: its declared SHA-256 (present and
// matching), contributors that are this edge's silos in the round, and weights that add up.
// A bad one drops the edge's silos for the round, with the reason; the direct silos commit.
TEST(Coordinator, AnEdgesPartialSumIsCheckedBeforeItIsFolded) {
  Harness h(4, edge_and_direct(8));
  h.edge_region_and_direct();
  struct Bad {
    const char* what;
    std::vector<std::pair<std::string, double>> contributors;
    double weight;
    std::optional<std::string> declared;
    const char* says;
    std::function<void(wire::Contributor&)> tamper = nullptr;
  };
  const std::vector<Bad> bad = {
      {"no hash", {{name(0), 10}, {name(1), 10}}, 20, std::string(), "declares no SHA-256"},
      {"wrong hash", {{name(0), 10}, {name(1), 10}}, 20, crypto::sha256_hex("x"), "does not match its SHA-256"},
      {"a silo not behind it", {{name(0), 10}, {name(2), 10}}, 20, std::nullopt, "not one of its silos"},
      {"weights that do not add up", {{name(0), 10}, {name(1), 10}}, 35, std::nullopt, "not the sum"},
      // Issue 37: each silo's own word on its upload is signed by it; the edge passes it on.
      {"a silo's word altered", {{name(0), 10}, {name(1), 10}}, 20, std::nullopt, "does not verify",
       [](wire::Contributor& c) { c.set_update_sha256(crypto::sha256_hex("something else")); }},
      {"a silo's word made up", {{name(0), 10}, {name(1), 10}}, 20, std::nullopt, "carries no signature",
       [](wire::Contributor& c) { c.clear_silo_signature(); }},
  };
  for (const auto& b : bad) {
    ASSERT_EQ(h.coord().phase(), Phase::Collecting) << b.what;
    h.edge_ready(900, {0, 1}, 10);
    h.ready(2, 10);
    h.ready(3, 10);
    h.edge_upload(900, constant(7), b.contributors, b.weight, b.declared, b.tamper);
    h.upload(2, constant(2), 10);
    h.upload(3, constant(3), 10);
    ASSERT_FALSE(h.store.records.empty()) << b.what;
    const auto& rec = h.store.records.back();
    EXPECT_EQ(rec["status"], "committed") << b.what << rec.dump(2);
    std::set<std::string> in;
    for (const auto& p : rec["participants"]) in.insert(p["silo"]);
    EXPECT_EQ(in, (std::set<std::string>{name(2), name(3)})) << b.what;
    std::string why;
    for (const auto& d : rec["dropouts"]) {
      if (d["silo"] == name(0)) why = d["reason"];
    }
    EXPECT_NE(why.find(b.says), std::string::npos) << b.what << ": " << why;
  }
  // A good partial sum: each of its silos recorded with its own signed hash (which its own
  // sent.jsonl names), and the region's sum apart.
  h.edge_ready(900, {0, 1}, 10);
  h.ready(2, 10);
  h.ready(3, 10);
  h.edge_upload(900, constant(7), {{name(0), 10}, {name(1), 10}}, 20);
  h.upload(2, constant(2), 10);
  h.upload(3, constant(3), 10);
  const auto& rec = h.store.records.back();
  ASSERT_EQ(rec["status"], "committed") << rec.dump(2);
  for (const auto& p : rec["participants"]) {
    if (p.value("edge", "").empty()) continue;
    EXPECT_EQ(p["update_sha256"], crypto::sha256_hex("update of " + p["silo"].get<std::string>())) << p.dump();
    EXPECT_TRUE(p.value("update_signed", false)) << p.dump();
  }
  ASSERT_EQ(rec["regions"].size(), 1u) << rec.dump(2);
  EXPECT_EQ(rec["regions"][0]["edge"], "edge-1");
  EXPECT_EQ(rec["regions"][0]["silos"], nlohmann::json({name(0), name(1)}));
  EXPECT_EQ(rec["regions"][0]["sum_sha256"].get<std::string>().size(), 64u);
}

// Adaptive clipping: each round clips with the current norm C, then C <- C exp(-lr (b - q)), b
// the fraction of updates left unclipped; the next round clips with the new C; the audit
// record says both.
TEST(Coordinator, AdaptiveClippingFollowsTheQuantileOfTheNorms) {
  RoundConfig cfg = three_rounds();
  cfg.rounds = 2;
  cfg.selection.min_silos = 4;
  cfg.selection.min_updates = 4;
  cfg.aggregation.adaptive_clip.quantile = 0.5;
  cfg.aggregation.adaptive_clip.lr = 0.2;
  cfg.aggregation.adaptive_clip.initial = 1.0;
  Harness h(4, cfg);
  h.connect_all(4);
  const std::vector<float> deltas = {0.1f, 2.0f, 3.0f, 4.0f};  // norms x sqrt(10): one below C = 1
  std::vector<double> used;
  for (int round = 0; round < 2; ++round) {
    for (std::size_t i = 0; i < 4; ++i) h.ready(i, 10);
    for (std::size_t i = 0; i < 4; ++i) h.upload(i, constant(deltas[i] * 10.0f), 10);
    ASSERT_EQ(h.store.commits.size(), static_cast<std::size_t>(round + 1));
    const auto& ac = h.store.commits.back().record["robust"]["adaptive_clip"];
    ASSERT_TRUE(ac.is_object()) << h.store.commits.back().record.dump(2);
    EXPECT_DOUBLE_EQ(ac["unclipped_fraction"].get<double>(), 0.25);
    EXPECT_NEAR(ac["next"].get<double>(), ac["clip_norm"].get<double>() * std::exp(-0.2 * (0.25 - 0.5)), 1e-12);
    used.push_back(ac["clip_norm"].get<double>());
  }
  EXPECT_DOUBLE_EQ(used[0], 1.0);
  EXPECT_NEAR(used[1], std::exp(0.05), 1e-12);  // round 2 clipped with round 1's next
  // And it clipped: round 2's model moved by the mean of the clipped deltas.
  const double c = used[1], s = std::sqrt(10.0);
  double mean = 0;
  for (float d : deltas) mean += d * std::min(1.0, c / (d * s));
  mean /= 4;
  EXPECT_NEAR(h.store.commits[1].model.flat()[0] - h.store.commits[0].model.flat()[0], mean, 1e-5);
}

// Adaptive clipping under central DP: each round clips with its C, which its privacy part states
// with the count's noise; the next round starts from the noised count's step; a restart given the
// chain's spend and last C goes on from both, and the budget ends on the planned round, the
// count included: the records pass the audit check.
TEST(Coordinator, CentralDpWithAdaptiveClippingCarriesItsClipNormAndSpendsExactlyItsBudget) {
  RoundConfig cfg = three_rounds();
  cfg.rounds = 2;
  cfg.selection.min_silos = 4;
  cfg.selection.min_updates = 4;
  cfg.aggregation.adaptive_clip = {.quantile = 0.5, .lr = 0.2, .initial = 1.0, .min = 1e-3};
  CentralDpConfig dp;
  dp.epsilon = 8;
  dp.clip_norm = 1.0;
  dp.denominator = 4;
  dp.rounds = 4;
  const double z_round = noise_multiplier_for_rounds(dp.epsilon, dp.delta, 1.0, dp.rounds);
  dp.count_stddev = default_count_stddev(dp.denominator, z_round);
  dp.noise_multiplier = update_noise_multiplier(z_round, dp.count_stddev);
  cfg.central_dp = dp;
  const std::vector<float> deltas = {0.1f, 2.0f, 3.0f, 4.0f};
  std::vector<nlohmann::json> log = {{{"event", "federation_start"}}};
  auto run = [&](Harness& h) {
    h.connect_all(4);
    for (int round = 0; round < 2; ++round) {
      for (std::size_t i = 0; i < 4; ++i) h.ready(i, 10);
      for (std::size_t i = 0; i < 4; ++i) h.upload(i, constant(deltas[i] * 10.0f), 10);
    }
    ASSERT_EQ(h.store.commits.size(), 2u);
    for (const auto& c : h.store.commits) log.push_back(c.record);
  };
  Harness h(4, cfg);
  run(h);
  // Restarted as the daemon does from the chain: its spend, and C where the last record left it.
  privacy::Ledger spent;
  spent.add(round_mechanism(dp), 2);
  cfg.central_dp->spent = spent;
  cfg.aggregation.adaptive_clip.initial = log.back()["robust"]["adaptive_clip"]["next"].get<double>();
  cfg.rounds = 5;
  Harness again(4, cfg, 3);
  run(again);
  double c = 1.0;
  for (std::size_t r = 1; r < log.size(); ++r) {
    const auto& p = log[r]["privacy"];
    const auto& ac = log[r]["robust"]["adaptive_clip"];
    ASSERT_TRUE(ac.is_object()) << log[r].dump(2);
    EXPECT_EQ(p["clip_norm"].get<double>(), c) << "round " << r;
    EXPECT_EQ(ac["clip_norm"].get<double>(), c) << "round " << r;
    EXPECT_EQ(p["count_stddev"].get<double>(), dp.count_stddev);
    EXPECT_EQ(p["noise_stddev"].get<double>(), dp.noise_multiplier * c / dp.denominator);
    EXPECT_NEAR(ac["next"].get<double>(), std::max(1e-3, c * std::exp(-0.2 * (ac["unclipped_fraction"].get<double>() - 0.5))),
                1e-12);
    c = ac["next"].get<double>();
  }
  const double spent_epsilon = log.back()["privacy"]["epsilon"].get<double>();
  EXPECT_LE(spent_epsilon, dp.epsilon);
  EXPECT_GT(spent_epsilon, 0.999 * dp.epsilon);
  EXPECT_TRUE(again.finished);
  EXPECT_EQ(again.finished_reason.rfind("privacy budget spent: epsilon", 0), 0u) << again.finished_reason;
  // xsilo status shows the count's noise and the C the next round would clip with.
  const auto status = again.coord().status(again.now)["central_dp"];
  EXPECT_EQ(status["count_stddev"].get<double>(), dp.count_stddev);
  EXPECT_EQ(status["clip_norm"].get<double>(), c);
  // Its multipliers named as the records name them: noise_multiplier the round's.
  EXPECT_EQ(status["noise_multiplier"], log.back()["privacy"]["noise_multiplier"]);
  EXPECT_EQ(status["update_noise_multiplier"], log.back()["privacy"]["update_noise_multiplier"]);
  const auto verified = check_privacy_claims(log);
  ASSERT_TRUE(succeeded(verified));
  EXPECT_EQ(verified->silo_rounds(), 4u);
  EXPECT_NEAR(verified->silo_epsilon, spent_epsilon, 1e-12);
}

// Silo-level central DP: each committed round's record states its spend so far; when another
// round would pass the budget the federation ends with the reason, rounds to spare or not. A
// coordinator started with the spend its audit chain gives (a restart) goes on from there.
TEST(Coordinator, CentralDpRecordsEachRoundsSpendAndEndsTheFederationWhenTheBudgetIsSpent) {
  RoundConfig cfg = three_rounds();
  cfg.rounds = 5;
  CentralDpConfig dp;
  dp.epsilon = 3;
  dp.clip_norm = 1;
  dp.denominator = 3;
  dp.rounds = 2;
  dp.noise_multiplier = noise_multiplier_for_rounds(dp.epsilon, dp.delta, 1.0, dp.rounds);
  cfg.central_dp = dp;
  Harness h(3, cfg);
  h.connect_all(3);
  for (int round = 0; round < 2; ++round) {
    for (std::size_t i = 0; i < 3; ++i) h.ready(i, 10);
    for (std::size_t i = 0; i < 3; ++i) h.upload(i, constant(0.01f * 10.0f), 10);
  }
  ASSERT_EQ(h.store.commits.size(), 2u);
  double last = 0;
  for (std::size_t r = 0; r < 2; ++r) {
    const auto& p = h.store.commits[r].record["privacy"];
    ASSERT_TRUE(p.is_object()) << h.store.commits[r].record.dump(2);
    EXPECT_EQ(p["mechanism"], "central");
    EXPECT_EQ(p["rounds_spent"], r + 1);
    EXPECT_EQ(p["noise_multiplier"], dp.noise_multiplier);
    EXPECT_GT(p["epsilon"].get<double>(), last);
    last = p["epsilon"].get<double>();
  }
  EXPECT_LE(last, dp.epsilon);
  EXPECT_TRUE(h.finished);
  EXPECT_EQ(h.finished_reason.rfind("privacy budget spent: epsilon", 0), 0u) << h.finished_reason;
  EXPECT_NE(h.coord().status(h.now).dump().find("\"central_dp\""), std::string::npos);

  // Restarted with the audit chain's two rounds: no round starts.
  cfg.central_dp->spent.add(round_mechanism(dp), 2);
  Harness again(3, cfg, 3);
  again.connect_all(3);
  EXPECT_TRUE(again.finished);
  EXPECT_TRUE(again.store.commits.empty());
  // With one round on record, one more commits, then it ends.
  cfg.central_dp->spent = {};
  cfg.central_dp->spent.add(round_mechanism(dp), 1);
  Harness once(3, cfg, 2);
  once.connect_all(3);
  for (std::size_t i = 0; i < 3; ++i) once.ready(i, 10);
  for (std::size_t i = 0; i < 3; ++i) once.upload(i, constant(0.1f), 10);
  ASSERT_EQ(once.store.commits.size(), 1u);
  EXPECT_EQ(once.store.commits[0].record["privacy"]["rounds_spent"], 2);
  EXPECT_TRUE(once.finished);
}

TEST(Coordinator, AnEdgeCannotNameASiloThatDidNotSignItsJoin) {
  Harness h(6);
  h.edge_connect(900, "edge-1");
  h.edge_connect(901, "edge-2");
  const std::string n1 = h.nonce(900), n2 = h.nonce(901);
  ASSERT_GE(n1.size(), 16u);
  ASSERT_NE(n1, n2);
  wire::Envelope e;
  e.set_federation("fed");
  auto* r = e.mutable_region_status();
  for (std::size_t i = 0; i < 6; ++i) r->add_silos(name(i));
  // silo 0: nothing signed
  *r->add_proofs() = protocol::sign_join(test::foreign_signer(wire::SILO, name(1)), "fed", "edge-1", n1);
  *r->add_proofs() = protocol::sign_join(test::signer(wire::SILO, name(2)), "fed", "edge-2", n1);
  *r->add_proofs() = protocol::sign_join(test::signer(wire::SILO, name(3)), "fed", "edge-1", n2);
  auto stolen = protocol::sign_join(test::signer(wire::SILO, name(5)), "fed", "edge-1", n1);
  stolen.set_silo(name(4));
  *r->add_proofs() = stolen;
  const auto good = protocol::sign_join(test::signer(wire::SILO, name(5)), "fed", "edge-1", n1);
  *r->add_proofs() = good;
  h.from_edge(900, e);
  EXPECT_EQ(h.coord().connected(), 1u);  // silo 5 only
  std::vector<std::string> errors;
  for (const auto& m : h.inbox[900]) {
    if (m.has_error()) errors.push_back(m.error().message());
  }
  ASSERT_EQ(errors.size(), 5u);
  EXPECT_NE(errors[0].find("no signed join"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("does not verify"), std::string::npos) << errors[1];  // foreign CA
  EXPECT_NE(errors[2].find("does not verify"), std::string::npos) << errors[2];  // made for edge-2
  EXPECT_NE(errors[3].find("another edge session"), std::string::npos) << errors[3];
  EXPECT_NE(errors[4].find("does not verify"), std::string::npos) << errors[4];  // silo 5's key, silo 4's name

  // A second session of edge-1 replaces the first; the old session's proofs are worthless.
  h.edge_connect(902, "edge-1");
  EXPECT_TRUE(std::count_if(h.closed.begin(), h.closed.end(), [](auto id) { return id == 900; }));
  EXPECT_EQ(h.coord().connected(), 0u);
  wire::Envelope replay;
  replay.set_federation("fed");
  replay.mutable_region_status()->add_silos(name(5));
  *replay.mutable_region_status()->add_proofs() = good;
  h.from_edge(902, replay);
  EXPECT_EQ(h.coord().connected(), 0u);
  EXPECT_NE(h.inbox[902].back().error().message().find("another edge session"), std::string::npos);
  h.region(902, {5});  // signed for this session: admitted
  EXPECT_EQ(h.coord().connected(), 1u);

  // Silo 5 leaves edge-1 (for another edge, say): the server gives edge-1 a new nonce, so
  // edge-1 cannot claim it back with the proof it holds.
  const std::string before = h.nonce(902);
  const auto held = protocol::sign_join(test::signer(wire::SILO, name(5)), "fed", "edge-1", before);
  h.region(902, {});
  EXPECT_EQ(h.coord().connected(), 0u);
  EXPECT_NE(h.nonce(902), before);
  wire::Envelope claim;
  claim.mutable_region_status()->add_silos(name(5));
  *claim.mutable_region_status()->add_proofs() = held;
  h.from_edge(902, claim);
  EXPECT_EQ(h.coord().connected(), 0u);
  EXPECT_NE(h.inbox[902].back().error().message().find("an earlier one of this session"), std::string::npos)
      << h.inbox[902].back().error().message();
  h.region(902, {5});  // signed again, for the new nonce: back
  EXPECT_EQ(h.coord().connected(), 1u);
}

TEST(Coordinator, NeverStartsBelowMinSilosEvenAfterTheJoinDeadline) {
  RoundConfig cfg = three_rounds();
  cfg.selection.min_silos = 3;
  Harness h(4, cfg);
  h.connect(0);
  h.connect(1);
  h.fire(Timer::Join);
  EXPECT_EQ(h.coord().phase(), Phase::Joining);
  h.connect(2);  // the deadline passed: three are enough now
  EXPECT_EQ(h.coord().phase(), Phase::Collecting);
}

TEST(Coordinator, SiloMissingTheTrainingDeadlineIsADropoutNotAFailure) {
  Harness h(3);
  h.connect_all(3);
  h.ready(0, 10);
  h.ready(1, 10);
  h.serve({{0, {constant(1), 10}}, {1, {constant(3), 10}}});
  EXPECT_TRUE(h.store.commits.empty());  // still waiting for silo 2
  h.fire(Timer::Train);
  ASSERT_EQ(h.store.commits.size(), 1u);
  const auto& rec = h.store.commits[0].record;
  ASSERT_EQ(rec["dropouts"].size(), 1u);
  EXPECT_EQ(rec["dropouts"][0]["silo"], name(2));
  EXPECT_EQ(rec["dropouts"][0]["phase"], "train");
  expect_model(h.store.commits[0].model, fedavg(h.initial_, {{constant(1), 10}, {constant(3), 10}}));
  // The late silo is told; its late UpdateReady is refused with an error, not a crash.
  ASSERT_TRUE(h.last(2, wire::Envelope::kRoundEnd));
  h.ready(2, 10, 1);
  ASSERT_TRUE(h.last(2, wire::Envelope::kError));
  EXPECT_EQ(h.last(2, wire::Envelope::kError)->error().code(), wire::WRONG_ROUND);
}

TEST(Coordinator, SiloVanishingMidUploadLeavesNoTraceInTheSum) {
  Harness h(3);
  h.connect_all(3);
  h.ready(0, 10);  // silo 0 gets the grant first
  h.ready(1, 10);
  h.ready(2, 10);
  ASSERT_TRUE(h.granted(0));
  h.upload(0, constant(1000), 10, /*stop_after=*/2);
  h.disconnect(0);
  h.serve({{1, {constant(2), 10}}, {2, {constant(4), 10}}});
  ASSERT_EQ(h.store.commits.size(), 1u);
  expect_model(h.store.commits[0].model, fedavg(h.initial_, {{constant(2), 10}, {constant(4), 10}}));
  EXPECT_EQ(h.store.commits[0].record["dropouts"][0]["phase"], "upload");
}

// Every upload staged in a file (the path of models over stage_uploads_over_mib), with chunks of
// 3 floats: no chunk boundary falls on a page.
RoundConfig staged_rounds() {
  RoundConfig c = three_rounds();
  c.staging.over_bytes = 0;
  c.staging.dir = std::filesystem::temp_directory_path();  // the file is unlinked at once: nothing is left
  return c;
}

TEST(StagedUpload, KeepsPutBytesInItsFileAndGivesTheWindowPagesBack) {
  const std::size_t n = 3 * 4096 + 5;  // floats: pages not whole at the end
  StagedUpload stage(staged_rounds().staging.dir, n * sizeof(float));
  auto w = stage.window();
  std::vector<float> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = static_cast<float>(i) * 0.5f;
  std::memcpy(w.data(), want.data(), w.size());
  const std::size_t cut = 1000 * sizeof(float) + 4;  // two chunks, the first ending inside a page
  EXPECT_TRUE(succeeded(stage.put(0, w.subspan(0, cut))));
  EXPECT_TRUE(succeeded(stage.put(cut, w.subspan(cut))));
  EXPECT_EQ(error_text(stage.put(w.size() - 4, w.subspan(0, 8))),  // past the end: refused
            "upload staging: bytes past the end of the upload");
  // Released pages read as zeros again; the file holds what was put.
  EXPECT_EQ(reinterpret_cast<const float*>(w.data())[4096], 0.0f);
  float back = 0;
  EXPECT_TRUE(succeeded(stage.get(4096 * sizeof(float), {reinterpret_cast<std::uint8_t*>(&back), sizeof back})));
  EXPECT_EQ(back, want[4096]);
  EXPECT_EQ(error_text(stage.get(w.size() - 2, {reinterpret_cast<std::uint8_t*>(&back), sizeof back})),
            "upload staging: bytes past the end of the upload");
  std::vector<float> sum(n, 1.0f);
  EXPECT_TRUE(succeeded(stage.add_to(sum)));
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(sum[i], want[i] + 1.0f) << i;
}

// A sink that cannot keep what it is given (the server's disk full): the chunk's check says so
// and checks nothing else; a sink that can is read back by the check.
class FailingSink final : public protocol::UploadSink {
 public:
  Status put(std::uint64_t, std::span<const std::uint8_t>) override { return Error("disk full"); }
  Status get(std::uint64_t, std::span<std::uint8_t>) override { return Error("not reached"); }
};

TEST(StagedUpload, AChunkItsSinkCouldNotKeepFailsItsCheckWithTheSinksReason) {
  Model layout;
  layout.add("a", {4});
  protocol::UploadSlot<int> slot;
  auto sink = std::make_shared<FailingSink>();
  slot.open(1, {{reinterpret_cast<std::uint8_t*>(layout.flat().data()), layout.bytes()}, wire::F32, layout.tensors(),
                true, nullptr, {}, sink});
  protocol::ChunkSource src(std::make_shared<Model>(layout), layout.flat(), layout.tensors(), "fed", 1, 8);
  while (auto e = src.next()) {
    auto work = slot.add(e->tensor_chunk());
    ASSERT_TRUE(work);
    (*work)();
  }
  EXPECT_EQ(error_text(slot.check()->sink_status), "disk full");
}

// Float32 chunks are scanned for NaN and infinities while they are copied into place (one pass,
// TensorReceiver::last_finite); the check work only records what was found. A chunk of the
// wrong length is still refused before anything is copied, a chunk holding an infinity still
// fails its upload's check with the same reason, and ring words are never taken for floats.
TEST(UploadSlot, ANonFiniteValueFoundWhileCopyingFailsTheUploadAndABadLengthIsRefusedFirst) {
  Model layout;
  layout.add("a", {8});
  std::vector<float> into(8, 5.0f);
  auto buffer = [&] {
    return protocol::UploadBuffer{{reinterpret_cast<std::uint8_t*>(into.data()), into.size() * sizeof(float)},
                                  wire::F32, layout.tensors(), true, nullptr, {}, nullptr};
  };
  protocol::UploadSlot<int> slot;
  slot.open(1, buffer());
  wire::TensorChunk bad;
  bad.set_name("a");
  bad.set_dtype(wire::F32);
  bad.set_offset(0);
  bad.set_data(std::string(7, '\x01'));
  auto refused = slot.add(bad);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), wire::BAD_UPDATE);
  EXPECT_EQ(refused.error().message(), "chunk of a has 7 bytes, not a positive multiple of 4");
  EXPECT_EQ(into, std::vector<float>(8, 5.0f));  // nothing was copied

  auto values = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8});
  (*values)[5] = std::numeric_limits<float>::infinity();
  slot.open(2, buffer());
  protocol::ChunkSource src(values, *values, layout.tensors(), "fed", 1, 2 * sizeof(float));
  std::vector<bool> finite;
  while (auto e = src.next()) {
    auto work = slot.add(e->tensor_chunk());
    ASSERT_TRUE(work);
    (*work)();
    finite.push_back(slot.check()->finite);
  }
  EXPECT_EQ(finite, (std::vector<bool>{true, true, false, false}));  // the third chunk holds the infinity
  EXPECT_EQ(into, *values);  // copied whole all the same (never folded)
  ASSERT_TRUE(succeeded(slot.end()));
  const std::string declared = crypto::sha256_hex(
      std::string_view(reinterpret_cast<const char*>(values->data()), values->size() * sizeof(float)));
  const auto verdict = protocol::verify_upload(*slot.check(), declared, "update");
  EXPECT_EQ(verdict.problem, protocol::UploadVerdict::Problem::NonFinite);
  EXPECT_EQ(verdict.why, "update contains NaN or infinite values");

  // Masked words whose bits read as an infinity are words like any other.
  std::vector<std::uint32_t> words(8, 0x7f800000u), received(8, 0);
  protocol::TensorReceiver rx;
  rx.reset_words({reinterpret_cast<std::uint8_t*>(received.data()), received.size() * 4}, {{"masked", {8}, 0}},
                 wire::U32, /*hash=*/false);
  protocol::ChunkSource words_src(nullptr, {reinterpret_cast<const std::uint8_t*>(words.data()), words.size() * 4},
                                  wire::U32, {{"masked", {8}, 0}}, "fed", 1, 16);
  while (auto e = words_src.next()) {
    ASSERT_TRUE(rx.add(e->tensor_chunk()));
    EXPECT_FALSE(rx.last_finite().has_value());
  }
  EXPECT_EQ(received, words);
}

TEST(Coordinator, StagedUploadsCommitTheSameWeightedMean) {
  Harness h(3, staged_rounds());
  h.connect_all(3);
  for (std::size_t i = 0; i < 3; ++i) h.ready(i, 10);
  std::map<std::size_t, std::pair<std::vector<float>, double>> ups = {
      {0, {constant(10.0f), 10}}, {1, {constant(-30.0f), 30}}, {2, {constant(30.0f), 60}}};
  h.serve(ups);
  ASSERT_EQ(h.store.commits.size(), 1u);
  expect_model(h.store.commits[0].model, fedavg(h.initial_, {ups[0], ups[1], ups[2]}));
  // A second round reuses the staging file: the first round's uploads leave nothing in it.
  for (std::size_t i = 0; i < 3; ++i) h.ready(i, 10);
  h.serve({{0, {constant(1.0f), 10}}, {1, {constant(2.0f), 10}}, {2, {constant(3.0f), 10}}});
  ASSERT_EQ(h.store.commits.size(), 2u);
  std::vector<float> want(h.store.commits[0].model.flat().begin(), h.store.commits[0].model.flat().end());
  for (auto& v : want) v += 0.2f;
  expect_model(h.store.commits[1].model, want);
}

TEST(Coordinator, StagedUploadVanishingHalfwayLeavesNoTraceInTheSum) {
  Harness h(3, staged_rounds());
  h.connect_all(3);
  h.ready(0, 10);  // silo 0 gets the grant first
  h.ready(1, 10);
  h.ready(2, 10);
  ASSERT_TRUE(h.granted(0));
  h.upload(0, constant(1000), 10, /*stop_after=*/2);  // two chunks staged, then gone
  h.disconnect(0);
  h.serve({{1, {constant(2), 10}}, {2, {constant(4), 10}}});
  ASSERT_EQ(h.store.commits.size(), 1u);
  expect_model(h.store.commits[0].model, fedavg(h.initial_, {{constant(2), 10}, {constant(4), 10}}));
  EXPECT_EQ(h.store.commits[0].record["dropouts"][0]["phase"], "upload");
}

TEST(Coordinator, StagedUploadsWithNaNOrABadHashAreRefusedAndNeverAdded) {
  RoundConfig cfg = staged_rounds();
  cfg.selection.min_updates = 1;
  Harness h(4, cfg);
  h.connect_all(4);
  for (std::size_t i = 0; i < 4; ++i) h.ready(i, 10);
  auto nan = constant(1);
  nan[9] = std::nanf("");  // in the last chunk: every other chunk was staged already
  h.upload(0, nan, 10);
  h.upload(1, constant(50), 10, -1, crypto::sha256_hex("another update"));
  h.upload(2, constant(3), 10);
  h.upload(3, constant(7), 10, -1, "");  // no declared hash
  ASSERT_EQ(h.store.commits.size(), 1u);
  const auto& rec = h.store.commits[0].record;
  ASSERT_EQ(rec["participants"].size(), 1u);
  std::map<std::string, std::string> why;
  for (const auto& d : rec["dropouts"]) why[d["silo"]] = d["reason"];
  EXPECT_NE(why[name(0)].find("NaN"), std::string::npos);
  EXPECT_NE(why[name(1)].find("does not match its SHA-256"), std::string::npos) << why[name(1)];
  EXPECT_NE(why[name(3)].find("declares no SHA-256"), std::string::npos) << why[name(3)];
  expect_model(h.store.commits[0].model, fedavg(h.initial_, {{constant(3), 10}}));
}

TEST(Coordinator, UploadDeadlineDropsTheUploaderAndGrantsTheNext) {
  Harness h(3);
  h.connect_all(3);
  h.ready(0, 10);
  h.ready(1, 10);
  h.ready(2, 10);
  h.upload(0, constant(7), 10, 1);
  h.fire(Timer::Upload);
  EXPECT_TRUE(h.granted(1));
  h.serve({{1, {constant(2), 10}}, {2, {constant(4), 10}}});
  ASSERT_EQ(h.store.commits.size(), 1u);
  EXPECT_EQ(h.store.commits[0].record["participants"].size(), 2u);
}

// ---- uploads at once --------------------------------------------------------------------------

RoundConfig with_lanes(std::size_t lanes, RoundConfig c = three_rounds()) {
  c.uploads_at_once = lanes;
  return c;
}

// Four updates whose float sum depends on the order they are added in (1e8 + 1 is 1e8).
std::map<std::size_t, std::pair<std::vector<float>, double>> order_sensitive() {
  return {{0, {constant(1e8f), 10}}, {1, {constant(1.0f), 10}}, {2, {constant(-1e8f), 10}}, {3, {constant(1.0f), 10}}};
}

// Each silo that holds a grant, in `order`, uploads whole; until nobody does. The committed model.
std::vector<float> finish_in(Harness& h, const std::map<std::size_t, std::pair<std::vector<float>, double>>& ups,
                             const std::vector<std::size_t>& order) {
  std::set<std::size_t> sent;
  for (bool progress = true; progress;) {
    progress = false;
    for (auto i : order) {
      if (!sent.count(i) && h.granted(i)) {
        h.upload(i, ups.at(i).first, ups.at(i).second);
        sent.insert(i);
        progress = true;
        break;
      }
    }
  }
  if (h.store.commits.empty()) return {};
  const auto m = h.store.commits.back().model.flat();
  return {m.begin(), m.end()};
}

TEST(UploadLanes, GrantsEachLaneOnceAndAnAbandonedOneOnlyAfterTheWorkerPassedItsChecks) {
  protocol::UploadLanes<int> lanes(2);
  std::vector<float> a(4), b(4);
  auto buf = [](std::vector<float>& v) {
    return protocol::UploadBuffer{{reinterpret_cast<std::uint8_t*>(v.data()), v.size() * sizeof(float)},
                                  wire::F32, {{"w", {4}, 0}}, true, nullptr, {}, nullptr};
  };
  ASSERT_EQ(lanes.free_lane(), std::optional<std::size_t>(0));
  lanes.open(0, 7, buf(a), 100);
  ASSERT_EQ(lanes.free_lane(), std::optional<std::size_t>(1));
  lanes.open(1, 8, buf(b), 50);
  EXPECT_FALSE(lanes.free_lane());
  EXPECT_EQ(lanes.held(), 2u);
  EXPECT_EQ(lanes.oldest(), std::optional<std::size_t>(0));
  EXPECT_EQ(lanes.next_deadline(), std::optional<std::int64_t>(50));
  EXPECT_EQ(lanes.lane_of(8), std::optional<std::size_t>(1));
  lanes.abandon(0, /*mark=*/5);
  EXPECT_EQ(lanes.oldest(), std::optional<std::size_t>(1));
  EXPECT_FALSE(lanes.free_lane());  // its chunk checks may still be queued
  EXPECT_TRUE(lanes.draining());
  lanes.drained(5);                  // the job that was running when it was given up
  EXPECT_FALSE(lanes.free_lane());
  lanes.drained(6);                  // a job started after it
  ASSERT_EQ(lanes.free_lane(), std::optional<std::size_t>(0));
  lanes.open(0, 9, buf(a), 200);
  EXPECT_EQ(lanes.oldest(), std::optional<std::size_t>(1));  // granted before 9
  EXPECT_EQ(lanes.overdue(60), std::vector<std::size_t>{1});
  EXPECT_EQ(lanes.overdue(200), (std::vector<std::size_t>{1, 0}));
}

TEST(Coordinator, UploadsAtOnceOneGrantsOneUploadAtATime) {
  Harness h(3, with_lanes(1));
  h.connect_all(3);
  for (std::size_t i = 0; i < 3; ++i) h.ready(i, 10);
  EXPECT_TRUE(h.granted(0));
  EXPECT_FALSE(h.granted(1));
  EXPECT_FALSE(h.granted(2));
  h.upload(0, constant(1), 10);
  EXPECT_TRUE(h.granted(1));
  EXPECT_FALSE(h.granted(2));
}

TEST(Coordinator, UploadsAtOnceGrantsThatManyAndFoldsInGrantOrderWhateverOrderTheyEndIn) {
  const auto ups = order_sensitive();
  Harness one(4, with_lanes(1));
  one.connect_all(4);
  for (std::size_t i = 0; i < 4; ++i) one.ready(i, 10);
  const auto reference = finish_in(one, ups, {0, 1, 2, 3});
  ASSERT_FALSE(reference.empty());

  Harness h(4, with_lanes(3));
  h.connect_all(4);
  for (std::size_t i = 0; i < 4; ++i) h.ready(i, 10);
  EXPECT_TRUE(h.granted(0) && h.granted(1) && h.granted(2));
  EXPECT_FALSE(h.granted(3));  // three lanes
  h.upload(2, ups.at(2).first, ups.at(2).second);
  h.upload(1, ups.at(1).first, ups.at(1).second);
  EXPECT_FALSE(h.granted(3));  // both wait, whole, for silo 0's, granted first
  const auto got = finish_in(h, ups, {3, 0});
  ASSERT_EQ(got.size(), reference.size());
  for (std::size_t k = 0; k < got.size(); ++k) EXPECT_EQ(got[k], reference[k]) << k;  // bit for bit
  // Ending in another order changes nothing either.
  Harness again(4, with_lanes(4));
  again.connect_all(4);
  for (std::size_t i = 0; i < 4; ++i) again.ready(i, 10);
  EXPECT_EQ(finish_in(again, ups, {3, 2, 1, 0}), reference);
}

// A silo gone halfway while others upload beside it: the sum is exactly that of the others,
// added in the order they were granted (as one lane would have added them).
void vanishing_beside_others(RoundConfig cfg) {
  auto ups = order_sensitive();
  ups.erase(1);
  Harness one(4, with_lanes(1, cfg));
  one.connect_all(4);
  for (std::size_t i = 0; i < 4; ++i) one.ready(i, 10);
  one.disconnect(1);
  const auto reference = finish_in(one, ups, {0, 2, 3});
  ASSERT_FALSE(reference.empty());

  Harness h(4, with_lanes(3, cfg));
  h.connect_all(4);
  for (std::size_t i = 0; i < 4; ++i) h.ready(i, 10);
  h.upload(1, constant(1000), 10, /*stop_after=*/2);  // two chunks, then gone
  h.upload(2, ups.at(2).first, ups.at(2).second);     // whole: waits for silo 0's, granted first
  h.disconnect(1);
  EXPECT_TRUE(h.granted(3));  // silo 1's lane, once its checks drained
  h.upload(0, ups.at(0).first, ups.at(0).second);
  const auto got = finish_in(h, ups, {3});
  ASSERT_EQ(h.store.commits.size(), 1u);
  EXPECT_EQ(got, reference);
  const auto& rec = h.store.commits[0].record;
  EXPECT_EQ(rec["participants"].size(), 3u);
  ASSERT_EQ(rec["dropouts"].size(), 1u);
  EXPECT_EQ(rec["dropouts"][0]["silo"], name(1));
  EXPECT_EQ(rec["dropouts"][0]["phase"], "upload");
}

TEST(Coordinator, ASiloVanishingMidUploadWhileOthersUploadLeavesTheSumExact) {
  vanishing_beside_others(three_rounds());
}

TEST(Coordinator, AStagedUploadVanishingWhileOthersUploadLeavesTheSumExact) { vanishing_beside_others(staged_rounds()); }

TEST(Coordinator, EachConcurrentUploadHasItsOwnDeadline) {
  RoundConfig cfg = with_lanes(2);
  cfg.selection.min_updates = 2;
  Harness h(3, cfg);
  h.connect_all(3);
  for (std::size_t i = 0; i < 3; ++i) h.ready(i, 10);
  ASSERT_TRUE(h.granted(0) && h.granted(1));
  const std::int64_t start = h.now, upload_ms = cfg.deadlines.upload.count();
  h.now += upload_ms / 2;
  h.upload(0, constant(1), 10);
  ASSERT_TRUE(h.granted(2));            // granted half a deadline later than silo 1
  h.upload(1, constant(5), 10, /*stop_after=*/1);
  h.now = start + upload_ms;
  h.fire(Timer::Upload);                // silo 1's deadline, not yet silo 2's
  EXPECT_TRUE(h.armed.count(Timer::Upload));
  h.upload(2, constant(3), 10);
  ASSERT_EQ(h.store.commits.size(), 1u);
  const auto& rec = h.store.commits[0].record;
  EXPECT_EQ(rec["participants"].size(), 2u);
  ASSERT_EQ(rec["dropouts"].size(), 1u);
  EXPECT_EQ(rec["dropouts"][0]["silo"], name(1));
  EXPECT_EQ(rec["dropouts"][0]["cause"], "deadline");
  expect_model(h.store.commits[0].model, fedavg(h.initial_, {{constant(1), 10}, {constant(3), 10}}));
}

TEST(Coordinator, TooFewUpdatesAbortCleanlyAndTheNextRoundStarts) {
  RoundConfig cfg = three_rounds();
  cfg.selection.min_silos = 2;
  cfg.selection.min_updates = 2;
  Harness h(3, cfg);
  h.connect_all(3);
  h.ready(0, 10);
  h.serve({{0, {constant(5), 10}}});
  h.disconnect(1);
  h.fire(Timer::Train);
  EXPECT_TRUE(h.store.commits.empty());
  ASSERT_FALSE(h.store.records.empty());
  const auto& rec = h.store.records.back();
  EXPECT_EQ(rec["status"], "aborted");
  EXPECT_NE(rec["reason"].get<std::string>().find("only 1 updates arrived, 2 needed"), std::string::npos);
  EXPECT_EQ(rec["model_sha256_after"], rec["model_sha256_before"]);
  EXPECT_EQ(crypto::sha256_hex(h.coord().model()->flat()), crypto::sha256_hex(h.initial_.flat()));
  EXPECT_EQ(h.coord().round(), 2u);
  EXPECT_EQ(h.coord().aborted(), 1u);
  // Two silos are still connected and silo 1 is known to have left: round 2 starts at once,
  // without waiting for it or for the join deadline.
  EXPECT_EQ(h.coord().phase(), Phase::Collecting);
  EXPECT_EQ(h.coord().members().size(), 2u);
}

TEST(Coordinator, OverSelectionClosesAtTheTargetAndReleasesTheRest) {
  RoundConfig cfg = three_rounds();
  cfg.selection.silos_per_round = 4;
  cfg.selection.over_selection = 0.5;  // select 6 of 10, close at 4
  Harness h(10, cfg);
  h.connect_all(10);
  ASSERT_EQ(h.coord().members().size(), 6u);
  std::vector<std::size_t> selected;
  for (std::size_t i = 0; i < 10; ++i) {
    if (h.last(i, wire::Envelope::kRoundStart)) selected.push_back(i);
  }
  ASSERT_EQ(selected.size(), 6u);
  std::map<std::size_t, std::pair<std::vector<float>, double>> ups;
  for (std::size_t k = 0; k < 4; ++k) {
    h.ready(selected[k], 5);
    ups[selected[k]] = {constant(static_cast<float>(k)), 5};
  }
  h.serve(ups);
  ASSERT_EQ(h.store.commits.size(), 1u);
  const auto& rec = h.store.commits[0].record;
  EXPECT_EQ(rec["participants"].size(), 4u);
  EXPECT_EQ(rec["surplus"].size(), 2u);
  EXPECT_EQ(rec["dropouts"].size(), 0u);
  EXPECT_EQ(rec["target"], 4);
}

TEST(Coordinator, NonFiniteOrMalformedUpdatesAreRejected) {
  RoundConfig cfg = three_rounds();
  cfg.selection.min_updates = 1;
  cfg.plan.set_max_weight(1000);
  Harness h(7, cfg);
  h.connect_all(7);
  for (std::size_t i = 0; i < 7; ++i) h.ready(i, 10);
  auto nan = constant(1);
  nan[3] = std::nanf("");
  h.upload(0, nan, 10);  // NaN
  // Silo 1 sends a chunk out of order.
  ASSERT_TRUE(h.granted(1));
  {
    wire::Envelope e;
    e.set_round(1);
    auto* c = e.mutable_tensor_chunk();
    c->set_name("b");
    c->set_dtype(wire::F32);
    c->set_data(std::string(12, '\0'));
    h.deliver(1, e);
  }
  h.upload(2, constant(2), -1);  // negative weight
  h.upload(3, constant(3), 10);
  h.upload(4, constant(4), 10, -1, "");  // no declared hash
  h.upload(5, constant(5), 10, -1, crypto::sha256_hex("another update"));
  // A weight no silo has (review N5): one silo would decide the step. The last: the round closes.
  h.upload(6, constant(6), 1e300);
  ASSERT_EQ(h.store.commits.size(), 1u);
  const auto& rec = h.store.commits[0].record;
  ASSERT_EQ(rec["participants"].size(), 1u);
  EXPECT_EQ(rec["participants"][0]["silo"], name(3));
  std::map<std::string, std::string> why;
  for (const auto& d : rec["dropouts"]) why[d["silo"]] = d["reason"];
  EXPECT_NE(why[name(0)].find("NaN"), std::string::npos);
  EXPECT_NE(why[name(1)].find("expected a chunk of a"), std::string::npos);
  EXPECT_NE(why[name(2)].find("weight"), std::string::npos);
  EXPECT_NE(why[name(4)].find("declares no SHA-256"), std::string::npos) << why[name(4)];
  EXPECT_NE(why[name(5)].find("does not match its SHA-256"), std::string::npos) << why[name(5)];
  EXPECT_NE(why[name(6)].find("exceeds training.max_weight 1000"), std::string::npos) << why[name(6)];
  expect_model(h.store.commits[0].model, fedavg(h.initial_, {{constant(3), 10}}));
}

TEST(Coordinator, MessagesOutOfPlaceGetAnErrorAndChangeNothing) {
  Harness h(2);
  h.connect_all(2);
  wire::Envelope chunk;
  chunk.set_round(1);
  chunk.mutable_tensor_chunk()->set_name("a");
  h.deliver(0, chunk);  // no grant yet
  EXPECT_EQ(h.last(0, wire::Envelope::kError)->error().code(), wire::UNEXPECTED);
  wire::Envelope rs;
  rs.set_round(1);
  rs.mutable_round_start();
  h.deliver(1, rs);  // a silo may not start rounds
  EXPECT_EQ(h.last(1, wire::Envelope::kError)->error().code(), wire::UNEXPECTED);
  h.ready(0, 10, 7);  // wrong round
  EXPECT_EQ(h.last(0, wire::Envelope::kError)->error().code(), wire::WRONG_ROUND);
  EXPECT_EQ(h.coord().members()[0].state, MemberState::Training);
}

TEST(Coordinator, AReconnectingSiloReplacesItsOldConnection) {
  Harness h(2);
  h.connect_all(2);
  h.coord().on_connect(9999, name(0), h.now);
  EXPECT_EQ(h.coord().connected(), 2u);
}

TEST(Coordinator, FinishesAfterTheLastRoundAndTellsEverySilo) {
  RoundConfig cfg;
  cfg.rounds = 2;
  Harness h(2, cfg);
  h.connect_all(2);
  for (int r = 0; r < 2; ++r) {
    h.ready(0, 1);
    h.ready(1, 1);
    h.serve({{0, {constant(1), 1}}, {1, {constant(1), 1}}});
  }
  EXPECT_TRUE(h.finished);
  EXPECT_EQ(h.coord().phase(), Phase::Finished);
  EXPECT_TRUE(h.last(0, wire::Envelope::kFinished));
  EXPECT_TRUE(h.last(1, wire::Envelope::kFinished));
  EXPECT_EQ(h.store.commits.size(), 2u);
}

TEST(Coordinator, ResumedPastTheLastRoundFinishesAtOnce) {
  RoundConfig cfg;
  cfg.rounds = 3;
  Harness h(2, cfg, 4);
  EXPECT_TRUE(h.finished);
}

TEST(Coordinator, HundredSilosWithRandomDropoutsAtEveryPhaseMatchTheReference) {
  std::mt19937 rng(12345);
  RoundConfig cfg;
  cfg.rounds = 1;
  cfg.selection.min_silos = 10;
  cfg.selection.min_updates = 10;
  Harness h(100, cfg);
  h.connect_all(100);
  ASSERT_EQ(h.coord().members().size(), 100u);
  std::map<std::size_t, std::pair<std::vector<float>, double>> ups;
  std::vector<std::pair<std::vector<float>, double>> included;
  std::uniform_real_distribution<float> u(-1, 1);
  for (std::size_t i = 0; i < 100; ++i) {
    const int fate = static_cast<int>(rng() % 5);  // 0: drop in training, 1: drop mid-upload
    if (fate == 0) {
      h.disconnect(i);
      continue;
    }
    const double w = 1 + rng() % 50;
    std::vector<float> v(10);
    for (auto& x : v) x = u(rng) * static_cast<float>(w);
    h.ready(i, static_cast<std::uint64_t>(w));
    if (fate == 1) {
      while (!h.granted(i)) h.serve(ups);
      h.upload(i, v, w, 1);
      h.disconnect(i);
      continue;
    }
    ups[i] = {v, w};
    included.push_back({v, w});
  }
  h.serve(ups);
  ASSERT_EQ(h.store.commits.size(), 1u);
  EXPECT_EQ(h.store.commits[0].record["participants"].size(), included.size());
  expect_model(h.store.commits[0].model, fedavg(h.initial_, included));
}

TEST(Coordinator, KrumKeepsTheAttackerOutAndTheAuditSaysWhy) {
  RoundConfig cfg = three_rounds();
  cfg.selection.min_silos = 5;
  cfg.aggregation.rule.rule = robust::Rule::Krum;
  cfg.aggregation.rule.f = 1;
  Harness h(5, cfg);
  h.connect_all(5);
  std::map<std::size_t, std::pair<std::vector<float>, double>> ups;
  for (std::size_t i = 0; i < 4; ++i) ups[i] = {constant(0.1f * static_cast<float>(i + 1) * 10), 10};
  ups[4] = {constant(1e6f * 10), 10};  // the Byzantine silo
  for (std::size_t i = 0; i < 5; ++i) h.ready(i, 10);
  h.serve(ups);
  ASSERT_EQ(h.store.commits.size(), 1u);
  const auto& robust = h.store.commits[0].record["robust"];
  EXPECT_EQ(robust["applied"], "krum");
  const double dims = static_cast<double>(h.initial_.size());
  for (const auto& d : robust["decisions"]) {
    // The norm of every input's delta is recorded, clipping or not (docs/robust.md).
    ASSERT_TRUE(d.contains("norm")) << d.dump();
    EXPECT_FALSE(d.contains("clipped")) << d.dump();
    if (d["silo"] == name(4)) {
      EXPECT_FALSE(d["kept"].get<bool>());
      EXPECT_NEAR(d["norm"].get<double>(), 1e6 * std::sqrt(dims), 1e-4 * 1e6 * std::sqrt(dims));
    }
  }
  // Krum picks one honest delta (0.2 or 0.3 are the most central); it is far from the attack.
  const float moved = h.store.commits[0].model.flat()[0] - h.initial_.flat()[0];
  EXPECT_TRUE(std::abs(moved - 0.2f) < 1e-5 || std::abs(moved - 0.3f) < 1e-5) << moved;
}

// Five silos, all of them in every round, under centered clipping with its defaults.
RoundConfig five_with_centered_clipping() {
  RoundConfig cfg = three_rounds();
  cfg.selection.min_silos = 5;
  cfg.aggregation.rule.rule = robust::Rule::CenteredClip;
  return cfg;
}

// The default centered clipping takes an update a million times an honest one out of the mean
// (it would otherwise pull by a radius) and the audit says by what measure.
TEST(Coordinator, CenteredClippingRejectsAFarUpdateAndTheAuditSaysBeyondWhatDistance) {
  Harness h(5, five_with_centered_clipping());
  h.connect_all(5);
  std::map<std::size_t, std::pair<std::vector<float>, double>> ups;
  for (std::size_t i = 0; i < 4; ++i) ups[i] = {constant(0.1f * static_cast<float>(i + 1) * 10), 10};
  ups[4] = {constant(-1e6f * 10), 10};  // the Byzantine silo
  for (std::size_t i = 0; i < 5; ++i) h.ready(i, 10);
  h.serve(ups);
  ASSERT_EQ(h.store.commits.size(), 1u);
  const auto& robust = h.store.commits[0].record["robust"];
  EXPECT_EQ(robust["applied"], "centered_clip");
  EXPECT_EQ(robust["reject"].get<double>(), robust::kDefaultReject);
  const double beyond = robust["rejected_beyond"].get<double>();
  EXPECT_GT(beyond, robust["tau"].get<double>());
  for (const auto& d : robust["decisions"]) {
    ASSERT_TRUE(d.contains("norm")) << d.dump();
    const bool attacker = d["silo"] == name(4);
    EXPECT_EQ(d["kept"].get<bool>(), !attacker) << d.dump();
    if (attacker) {
      EXPECT_GT(d["score"].get<double>(), beyond);
      EXPECT_NE(d["reason"].get<std::string>().find("rejected"), std::string::npos) << d.dump();
    }
  }
  // The honest deltas are 0.1-0.4; the attacker's -10^6 moved the step nowhere near it.
  const float moved = h.store.commits[0].model.flat()[0] - h.initial_.flat()[0];
  EXPECT_GT(moved, 0.05f);
  EXPECT_LT(moved, 0.4f);
}

// Silos 0-3's honest uploads (deltas 0.1-0.4 over 10 parameters, weight 10) into `ups`; returns
// their mean delta.
std::vector<float> four_honest_uploads(std::map<std::size_t, std::pair<std::vector<float>, double>>& ups,
                                       std::size_t d = 10) {
  std::vector<float> mean(d, 0.0f);
  for (std::size_t i = 0; i < 4; ++i) {
    std::vector<float> delta(d);
    for (std::size_t k = 0; k < d; ++k) delta[k] = 0.1f + 0.3f * static_cast<float>((i + k) % 4 == 0);
    for (std::size_t k = 0; k < d; ++k) mean[k] += delta[k] / 4;
    for (auto& v : delta) v *= 10;
    ups[i] = {delta, 10};
  }
  return mean;
}

// IPM 0.5 from one of five: inside the radius, so in round 1 (no last step yet) it counts; in
// round 2 it points against round 1's step, is left out, and the record says each alignment.
TEST(Coordinator, CenteredClippingLeavesOutAnUpdateAgainstTheLastStepAndTheAuditSaysWhy) {
  Harness h(5, five_with_centered_clipping());
  h.connect_all(5);
  std::map<std::size_t, std::pair<std::vector<float>, double>> ups;
  const std::vector<float> mean = four_honest_uploads(ups);
  std::vector<float> ipm(10);
  for (std::size_t k = 0; k < 10; ++k) ipm[k] = -0.5f * mean[k] * 10;
  ups[4] = {ipm, 10};
  for (int round = 0; round < 2; ++round) {
    for (std::size_t i = 0; i < 5; ++i) h.ready(i, 10);
    h.serve(ups);
  }
  ASSERT_EQ(h.store.commits.size(), 2u);
  const auto& first = h.store.commits[0].record["robust"];
  EXPECT_FALSE(first.contains("median_alignment")) << first.dump();
  for (const auto& d : first["decisions"]) {
    EXPECT_TRUE(d["kept"].get<bool>()) << d.dump();
    EXPECT_FALSE(d.contains("alignment")) << d.dump();
  }
  const auto& second = h.store.commits[1].record["robust"];
  // Ten parameters are too few for a balance of signs to say anything: the record says so.
  EXPECT_NE(second.value("one_sided_off", "").find("coordinates"), std::string::npos) << second.dump();
  ASSERT_TRUE(second.contains("median_alignment")) << second.dump();
  EXPECT_EQ(second["oppose"].get<double>(), robust::kDefaultOppose);
  EXPECT_GT(second["median_alignment"].get<double>(), 0.5);
  const double below = second["opposed_below"].get<double>();
  for (const auto& d : second["decisions"]) {
    const bool attacker = d["silo"] == name(4);
    EXPECT_EQ(d["kept"].get<bool>(), !attacker) << d.dump();
    EXPECT_EQ(d["alignment"].get<double>() < below, attacker) << d.dump();
    if (attacker) {
      EXPECT_NE(d["reason"].get<std::string>().find("opposed"), std::string::npos) << d.dump();
    }
  }
}

// A label flipper's kind of update from one of five: as long as an honest one but orthogonal to
// the honest mean, so inside the radius and not backwards. In round 2 it lags far behind the
// median alignment with round 1's step, is left out, and the record says the bound and why.
TEST(Coordinator, CenteredClippingLeavesOutAnUpdateThatLagsBehindTheLastStepAndTheAuditSaysWhy) {
  // 100 parameters: on fewer than 57 the cosine's own noise (3 / sqrt(d)) is above the lag
  // test's floor, and on 10 it would keep anything (Robust.OnAModelWithFewCoordinates...).
  const std::size_t d = 100;
  Model initial;
  initial.add("w", {d});
  Harness h(5, five_with_centered_clipping(), 1, initial);
  h.connect_all(5);
  std::map<std::size_t, std::pair<std::vector<float>, double>> ups;
  const std::vector<float> mean = four_honest_uploads(ups, d);
  // Alternating signs, less their projection on the honest mean, at the honest mean's norm.
  std::vector<float> side(d);
  double dot = 0, mm = 0;
  for (std::size_t k = 0; k < d; ++k) side[k] = k % 2 ? 1.0f : -1.0f;
  for (std::size_t k = 0; k < d; ++k) dot += double(side[k]) * mean[k], mm += double(mean[k]) * mean[k];
  double sn = 0;
  for (std::size_t k = 0; k < d; ++k) side[k] -= static_cast<float>(dot / mm) * mean[k], sn += double(side[k]) * side[k];
  for (auto& v : side) v *= static_cast<float>(std::sqrt(mm / sn) * 10);
  ups[4] = {side, 10};
  for (int round = 0; round < 2; ++round) {
    for (std::size_t i = 0; i < 5; ++i) h.ready(i, 10);
    h.serve(ups);
  }
  ASSERT_EQ(h.store.commits.size(), 2u);
  const auto& second = h.store.commits[1].record["robust"];
  EXPECT_EQ(second["lag"].get<double>(), robust::kDefaultLag);
  ASSERT_TRUE(second.contains("lagging_beyond")) << second.dump();
  const double median = second["median_alignment"].get<double>(), beyond = second["lagging_beyond"].get<double>();
  EXPECT_GE(beyond, robust::kLagFloor);
  for (const auto& d : second["decisions"]) {
    const bool lagging = d["silo"] == name(4);
    EXPECT_EQ(d["kept"].get<bool>(), !lagging) << d.dump();
    EXPECT_EQ(d["alignment"].get<double>() < median - beyond, lagging) << d.dump();
    EXPECT_GT(d["alignment"].get<double>(), second["opposed_below"].get<double>()) << d.dump();
    if (lagging) {
      EXPECT_EQ(d["reason"].get<std::string>().rfind("lagging", 0), 0u) << d.dump();
    }
  }
}

// A little below the honest mean on every coordinate (ALIE) from one of five, on a model of
// 300 parameters: inside the radius and along the honest updates, but below the inputs' median
// everywhere. It is left out as one-sided, and the record says every balance and the bound.
TEST(Coordinator, CenteredClippingLeavesOutAOneSidedUpdateAndTheAuditSaysWhy) {
  Model initial;
  initial.add("w", {300});
  Harness h(5, five_with_centered_clipping(), 1, initial);
  h.connect_all(5);
  std::mt19937 rng(4);
  std::normal_distribution<float> g(0, 1);
  std::map<std::size_t, std::pair<std::vector<float>, double>> ups;
  std::vector<float> mean(300, 0.0f);
  for (std::size_t i = 0; i < 4; ++i) {
    std::vector<float> delta(300);
    for (auto& v : delta) v = 1 + 0.5f * g(rng);
    for (std::size_t k = 0; k < 300; ++k) mean[k] += delta[k] / 4;
    for (auto& v : delta) v *= 10;
    ups[i] = {delta, 10};
  }
  std::vector<float> alie(300);
  for (std::size_t k = 0; k < 300; ++k) alie[k] = (mean[k] - 0.3f) * 10;
  ups[4] = {alie, 10};
  for (std::size_t i = 0; i < 5; ++i) h.ready(i, 10);
  h.serve(ups);
  ASSERT_EQ(h.store.commits.size(), 1u);
  const auto& r = h.store.commits[0].record["robust"];
  EXPECT_EQ(r["one_sided"].get<double>(), robust::kDefaultOneSided);
  ASSERT_TRUE(r.contains("one_sided_beyond")) << r.dump();
  EXPECT_FALSE(r.contains("one_sided_off")) << r.dump();
  const double median = r["median_balance"].get<double>(), beyond = r["one_sided_beyond"].get<double>();
  for (const auto& d : r["decisions"]) {
    const bool attacker = d["silo"] == name(4);
    EXPECT_EQ(d["kept"].get<bool>(), !attacker) << d.dump();
    EXPECT_EQ(std::abs(d["balance"].get<double>() - median) > beyond, attacker) << d.dump();
    if (attacker) {
      EXPECT_EQ(d["reason"].get<std::string>().rfind("one-sided", 0), 0u) << d.dump();
    }
  }
}

TEST(Coordinator, TooFewUpdatesForTheRuleFallBackAsConfigured) {
  RoundConfig cfg = three_rounds();
  cfg.selection.min_silos = 3;
  cfg.aggregation.rule.rule = robust::Rule::Bulyan;  // needs 4f + 3 = 7
  cfg.aggregation.rule.f = 1;
  cfg.aggregation.fallback = robust::Fallback::Median;
  Harness h(3, cfg);
  h.connect_all(3);
  for (std::size_t i = 0; i < 3; ++i) h.ready(i, 1);
  h.serve({{0, {constant(1), 1}}, {1, {constant(2), 1}}, {2, {constant(100), 1}}});
  ASSERT_EQ(h.store.commits.size(), 1u);
  const auto& robust = h.store.commits[0].record["robust"];
  EXPECT_EQ(robust["applied"], "median");
  EXPECT_NE(robust["fallback_reason"].get<std::string>().find("Bulyan needs n >= 4f + 3: n = 3"), std::string::npos);
  EXPECT_NEAR(h.store.commits[0].model.flat()[0] - h.initial_.flat()[0], 2.0f, 1e-5);

  cfg.aggregation.fallback = robust::Fallback::Abort;
  Harness g(3, cfg);
  g.connect_all(3);
  for (std::size_t i = 0; i < 3; ++i) g.ready(i, 1);
  g.serve({{0, {constant(1), 1}}, {1, {constant(2), 1}}, {2, {constant(100), 1}}});
  EXPECT_TRUE(g.store.commits.empty());
  EXPECT_EQ(g.store.records.back()["status"], "aborted");
  EXPECT_EQ(g.coord().aborted(), 1u);
  EXPECT_EQ(crypto::sha256_hex(g.coord().model()->flat()), crypto::sha256_hex(g.initial_.flat()));
}

TEST(Coordinator, ServerSideClippingBoundsEachUpdate) {
  RoundConfig cfg = three_rounds();
  cfg.aggregation.clip_norm = 1.0;
  Harness h(2, cfg);
  h.connect_all(2);
  h.ready(0, 2);
  h.ready(1, 2);
  // Silo 0's delta has norm sqrt(10) * 10; silo 1's is tiny. Uploads are weight * delta.
  h.serve({{0, {constant(20), 2}}, {1, {constant(0.002f), 2}}});
  ASSERT_EQ(h.store.commits.size(), 1u);
  const float clipped = 10.0f / std::sqrt(1000.0f) / 1.0f;  // 10 * (1 / (10 sqrt 10))
  const float want = (clipped + 0.001f) / 2;
  EXPECT_NEAR(h.store.commits[0].model.flat()[0] - h.initial_.flat()[0], want, 1e-5);
  EXPECT_TRUE(h.store.commits[0].record["robust"]["decisions"][0]["clipped"].get<bool>());
}

// An operator's pause lets the round in progress finish and starts none after it; resume
// starts the next; stop ends the federation between rounds. Each is in the audit log with the
// admin's name, and the round outcomes and totals that status and metrics show follow.
TEST(Coordinator, AdminPauseResumeAndStopActBetweenRoundsAndAreAudited) {
  RoundConfig cfg;
  cfg.rounds = 5;
  Harness h(2, cfg);
  h.connect_all(2);
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  auto [ok, msg] = h.coord().admin(wire::AdminRequest::PAUSE, "alice", h.now);
  h.pump();
  EXPECT_TRUE(ok) << msg;
  EXPECT_NE(msg.find("finishes first"), std::string::npos) << msg;
  EXPECT_FALSE(h.coord().admin(wire::AdminRequest::PAUSE, "bob", h.now).first);  // already paused
  h.ready(0, 10);
  h.ready(1, 10);
  h.serve({{0, {constant(1), 10}}, {1, {constant(3), 10}}});
  ASSERT_EQ(h.store.commits.size(), 1u);  // round 1 finished although paused during it
  EXPECT_EQ(h.coord().round(), 2u);
  EXPECT_EQ(h.coord().phase(), Phase::Joining);  // and round 2 did not start
  h.fire(Timer::Join);
  EXPECT_EQ(h.coord().phase(), Phase::Joining);  // not even at the join deadline
  EXPECT_TRUE(h.coord().status(h.now)["paused"].get<bool>());
  EXPECT_EQ(h.coord().status(h.now)["paused_by"], "alice");

  std::tie(ok, msg) = h.coord().admin(wire::AdminRequest::RESUME, "bob", h.now);
  h.pump();
  EXPECT_TRUE(ok) << msg;
  EXPECT_EQ(h.coord().phase(), Phase::Collecting);  // round 2 starts at once
  EXPECT_FALSE(h.coord().admin(wire::AdminRequest::RESUME, "bob", h.now).first);  // not paused

  std::tie(ok, msg) = h.coord().admin(wire::AdminRequest::STOP, "carol", h.now);
  h.pump();
  EXPECT_TRUE(ok) << msg;
  EXPECT_FALSE(h.finished);  // round 2 finishes first
  h.ready(0, 10);
  h.disconnect(1);  // a dropout, for the outcomes below
  h.fire(Timer::Train);
  h.serve({{0, {constant(2), 10}}});
  EXPECT_TRUE(h.finished);
  EXPECT_EQ(h.coord().phase(), Phase::Finished);
  const auto* fin = h.last(0, wire::Envelope::kFinished);
  ASSERT_TRUE(fin);
  EXPECT_EQ(fin->finished().reason(), "stopped by admin carol");
  EXPECT_EQ(fin->finished().rounds(), 2u);  // the rounds run, not the config's 5 (the silos log it)
  EXPECT_FALSE(h.coord().admin(wire::AdminRequest::RESUME, "bob", h.now).first);  // finished

  std::vector<std::pair<std::string, std::string>> audited;
  for (const auto& r : h.store.records) {
    if (r.value("event", "") == "admin") audited.emplace_back(r["command"], r["admin"]);
  }
  const std::vector<std::pair<std::string, std::string>> want = {{"pause", "alice"}, {"resume", "bob"}, {"stop", "carol"}};
  EXPECT_EQ(audited, want);  // refused commands are not audited

  ASSERT_EQ(h.coord().recent().size(), 2u);
  const auto& r2 = h.coord().recent().back();
  EXPECT_EQ(r2.round, 2u);
  EXPECT_EQ(r2.updates, 1u);
  ASSERT_EQ(r2.dropouts.size(), 1u);
  EXPECT_EQ(r2.dropouts[0].silo, name(1));
  EXPECT_EQ(r2.dropouts[0].cause, "disconnected");
  EXPECT_EQ(h.coord().totals().dropouts.at("disconnected"), 1u);
  EXPECT_EQ(h.coord().totals().admin_commands, 3u);
  EXPECT_EQ(h.coord().totals().phase_seconds.at("collect").second, 2u);  // entered twice
  const auto st = h.coord().status(h.now);
  EXPECT_EQ(st["recent_rounds"].size(), 2u);
  EXPECT_EQ(st["recent_rounds"][1]["dropouts"][0]["silo"], name(1));
}

// Between rounds (here: waiting for silos) a stop ends the federation at once; a pause there
// holds the next round until resumed.
TEST(Coordinator, AdminStopBetweenRoundsEndsTheFederationAtOnce) {
  Harness h(2);
  h.connect(0);  // the round waits for the second silo
  ASSERT_EQ(h.coord().phase(), Phase::Joining);
  ASSERT_TRUE(h.coord().admin(wire::AdminRequest::PAUSE, "alice", h.now).first);
  h.pump();
  h.connect(1);
  EXPECT_EQ(h.coord().phase(), Phase::Joining);  // everyone is there, but paused
  h.now += 2500;
  const auto [ok, msg] = h.coord().admin(wire::AdminRequest::STOP, "alice", h.now);
  h.pump();
  EXPECT_TRUE(ok) << msg;
  EXPECT_TRUE(h.finished);
  EXPECT_EQ(h.coord().phase(), Phase::Finished);
  ASSERT_TRUE(h.last(0, wire::Envelope::kFinished));
  EXPECT_EQ(h.last(1, wire::Envelope::kFinished)->finished().reason(), "stopped by admin alice");
  EXPECT_EQ(h.last(1, wire::Envelope::kFinished)->finished().rounds(), 0u);  // none ran
  EXPECT_TRUE(h.store.commits.empty());
  // The time spent waiting counts as join time, once.
  const auto& join = h.coord().totals().phase_seconds.at("join");
  EXPECT_DOUBLE_EQ(join.first, 2.5);
  EXPECT_EQ(join.second, 1u);
}

// Found by fuzzing (fuzz/corpus/coordinator): a silo's error message that is not UTF-8 went
// into the dropout reason, and writing the audit record (or the status) threw. Since issue 38
// (what leaves a silo) a silo's words are not recorded at all: the dropout reason is the fixed
// text of the failure code it sent, so neither bad bytes nor a trainer's output (a patient row
// in a traceback) reach the audit record or the status.
TEST(Coordinator, ASilosWordsNeverReachTheAuditRecordOnlyItsFailureCodesText) {
  Harness h(2);
  h.connect_all(2);
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  wire::Envelope err;
  err.set_round(h.coord().round());
  err.mutable_error()->set_code(wire::TRAINING_FAILED);
  err.mutable_error()->set_failure(wire::TRAINER_HUNG);
  err.mutable_error()->set_message(std::string("bad \xff\xfe bytes\n\x1b[31m patient 4711 ") + std::string(2000, 'x'));
  h.deliver(0, err);
  h.ready(1, 10);
  h.serve({{1, {constant(1), 10}}});
  // One update of the two needed: the round aborts, and its record names the dropout.
  nlohmann::json round;
  for (const auto& r : h.store.records) {
    if (r.value("event", "") == "round") round = r;
  }
  ASSERT_TRUE(round.contains("dropouts")) << round.dump();
  EXPECT_EQ(round["dropouts"][0]["reason"], "its training failed: the trainer hung and was stopped");
  for (const auto& r : h.store.records) EXPECT_EQ(r.dump().find("patient 4711"), std::string::npos) << r.dump();
  EXPECT_EQ(h.coord().status(h.now).dump().find("patient 4711"), std::string::npos);
}

RoundConfig four_rounds_with_8_bit_broadcasts() {
  RoundConfig cfg = three_rounds();
  cfg.rounds = 4;
  cfg.broadcast.set_scheme(wire::Compression::QUANTIZE);
  cfg.broadcast.set_bits(8);
  cfg.broadcast.set_block(8);
  return cfg;
}

// A compressed broadcast: the model goes as a quantized delta to each session that said it holds
// the previous round's model, whole to the others; the delta rebuilds the committed model bit
// for bit from that base, and the audit record says who got what.
TEST(Coordinator, BroadcastsTheModelAsADeltaToTheSessionsThatHoldTheLastOne) {
  Harness h(3, four_rounds_with_8_bit_broadcasts());
  h.connect_all(3);
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  auto start = [&](std::size_t i) { return h.last(i, wire::Envelope::kRoundStart)->round_start(); };
  auto sent_delta = [&](std::size_t i) { return h.model_actions[h.session(i)].back().delta != nullptr; };
  const std::string m1 = crypto::sha256_hex(h.initial_.flat());
  // Round 1: nobody holds a model; the round says how a delta would come, and against nothing.
  EXPECT_EQ(start(0).broadcast().scheme(), wire::Compression::QUANTIZE);
  EXPECT_EQ(start(0).base_sha256(), "");
  for (std::size_t i = 0; i < 3; ++i) EXPECT_FALSE(sent_delta(i)) << i;
  h.ready(0, 10, 0, m1);
  h.ready(1, 10, 0, m1);
  h.ready(2, 10);  // holds nothing it says
  std::map<std::size_t, std::pair<std::vector<float>, double>> ups = {
      {0, {constant(1.0f), 10}}, {1, {constant(-0.5f), 10}}, {2, {constant(2.0f), 10}}};
  h.serve(ups);
  ASSERT_EQ(h.store.commits.size(), 1u);
  const Model& c1 = h.store.commits[0].model;
  EXPECT_EQ(h.store.commits[0].record["broadcast"]["whole"], 3);
  EXPECT_EQ(h.store.commits[0].record["broadcast"]["deltas"], 0);
  EXPECT_EQ(h.store.commits[0].record["broadcast_bytes"], 3 * 40);
  // The committed model is the rounded step: within one step (max |delta| / 127 of a block) of
  // the exact mean, and what the delta rebuilds from the base.
  const auto exact = fedavg(h.initial_, {ups[0], ups[1], ups[2]});
  for (std::size_t k = 0; k < exact.size(); ++k) EXPECT_NEAR(c1.flat()[k], exact[k], 0.0834f / 127 + 1e-6f) << k;

  // Round 2: the delta against m1 to silos 0 and 1, the whole model to silo 2.
  const std::string m2 = crypto::sha256_hex(c1.flat());
  EXPECT_EQ(start(0).base_sha256(), m1);
  EXPECT_EQ(start(0).model_sha256(), m2);
  EXPECT_TRUE(sent_delta(0));
  EXPECT_TRUE(sent_delta(1));
  EXPECT_FALSE(sent_delta(2));
  Model held = h.initial_;
  protocol::TensorReceiver rx;
  rx.reset_model(held.flat(), held.tensors(), start(0).broadcast(), /*have_base=*/true);
  std::uint64_t delta_bytes = 0;
  for (const auto& ch : *h.model_actions[h.session(0)].back().delta) {
    ASSERT_TRUE(rx.add(ch));
    delta_bytes += ch.data().size();
  }
  ASSERT_TRUE(rx.complete());
  EXPECT_EQ(rx.finish_sha256(), m2);
  EXPECT_EQ(std::memcmp(held.flat().data(), c1.flat().data(), 4 * c1.size()), 0);
  // Silo 2 claims m1 now: that model is no base for any delta to come, so the claim is dropped.
  h.ready(0, 10, 0, m2);
  h.ready(1, 10, 0, m2);
  h.ready(2, 10, 0, m1);
  h.serve(ups);
  ASSERT_EQ(h.store.commits.size(), 2u);
  const auto& rec2 = h.store.commits[1].record;
  EXPECT_EQ(rec2["broadcast"]["deltas"], 2);
  EXPECT_EQ(rec2["broadcast"]["whole"], 1);
  EXPECT_EQ(rec2["broadcast"]["base_sha256"], m1);
  EXPECT_EQ(rec2["broadcast_bytes"], 2 * delta_bytes + 40);
  EXPECT_LT(delta_bytes, 40u);

  // Round 3: deltas against m2 for 0 and 1, whole for 2. Silo 0's connection then drops after its
  // upload: the session it comes back on holds nothing the server knows of.
  EXPECT_EQ(start(0).base_sha256(), m2);
  EXPECT_TRUE(sent_delta(0));
  EXPECT_TRUE(sent_delta(1));
  EXPECT_FALSE(sent_delta(2));
  const std::string m3 = start(0).model_sha256();
  for (std::size_t i = 0; i < 3; ++i) h.ready(i, 10, 0, m3);
  h.serve({{0, ups[0]}});
  h.disconnect(0);
  h.connect(0);
  h.serve({{1, ups[1]}, {2, ups[2]}});
  ASSERT_EQ(h.store.commits.size(), 3u);
  EXPECT_EQ(h.coord().round(), 4u);
  EXPECT_FALSE(sent_delta(0));
  EXPECT_TRUE(sent_delta(1));
  EXPECT_TRUE(sent_delta(2));
}

// A word about the model a session holds counts only when said since the last model went to
// it: a late UpdateReady of an earlier round (here after an aborted round, when the model did
// not change) must not earn the session a delta against a model it may have replaced. After the
// aborted round, the sessions that hold the unchanged model get it as a step of zeros.
TEST(Coordinator, ALateWordAboutAnEarlierRoundsModelEarnsNoDelta) {
  Harness h(3, four_rounds_with_8_bit_broadcasts());
  h.connect_all(3);
  auto sent_delta = [&](std::size_t i) { return h.model_actions[h.session(i)].back().delta != nullptr; };
  auto sha = [&] { return h.last(0, wire::Envelope::kRoundStart)->round_start().model_sha256(); };
  std::map<std::size_t, std::pair<std::vector<float>, double>> ups = {
      {0, {constant(1.0f), 10}}, {1, {constant(-0.5f), 10}}, {2, {constant(2.0f), 10}}};
  for (std::size_t i = 0; i < 3; ++i) h.ready(i, 10, 0, sha());
  h.serve(ups);  // round 1 commits: m2
  const std::string m2 = sha();
  for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(sent_delta(i)) << i;
  // Round 2: every silo trains on m2 and says so, then none uploads: the round aborts.
  for (std::size_t i = 0; i < 3; ++i) h.ready(i, 10, 0, m2);
  h.fire(Timer::Train);
  while (h.coord().round() == 2 && h.armed.count(Timer::Upload)) h.fire(Timer::Upload);
  ASSERT_EQ(h.coord().round(), 3u);
  ASSERT_EQ(h.store.commits.size(), 1u);
  // Round 3 (model m2 still): every silo said it holds m2, so each gets m2 as a step of zeros
  // against itself, which rebuilds it bit for bit, not the whole model again; silo 1's word from
  // round 2 arrives after its round-3 model went out, and silo 1 says nothing in round 3.
  const auto& start3 = h.last(0, wire::Envelope::kRoundStart)->round_start();
  EXPECT_EQ(start3.base_sha256(), m2);
  EXPECT_EQ(start3.model_sha256(), m2);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(sent_delta(i)) << i;
  Model held = h.store.commits[0].model;
  protocol::TensorReceiver rx;
  rx.reset_model(held.flat(), held.tensors(), start3.broadcast(), /*have_base=*/true);
  std::uint64_t bytes = 0;
  for (const auto& ch : *h.model_actions[h.session(0)].back().delta) {
    ASSERT_TRUE(rx.add(ch));
    EXPECT_EQ(ch.encoding(), wire::Compression::QUANTIZE);
    bytes += ch.data().size();
  }
  ASSERT_TRUE(rx.complete());
  EXPECT_EQ(rx.finish_sha256(), m2);
  EXPECT_LT(bytes, 40u);  // codes and scales, less than the 10 float32 of the whole model
  h.ready(1, 10, 2, m2);
  h.ready(0, 10, 0, m2);
  h.ready(2, 10, 0, m2);
  h.serve({{0, ups[0]}, {2, ups[2]}});
  h.fire(Timer::Train);  // silo 1 is dropped; the round commits with 0 and 2
  ASSERT_EQ(h.store.commits.size(), 2u);
  EXPECT_EQ(h.store.commits[1].record["broadcast"]["deltas"], 3);
  EXPECT_EQ(h.store.commits[1].record["broadcast"]["whole"], 0);
  EXPECT_EQ(h.store.commits[1].record["broadcast"]["base_sha256"], m2);
  // Round 4: the delta against m2 to silos 0 and 2, the whole model to silo 1.
  EXPECT_EQ(h.last(0, wire::Envelope::kRoundStart)->round_start().base_sha256(), m2);
  EXPECT_TRUE(sent_delta(0));
  EXPECT_FALSE(sent_delta(1));
  EXPECT_TRUE(sent_delta(2));
}

// Two aborted rounds in a row: the step of zeros made after the first is offered again after
// the second (the same chunks, not encoded again), each audit record counts it, and the commit
// that follows offers the delta against the model the silos held.
TEST(Coordinator, TwoAbortedRoundsInARowOfferTheSameStepOfZerosUntilTheNextCommit) {
  auto cfg = four_rounds_with_8_bit_broadcasts();
  cfg.rounds = 5;
  Harness h(3, cfg);
  h.connect_all(3);
  auto sent = [&](std::size_t i) { return h.model_actions[h.session(i)].back().delta; };
  auto start = [&] { return h.last(0, wire::Envelope::kRoundStart)->round_start(); };
  std::map<std::size_t, std::pair<std::vector<float>, double>> ups = {
      {0, {constant(1.0f), 10}}, {1, {constant(-0.5f), 10}}, {2, {constant(2.0f), 10}}};
  for (std::size_t i = 0; i < 3; ++i) h.ready(i, 10, 0, start().model_sha256());
  h.serve(ups);  // round 1 commits m2
  ASSERT_EQ(h.store.commits.size(), 1u);
  const std::string m2 = start().model_sha256();
  auto abort_round = [&](std::uint64_t round) {
    for (std::size_t i = 0; i < 3; ++i) h.ready(i, 10, 0, m2);
    h.fire(Timer::Train);
    while (h.coord().round() == round && h.armed.count(Timer::Upload)) h.fire(Timer::Upload);
    ASSERT_EQ(h.coord().round(), round + 1);
  };
  abort_round(2);
  ASSERT_EQ(h.store.commits.size(), 1u);
  EXPECT_EQ(start().base_sha256(), m2);
  EXPECT_EQ(start().model_sha256(), m2);
  std::vector<std::shared_ptr<const std::vector<wire::TensorChunk>>> first;
  for (std::size_t i = 0; i < 3; ++i) {
    first.push_back(sent(i));
    ASSERT_NE(first.back(), nullptr) << i;
  }
  abort_round(3);
  ASSERT_EQ(h.store.commits.size(), 1u);
  EXPECT_EQ(start().base_sha256(), m2);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(sent(i), first[i]) << i;  // the same step, kept
  // Both aborted rounds' records count three deltas and no whole model: round 2 sent m2 as the
  // step from m1, round 3 as the step of zeros from m2.
  ASSERT_GE(h.store.records.size(), 2u);
  const std::string m1 = crypto::sha256_hex(h.initial_.flat());
  for (std::size_t r = h.store.records.size() - 2; r < h.store.records.size(); ++r) {
    EXPECT_EQ(h.store.records[r]["status"], "aborted") << r;
    EXPECT_EQ(h.store.records[r]["broadcast"]["deltas"], 3) << r;
    EXPECT_EQ(h.store.records[r]["broadcast"]["whole"], 0) << r;
    EXPECT_EQ(h.store.records[r]["broadcast"]["base_sha256"], r + 1 == h.store.records.size() ? m2 : m1) << r;
  }
  // Round 4 commits m3 from m2; round 5 offers the delta against m2, a new step, not the zeros.
  for (std::size_t i = 0; i < 3; ++i) h.ready(i, 10, 0, m2);
  h.serve(ups);
  ASSERT_EQ(h.store.commits.size(), 2u);
  EXPECT_EQ(start().base_sha256(), m2);
  EXPECT_NE(start().model_sha256(), m2);
  for (std::size_t i = 0; i < 3; ++i) {
    ASSERT_NE(sent(i), nullptr) << i;
    EXPECT_NE(sent(i), first[i]) << i;
  }
  Model held = h.store.commits[0].model;
  protocol::TensorReceiver rx;
  rx.reset_model(held.flat(), held.tensors(), start().broadcast(), /*have_base=*/true);
  for (const auto& ch : *sent(1)) ASSERT_TRUE(rx.add(ch));
  ASSERT_TRUE(rx.complete());
  EXPECT_EQ(rx.finish_sha256(), start().model_sha256());
}

// A model with a -0.0 where the broadcast sends deltas: a step of zeros would rebuild it as
// +0.0, so after each aborted round every silo gets the whole model, bit for bit, and the
// records say so.
TEST(Coordinator, AModelNoStepOfZerosCanRebuildGoesWholeAfterEveryAbort) {
  Model initial = small_model();
  initial.flat()[3] = -0.0f;
  Harness h(3, four_rounds_with_8_bit_broadcasts(), 1, initial);
  h.connect_all(3);
  const std::string m1 = crypto::sha256_hex(initial.flat());
  for (std::uint64_t round = 1; round <= 2; ++round) {
    for (std::size_t i = 0; i < 3; ++i) h.ready(i, 10, 0, m1);
    h.fire(Timer::Train);
    while (h.coord().round() == round && h.armed.count(Timer::Upload)) h.fire(Timer::Upload);
    ASSERT_EQ(h.coord().round(), round + 1);
    const auto& start = h.last(0, wire::Envelope::kRoundStart)->round_start();
    EXPECT_EQ(start.model_sha256(), m1);
    EXPECT_EQ(start.base_sha256(), "") << round;  // nothing on offer
    for (std::size_t i = 0; i < 3; ++i) {
      const auto& sent = h.model_actions[h.session(i)].back();
      EXPECT_EQ(sent.delta, nullptr) << i;
      ASSERT_NE(sent.model, nullptr);
      EXPECT_EQ(std::bit_cast<std::uint32_t>(sent.model->flat()[3]), std::bit_cast<std::uint32_t>(-0.0f));
    }
  }
  ASSERT_TRUE(h.store.commits.empty());
  EXPECT_EQ(h.store.records.back()["broadcast"]["whole"], 3);
  EXPECT_EQ(h.store.records.back()["broadcast"]["deltas"], 0);
}

TEST(Printable, KeepsUtf8AndReplacesWhatIsNot) {
  EXPECT_EQ(proto::printable("h\xc3\xa9llo \xe2\x82\xac"), "h\xc3\xa9llo \xe2\x82\xac");  // é, €
  EXPECT_EQ(proto::printable("a\xc3(b"), "a?(b");                 // a lead byte without its continuation
  EXPECT_EQ(proto::printable("\xed\xa0\x80"), "???");            // a UTF-16 surrogate in UTF-8
  EXPECT_EQ(proto::printable("\xc0\xaf"), "??");                  // overlong
  EXPECT_EQ(proto::printable("tab\there\x7f"), "tab?here?");
  EXPECT_EQ(proto::printable("abcdef", 4), "abcd...");
  EXPECT_EQ(proto::printable("ab\xe2\x82\xac", 4), "ab...");     // never half a character
}


// ---- the last committed model, asked of the silos (Coordinator::await_model) ------------------

// What committed round 4 made, which the server's state folder lost: the server starts from a
// placeholder (the initial model) and must not run a round on it.
Model lost_model() {
  Model m = small_model();
  for (std::size_t i = 0; i < m.size(); ++i) m.flat()[i] = 1.0f - 0.05f * static_cast<float>(i);
  return m;
}

struct Fetching {
  Model lost = lost_model();
  std::string sha = crypto::sha256_hex(lost.flat());
  std::vector<std::string> restored;  // the SHA-256 of each model given to restore()
  std::unique_ptr<Harness> h;

  explicit Fetching(std::size_t silos) {
    RoundConfig cfg = three_rounds();
    cfg.rounds = 6;
    h = std::make_unique<Harness>(silos, cfg, 5, small_model(), [this](Coordinator& c) {
      c.await_model(4, sha, [this](const Model& m) { restored.push_back(crypto::sha256_hex(m.flat())); },
                    "the model of committed round 4 is in no copy");
    });
  }
  // Silo i's answer: `copy`'s chunks then a ModelOffer, or an offer without a model. Through
  // `edge` when set (the silo's name on each message).
  void answer(std::size_t i, const Model* copy, SessionId edge = 0) {
    auto from = [&](wire::Envelope e) {
      e.set_round(h->coord().round());
      if (!edge) return h->deliver(i, std::move(e));
      e.set_silo(name(i));
      h->from_edge(edge, std::move(e));
    };
    if (copy) {
      auto m = std::make_shared<Model>(*copy);
      protocol::ChunkSource src(m, m->flat(), m->tensors(), "fed", h->coord().round(), 12);
      while (auto e = src.next()) from(*e);
    }
    wire::Envelope offer;
    offer.mutable_model_offer()->set_model_sha256(sha);
    offer.mutable_model_offer()->set_held(copy != nullptr);
    from(std::move(offer));
  }
  // How many ModelRequests silo i (or the edge, for it) received.
  int requests(SessionId to, const std::string& silo = "") const {
    int n = 0;
    auto it = h->inbox.find(to);
    if (it == h->inbox.end()) return 0;
    for (const auto& e : it->second) n += e.has_model_request() && e.silo() == silo && e.model_request().model_sha256() == sha;
    return n;
  }
};

TEST(Coordinator, ALostModelIsTakenFromTheFirstSiloWhoseCopyMatchesTheLogAndTheRoundsGoOnFromIt) {
  Fetching f(3);
  f.h->connect_all(3);
  // Every expected silo is here, yet no round starts on the placeholder; one silo is asked at a time.
  EXPECT_EQ(f.h->coord().phase(), Phase::Joining);
  EXPECT_TRUE(f.h->coord().awaiting_model());
  EXPECT_EQ(f.requests(f.h->session(0)), 1);
  EXPECT_EQ(f.requests(f.h->session(1)), 0);
  f.answer(0, nullptr);  // holds none
  EXPECT_EQ(f.requests(f.h->session(1)), 1);
  // What `xsilo status` shows meanwhile: the model the log names, not the placeholder's hash.
  const auto st = f.h->coord().status(f.h->now);
  EXPECT_EQ(st["model_sha256"], f.sha);
  ASSERT_TRUE(st.contains("awaiting_model")) << st.dump();
  EXPECT_EQ(st["awaiting_model"]["round"], 4);
  EXPECT_EQ(st["awaiting_model"]["asking"], name(1));
  EXPECT_EQ(st["awaiting_model"]["answered"].size(), 1u) << st.dump();
  const auto shown = tools::format_status(st);
  EXPECT_NE(shown.find("AWAITING the model of committed round 4 (" + f.sha.substr(0, 16) + ") from the silos"),
            std::string::npos)
      << shown;
  EXPECT_NE(shown.find("(asking " + name(1) + ")"), std::string::npos) << shown;
  Model other = f.lost;
  other.flat()[3] += 1e-3f;  // a copy of another model: refused
  f.answer(1, &other);
  EXPECT_TRUE(f.restored.empty());
  EXPECT_EQ(f.h->coord().phase(), Phase::Joining);
  ASSERT_EQ(f.requests(f.h->session(2)), 1);
  f.answer(2, &f.lost);
  ASSERT_EQ(f.restored, std::vector<std::string>{f.sha});
  EXPECT_FALSE(f.h->coord().awaiting_model());
  EXPECT_FALSE(f.h->coord().status(f.h->now).contains("awaiting_model"));
  // Round 5 starts from the restored model, with every silo.
  ASSERT_EQ(f.h->coord().phase(), Phase::Collecting);
  EXPECT_EQ(f.h->coord().round(), 5u);
  EXPECT_EQ(f.h->coord().model_sha256(), f.sha);
  for (std::size_t i = 0; i < 3; ++i) {
    const auto* rs = f.h->last(i, wire::Envelope::kRoundStart);
    ASSERT_TRUE(rs) << i;
    EXPECT_EQ(rs->round_start().model_sha256(), f.sha);
  }
  // Nobody was asked twice.
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(f.requests(f.h->session(i)), 1) << i;
  EXPECT_FALSE(f.h->stopped);
}

TEST(Coordinator, AnAskedSiloThatLeavesMidCopyIsAskedAgainWhenItComesBackAndOthersMeanwhile) {
  Fetching f(2);
  f.h->connect(0);
  // Half its copy, then it is gone: the next silo is asked.
  auto m = std::make_shared<Model>(f.lost);
  protocol::ChunkSource src(m, m->flat(), m->tensors(), "fed", f.h->coord().round(), 12);
  wire::Envelope first = *src.next();
  f.h->deliver(0, first);
  f.h->disconnect(0);
  f.h->connect(1);
  EXPECT_EQ(f.requests(f.h->session(1)), 1);
  f.answer(1, nullptr);
  // Back: asked again from the start, and its whole copy is taken.
  f.h->connect(0);
  EXPECT_EQ(f.requests(f.h->session(0)), 2);
  f.answer(0, &f.lost);
  EXPECT_EQ(f.restored, std::vector<std::string>{f.sha});
  EXPECT_EQ(f.h->coord().phase(), Phase::Collecting);
}

TEST(Coordinator, ASiloBehindAnEdgeIsAskedThroughItAndItsCopyTaken) {
  Fetching f(2);
  const SessionId edge = 7;
  f.h->edge_connect(edge, "edge-01");
  f.h->region(edge, {0, 1});
  ASSERT_EQ(f.requests(edge, name(0)), 1);
  EXPECT_EQ(f.requests(edge, name(1)), 0);
  // A chunk in another silo's name than the one asked is refused, and changes nothing.
  f.answer(1, &f.lost, edge);
  EXPECT_TRUE(f.restored.empty());
  f.answer(0, &f.lost, edge);
  EXPECT_EQ(f.restored, std::vector<std::string>{f.sha});
  EXPECT_EQ(f.h->coord().phase(), Phase::Collecting);
}

TEST(Coordinator, ASiloThatStallsIsPassedOverAtTheUploadDeadlineAndAfterTheJoinDeadlineOnlySilosHereAreAsked) {
  Fetching f(3);
  f.h->connect_all(3);
  ASSERT_EQ(f.requests(f.h->session(0)), 1);
  // Silo 0 says nothing: at the upload deadline silo 1 is asked.
  f.h->fire(Timer::Upload);
  ASSERT_EQ(f.requests(f.h->session(1)), 1);
  // The join deadline passes while silo 1's copy is on its way: it still gets its time.
  auto m = std::make_shared<Model>(f.lost);
  protocol::ChunkSource src(m, m->flat(), m->tensors(), "fed", f.h->coord().round(), 12);
  f.h->deliver(1, *src.next());
  f.h->fire(Timer::Join);
  EXPECT_FALSE(f.h->stopped);
  f.h->disconnect(1);  // cut off: the silo already here is still asked
  ASSERT_EQ(f.requests(f.h->session(2)), 1);
  EXPECT_FALSE(f.h->stopped);
  f.answer(2, nullptr);
  ASSERT_TRUE(f.h->stopped);
  EXPECT_NE(f.h->stopped->find(name(0) + " sent no whole copy within the upload deadline"), std::string::npos)
      << *f.h->stopped;
  EXPECT_TRUE(f.restored.empty());
}

TEST(Coordinator, WithNoCopyOfTheLostModelTheServerStopsAtTheJoinDeadlineSayingWhatEachSiloAnswered) {
  Fetching f(2);
  f.h->connect_all(2);
  f.answer(0, nullptr);
  Model truncated;  // a copy with the wrong layout's worth of elements: the offer comes early
  truncated.add("a", {4});
  auto m = std::make_shared<Model>(truncated);
  protocol::ChunkSource src(m, m->flat(), m->tensors(), "fed", f.h->coord().round(), 12);
  while (auto e = src.next()) f.h->deliver(1, *e);
  wire::Envelope offer;
  offer.set_round(f.h->coord().round());
  offer.mutable_model_offer()->set_model_sha256(f.sha);
  offer.mutable_model_offer()->set_held(true);
  f.h->deliver(1, offer);
  EXPECT_FALSE(f.h->stopped);
  f.h->fire(Timer::Join);
  ASSERT_TRUE(f.h->stopped);
  EXPECT_NE(f.h->stopped->find("the model of committed round 4 is in no copy"), std::string::npos) << *f.h->stopped;
  EXPECT_NE(f.h->stopped->find(name(0) + " holds no model"), std::string::npos) << *f.h->stopped;
  EXPECT_NE(f.h->stopped->find(name(1) + " offered the model after 4 elements"), std::string::npos) << *f.h->stopped;
  EXPECT_TRUE(f.restored.empty());
  EXPECT_TRUE(f.h->store.records.empty());  // nothing signed
  EXPECT_EQ(f.h->coord().phase(), Phase::Joining);
}


TEST(Coordinator, WhileTheLostModelIsAwaitedOnlyStopAppliesAndItSignsNothing) {
  Fetching f(2);
  f.h->connect(0);
  auto [ok, why] = f.h->coord().admin(wire::AdminRequest::PAUSE, "admin-1", f.h->now);
  EXPECT_FALSE(ok);
  EXPECT_NE(why.find("only stop applies"), std::string::npos) << why;
  std::tie(ok, why) = f.h->coord().admin(wire::AdminRequest::STOP, "admin-1", f.h->now);
  f.h->pump();
  EXPECT_TRUE(ok) << why;
  ASSERT_TRUE(f.h->stopped);
  EXPECT_NE(f.h->stopped->find("stopped by admin admin-1"), std::string::npos) << *f.h->stopped;
  EXPECT_TRUE(f.h->store.records.empty());
  EXPECT_TRUE(f.h->store.commits.empty());
  EXPECT_FALSE(f.h->finished);
}

TEST(Coordinator, AfterTheJoinDeadlineASiloThatLeavesMidCopyHasAnsweredAndNoNewcomerIsAsked) {
  Fetching f(3);
  f.h->connect_all(2);
  f.h->fire(Timer::Join);  // silo 0 is being asked, silo 1 waits
  EXPECT_FALSE(f.h->stopped);
  f.h->connect(2);  // too late to be asked
  f.h->disconnect(0);  // not asked again, even if it comes back
  ASSERT_EQ(f.requests(f.h->session(1)), 1);
  f.h->connect(0);
  EXPECT_EQ(f.requests(f.h->session(0)), 1);
  f.answer(1, nullptr);
  EXPECT_EQ(f.requests(f.h->session(2)), 0);
  ASSERT_TRUE(f.h->stopped);
  EXPECT_NE(f.h->stopped->find(name(0) + " left before its copy of the model arrived"), std::string::npos)
      << *f.h->stopped;
}


// The deterministic counterpart of Edges.AnEdgeKilledMidRoundDropsItsSilosWhoFailOverAndComeBack
// (and of the combination cases that restart an edge mid-round): an edge lost after round 1 has
// started costs the round its region's silos only; they fail over to the server directly and the
// next round has all four.
TEST(Coordinator, AnEdgeLostMidRoundCostsOnlyItsSilosWhoComeBackDirectlyForTheNextRound) {
  Harness h(4, edge_and_direct(4));
  h.edge_region_and_direct();
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  ASSERT_EQ(h.coord().members().size(), 4u);
  h.edge_ready(900, {0, 1}, 10);
  h.coord().on_disconnect(900, h.now);  // the edge dies before its region's sum went up
  h.pump();
  for (std::size_t i : {0u, 1u}) {
    const auto& m = h.coord().members()[i];
    EXPECT_EQ(m.state, MemberState::Dropped) << m.silo;
    EXPECT_EQ(m.drop_cause, DropCause::Disconnected) << m.silo;
  }
  h.ready(2, 10);
  h.ready(3, 10);
  h.serve({{2, {constant(2), 10}}, {3, {constant(4), 10}}});
  ASSERT_EQ(h.store.commits.size(), 1u);
  expect_model(h.store.commits[0].model, fedavg(h.initial_, {{constant(2), 10}, {constant(4), 10}}));
  const auto& rec = h.store.commits[0].record;
  EXPECT_EQ(rec["participants"].size(), 2u);
  // Its silos fail over: straight to the server, where round 2 selects them with the others.
  h.connect(0);
  h.connect(1);
  ASSERT_EQ(h.coord().round(), 2u);
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  EXPECT_EQ(h.coord().members().size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(h.last(i, wire::Envelope::kRoundStart)) << i;
}

// The deterministic counterpart of the restart part of Federation.OperatorsWatchPauseResumeAndStop:
// a server started paused (its daemon kept the flag in the state folder) starts no round, at the
// join deadline either, until an admin resumes it.
TEST(Coordinator, AServerStartedPausedStartsNoRoundUntilResumed) {
  RoundConfig cfg = three_rounds();
  Harness h(2, cfg, 1, small_model(), [](Coordinator& c) { c.start_paused("alice"); });
  h.connect_all(2);
  EXPECT_EQ(h.coord().phase(), Phase::Joining);
  h.fire(Timer::Join);
  EXPECT_EQ(h.coord().phase(), Phase::Joining);
  EXPECT_EQ(h.coord().status(h.now)["paused_by"], "alice");
  const auto [ok, msg] = h.coord().admin(wire::AdminRequest::RESUME, "bob", h.now);
  h.pump();
  EXPECT_TRUE(ok) << msg;
  EXPECT_EQ(h.coord().phase(), Phase::Collecting);
  ASSERT_FALSE(h.store.records.empty());
  EXPECT_EQ(h.store.records.back()["event"], "admin");
}

// ---- buffered rounds (coordinator_buffered.cpp) ---------------------------------------------

RoundConfig buffered_rounds(std::size_t k, std::uint64_t max_staleness) {
  RoundConfig c = three_rounds();
  c.selection.min_silos = 3;
  c.schedule.mode = ScheduleMode::Buffered;
  c.schedule.k = k;
  c.schedule.max_staleness = max_staleness;
  return c;
}

// The round of the last RoundStart silo i was sent.
std::uint64_t last_start(const Harness& h, std::size_t i) {
  const auto* e = h.last(i, wire::Envelope::kRoundStart);
  return e ? e->round_start().round() : 0;
}

TEST(Coordinator, BufferedCommitsAtKWithoutTheSlowSiloAndFoldsItsLateUpdateScaledByItsStaleness) {
  Harness h(3, buffered_rounds(2, 5));
  h.connect_all(3);
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(last_start(h, i), 1u);
  // Silos 0 and 1 fill the buffer of two; silo 2 (slow) is still training on version 0.
  h.ready(0, 10);
  h.ready(1, 10);
  h.serve({{0, {constant(10.0f), 10}}, {1, {constant(20.0f), 10}}});
  ASSERT_EQ(h.store.commits.size(), 1u);
  const auto after1 = fedavg(h.initial_, {{constant(10.0f), 10}, {constant(20.0f), 10}});
  expect_model(h.store.commits[0].model, after1);
  const auto& rec1 = h.store.commits[0].record;
  EXPECT_EQ(rec1["schedule"]["mode"], "buffered");
  ASSERT_EQ(rec1["participants"].size(), 2u);
  for (const auto& p : rec1["participants"]) {
    EXPECT_EQ(p["base_version"], 0);
    EXPECT_EQ(p["staleness"], 0);
    EXPECT_EQ(p["staleness_weight"], 1.0);
  }
  EXPECT_EQ(rec1["training"], nlohmann::json::array({name(2)}));  // not a dropout: it goes on
  EXPECT_TRUE(rec1["dropouts"].empty());
  // The next round: the two whose updates committed get its start and the newest model (with
  // the round end carrying the audit head); the slow silo is left to finish, unbothered.
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  EXPECT_EQ(h.coord().round(), 2u);
  EXPECT_EQ(last_start(h, 0), 2u);
  EXPECT_EQ(last_start(h, 1), 2u);
  EXPECT_EQ(last_start(h, 2), 1u);
  EXPECT_EQ(h.models_sent[h.session(2)], 1);
  ASSERT_TRUE(h.last(0, wire::Envelope::kRoundEnd));
  EXPECT_TRUE(h.last(0, wire::Envelope::kRoundEnd)->round_end().has_audit_head());
  EXPECT_FALSE(h.last(2, wire::Envelope::kRoundEnd));
  // Its base is the start the server sent it: a silo cannot claim a fresher one.
  h.ready(2, 10, /*round=*/2);
  EXPECT_FALSE(h.granted(2));
  ASSERT_TRUE(h.last(2, wire::Envelope::kError));
  EXPECT_EQ(h.last(2, wire::Envelope::kError)->error().code(), wire::WRONG_ROUND);
  // Silo 2's update of round 1 (version 0) arrives while version 1 is the newest: staleness 1.
  h.ready(2, 10, /*round=*/1);
  ASSERT_TRUE(h.granted(2));
  EXPECT_EQ(h.last(2, wire::Envelope::kUploadGrant)->round(), 1u);  // of the round it trains on
  h.upload(2, constant(10.0f), 10, -1, std::nullopt, /*round=*/1);
  h.ready(0, 10);
  h.serve({{0, {constant(-10.0f), 10}}});
  ASSERT_EQ(h.store.commits.size(), 2u);
  const double s1 = 1 / std::sqrt(2.0);
  std::vector<float> after2 = after1;
  for (auto& v : after2) v += static_cast<float>((s1 * 10.0 - 10.0) / 20.0);
  expect_model(h.store.commits[1].model, after2);
  const auto& rec2 = h.store.commits[1].record;
  ASSERT_EQ(rec2["participants"].size(), 2u);
  const auto& late = rec2["participants"][0]["silo"] == name(2) ? rec2["participants"][0] : rec2["participants"][1];
  EXPECT_EQ(late["silo"], name(2));
  EXPECT_EQ(late["base_version"], 0);
  EXPECT_EQ(late["staleness"], 1);
  EXPECT_NEAR(late["staleness_weight"].get<double>(), s1, 1e-12);
  EXPECT_EQ(late["weight"], 10.0);  // its weight is not scaled: the step is
  EXPECT_EQ(rec2["aggregation"]["total_weight"], 20.0);
  // Silo 2's round (1) ends with the commit that holds its update.
  ASSERT_TRUE(h.last(2, wire::Envelope::kRoundEnd));
  EXPECT_EQ(h.last(2, wire::Envelope::kRoundEnd)->round(), 1u);
  EXPECT_TRUE(h.last(2, wire::Envelope::kRoundEnd)->round_end().committed());
  EXPECT_EQ(last_start(h, 2), 3u);
}

TEST(Coordinator, BufferedRefusesAnUpdateBeyondMaxStalenessRecordsItAndRestartsTheSiloOnTheNewest) {
  Harness h(3, buffered_rounds(2, 0));
  h.connect_all(3);
  h.ready(0, 10);
  h.ready(1, 10);
  h.serve({{0, {constant(10.0f), 10}}, {1, {constant(20.0f), 10}}});
  ASSERT_EQ(h.coord().round(), 2u);
  // Silo 2 trained on version 0; version 1 is the newest and max_staleness is 0.
  h.ready(2, 10, /*round=*/1);
  EXPECT_FALSE(h.granted(2));
  const auto* end = h.last(2, wire::Envelope::kRoundEnd);
  ASSERT_TRUE(end);
  EXPECT_EQ(end->round(), 1u);
  EXPECT_FALSE(end->round_end().committed());
  EXPECT_NE(end->round_end().reason().find("too stale"), std::string::npos) << end->round_end().reason();
  EXPECT_EQ(last_start(h, 2), 2u);  // it starts again on the newest version
  EXPECT_EQ(h.models_sent[h.session(2)], 2);
  // It retrains on round 2's start; with silo 0 that fills the buffer.
  h.ready(2, 10);
  h.ready(0, 10);
  h.serve({{0, {constant(10.0f), 10}}, {2, {constant(10.0f), 10}}});
  ASSERT_EQ(h.store.commits.size(), 2u);
  const auto& rec = h.store.commits[1].record;
  ASSERT_EQ(rec["refused"].size(), 1u);
  EXPECT_EQ(rec["refused"][0]["silo"], name(2));
  EXPECT_EQ(rec["refused"][0]["base_version"], 0);
  EXPECT_EQ(rec["refused"][0]["staleness"], 1);
  for (const auto& p : rec["participants"]) EXPECT_EQ(p["staleness"], 0);
}

TEST(Coordinator, BufferedRoundsRefuseEdgesAndTakeASiloThatJoinsMidRound) {
  RoundConfig cfg = buffered_rounds(2, 5);
  cfg.selection.min_silos = 2;
  Harness h(3, cfg);
  h.edge_connect(900, "edge-1");
  ASSERT_EQ(h.closed, std::vector<SessionId>{900});
  h.connect(0);
  h.connect(1);
  h.fire(Timer::Join);  // silo 2 is late
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  h.connect(2);
  EXPECT_EQ(last_start(h, 2), 1u);  // it takes part at once
  h.ready(2, 10);
  h.ready(0, 10);
  h.serve({{0, {constant(10.0f), 10}}, {2, {constant(20.0f), 10}}});
  ASSERT_EQ(h.store.commits.size(), 1u);
}

TEST(Coordinator, BufferedTrainingDeadlineCommitsWhatTheBufferHoldsAndKeepsTheTrainersGoing) {
  RoundConfig cfg = buffered_rounds(3, 5);
  cfg.selection.min_updates = 1;  // a commit may hold fewer than k updates
  Harness h(3, cfg);
  h.connect_all(3);
  h.ready(0, 10);
  h.serve({{0, {constant(10.0f), 10}}});
  EXPECT_TRUE(h.store.commits.empty());  // one of three
  h.fire(Timer::Train);
  ASSERT_EQ(h.store.commits.size(), 1u);  // at the deadline, with what it holds
  EXPECT_EQ(h.store.commits[0].record["participants"].size(), 1u);
  EXPECT_EQ(h.store.commits[0].record["training"].size(), 2u);
  EXPECT_TRUE(h.store.commits[0].record["dropouts"].empty());
  EXPECT_EQ(last_start(h, 1), 1u);  // still training on round 1's start
  // An empty buffer at the deadline waits again instead of aborting.
  h.fire(Timer::Train);
  EXPECT_EQ(h.store.records.size(), 1u);
  EXPECT_EQ(h.coord().phase(), Phase::Collecting);
}

// Between two rounds (here: paused after a commit) a silo still training announces its update:
// it is kept, not refused, and the next round grants its upload with its staleness then.
TEST(Coordinator, BufferedKeepsAnUpdateAnnouncedBetweenRoundsAndGrantsItInTheNext) {
  Harness h(3, buffered_rounds(2, 5));
  h.connect_all(3);
  ASSERT_TRUE(h.coord().admin(wire::AdminRequest::PAUSE, "alice", h.now).first);
  h.pump();
  h.ready(0, 10);
  h.ready(1, 10);
  h.serve({{0, {constant(10.0f), 10}}, {1, {constant(20.0f), 10}}});
  ASSERT_EQ(h.store.commits.size(), 1u);
  ASSERT_EQ(h.coord().phase(), Phase::Joining);  // paused: no round starts
  const std::size_t errors_before = h.inbox[h.session(2)].size();
  h.ready(2, 10, /*round=*/1);
  EXPECT_EQ(h.inbox[h.session(2)].size(), errors_before);  // no error: kept for the next round
  EXPECT_FALSE(h.granted(2));
  ASSERT_TRUE(h.coord().admin(wire::AdminRequest::RESUME, "alice", h.now).first);
  h.pump();
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  EXPECT_EQ(last_start(h, 2), 1u);  // not restarted
  ASSERT_TRUE(h.granted(2));
  EXPECT_EQ(h.last(2, wire::Envelope::kUploadGrant)->round(), 1u);
  h.upload(2, constant(10.0f), 10, -1, std::nullopt, /*round=*/1);
  h.ready(0, 10);
  h.serve({{0, {constant(10.0f), 10}}});
  ASSERT_EQ(h.store.commits.size(), 2u);
  bool late = false;
  for (const auto& p : h.store.commits[1].record["participants"]) {
    if (p["silo"] == name(2)) late = p["staleness"] == 1 && p["base_version"] == 0;
  }
  EXPECT_TRUE(late) << h.store.commits[1].record.dump();
}

// Admitted when announced, an update that waits for its grant across a commit is checked again:
// by the grant it may be too stale (here, k = 1 and max_staleness 1: announced one version
// behind, granted two behind).
TEST(Coordinator, BufferedChecksStalenessAgainAtTheGrantOfAnUpdateThatWaitedAcrossACommit) {
  Harness h(3, buffered_rounds(1, 1));
  h.connect_all(3);
  h.ready(0, 10);
  h.serve({{0, {constant(10.0f), 10}}});
  ASSERT_EQ(h.coord().round(), 2u);
  h.ready(1, 10, /*round=*/1);  // granted: the buffer of one is now full with it
  ASSERT_TRUE(h.granted(1));
  h.ready(2, 10, /*round=*/1);  // staleness 1: admitted, waits for a grant
  EXPECT_FALSE(h.granted(2));
  EXPECT_FALSE(h.last(2, wire::Envelope::kRoundEnd));
  h.upload(1, constant(10.0f), 10, -1, std::nullopt, /*round=*/1);
  ASSERT_EQ(h.store.commits.size(), 2u);
  // Round 3 takes silo 2 over, ready; at its grant it would be two versions behind.
  EXPECT_EQ(h.coord().round(), 3u);
  EXPECT_FALSE(h.granted(2));
  ASSERT_TRUE(h.last(2, wire::Envelope::kRoundEnd));
  EXPECT_EQ(h.last(2, wire::Envelope::kRoundEnd)->round(), 1u);
  EXPECT_EQ(last_start(h, 2), 3u);  // restarted on the newest version
  h.ready(2, 10);
  h.serve({{2, {constant(10.0f), 10}}});
  ASSERT_EQ(h.store.commits.size(), 3u);
  const auto& rec = h.store.commits[2].record;
  ASSERT_EQ(rec["refused"].size(), 1u) << rec.dump();
  EXPECT_EQ(rec["refused"][0]["silo"], name(2));
  EXPECT_EQ(rec["refused"][0]["staleness"], 2);
}

// Review B1: a silo dropped from the open round (here: disconnected while training) rejoins it
// when it comes back, on the newest version; one silo that hangs "training" holds nobody back.
TEST(Coordinator, BufferedLetsDroppedSilosRejoinTheOpenRoundSoAHungSiloCannotStallTheFederation) {
  RoundConfig cfg = buffered_rounds(2, 2);
  cfg.rounds = 5;
  Harness h(3, cfg);
  h.connect_all(3);
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  // Silo 2 hangs; silos 0 and 1 lose their connections while training, and come back.
  for (std::size_t i : {0u, 1u}) {
    h.disconnect(i);
    h.connect(i);
    EXPECT_EQ(last_start(h, i), 1u) << i;
    EXPECT_EQ(h.models_sent[h.session(i)], 2) << i;  // the newest model again
  }
  h.ready(0, 10);
  h.ready(1, 10);
  h.serve({{0, {constant(10.0f), 10}}, {1, {constant(20.0f), 10}}});
  ASSERT_EQ(h.store.commits.size(), 1u);
  const auto& rec = h.store.commits[0].record;
  ASSERT_EQ(rec["participants"].size(), 2u) << rec.dump();
  // Their drops stay on record, marked as rejoined.
  ASSERT_EQ(rec["dropouts"].size(), 2u) << rec.dump();
  for (const auto& d : rec["dropouts"]) {
    EXPECT_EQ(d["cause"], "disconnected");
    EXPECT_EQ(d["rejoined"], true);
  }
  EXPECT_EQ(rec["training"], nlohmann::json::array({name(2)}));
  // The federation goes on committing around the hung silo.
  for (std::uint64_t r = 2; r <= 3; ++r) {
    ASSERT_EQ(h.coord().round(), r);
    h.ready(0, 10);
    h.ready(1, 10);
    h.serve({{0, {constant(10.0f), 10}}, {1, {constant(20.0f), 10}}});
    ASSERT_EQ(h.store.commits.size(), r);
  }
}

// Review B1: with min_updates = k = 3, two updates folded and the third silo hung, the round
// cannot commit; after max_staleness + 1 training deadlines the hung silo is dropped (Deadline)
// and the round aborts, so that the next round's start reaches every silo.
TEST(Coordinator, BufferedDropsASiloHungThroughMaxStalenessPlusOneDeadlinesAndAbortsTheShortRound) {
  RoundConfig cfg = buffered_rounds(3, 2);
  cfg.rounds = 5;
  Harness h(3, cfg);
  h.connect_all(3);
  h.ready(0, 10);
  h.ready(1, 10);
  h.serve({{0, {constant(10.0f), 10}}, {1, {constant(20.0f), 10}}});
  EXPECT_TRUE(h.store.records.empty());
  h.fire(Timer::Train);
  h.fire(Timer::Train);
  EXPECT_TRUE(h.store.records.empty());  // it waits, up to max_staleness + 1 deadlines
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  h.fire(Timer::Train);
  ASSERT_EQ(h.store.records.size(), 1u);
  const auto& rec = h.store.records[0];
  EXPECT_EQ(rec["status"], "aborted");
  ASSERT_EQ(rec["dropouts"].size(), 1u) << rec.dump();
  EXPECT_EQ(rec["dropouts"][0]["silo"], name(2));
  EXPECT_EQ(rec["dropouts"][0]["cause"], "deadline");
  ASSERT_EQ(h.coord().round(), 2u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(last_start(h, i), 2u) << i;
  for (std::size_t i = 0; i < 3; ++i) h.ready(i, 10);
  h.serve({{0, {constant(10.0f), 10}}, {1, {constant(20.0f), 10}}, {2, {constant(30.0f), 10}}});
  ASSERT_EQ(h.store.commits.size(), 1u);
}

// Review B2: model versions count commits, not rounds. Round 1 aborts (too few updates by its
// last deadline) while silo 2, which rejoined it, goes on training on version 0; round 2
// commits version 1 on version 0; silo 2's update arrives in round 3 one version behind, not two
// (with max_staleness 1 it is admitted).
TEST(Coordinator, BufferedVersionsCountCommitsSoAnAbortedRoundNeitherShiftsBaseVersionsNorAddsStaleness) {
  RoundConfig cfg = buffered_rounds(2, 1);
  cfg.rounds = 5;
  Harness h(3, cfg);
  h.connect_all(3);
  h.ready(0, 10);
  h.serve({{0, {constant(10.0f), 10}}});
  h.fire(Timer::Train);  // one of two: waits
  h.disconnect(2);
  h.connect(2);  // rejoins round 1 afresh
  h.fire(Timer::Train);  // silo 1 hung through two deadlines: dropped, and the round aborts
  ASSERT_EQ(h.store.records.size(), 1u);
  EXPECT_EQ(h.store.records[0]["status"], "aborted");
  ASSERT_EQ(h.coord().round(), 2u);
  EXPECT_EQ(h.coord().version(), 0u);
  EXPECT_EQ(last_start(h, 2), 1u);  // carried: still training on round 1's start
  h.ready(0, 10);
  h.ready(1, 10);
  h.serve({{0, {constant(10.0f), 10}}, {1, {constant(20.0f), 10}}});
  ASSERT_EQ(h.store.commits.size(), 1u);
  EXPECT_EQ(h.coord().version(), 1u);
  for (const auto& p : h.store.commits[0].record["participants"]) {
    EXPECT_EQ(p["base_version"], 0) << p.dump();
    EXPECT_EQ(p["staleness"], 0) << p.dump();
    EXPECT_EQ(p["base_model_sha256"], crypto::sha256_hex(h.initial_.flat())) << p.dump();
  }
  ASSERT_EQ(h.coord().round(), 3u);
  h.ready(2, 10, /*round=*/1);
  ASSERT_TRUE(h.granted(2));
  h.upload(2, constant(10.0f), 10, -1, std::nullopt, /*round=*/1);
  h.ready(0, 10);
  h.serve({{0, {constant(10.0f), 10}}});
  ASSERT_EQ(h.store.commits.size(), 2u);
  const auto& rec = h.store.commits[1].record;
  EXPECT_TRUE(rec["refused"].empty()) << rec.dump();
  bool seen = false;
  for (const auto& p : rec["participants"]) {
    if (p["silo"] != name(2)) continue;
    seen = true;
    EXPECT_EQ(p["base_version"], 0);
    EXPECT_EQ(p["staleness"], 1);
  }
  EXPECT_TRUE(seen) << rec.dump();
}

// Review B5: the selection's rules hold for members carried over a commit too: a silo that asked
// to leave while training is not taken into the next round (as it would not be started).
TEST(Coordinator, BufferedCarriesNoSiloTheSelectionWouldNotTake) {
  RoundConfig cfg = buffered_rounds(2, 5);
  cfg.selection.min_silos = 2;
  Harness h(3, cfg);
  h.connect_all(3);
  ASSERT_EQ(h.coord().members().size(), 3u);
  wire::Envelope leave;
  leave.set_round(1);
  leave.mutable_leaving();
  h.deliver(2, leave);  // still training on round 1's start
  h.ready(0, 10);
  h.ready(1, 10);
  h.serve({{0, {constant(10.0f), 10}}, {1, {constant(20.0f), 10}}});
  ASSERT_EQ(h.store.commits.size(), 1u);
  ASSERT_EQ(h.coord().round(), 2u);
  ASSERT_EQ(h.coord().phase(), Phase::Collecting);
  EXPECT_EQ(h.coord().members().size(), 2u);
  for (const auto& m : h.coord().members()) EXPECT_NE(m.silo, name(2));
}

}  // namespace
}  // namespace xsilo::server
