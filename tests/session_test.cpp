// The silo's sans-I/O session driven message by message, with an in-process trainer: no
// sockets, no threads, every timing scripted (jobs run when the test says so).
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <set>

#include <cmath>
#include <cstring>

#include "crypto/hash.h"
#include "crypto/sign.h"
#include "crypto/skellam.h"
#include "protocol/audit_key.h"
#include "protocol/compression.h"
#include "protocol/join.h"
#include "protocol/round_start.h"
#include "protocol/secagg_wire.h"
#include "silo_agent/session.h"
#include "silo_agent/silo_state.h"
#include "common/fs.h"
#include "common/safetensors.h"
#include "tests/testlib.h"
#include "tests/result_util.h"

namespace xsilo::agent {
namespace {

// local = global + step; `samples` training rows.
class StepTrainer final : public Trainer {
 public:
  float step = 1.0f;
  std::uint64_t samples = 5;
  bool fail = false, fatal = false;
  wire::TrainMetrics evaluate(const Model&, const TrainTask&) override {
    wire::TrainMetrics m;
    m.set_eval_accuracy(0.5);
    m.set_eval_samples(2);
    return m;
  }
  TrainResult train(const Model& global, const TrainTask& task, Model& local) override {
    if (fail) throw TrainerError(wire::TRAINER_EXITED, "external trainer: rank 0 exited with code 3", fatal);
    seen_silo = task.silo;
    for (std::size_t i = 0; i < local.size(); ++i) local.flat()[i] = global.flat()[i] + step;
    TrainResult r;
    r.num_samples = samples;
    r.metrics.set_train_loss(0.125);
    return r;
  }
  std::string seen_silo;
};

class CrashHook final : public FaultHook {
 public:
  bool after_sent(SecureStep step, std::uint64_t) override { return step == SecureStep::KeysSent; }
};

Model model() {
  Model m;
  m.add("w", {3});
  m.add("b", {1});
  for (std::size_t i = 0; i < m.size(); ++i) m.flat()[i] = 0.5f * static_cast<float>(i);
  return m;
}

SessionConfig session_config(std::set<std::string> servers = {}) {
  SessionConfig c;
  c.federation = "fed";
  c.chunk_bytes = 8;
  c.signer = test::signer(wire::SILO, "silo-a");
  c.ca = test::verifier();
  c.servers = std::move(servers);
  c.floor = crypto::secagg::Floor{2, 0.0};  // the groups of two below (the floor has tests of its own)
  return c;
}

// A secure group of silo-a and silo-b set up and signed as the server named `server` does it
// (the box key pair stays with the caller, as the server keeps it).
wire::SecAggSetup signed_setup(const Model& m, const crypto::X25519KeyPair& box, std::uint32_t bits = 64,
                               const std::string& server = "server", wire::Role role = wire::SERVER) {
  wire::SecAggSetup s;
  s.set_group(1);
  s.add_members("silo-a");
  s.add_members("silo-b");
  s.set_threshold(2);
  s.set_min_survivors(2);
  s.set_modulus_bits(bits);
  s.set_fraction_bits(20);
  s.set_vector_length(m.size() + 1);
  s.set_clip_norm(100);
  s.set_max_weight(100);
  s.set_server_key(std::string(reinterpret_cast<const char*>(box.public_key.data()), box.public_key.size()));
  const auto signer = test::signer(role, server);
  s.set_server_certificate(signer.certificate());
  s.set_server_signature(signer.sign(protocol::setup_statement(s, "fed", 1)));
  return s;
}

// Signs a round start as the server named "server" does (again, after a test changed it).
void sign(wire::Envelope& start) {
  protocol::sign_round_start(*start.mutable_round_start(), test::signer(wire::SERVER, "server"), "fed");
}

class Harness {
 public:
  // `own`: a trainer of the test's in place of `trainer`.
  explicit Harness(FaultHook* hook = nullptr, SessionConfig cfg = session_config(), Trainer* own = nullptr)
      : session_(std::move(cfg), own ? *own : trainer, hook ? *hook : none_) {
    session_.on_connected("silo-a", "127.0.0.1:7443", "server", "server server");
    take();
  }

  wire::Envelope round_start(std::uint64_t round, const Model& m, const std::string& sha = "") {
    wire::Envelope e;
    e.set_federation("fed");
    e.set_round(round);
    auto* rs = e.mutable_round_start();
    rs->set_round(round);
    rs->mutable_plan()->set_train(true);
    rs->mutable_plan()->set_seed(1);
    protocol::add_layout(*rs, m.tensors());
    rs->set_model_sha256(sha.empty() ? crypto::sha256_hex(m.flat()) : sha);
    sign(e);
    return e;
  }
  void deliver(const wire::Envelope& e) {
    session_.on_message(e);
    take();
  }
  void send_model(std::uint64_t round, const Model& m) {
    auto keep = std::make_shared<Model>(m);
    protocol::ChunkSource src(keep, keep->flat(), keep->tensors(), "fed", round, 8);
    while (auto c = src.next()) deliver(*c);
  }
  // Runs the queued jobs (on "the worker") and feeds their results back.
  void run_jobs() {
    while (!jobs_.empty()) {
      auto j = std::move(jobs_.front());
      jobs_.erase(jobs_.begin());
      session_.on_job_done(j.id, j.work());
      take();
    }
  }
  // Delivers a message of `round` whose body `fill` writes, as the server would send it.
  template <class Fill>
  void deliver_in(std::uint64_t round, Fill fill) {
    wire::Envelope e;
    e.set_federation("fed");
    e.set_round(round);
    fill(e);
    deliver(e);
  }
  void grant(std::uint64_t round) {
    deliver_in(round, [](wire::Envelope& e) { e.mutable_upload_grant(); });
  }
  void request_leave() {
    session_.request_leave();
    take();
  }
  const wire::Envelope* last(wire::Envelope::BodyCase body) const {
    for (auto it = sent.rbegin(); it != sent.rend(); ++it) {
      if (it->body_case() == body) return &*it;
    }
    return nullptr;
  }
  // The last secure-aggregation step of this kind sent.
  const wire::Envelope* last(wire::SecureAggregation::StepCase step) const {
    for (auto it = sent.rbegin(); it != sent.rend(); ++it) {
      if (it->has_secure() && it->secure().step_case() == step) return &*it;
    }
    return nullptr;
  }
  std::vector<std::uint8_t> streamed_bytes() {
    std::vector<std::uint8_t> out;
    for (auto& s : streams) {
      while (auto c = s->next()) out.insert(out.end(), c->tensor_chunk().data().begin(), c->tensor_chunk().data().end());
    }
    return out;
  }

  StepTrainer trainer;
  std::vector<wire::Envelope> sent;
  std::vector<std::shared_ptr<protocol::ChunkSource>> streams;
  std::vector<nlohmann::json> records;
  std::vector<action::Record> record_actions;  // as the daemon gets them (with what to rename after)
  std::vector<std::size_t> sent_before_record;  // for each record: how many envelopes went out before it
  bool fatal = false;
  Session& session() { return session_; }

 private:
  void take() {
    actions_before_.clear();
    for (auto& a : session_.take_actions()) {
      if (auto* s = std::get_if<action::Send>(&a)) sent.push_back(s->env);
      if (auto* s = std::get_if<action::SendStream>(&a)) streams.push_back(s->source);
      if (auto* j = std::get_if<action::Job>(&a)) jobs_.push_back(std::move(*j));
      if (auto* r = std::get_if<action::Record>(&a)) {
        records.push_back(r->entry);
        sent_before_record.push_back(sent.size());
        record_actions.push_back(*r);
        // The record is queued before the upload's stream: durable before a byte leaves.
        EXPECT_TRUE(r->log != "sent.jsonl" || !std::any_of(actions_before_.begin(), actions_before_.end(), [](bool s) { return s; }));
      }
      actions_before_.push_back(std::holds_alternative<action::SendStream>(a));
      if (std::get_if<action::Fatal>(&a)) fatal = true;
    }
  }
  FaultHook none_;
  Session session_;
  std::vector<action::Job> jobs_;
  std::vector<bool> actions_before_;  // of the batch being taken: whether each was a SendStream
};

TEST(Session, TrainsOnTheModelAndUploadsWeightTimesDeltaWhenGranted) {
  Harness h;
  const Model m = model();
  h.deliver(h.round_start(1, m));
  h.send_model(1, m);
  EXPECT_FALSE(h.last(wire::Envelope::kUpdateReady));  // training is a job, not yet run
  h.run_jobs();
  const auto* ready = h.last(wire::Envelope::kUpdateReady);
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->update_ready().num_samples(), 5u);
  EXPECT_DOUBLE_EQ(ready->update_ready().metrics().eval_accuracy(), 0.5);
  EXPECT_EQ(h.trainer.seen_silo, "silo-a");
  h.grant(1);
  const auto* end = h.last(wire::Envelope::kUpdateEnd);
  ASSERT_TRUE(end);
  EXPECT_DOUBLE_EQ(end->update_end().weight(), 5.0);
  const auto bytes = h.streamed_bytes();
  ASSERT_EQ(bytes.size(), m.bytes());
  std::vector<float> up(m.size());
  std::memcpy(up.data(), bytes.data(), bytes.size());
  for (float v : up) EXPECT_FLOAT_EQ(v, 5.0f);  // weight 5 x delta 1
  EXPECT_EQ(end->update_end().update_sha256(), crypto::sha256_hex(std::span<const float>(up)));
  ASSERT_EQ(h.records.size(), 1u);  // the silo's own send log: hashes, never data
  EXPECT_EQ(h.records[0]["update_sha256"], end->update_end().update_sha256());
  EXPECT_EQ(h.records[0]["upstream_identity"], "server server");
  EXPECT_EQ(h.records[0]["federation"], "fed");  // sent.jsonl outlives federations: --sent skips others' lines
}

// A trainer whose delta is made as it is sent: element i of the delta is 0.25 * (i + 1).
class StreamingTrainer final : public Trainer {
 public:
  class Delta final : public DeltaStream {
   public:
    void fill(std::size_t first, std::span<float> out) const override {
      for (std::size_t k = 0; k < out.size(); ++k) out[k] = 0.25f * static_cast<float>(first + k + 1);
    }
  };
  wire::TrainMetrics evaluate(const Model&, const TrainTask&) override { throw std::logic_error("not streamed"); }
  TrainResult train(const Model&, const TrainTask&, Model&) override { throw std::logic_error("not streamed"); }
  bool streams() const override { return true; }
  StreamedTraining train_streamed(const TrainTask&, std::size_t elements) override {
    seen_elements = elements;
    StreamedTraining t;
    t.delta = std::make_shared<Delta>();
    t.result.num_samples = 4;
    return t;
  }
  std::size_t seen_elements = 0;
};

TEST(Session, AStreamingTrainersUpdateIsMadeAsItIsSentAndTheModelOnlyHashed) {
  StreamingTrainer trainer;
  Harness h(nullptr, session_config(), &trainer);
  const Model m = model();
  // A model whose bytes do not match the announced hash is refused, as without streaming.
  h.deliver(h.round_start(1, m, std::string(64, 'a')));
  h.send_model(1, m);
  h.run_jobs();
  ASSERT_FALSE(h.sent.empty());
  EXPECT_EQ(h.sent.back().body_case(), wire::Envelope::kError);
  EXPECT_EQ(h.sent.back().error().failure(), wire::MODEL_MISMATCH);
  h.sent.clear();
  h.deliver(h.round_start(2, m));
  h.send_model(2, m);
  h.run_jobs();
  EXPECT_EQ(trainer.seen_elements, m.size());
  ASSERT_FALSE(h.sent.empty());
  ASSERT_EQ(h.sent.back().body_case(), wire::Envelope::kUpdateReady);
  h.grant(2);
  ASSERT_EQ(h.sent.back().body_case(), wire::Envelope::kUpdateEnd);
  const auto& end = h.sent.back().update_end();
  EXPECT_DOUBLE_EQ(end.weight(), 4.0);
  ASSERT_EQ(h.streams.size(), 1u);
  const auto bytes = h.streamed_bytes();
  std::vector<float> up(bytes.size() / sizeof(float));
  std::memcpy(up.data(), bytes.data(), bytes.size());
  ASSERT_EQ(up.size(), m.size());
  for (std::size_t i = 0; i < up.size(); ++i) EXPECT_FLOAT_EQ(up[i], 4.0f * 0.25f * static_cast<float>(i + 1)) << i;
  EXPECT_EQ(end.update_sha256(), crypto::sha256_hex(std::span<const float>(up)));
}

// With silo momentum beta, the silo uploads weight * m, m <- beta m + (1 - beta) delta, and keeps
// m in its state folder: a restarted agent goes on from it.
TEST(Session, SiloMomentumIsUploadedAndKeptAcrossRestarts) {
  test::TempDir dir;
  SessionConfig cfg = session_config();
  cfg.momentum_file = dir / "momentum.safetensors";
  const Model m = model();
  auto round = [&](Harness& h, std::uint64_t r, float step) {
    h.trainer.step = step;
    auto start = h.round_start(r, m);
    start.mutable_round_start()->mutable_plan()->set_silo_momentum(0.5f);
    sign(start);
    h.deliver(start);
    h.send_model(r, m);
    h.run_jobs();
    h.grant(r);
    const auto bytes = h.streamed_bytes();
    std::vector<float> up(m.size());
    std::memcpy(up.data(), bytes.data(), bytes.size());
    return up;
  };
  {
    Harness h(nullptr, cfg);
    for (float v : round(h, 1, 2.0f)) EXPECT_FLOAT_EQ(v, 5.0f * 1.0f);  // m = 0.5 * 0 + 0.5 * 2
  }
  EXPECT_TRUE(std::filesystem::exists(cfg.momentum_file));
  Harness restarted(nullptr, cfg);
  for (float v : round(restarted, 2, 4.0f)) EXPECT_FLOAT_EQ(v, 5.0f * 2.5f);  // m = 0.5 * 1 + 0.5 * 4
  Harness plain;  // silo_momentum 0: the plain delta
  const auto up = [&] {
    plain.deliver(plain.round_start(1, m));
    plain.send_model(1, m);
    plain.run_jobs();
    plain.grant(1);
    const auto bytes = plain.streamed_bytes();
    std::vector<float> v(m.size());
    std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  }();
  for (float v : up) EXPECT_FLOAT_EQ(v, 5.0f);
}

// Error feedback moves on exactly with the upload's line of sent.jsonl, wherever a crash lands
// (issue 47: a silo killed between saving its residual and writing that line came back with the
// residual moved on and no line, so the silo's own log lacked an update the server had counted).
// The crash points the real processes hit only by timing, here one at a time: after the training
// job staged the residual, after the line, after the rename; then the state folder is repaired
// as the agent does at start and a restarted session uploads round 2 from it.
TEST(Session, ErrorFeedbackMovesOnExactlyWithTheUploadsLineWhereverACrashLands) {
  // local = global + step * (1, 2, 3, 4): top-1 of 4 keeps the largest, error feedback the rest.
  class RampTrainer final : public Trainer {
   public:
    wire::TrainMetrics evaluate(const Model&, const TrainTask&) override { return {}; }
    TrainResult train(const Model& global, const TrainTask&, Model& local) override {
      for (std::size_t i = 0; i < local.size(); ++i) local.flat()[i] = global.flat()[i] + 0.1f * float(i + 1);
      TrainResult r;
      r.num_samples = 1;
      return r;
    }
  } trainer;
  const Model m = model();
  auto start = [&](Harness& h, std::uint64_t r) {
    auto e = h.round_start(r, m);
    auto* c = e.mutable_round_start()->mutable_compression();
    c->set_scheme(wire::Compression::TOP_K);
    c->set_fraction(0.25);
    c->set_error_feedback(true);
    sign(e);
    h.deliver(e);
    h.send_model(r, m);
    h.run_jobs();
  };
  enum class Crash { AfterStaging, AfterLine, AfterRename };
  for (const Crash crash : {Crash::AfterStaging, Crash::AfterLine, Crash::AfterRename}) {
    SCOPED_TRACE(static_cast<int>(crash));
    test::TempDir dir;
    SessionConfig cfg = session_config();
    cfg.residual_file = dir / "error_feedback.safetensors";
    std::string named;  // the residual the line names
    {
      Harness h(nullptr, cfg, &trainer);
      start(h, 1);
      EXPECT_TRUE(std::filesystem::exists(staged_path(cfg.residual_file)));
      EXPECT_FALSE(std::filesystem::exists(cfg.residual_file));  // staged only: no upload has left
      if (crash != Crash::AfterStaging) {
        h.grant(1);
        ASSERT_EQ(h.record_actions.size(), 1u);
        const auto& rec = h.record_actions[0];
        named = rec.entry["error_feedback_sha256"].get<std::string>();
        EXPECT_EQ(named, residual_sha256(staged_path(cfg.residual_file)));
        if (crash == Crash::AfterLine) {
          append_durable(dir / rec.log, rec.entry.dump() + "\n");  // the daemon's first step only
        } else {
          commit_record(dir / rec.log, rec.entry, rec.staged, rec.onto);
        }
      }
    }
    // A write cut short by the crash, and a torn line of an earlier crash's witness log.
    std::ofstream(dir / "error_feedback.safetensors.tmp123") << "partial";
    std::ofstream(dir / "audit_heads.jsonl") << "{\"seq\":1}\n{\"seq\":2,\"he";
    const auto did = repair_state(dir.path());
    EXPECT_FALSE(std::filesystem::exists(staged_path(cfg.residual_file)));
    EXPECT_FALSE(std::filesystem::exists(dir / "error_feedback.safetensors.tmp123"));
    EXPECT_EQ(read_file(dir / "audit_heads.jsonl"), "{\"seq\":1}\n");
    EXPECT_EQ(did.size(), crash == Crash::AfterRename ? 2u : 3u) << ::testing::PrintToString(did);
    if (crash == Crash::AfterStaging) {
      EXPECT_FALSE(std::filesystem::exists(dir / "sent.jsonl"));
      EXPECT_FALSE(std::filesystem::exists(cfg.residual_file));  // round 1's upload never left
    } else {
      EXPECT_EQ(residual_sha256(cfg.residual_file), named);  // moved on with the line
    }
    // The restarted silo's round 2 sends its update plus what the log says is held back.
    Harness again(nullptr, cfg, &trainer);
    start(again, 2);
    again.grant(2);
    const auto bytes = again.streamed_bytes();
    ASSERT_FALSE(bytes.empty());
    const auto& line = again.record_actions.at(0).entry;
    EXPECT_EQ(line["round"], 2);
    const Model held = crash == Crash::AfterStaging ? m.zeros_like() : load_safetensors(cfg.residual_file);
    // Everything round 2 had to send (its delta plus the residual) is split between what the
    // staged residual holds back and the kept coordinate, which top-k chose as the largest.
    const Model next = load_safetensors(staged_path(cfg.residual_file));
    double held_back = 0, total = 0, largest = 0;
    for (std::size_t i = 0; i < m.size(); ++i) {
      const double want = 0.1 * double(i + 1) + held.flat()[i];
      // Round 1 held back all but its largest coordinate, unless its upload never left.
      EXPECT_NEAR(held.flat()[i], crash == Crash::AfterStaging || i == 3 ? 0.0 : 0.1 * double(i + 1), 1e-6) << i;
      total += want;
      largest = std::max(largest, want);
      held_back += next.flat()[i];
      if (next.flat()[i] != 0.0f) {
        EXPECT_NEAR(next.flat()[i], want, 1e-6) << i;
      }
    }
    EXPECT_NEAR(total - held_back, largest, 1e-6);  // what left: the largest coordinate
  }
}

// Witnesses (docs/audit.md): the silo keeps only heads the round's audit key signed, names the
// key in each, and sends its last one after connecting; a RoundStart under an audit key it cannot
// reach from the one it witnessed (a wiped state folder, another server) is refused untrained.
wire::AuditHead head_signed(const crypto::SigningKey& key, std::uint64_t seq, const std::string& sha) {
  wire::AuditHead h;
  h.set_seq(seq);
  h.set_sha256(sha);
  const std::string sig = key.sign(protocol::audit_head_statement(seq, sha));
  h.set_signature(crypto::to_hex(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(sig.data()), sig.size())));
  return h;
}

TEST(Session, WitnessesOnlyHeadsTheRoundsAuditKeySignedAndRefusesAKeyItCannotReach) {
  const Model m = model();
  const auto audit = crypto::SigningKey::generate();
  auto start_under = [&](Harness& h, std::uint64_t r, const wire::AuditKey& key) {
    auto e = h.round_start(r, m);
    *e.mutable_round_start()->mutable_audit_key() = key;
    e.mutable_round_start()->set_nonce("nonce-" + std::to_string(r));
    sign(e);
    h.deliver(e);
  };
  wire::AuditKey k;
  k.set_public_key(audit.public_key());
  Harness h;
  start_under(h, 1, k);
  h.send_model(1, m);
  h.run_jobs();
  EXPECT_NE(h.last(wire::Envelope::kUpdateReady), nullptr);
  const auto forged = head_signed(crypto::SigningKey::generate(), 7, std::string(64, 'f'));
  const auto genuine = head_signed(audit, 7, std::string(64, 'a'));
  for (const auto& head : {forged, genuine}) {
    h.deliver_in(1, [&](wire::Envelope& e) { *e.mutable_round_end()->mutable_audit_head() = head; });
  }
  ASSERT_EQ(h.records.size(), 1u);  // the forged head is not kept
  EXPECT_EQ(h.records[0]["head"], std::string(64, 'a'));
  EXPECT_EQ(h.records[0]["key"], crypto::to_hex(std::span<const std::uint8_t>(
                                     reinterpret_cast<const std::uint8_t*>(k.public_key().data()), 32)));

  // A restarted agent: its last witness goes up on connecting; a server with another key is refused.
  SessionConfig cfg = session_config();
  wire::Witness w;
  *w.mutable_head() = genuine;
  w.set_public_key(audit.public_key());
  cfg.witnessed = w;
  Harness again(nullptr, cfg);
  ASSERT_NE(again.last(wire::Envelope::kWitness), nullptr);
  EXPECT_EQ(again.last(wire::Envelope::kWitness)->witness().head().seq(), 7u);
  const auto other = crypto::SigningKey::generate();
  wire::AuditKey other_key;
  other_key.set_public_key(other.public_key());
  start_under(again, 2, other_key);
  const auto* refused = again.last(wire::Envelope::kError);
  ASSERT_NE(refused, nullptr);
  EXPECT_EQ(refused->error().code(), wire::NOT_ALLOWED);
  EXPECT_NE(refused->error().message().find("not the history this silo witnessed"), std::string::npos)
      << refused->error().message();
  again.send_model(2, m);
  again.run_jobs();
  EXPECT_EQ(again.last(wire::Envelope::kUpdateReady), nullptr);  // it did not train
  // The same key reached by a rotation the witnessed key signed: accepted.
  auto* rot = other_key.add_rotations();
  rot->set_old_key(audit.public_key());
  rot->set_next_key(other.public_key());
  rot->set_signature(audit.sign(protocol::key_rotation_statement(audit.public_key(), other.public_key())));
  start_under(again, 3, other_key);
  again.send_model(3, m);
  again.run_jobs();
  EXPECT_NE(again.last(wire::Envelope::kUpdateReady), nullptr);
}

// Found by the 2026-12-04 review (N4): a replayed signed RoundStart made a silo train and upload
// twice (or, in secure mode, throw away its keys: a dropout an edge could aim). Each is acted on
// once, and the replay gets no answer the server could count against the silo.
TEST(Session, ASignedRoundStartIsActedOnOnce) {
  const Model m = model();
  Harness h;
  auto start = h.round_start(1, m);
  start.mutable_round_start()->set_nonce("n1");
  sign(start);
  h.deliver(start);
  h.send_model(1, m);
  h.run_jobs();
  const auto sent = h.sent.size();
  h.deliver(start);  // replayed
  h.run_jobs();
  EXPECT_EQ(h.sent.size(), sent);  // no second UpdateReady, no error
  h.grant(1);
  EXPECT_EQ(h.streams.size(), 1u);
}

// Behind an edge, the silo signs the server's join challenge for the edge named in its
// connection's certificate, so the proof is good through that edge only.
TEST(Session, SignsAJoinChallengeForTheUpstreamItIsConnectedTo) {
  Harness h;  // connected to an upstream whose certificate names "server"
  const std::string nonce = "a-nonce-of-32-bytes-from-server";
  h.deliver_in(0, [&](wire::Envelope& e) { e.mutable_join_challenge()->set_nonce(nonce); });
  const auto* p = h.last(wire::Envelope::kJoinProof);
  ASSERT_NE(p, nullptr);
  const auto v = test::verifier();
  EXPECT_EQ(error_text(protocol::check_join(v, p->join_proof(), "fed", "server", nonce, "silo-a")), "");
  EXPECT_NE(error_text(protocol::check_join(v, p->join_proof(), "fed", "edge-2", nonce, "silo-a")), "");
  EXPECT_NE(error_text(protocol::check_join(v, p->join_proof(), "other-fed", "server", nonce, "silo-a")), "");
  h.deliver_in(0, [&](wire::Envelope& e) { e.mutable_join_challenge()->set_nonce("short"); });
  ASSERT_NE(h.last(wire::Envelope::kError), nullptr);  // too short a nonce to be fresh: refused
}

TEST(Session, AnUpdateIsUploadedOnceHoweverManyGrantsArrive) {
  Harness h;
  const Model m = model();
  h.deliver(h.round_start(1, m));
  h.send_model(1, m);
  h.run_jobs();
  h.grant(1);
  h.grant(1);
  EXPECT_EQ(h.streams.size(), 1u);
  EXPECT_EQ(h.records.size(), 1u);
  EXPECT_EQ(h.last(wire::Envelope::kError)->error().code(), wire::UNEXPECTED);
}

// Failback: the silo asks its upstream to leave (once per connection) and may go only once
// answered and in no round. An answer it did not ask for is an error; a new connection starts
// afresh.
TEST(Session, LeavesOnlyOnceAnsweredAndInNoRound) {
  Harness h;
  const Model m = model();
  h.deliver(h.round_start(1, m));
  h.send_model(1, m);
  h.request_leave();
  h.request_leave();
  int asked = 0;
  for (const auto& e : h.sent) asked += e.has_leaving();
  EXPECT_EQ(asked, 1);
  EXPECT_FALSE(h.session().may_leave());  // not answered
  const auto answer = [](wire::Envelope& e) { e.mutable_leaving(); };
  h.deliver_in(1, answer);
  EXPECT_FALSE(h.session().may_leave());  // round 1 holds it
  h.run_jobs();
  h.grant(1);
  ASSERT_TRUE(h.last(wire::Envelope::kUpdateEnd));  // it finishes its round
  EXPECT_FALSE(h.session().may_leave());
  h.deliver_in(1, [](wire::Envelope& e) { e.mutable_round_end()->set_committed(true); });
  EXPECT_TRUE(h.session().may_leave());
  EXPECT_FALSE(h.last(wire::Envelope::kError));

  // Selected again after the answer: the server restarted and forgot (the edge between stayed
  // up). The silo takes part in the round, asks again, and stays until that is answered.
  h.deliver(h.round_start(2, m));
  h.send_model(2, m);
  EXPECT_FALSE(h.session().may_leave());
  asked = 0;
  for (const auto& e : h.sent) asked += e.has_leaving();
  EXPECT_EQ(asked, 2);
  h.deliver_in(2, answer);
  h.run_jobs();
  h.grant(2);
  h.deliver_in(2, [](wire::Envelope& e) { e.mutable_round_end()->set_committed(true); });
  EXPECT_TRUE(h.session().may_leave());
  EXPECT_FALSE(h.last(wire::Envelope::kError));

  h.session().on_disconnected();
  h.session().on_connected("silo-a", "127.0.0.1:7444", "edge-1", "edge edge-1");
  EXPECT_FALSE(h.session().may_leave());
  h.deliver_in(3, answer);
  ASSERT_TRUE(h.last(wire::Envelope::kError));
  EXPECT_EQ(h.last(wire::Envelope::kError)->error().code(), wire::UNEXPECTED);
  EXPECT_FALSE(h.session().may_leave());
}

TEST(Session, ARoundStartWithABadLayoutIsRefused) {
  Harness h;
  Model m;
  m.add("w", {2});
  auto start = h.round_start(1, m);
  *start.mutable_round_start()->add_tensors() = start.round_start().tensors(0);  // "w" twice
  h.deliver(start);
  EXPECT_FALSE(h.session().in_round());
  ASSERT_TRUE(h.last(wire::Envelope::kError));
  EXPECT_NE(h.last(wire::Envelope::kError)->error().message().find("repeated"), std::string::npos);
  auto huge = h.round_start(2, m);
  huge.mutable_round_start()->mutable_tensors(0)->add_shape(std::uint64_t{1} << 40);
  huge.mutable_round_start()->mutable_tensors(0)->add_shape(std::uint64_t{1} << 40);
  h.deliver(huge);
  EXPECT_NE(h.last(wire::Envelope::kError)->error().message().find("overflows"), std::string::npos);
}

TEST(Session, AModelThatDoesNotMatchItsAnnouncedHashIsNotTrainedOn) {
  Harness h;
  const Model m = model();
  h.deliver(h.round_start(1, m, std::string(64, 'a')));
  h.send_model(1, m);
  h.run_jobs();
  EXPECT_FALSE(h.last(wire::Envelope::kUpdateReady));
  const auto* err = h.last(wire::Envelope::kError);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->error().code(), wire::TRAINING_FAILED);
  EXPECT_EQ(err->error().failure(), wire::MODEL_MISMATCH);
  EXPECT_EQ(err->error().message(), "the model received did not match the round's hash");
}

TEST(Session, ATrainerFailureIsReportedAndAFatalOneStopsTheAgent) {
  Harness h;
  h.trainer.fail = true;
  const Model m = model();
  h.deliver(h.round_start(1, m));
  h.send_model(1, m);
  h.run_jobs();
  const auto* err = h.last(wire::Envelope::kError);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->error().code(), wire::TRAINING_FAILED);
  // The server gets the code and its fixed text; the trainer's words stay in the silo's log.
  EXPECT_EQ(err->error().failure(), wire::TRAINER_EXITED);
  EXPECT_EQ(err->error().message(), "the trainer exited");
  EXPECT_FALSE(h.fatal);
  h.trainer.fatal = true;
  h.deliver(h.round_start(2, m));
  h.send_model(2, m);
  h.run_jobs();
  EXPECT_TRUE(h.fatal);
}

TEST(Session, WorkOfAConnectionThatIsGoneIsDropped) {
  Harness h;
  const Model m = model();
  h.deliver(h.round_start(1, m));
  h.send_model(1, m);
  h.session().on_disconnected();
  h.run_jobs();  // the training finishes after the connection went away
  EXPECT_FALSE(h.last(wire::Envelope::kUpdateReady));
  h.grant(1);  // and a grant that finds nothing pending is an error, not an upload
  EXPECT_TRUE(h.streams.empty());
  EXPECT_TRUE(h.last(wire::Envelope::kError));
}

// Round 1's start of model `m` under the secure `setup` (and the audit key `audit_key`, when
// given), signed by the server.
wire::Envelope secure_start(Harness& h, const Model& m, wire::SecAggSetup setup, const std::string& audit_key = "") {
  auto start = h.round_start(1, m);
  *start.mutable_round_start()->mutable_secagg() = std::move(setup);
  if (!audit_key.empty()) start.mutable_round_start()->mutable_audit_key()->set_public_key(audit_key);
  sign(start);
  return start;
}

// The other member of a two-member group (silo-b, played with the crypto library's client) and
// the group's server, under the secure setup of round 1's start.
struct TwoMemberGroup {
  TwoMemberGroup(const wire::SecAggSetup& setup, const crypto::X25519KeyPair& box)
      : params(protocol::secagg_params(setup, "fed", 1)),
        server_signer(test::signer(wire::SERVER, "server")),
        b(params, "silo-b", test::signer(wire::SILO, "silo-b"), test::verifier(), server_signer.certificate(), "server",
          crypto::secagg::Floor{2, 0.0}),
        server(params, test::verifier(), server_signer, box) {}
  crypto::secagg::Params params;
  crypto::CertSigner server_signer;
  crypto::secagg::Client b;
  crypto::secagg::Server server;
};

// What a distributed-DP round's unmask request may carry: the round's Skellam setup hash and the
// members' keys of the run (what its key list named), and the record that charges the round.
struct UnmaskRun {
  std::string setup_sha;
  std::vector<std::pair<std::string, std::string>> keys;  // member -> keys_sha256 of this run
  wire::SecureAggregation key_list;                        // the key list step silo-a accepted
  // Called before the unmask request is delivered (an extra step a deviating server sends).
  std::function<void(Harness&, UnmaskRun&)> before_request;
  std::size_t before = 0;                                  // messages the session had sent before the request
  // The unmask_begun record of round 1 naming `named` (the run's keys by default) under `setup`.
  std::string record(std::optional<std::vector<std::pair<std::string, std::string>>> named = std::nullopt,
                     std::optional<std::string> setup = std::nullopt) const {
    auto list = nlohmann::json::array();
    for (const auto& [silo, sha] : named.value_or(keys)) list.push_back({{"silo", silo}, {"keys_sha256", sha}});
    return nlohmann::json{{"event", "unmask_begun"}, {"round", 1}, {"seq", 5},
                          {"privacy", {{"setup_sha256", setup.value_or(setup_sha)}}}, {"keys", list}}.dump();
  }
};

// A round start with a secure setup, delivered: the keys, shares and receipts of its two-member
// group, silo-a being the session under test and silo-b played with the crypto library's client,
// up to the settled list (`settled`) that both members hold, silo-a's still to be delivered.
void settle_two_members(Harness& h, const wire::Envelope& start, TwoMemberGroup& group,
                        crypto::secagg::Settled& settled, UnmaskRun* run = nullptr) {
  auto& b = group.b;
  auto& server = group.server;
  h.deliver(start);
  const auto* keys = h.last(wire::SecureAggregation::kSecaggKeys);
  ASSERT_TRUE(keys);  // at once, before training
  ASSERT_TRUE(succeeded(server.on_keys("silo-a", *protocol::from_wire(keys->secure().secagg_keys()))));
  ASSERT_TRUE(succeeded(server.on_keys("silo-b", *b.advertise())));
  auto list = *server.close_keys();
  h.deliver_in(1, [&](wire::Envelope& e) { *e.mutable_secure()->mutable_secagg_key_list() = protocol::to_wire(list); });
  if (run) {
    wire::SecureAggregation step;
    *step.mutable_secagg_key_list() = protocol::to_wire(list);
    run->keys = protocol::advertised_keys(step);
    run->key_list = step;
  }
  const auto* shares = h.last(wire::SecureAggregation::kSecaggShares);
  ASSERT_TRUE(shares);
  ASSERT_TRUE(succeeded(server.on_shares("silo-a", *protocol::from_wire(shares->secure().secagg_shares()))));
  ASSERT_TRUE(succeeded(server.on_shares("silo-b", *b.share(list))));
  auto boxes = *server.close_shares();
  ASSERT_TRUE(succeeded(server.on_receipt("silo-b", *b.receive(boxes["silo-b"]))));
  h.deliver_in(1, [&](wire::Envelope& e) {
    *e.mutable_secure()->mutable_secagg_share_delivery() = protocol::delivery_to_wire(boxes["silo-a"]);
  });
  const auto* receipt = h.last(wire::SecureAggregation::kSecaggReceipt);
  ASSERT_TRUE(receipt);
  ASSERT_TRUE(succeeded(server.on_receipt("silo-a", *protocol::from_wire(receipt->secure().secagg_receipt()))));
  settled = *server.settle();
  ASSERT_TRUE(succeeded(b.settle(settled)));
}

// A whole secure round with a second member played here with the crypto library's client and
// server: the session's keys, shares, masked input and unmask shares let the server recover
// exactly sum(w x) of both.
TEST(Session, TakesPartInSecureAggregationSoThatOnlyTheSumIsRevealed) {
  Harness h;
  const Model m = model();
  auto box = crypto::X25519KeyPair::generate();
  const auto start = secure_start(h, m, signed_setup(m, box));
  const auto& s = start.round_start().secagg();
  TwoMemberGroup group(s, box);
  crypto::secagg::Settled settled;
  ASSERT_NO_FATAL_FAILURE(settle_two_members(h, start, group, settled));
  auto& [params, server_signer, b, server] = group;
  h.send_model(1, m);
  h.run_jobs();  // train; masking waits for the settled members
  EXPECT_FALSE(h.last(wire::Envelope::kUpdateReady));
  h.deliver_in(1, [&](wire::Envelope& e) { *e.mutable_secure()->mutable_secagg_settled() = protocol::to_wire(settled); });
  // A survivor list that overtakes the masking job (only a faulty or malicious upstream sends
  // one) is refused, not handled beside the job that holds the client; the round goes on.
  h.deliver_in(1, [&](wire::Envelope& e) { e.mutable_secure()->mutable_secagg_survivors()->add_survivors("silo-a"); });
  ASSERT_TRUE(h.last(wire::Envelope::kError));
  EXPECT_NE(h.last(wire::Envelope::kError)->error().message().find("survivors arrived while this silo masks"),
            std::string::npos);
  EXPECT_FALSE(h.last(wire::SecureAggregation::kSecaggConfirmation));
  h.run_jobs();  // mask
  const auto* ready = h.last(wire::Envelope::kUpdateReady);
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->update_ready().num_samples(), 1u);  // the real count is inside the masked sum
  h.grant(1);
  ASSERT_TRUE(h.last(wire::Envelope::kUpdateEnd));
  EXPECT_DOUBLE_EQ(h.last(wire::Envelope::kUpdateEnd)->update_end().weight(), 0.0);
  const auto a_words = h.streamed_bytes();
  ASSERT_EQ(a_words.size(), (m.size() + 1) * 8);
  // silo-b: delta 2 everywhere, weight 3.
  const crypto::FixedPointParams codec{64, 20, 100, 100};
  std::vector<std::uint64_t> b_words(m.size() + 1);
  crypto::encode(codec, std::vector<float>(m.size(), 2.0f), 3.0, 7, b_words);
  ASSERT_TRUE(succeeded(b.mask(std::span<std::uint64_t>(b_words))));
  std::vector<std::uint64_t> sum(m.size() + 1);
  std::memcpy(sum.data(), a_words.data(), a_words.size());
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += b_words[i];
  ASSERT_TRUE(succeeded(server.on_masked_input("silo-a")));
  ASSERT_TRUE(succeeded(server.on_masked_input("silo-b")));
  auto u3 = *server.close_masked();
  // Its route drops after the upload: through the new one, the server still reaches the member
  // for the unmasking (the coordinator re-routes a member whose input is in the sum).
  h.session().on_disconnected();
  h.session().on_connected("silo-a", "127.0.0.1:7444", "edge-1", "edge edge-1");
  h.deliver_in(1, [&](wire::Envelope& e) {
    for (const auto& v : u3) e.mutable_secure()->mutable_secagg_survivors()->add_survivors(v);
  });
  const auto* confirmation = h.last(wire::SecureAggregation::kSecaggConfirmation);
  ASSERT_TRUE(confirmation);
  ASSERT_TRUE(succeeded(server.on_confirmation("silo-a", confirmation->secure().secagg_confirmation().signature())));
  ASSERT_TRUE(succeeded(server.on_confirmation("silo-b", b.confirm(u3)->signature)));
  auto request = *server.close_confirmations();
  h.deliver_in(1, [&](wire::Envelope& e) { *e.mutable_secure()->mutable_secagg_unmask_request() = protocol::to_wire(request); });
  const auto* a_unmask = h.last(wire::SecureAggregation::kSecaggUnmaskShares);
  ASSERT_TRUE(a_unmask);
  ASSERT_TRUE(succeeded(server.on_unmask("silo-a", a_unmask->secure().secagg_unmask_shares().sealed())));
  ASSERT_TRUE(succeeded(server.on_unmask("silo-b", b.unmask(request)->box)));
  ASSERT_TRUE(succeeded(server.finish(std::span<std::uint64_t>(sum))));
  EXPECT_EQ(h.records.size(), 1u);  // the upload's line only: no noise in the sum, no release to charge
  const auto decoded = crypto::decode(codec, std::span<const std::uint64_t>(sum));
  for (std::size_t i = 0; i < m.size(); ++i) EXPECT_NEAR(decoded[i], 5.0 * 1.0 + 3.0 * 2.0, 1e-4) << i;
  EXPECT_NEAR(decoded[m.size()], 5.0 + 3.0, 1e-4);  // the summed weights
}

// The silo answered a round start with NOT_ALLOWED, below its floor, naming the key `says`, and
// sent no key.
void expect_refused_before_any_key(Harness& h, const std::string& says) {
  EXPECT_EQ(h.last(wire::SecureAggregation::kSecaggKeys), nullptr);
  const auto* err = h.last(wire::Envelope::kError);
  ASSERT_NE(err, nullptr);
  EXPECT_EQ(err->error().code(), wire::NOT_ALLOWED);
  EXPECT_NE(err->error().message().find("below this silo's floor"), std::string::npos) << err->error().message();
  EXPECT_NE(err->error().message().find(says), std::string::npos) << err->error().message();
}

// The silo's own floor (review N1b): a server's signed setup for a sum of two silos is refused
// before any key is made, with the reason, whatever the server signed.
TEST(Session, ASecureSetupBelowTheSilosOwnFloorIsRefusedBeforeAnyKey) {
  SessionConfig cfg = session_config();
  cfg.floor = crypto::secagg::Floor{};  // the defaults: sums of at least 3
  Harness h(nullptr, cfg);
  const Model m = model();
  auto start = h.round_start(1, m);
  const auto box = crypto::X25519KeyPair::generate();
  *start.mutable_round_start()->mutable_secagg() = signed_setup(m, box);
  sign(start);
  h.deliver(start);
  expect_refused_before_any_key(h, "secure_floor.min_sum");
}

TEST(Session, ASecureSetupNotSignedByATrustedServerIsRefused) {
  const Model m = model();
  const auto box = crypto::X25519KeyPair::generate();
  struct Case {
    const char* what;
    wire::SecAggSetup setup;
    std::set<std::string> pinned;
    const char* says;
  };
  auto lowered = signed_setup(m, box);
  lowered.set_threshold(1);  // an edge lowers the threshold on the way
  auto swapped = signed_setup(m, box);
  swapped.set_server_key(std::string(32, '\x07'));  // an edge puts in its own key, to read the unmask shares
  std::vector<Case> cases = {
      {"altered threshold", lowered, {}, "not signed by the server"},
      {"swapped server key", swapped, {}, "not signed by the server"},
      {"signed by an edge", signed_setup(m, box, 64, "edge-1", wire::EDGE), {}, "no valid server certificate"},
      {"another server than the pinned one", signed_setup(m, box), {"central"}, "not one this agent trusts"},
  };
  for (const auto& c : cases) {
    Harness h(nullptr, session_config(c.pinned));
    auto start = h.round_start(1, m);
    *start.mutable_round_start()->mutable_secagg() = c.setup;
    sign(start);  // the server's signature on the round start is good: the setup inside is what fails
    h.deliver(start);
    EXPECT_FALSE(h.last(wire::SecureAggregation::kSecaggKeys)) << c.what;
    const auto* err = h.last(wire::Envelope::kError);
    ASSERT_TRUE(err) << c.what;
    EXPECT_NE(err->error().message().find(c.says), std::string::npos) << c.what << ": " << err->error().message();
    // And it takes no part in the round: nothing is trained, nothing could leave in the clear.
    h.send_model(1, m);
    h.run_jobs();
    EXPECT_FALSE(h.last(wire::Envelope::kUpdateReady)) << c.what;
    EXPECT_FALSE(h.session().in_round()) << c.what;
  }
}

// An edge relays the round start; changed on the way (model hash, plan), unsigned, signed by a
// non-server or by a server the agent does not pin, it is refused before anything is trained.
TEST(Session, ARoundStartNotSignedByATrustedServerIsRefused) {
  const Model m = model();
  struct Case {
    const char* what;
    std::function<void(wire::RoundStart&)> change;
    std::set<std::string> pinned;
    const char* says;
  };
  std::vector<Case> cases = {
      {"another model", [](wire::RoundStart& rs) { rs.set_model_sha256(std::string(64, 'e')); }, {}, "not signed by server"},
      {"another plan", [](wire::RoundStart& rs) { rs.mutable_plan()->set_learning_rate(50); }, {}, "not signed by server"},
      {"unsigned", [](wire::RoundStart& rs) { rs.clear_server_signature(); rs.clear_server_certificate(); }, {},
       "not signed by a server"},
      {"signed by an edge",
       [](wire::RoundStart& rs) { protocol::sign_round_start(rs, test::signer(wire::EDGE, "edge-1"), "fed"); }, {},
       "no valid server certificate"},
      {"not the pinned server", [](wire::RoundStart&) {}, {"central"}, "not one this agent trusts"},
      {"secure setup dropped",  // an edge strips a secure round's setup, to get the update in the clear
       [&](wire::RoundStart& rs) {
         wire::Envelope e;
         *e.mutable_round_start() = rs;
         *e.mutable_round_start()->mutable_secagg() = signed_setup(m, crypto::X25519KeyPair::generate());
         sign(e);
         rs = e.round_start();
         rs.clear_secagg();
       },
       {},
       "not signed by server"},
  };
  for (const auto& c : cases) {
    Harness h(nullptr, session_config(c.pinned));
    auto start = h.round_start(1, m);
    c.change(*start.mutable_round_start());
    h.deliver(start);
    h.send_model(1, m);
    h.run_jobs();
    EXPECT_FALSE(h.last(wire::Envelope::kUpdateReady)) << c.what;
    ASSERT_FALSE(h.sent.empty()) << c.what;
    ASSERT_TRUE(h.sent.front().has_error()) << c.what;  // the refusal, before anything else
    EXPECT_NE(h.sent.front().error().message().find(c.says), std::string::npos)
        << c.what << ": " << h.sent.front().error().message();
  }
  Harness h;  // and the same, untouched, trains
  h.deliver(h.round_start(1, m));
  h.send_model(1, m);
  h.run_jobs();
  EXPECT_TRUE(h.last(wire::Envelope::kUpdateReady));

  // A signed start of an earlier round, replayed after a later one: refused.
  Harness r;
  r.deliver(r.round_start(2, m));
  r.deliver(r.round_start(1, m));
  ASSERT_TRUE(r.last(wire::Envelope::kError));
  EXPECT_EQ(r.last(wire::Envelope::kError)->error().code(), wire::WRONG_ROUND);
}

TEST(Session, ASimulatedCrashAfterSendingKeysSilencesTheSession) {
  CrashHook crash;
  Harness h(&crash);
  const Model m = model();
  auto start = h.round_start(1, m);
  *start.mutable_round_start()->mutable_secagg() = signed_setup(m, crypto::X25519KeyPair::generate(), 32);
  sign(start);
  h.deliver(start);
  EXPECT_TRUE(h.last(wire::SecureAggregation::kSecaggKeys));
  const auto before = h.sent.size();
  h.send_model(1, m);
  h.run_jobs();
  EXPECT_EQ(h.sent.size(), before);  // as if the process were already gone
}

// A compressed broadcast: the model comes whole first; the silo says in UpdateReady which model
// it trained on; the next round's delta goes onto that model (the round's hash checks the
// result). A delta against a model the silo does not hold is refused with the reason.
TEST(Session, TakesABroadcastDeltaOntoTheModelItHoldsAndSaysWhichItHolds) {
  Harness h;
  wire::Compression b;
  b.set_scheme(wire::Compression::QUANTIZE);
  b.set_bits(8);
  b.set_block(8);
  auto start = [&](std::uint64_t round, const Model& m, const std::string& base) {
    auto e = h.round_start(round, m);
    *e.mutable_round_start()->mutable_broadcast() = b;
    e.mutable_round_start()->set_base_sha256(base);
    sign(e);
    return e;
  };
  auto deliver_chunks = [&](std::uint64_t round, const std::vector<wire::TensorChunk>& chunks) {
    for (const auto& ch : chunks) {
      h.deliver_in(round, [&](wire::Envelope& e) { *e.mutable_tensor_chunk() = ch; });
    }
  };
  const Model m1 = model();
  const std::string sha1 = crypto::sha256_hex(m1.flat());
  h.deliver(start(1, m1, ""));
  h.send_model(1, m1);
  h.run_jobs();
  ASSERT_TRUE(h.last(wire::Envelope::kUpdateReady));
  EXPECT_EQ(h.last(wire::Envelope::kUpdateReady)->update_ready().model_sha256(), sha1);
  h.grant(1);

  // Round 2: the delta against m1.
  Model m2 = m1;
  for (std::size_t i = 0; i < m2.size(); ++i) m2.flat()[i] += 0.01f * static_cast<float>(i + 1);
  const auto enc = protocol::encode_model_delta(b, m1.flat(), m2.flat(), m2.tensors(), 2, 5);
  const std::string sha2 = crypto::sha256_hex(m2.flat());
  h.sent.clear();
  h.deliver(start(2, m2, sha1));
  deliver_chunks(2, enc.chunks);
  h.run_jobs();
  ASSERT_TRUE(h.last(wire::Envelope::kUpdateReady)) << (h.sent.empty() ? "" : h.sent.back().DebugString());
  EXPECT_EQ(h.last(wire::Envelope::kUpdateReady)->update_ready().model_sha256(), sha2);
  // A chunk past the model's end (a relay's doing) is answered and changes nothing: the upload
  // goes ahead.
  deliver_chunks(2, {enc.chunks[0]});
  ASSERT_TRUE(h.last(wire::Envelope::kError));
  EXPECT_NE(h.last(wire::Envelope::kError)->error().message().find("after the whole model"), std::string::npos);
  h.grant(2);
  ASSERT_TRUE(h.last(wire::Envelope::kUpdateEnd));

  // Round 3 claims a delta against m1 again, which this silo no longer holds.
  h.sent.clear();
  h.deliver(start(3, m2, sha1));
  deliver_chunks(3, enc.chunks);
  h.run_jobs();
  EXPECT_FALSE(h.last(wire::Envelope::kUpdateReady));
  // One error says why; the rest of that model goes unanswered.
  EXPECT_EQ(std::count_if(h.sent.begin(), h.sent.end(), [](const auto& e) { return e.has_error(); }), 1);
  ASSERT_TRUE(h.last(wire::Envelope::kError));
  EXPECT_NE(h.last(wire::Envelope::kError)->error().message().find("does not hold"), std::string::npos)
      << h.last(wire::Envelope::kError)->error().message();

  // Round 4: the whole model, and the silo holds a model again.
  h.sent.clear();
  h.deliver(start(4, m2, sha1));
  h.send_model(4, m2);
  h.run_jobs();
  ASSERT_TRUE(h.last(wire::Envelope::kUpdateReady));
  EXPECT_EQ(h.last(wire::Envelope::kUpdateReady)->update_ready().model_sha256(), sha2);
}

// A trainer that could stream keeps the model in rounds with a compressed broadcast (the next
// delta goes onto it) and trains on it in memory; without one it keeps nothing and says so.
TEST(Session, AStreamingTrainerKeepsTheModelForABroadcastDelta) {
  class BothWays final : public Trainer {
   public:
    wire::TrainMetrics evaluate(const Model&, const TrainTask&) override { return {}; }
    TrainResult train(const Model& global, const TrainTask&, Model& local) override {
      ++in_memory;
      for (std::size_t i = 0; i < local.size(); ++i) local.flat()[i] = global.flat()[i] + 1.0f;
      TrainResult r;
      r.num_samples = 2;
      return r;
    }
    bool streams() const override { return true; }
    StreamedTraining train_streamed(const TrainTask&, std::size_t) override {
      ++streamed;
      StreamedTraining t;
      t.delta = std::make_shared<StreamingTrainer::Delta>();
      t.result.num_samples = 2;
      return t;
    }
    int in_memory = 0, streamed = 0;
  } trainer;
  Harness h(nullptr, session_config(), &trainer);
  const Model m = model();
  h.deliver(h.round_start(1, m));
  h.send_model(1, m);
  h.run_jobs();
  EXPECT_EQ(trainer.streamed, 1);
  ASSERT_TRUE(h.last(wire::Envelope::kUpdateReady));
  EXPECT_EQ(h.last(wire::Envelope::kUpdateReady)->update_ready().model_sha256(), "");  // it keeps none
  h.grant(1);
  auto e = h.round_start(2, m);
  e.mutable_round_start()->mutable_broadcast()->set_scheme(wire::Compression::QUANTIZE);
  e.mutable_round_start()->mutable_broadcast()->set_bits(8);
  e.mutable_round_start()->mutable_broadcast()->set_block(8);
  sign(e);
  h.sent.clear();
  h.deliver(e);
  h.send_model(2, m);
  h.run_jobs();
  EXPECT_EQ(trainer.in_memory, 1);
  ASSERT_TRUE(h.last(wire::Envelope::kUpdateReady));
  EXPECT_EQ(h.last(wire::Envelope::kUpdateReady)->update_ready().model_sha256(), crypto::sha256_hex(m.flat()));
}


TEST(Session, SendsTheModelItHoldsWhenARestartedServerAsksForItByItsHashAndNothingElse) {
  Harness h;
  const Model m = model();
  const std::string sha = crypto::sha256_hex(m.flat());
  auto ask = [&](const std::string& want) {
    h.sent.clear();
    h.streams.clear();
    h.deliver_in(2, [&](wire::Envelope& e) {
      e.mutable_model_request()->set_model_sha256(want);
      e.mutable_model_request()->set_round(1);
    });
    const auto* offer = h.last(wire::Envelope::kModelOffer);
    EXPECT_TRUE(offer);
    return offer ? offer->model_offer() : wire::ModelOffer();
  };
  // Before any round it holds nothing.
  EXPECT_FALSE(ask(sha).held());
  EXPECT_TRUE(h.streams.empty());
  h.deliver(h.round_start(1, m));
  h.send_model(1, m);
  // Received but not yet checked by the training job: not offered.
  EXPECT_FALSE(ask(sha).held());
  h.run_jobs();
  // Another hash (its own trained model, say): nothing but "none".
  EXPECT_FALSE(ask(crypto::sha256_hex("its local model")).held());
  EXPECT_TRUE(h.streams.empty());
  // The model it trained on, asked by its hash: every element, exactly, then the offer.
  const auto offer = ask(sha);
  EXPECT_TRUE(offer.held());
  EXPECT_EQ(offer.model_sha256(), sha);
  const auto bytes = h.streamed_bytes();
  ASSERT_EQ(bytes.size(), m.bytes());
  EXPECT_EQ(std::memcmp(bytes.data(), m.flat().data(), bytes.size()), 0);
  EXPECT_TRUE(h.records.empty());  // no upload: nothing in sent.jsonl
}

// The secure client on its own (silo_agent/secure_client.h): what it returns, without a session.
SecureClientConfig secure_client_config(std::set<std::string> servers = {}) {
  const SessionConfig c = session_config(std::move(servers));
  return SecureClientConfig{.federation = c.federation, .signer = c.signer, .ca = c.ca, .servers = c.servers, .floor = c.floor};
}

TEST(SecureClient, ReturnsItsKeysForATrustedSetupAndMasksNothingBeforeItsGroupSettles) {
  SecureClient client(secure_client_config());
  const Model m = model();
  const auto setup = signed_setup(m, crypto::X25519KeyPair::generate());
  auto keys = client.start(setup, 1, "silo-a");
  ASSERT_TRUE(keys) << keys.error().message();
  EXPECT_TRUE(keys->has_secagg_keys());
  EXPECT_TRUE(client.active());
  EXPECT_EQ(client.session_string(), protocol::secure_session(setup, "fed", 1));
  // The update is here, but the share deliveries are not: no masking job yet, and no words.
  RoundOutput pending;
  pending.update = std::make_shared<Model>(m);
  pending.weight = 1;
  FaultHook hook;
  EXPECT_FALSE(client.masking_job(pending, hook));
  EXPECT_FALSE(client.masking());
  EXPECT_FALSE(client.words());
  // A lost connection leaves a member that is not masking in its group; a new round drops it.
  client.disconnected();
  EXPECT_TRUE(client.active());
  client.reset();
  EXPECT_FALSE(client.active());
  EXPECT_EQ(client.session_string(), "");
}

TEST(SecureClient, RefusesWithAWireCodeAndTakesNoPartWithoutAKeyOrUnderAServerItDoesNotPin) {
  const Model m = model();
  const auto setup = signed_setup(m, crypto::X25519KeyPair::generate());
  SecureClientConfig keyless = secure_client_config();
  keyless.signer.reset();
  for (auto& [cfg, says] : std::vector<std::pair<SecureClientConfig, std::string>>{
           {keyless, "no certificate key"}, {secure_client_config({"central"}), "not one this agent trusts"}}) {
    SecureClient client(cfg);
    auto keys = client.start(setup, 1, "silo-a");
    ASSERT_FALSE(keys) << says;
    EXPECT_EQ(keys.error().code(), wire::NOT_ALLOWED) << says;
    EXPECT_NE(keys.error().message().find(says), std::string::npos) << keys.error().message();
    EXPECT_FALSE(client.active()) << says;
  }
}

// A group of silo-a and silo-b under distributed DP whose signed Skellam part gives noise
// multiplier z (the sum's noise over its sensitivity), signed by the server.
// `members` above 2: silo-a and others, t = min_survivors = members - 1.
wire::SecAggSetup skellam_setup(const Model& m, const crypto::X25519KeyPair& box, double z, int members = 2) {
  auto s = signed_setup(m, box, 32);
  for (int i = 2; i < members; ++i) s.add_members("silo-" + std::string(1, static_cast<char>('a' + i)));
  if (members > 2) {
    s.set_threshold(static_cast<std::uint32_t>(members - 1));
    s.set_min_survivors(static_cast<std::uint32_t>(members - 1));
  }
  const std::size_t padded = crypto::padded_length(m.size());
  s.set_vector_length(padded + 1);
  auto* k = s.mutable_skellam();
  k->set_bits(20);
  k->set_gamma(64);
  k->set_clip_norm(1);
  k->set_beta(0.6065306597126334);
  k->set_rotation_seed(5);
  const double l2 = crypto::rounded_l2_bound(k->gamma() * k->clip_norm(), padded, k->beta());
  k->set_variance(z * z * l2 * l2);
  s.set_server_signature(test::signer(wire::SERVER, "server").sign(protocol::setup_statement(s, "fed", 1)));
  return s;
}

// Issue 42, a deviating server: a silo whose own config sets secure_floor.min_noise_multiplier
// refuses, with the wire code and the numbers, a signed setup whose Skellam noise is below it,
// or one that carries no noise at all, and takes no part in the round; the same setup passes a
// silo without that floor, and a setup at the floor passes it.
TEST(SecureClient, RefusesASignedSetupWhoseDistributedDpNoiseIsBelowItsOwnFloor) {
  const Model m = model();
  const auto box = crypto::X25519KeyPair::generate();
  SecureClientConfig floored = secure_client_config();
  floored.floor.min_noise_multiplier = 1.0;
  struct Case {
    const char* what;
    wire::SecAggSetup setup;
    const char* says;  // "" when the silo joins
  };
  const std::vector<Case> cases = {
      {"a tenth of the noise", skellam_setup(m, box, 0.1), "has noise multiplier 0.1, below this silo's 1"},
      {"no noise", signed_setup(m, box, 32), "adds no distributed-DP noise"},
      {"the floor's noise", skellam_setup(m, box, 1.0000001), ""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    SecureClient client(floored);
    auto keys = client.start(c.setup, 1, "silo-a");
    if (std::string(c.says).empty()) {
      EXPECT_TRUE(keys) << keys.error().message();
      EXPECT_TRUE(client.active());
      EXPECT_EQ(client.skellam_sha256(), protocol::skellam_sha256(c.setup.skellam(), c.setup.vector_length() - 1));  // for its sent.jsonl
      continue;
    }
    ASSERT_FALSE(keys);
    EXPECT_EQ(keys.error().code(), wire::NOT_ALLOWED);
    EXPECT_NE(keys.error().message().find("below this silo's floor"), std::string::npos) << keys.error().message();
    EXPECT_NE(keys.error().message().find(c.says), std::string::npos) << keys.error().message();
    EXPECT_NE(keys.error().message().find("secure_floor.min_noise_multiplier"), std::string::npos) << keys.error().message();
    EXPECT_FALSE(client.active());
  }
  SecureClient unfloored(secure_client_config());
  EXPECT_TRUE(unfloored.start(skellam_setup(m, box, 0.1), 1, "silo-a"));
  // A noise multiplier far above any floor, from a variance too large to draw exactly: its
  // draws would come out in coarse steps or as nothing, so floored or not, the silo refuses.
  for (const auto& cfg : {secure_client_config(), floored}) {
    SecureClient client(cfg);
    auto keys = client.start(skellam_setup(m, box, 1e12), 1, "silo-a");
    ASSERT_FALSE(keys);
    EXPECT_EQ(keys.error().code(), wire::NOT_ALLOWED);
    EXPECT_NE(keys.error().message().find("larger than this silo can draw exactly"), std::string::npos)
        << keys.error().message();
  }
}

// Adaptive clipping under distributed DP: the count word's scale h counts against the same
// noise, so a silo's floor holds the round's multiplier over the whole vector. A server that
// signs the update's noise at 1.2 but a count word of h = sqrt(3) Delta_2 leaves the round at
// 0.6, and a floored silo refuses it; a small h passes.
TEST(SecureClient, ItsFloorCountsTheAdaptiveClippingCountWordAgainstTheNoise) {
  const Model m = model();
  const auto box = crypto::X25519KeyPair::generate();
  SecureClientConfig floored = secure_client_config();
  floored.floor.min_noise_multiplier = 1.0;
  auto with_count = [&](double h_over_l2) {
    auto s = skellam_setup(m, box, 1.2);
    const std::size_t padded = crypto::padded_length(m.size());
    const double l2 = crypto::rounded_l2_bound(64, padded, 0.6065306597126334);
    s.mutable_skellam()->set_count_scale(static_cast<std::uint64_t>(std::llround(h_over_l2 * l2)));
    s.set_vector_length(padded + 2);
    s.set_server_signature(test::signer(wire::SERVER, "server").sign(protocol::setup_statement(s, "fed", 1)));
    return s;
  };
  {
    SecureClient client(floored);
    auto keys = client.start(with_count(std::sqrt(3.0)), 1, "silo-a");
    ASSERT_FALSE(keys);
    EXPECT_EQ(keys.error().code(), wire::NOT_ALLOWED);
    EXPECT_NE(keys.error().message().find("has noise multiplier 0.59"), std::string::npos) << keys.error().message();
    EXPECT_NE(keys.error().message().find("count word scale"), std::string::npos) << keys.error().message();
  }
  SecureClient client(floored);
  const auto small = with_count(0.3);  // the round's multiplier 1.2 / sqrt(1.09) = 1.149
  ASSERT_TRUE(client.start(small, 1, "silo-a"));
  EXPECT_EQ(client.skellam_sha256(),
            protocol::skellam_sha256(small.skellam(), crypto::padded_length(m.size())));  // P, not the count word
}

// Issue 42: colluders know their own shares of the noise. A silo that assumes some of its group
// collude with the server (secure_floor.corrupt) holds the signed setup's noise multiplier z,
// discounted to z sqrt((n_min - c) / n_min), to its floor: a group of five whose least revealed
// sum has four survivors, c = ceil(0.2 x 5) = 1 of them colluding, leaves z sqrt(3/4). A setup
// with z = 1.1 passes a floor of 1 without colluders and is refused with them, the message
// showing both numbers; z = 1.2 passes both.
TEST(SecureClient, DiscountsTheNoiseSharesOfTheColludersItAssumesBeforeItsFloor) {
  const Model m = model();
  const auto box = crypto::X25519KeyPair::generate();
  SecureClientConfig alone = secure_client_config();
  alone.floor.min_noise_multiplier = 1.0;
  SecureClientConfig colluders = alone;
  colluders.floor.corrupt = 0.2;
  const auto setup = skellam_setup(m, box, 1.1, 5);
  EXPECT_TRUE(SecureClient(alone).start(setup, 1, "silo-a"));
  auto keys = SecureClient(colluders).start(setup, 1, "silo-a");
  ASSERT_FALSE(keys);
  EXPECT_EQ(keys.error().code(), wire::NOT_ALLOWED);
  char held[32];
  std::snprintf(held, sizeof held, "%.6g", 1.1 * std::sqrt(3.0 / 4.0));
  for (const std::string& says : {std::string("has noise multiplier 1.1, ") + held + " against the 1 of its 5 members",
                                 std::string("secure_floor.corrupt 0.2"), std::string("1 of the 4 in the least sum"),
                                 std::string("below this silo's 1 (secure_floor.min_noise_multiplier)")}) {
    EXPECT_NE(keys.error().message().find(says), std::string::npos) << keys.error().message();
  }
  EXPECT_TRUE(SecureClient(colluders).start(skellam_setup(m, box, 1.2, 5), 1, "silo-a"));
}

// The same refusal through a session: an Error with the code and reason goes to the server, no
// key leaves.
TEST(Session, ASignedSetupWithLessDistributedDpNoiseThanTheSilosFloorIsRefusedBeforeAnyKey) {
  SessionConfig cfg = session_config();
  cfg.floor.min_noise_multiplier = 2;
  Harness h(nullptr, cfg);
  const Model m = model();
  auto start = h.round_start(1, m);
  *start.mutable_round_start()->mutable_secagg() = skellam_setup(m, crypto::X25519KeyPair::generate(), 0.5);
  sign(start);
  h.deliver(start);
  expect_refused_before_any_key(h, "secure_floor.min_noise_multiplier");
}

// Issue 42: under distributed DP the unmask shares a silo sends let the server unmask its group's
// noisy sum, whatever the server's record says it unmasked. The silo's own word for it: a line of
// sent.jsonl naming the round and the Skellam setup, required durable, queued before the shares
// leave; `xsilo audit verify --sent` holds the log's charges to it.

// A distributed-DP round of a two-member group (silo-b played with the crypto library) up to the
// server's unmask request, to which `attach` may add the round's unmask_begun record and its head
// signed under the audit key `audit` the round start names.
void distributed_dp_round_to_unmask(Harness& h, const crypto::SigningKey& audit,
                                    const std::function<void(wire::SecureAggregation&, const UnmaskRun&)>& attach,
                                    UnmaskRun& run) {
  const Model m = model();
  auto box = crypto::X25519KeyPair::generate();
  const auto start = secure_start(h, m, skellam_setup(m, box, 1.0), audit.public_key());
  const auto& s = start.round_start().secagg();
  TwoMemberGroup group(s, box);
  crypto::secagg::Settled settled;
  ASSERT_NO_FATAL_FAILURE(settle_two_members(h, start, group, settled, &run));
  auto& [params, server_signer, b, server] = group;
  h.send_model(1, m);
  h.run_jobs();  // train
  h.deliver_in(1, [&](wire::Envelope& e) { *e.mutable_secure()->mutable_secagg_settled() = protocol::to_wire(settled); });
  h.run_jobs();  // mask
  ASSERT_TRUE(h.last(wire::Envelope::kUpdateReady));
  h.grant(1);
  ASSERT_TRUE(h.last(wire::Envelope::kUpdateEnd));
  ASSERT_EQ(h.records.size(), 1u);  // the upload's line
  run.setup_sha = protocol::skellam_sha256(s.skellam(), s.vector_length() - 1);
  EXPECT_EQ(h.records[0]["skellam_setup_sha256"], run.setup_sha);
  EXPECT_FALSE(h.records[0].contains("kind"));
  std::vector<std::uint32_t> b_words(s.vector_length());  // silo-b's input in the 32-bit ring: its words do not matter here
  ASSERT_TRUE(succeeded(b.mask(std::span<std::uint32_t>(b_words))));
  ASSERT_TRUE(succeeded(server.on_masked_input("silo-a")));
  ASSERT_TRUE(succeeded(server.on_masked_input("silo-b")));
  auto u3 = *server.close_masked();
  h.deliver_in(1, [&](wire::Envelope& e) {
    for (const auto& v : u3) e.mutable_secure()->mutable_secagg_survivors()->add_survivors(v);
  });
  const auto* confirmation = h.last(wire::SecureAggregation::kSecaggConfirmation);
  ASSERT_TRUE(confirmation);
  EXPECT_EQ(h.records.size(), 1u);  // confirming releases nothing yet
  ASSERT_TRUE(succeeded(server.on_confirmation("silo-a", confirmation->secure().secagg_confirmation().signature())));
  ASSERT_TRUE(succeeded(server.on_confirmation("silo-b", b.confirm(u3)->signature)));
  auto request = *server.close_confirmations();
  if (run.before_request) run.before_request(h, run);
  run.before = h.sent.size();
  h.deliver_in(1, [&](wire::Envelope& e) {
    *e.mutable_secure()->mutable_secagg_unmask_request() = protocol::to_wire(request);
    attach(*e.mutable_secure(), run);
  });
}

// Attaches `record` (a line) and its head at seq 5 signed with `key`.
std::function<void(wire::SecureAggregation&, const UnmaskRun&)> shown(const crypto::SigningKey& key,
                                                                      std::function<std::string(const UnmaskRun&)> record) {
  return [&key, record](wire::SecureAggregation& s, const UnmaskRun& run) {
    const std::string line = record(run);
    *s.mutable_unmask_begun() = head_signed(key, 5, crypto::sha256_hex(line));
    s.set_unmask_begun_record(line);
  };
}

TEST(Session, UnderDistributedDpTheReleaseOfUnmaskSharesIsLoggedDurablyBeforeTheyLeave) {
  Harness h;
  const auto audit = crypto::SigningKey::generate();
  UnmaskRun run;
  ASSERT_NO_FATAL_FAILURE(distributed_dp_round_to_unmask(h, audit, shown(audit, [](const UnmaskRun& r) { return r.record(); }), run));
  ASSERT_TRUE(h.last(wire::SecureAggregation::kSecaggUnmaskShares));
  ASSERT_EQ(h.records.size(), 2u);
  const auto& line = h.records[1];
  EXPECT_EQ(line["kind"], protocol::kUnmaskSharesReleased);
  EXPECT_EQ(line["round"], 1u);
  EXPECT_EQ(line["federation"], "fed");
  EXPECT_EQ(line["skellam_setup_sha256"], run.setup_sha);
  EXPECT_EQ(line["unmask_begun_seq"], 5u);  // the record that charges this release
  EXPECT_EQ(line["unmask_begun_sha256"], crypto::sha256_hex(run.record()));
  ASSERT_EQ(run.keys.size(), 2u);
  EXPECT_EQ(line["keys_sha256"], run.keys[0].first == "silo-a" ? run.keys[0].second : run.keys[1].second);
  EXPECT_FALSE(line.contains("update_sha256"));  // not an upload, and no spend of the silo's records
  EXPECT_EQ(h.record_actions[1].log, "sent.jsonl");
  EXPECT_TRUE(h.record_actions[1].required);  // the shares do not leave unless the line is durable
  EXPECT_EQ(h.sent_before_record[1], run.before);  // queued before the shares
}

// The key list must name this silo with the keys it advertised in this run: one with other keys
// (another run's, which the server relayed) is refused, no shares leave, and the silo takes no
// further part in the run.
TEST(Session, UnderSecureAggregationAKeyListNamingThisSiloWithOtherKeysIsRefused) {
  Harness h;
  const Model m = model();
  auto box = crypto::X25519KeyPair::generate();
  const auto start = secure_start(h, m, skellam_setup(m, box, 1.0));
  TwoMemberGroup group(start.round_start().secagg(), box);
  h.deliver(start);
  ASSERT_TRUE(h.last(wire::SecureAggregation::kSecaggKeys));
  const wire::SecAggKeys own = h.last(wire::SecureAggregation::kSecaggKeys)->secure().secagg_keys();
  ASSERT_TRUE(succeeded(group.server.on_keys("silo-a", *protocol::from_wire(own))));
  ASSERT_TRUE(succeeded(group.server.on_keys("silo-b", *group.b.advertise())));
  auto list = protocol::to_wire(*group.server.close_keys());
  for (auto& entry : *list.mutable_entries()) {
    if (entry.silo() == "silo-a") entry.mutable_keys()->set_signature(entry.keys().signature() + "-another-run");
  }
  h.deliver_in(1, [&](wire::Envelope& e) { *e.mutable_secure()->mutable_secagg_key_list() = list; });
  EXPECT_FALSE(h.last(wire::SecureAggregation::kSecaggShares));
  ASSERT_TRUE(h.last(wire::Envelope::kError));
  EXPECT_EQ(h.last(wire::Envelope::kError)->error().message(),
            "the key list names this silo with other keys than those it advertised in this run");
  // No further part in the run: not even the genuine list gets an answer.
  auto genuine = list;
  for (auto& entry : *genuine.mutable_entries()) {
    if (entry.silo() == "silo-a") *entry.mutable_keys() = own;
  }
  h.deliver_in(1, [&](wire::Envelope& e) { *e.mutable_secure()->mutable_secagg_key_list() = genuine; });
  EXPECT_FALSE(h.last(wire::SecureAggregation::kSecaggShares));
}

// At start the agent reads which records it released against (unmask_releases): this
// federation's release lines that name one; other federations, older lines and damage name none.
TEST(SiloState, TheRecordsReleasedAgainstAreReadFromSentJsonlForItsFederationOnly) {
  test::TempDir dir;
  const std::string a(64, 'a'), b(64, 'b');
  std::ofstream(dir.path() / "sent.jsonl")
      << R"({"kind":"unmask_shares_released","federation":"fed","round":1,"unmask_begun_seq":4,"unmask_begun_sha256":")"
      << a << "\"}\n"
      << R"({"kind":"unmask_shares_released","federation":"other","round":1,"unmask_begun_seq":9,"unmask_begun_sha256":")"
      << b << "\"}\n"
      << R"({"kind":"unmask_shares_released","federation":"fed","round":2,"skellam_setup_sha256":"x"})" << "\n"
      << R"({"round":3,"update_sha256":"u","federation":"fed"})" << "\n"
      << "{not json\n"
      << R"({"kind":"unmask_shares_released","federation":"fed","round":3,"unmask_begun_seq":11,"unmask_begun_sha256":")"
      << b << "\"}\n";
  EXPECT_EQ(unmask_releases(dir.path(), "fed"), (std::set<std::string>{"4:" + a, "11:" + b}));
  EXPECT_EQ(unmask_releases(dir.path(), "other"), (std::set<std::string>{"9:" + b}));
  EXPECT_TRUE(unmask_releases(dir.path() / "none", "fed").empty());
}

// The server must show the record that charges the round (its unmask_begun's head, signed by the
// round's audit key), once: without one, under another key, or one this silo released against
// already (a second run of the round under one charge), the shares stay and the server is told why.
TEST(Session, UnderDistributedDpReleasesUnmaskSharesOnlyAgainstASignedUnmaskBegunRecordItHasNotReleasedAgainst) {
  const auto audit = crypto::SigningKey::generate();
  const auto other_key = crypto::SigningKey::generate();
  using Keys = std::vector<std::pair<std::string, std::string>>;
  struct Case {
    const char* what;
    std::function<void(wire::SecureAggregation&, const UnmaskRun&)> attach;
    std::set<std::string> released;
    const char* why;
    std::function<void(Harness&, UnmaskRun&)> before_request = {};
  };
  // A deviating server's second key list, with the signatures of another run (the keys it relayed
  // then): the member refuses it, and the keys the silo checks records against stay this run's.
  const auto replayed = [](Harness& h, UnmaskRun& run) {
    auto step = run.key_list;
    for (auto& entry : *step.mutable_secagg_key_list()->mutable_entries()) {
      entry.mutable_keys()->set_signature(entry.keys().signature() + "-run-1");
    }
    h.deliver_in(1, [&](wire::Envelope& e) { *e.mutable_secure() = step; });
    run.keys = protocol::advertised_keys(step);  // what the record below names: the other run's keys
  };
  const std::vector<Case> cases = {
      {"no head", [](wire::SecureAggregation&, const UnmaskRun&) {}, {}, "without the signed audit head"},
      {"another key", shown(other_key, [](const UnmaskRun& r) { return r.record(); }), {},
       "is not signed by the round's audit key"},
      {"released before", shown(audit, [](const UnmaskRun& r) { return r.record(); }), {"5:" + std::string(64, 'b')},
       "released its unmask shares against audit record 5 already"},
      {"a line that is not the head's",
       [&](wire::SecureAggregation& s, const UnmaskRun& r) {
         shown(audit, [](const UnmaskRun& run) { return run.record(); })(s, r);
         s.set_unmask_begun_record(r.record() + " ");
       },
       {}, "does not hash to it"},
      {"another setup", shown(audit, [](const UnmaskRun& r) { return r.record(std::nullopt, std::string(64, 'c')); }),
       {}, "names another distributed-DP setup"},
      // The record of another run of the round: silo-a's keys then were others.
      {"another run", shown(audit, [](const UnmaskRun& r) {
         Keys k = r.keys;
         for (auto& [silo, sha] : k) if (silo == "silo-a") sha = std::string(64, 'd');
         return r.record(k);
       }), {}, "does not name member silo-a with the keys of this run"},
      // One record naming both runs' keys of silo-b (the other run's first): one charge for two.
      {"two runs in one record", shown(audit, [](const UnmaskRun& r) {
         Keys k = r.keys;
         k.insert(k.begin(), {"silo-b", std::string(64, 'e')});
         return r.record(k);
       }), {}, "names member silo-b twice"},
      {"a record of another run after a refused key list of that run",
       shown(audit, [](const UnmaskRun& r) { return r.record(); }), {},
       "does not name member silo-a with the keys of this run", replayed},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    SessionConfig cfg = session_config();
    cfg.unmask_released = c.released;
    Harness h(nullptr, cfg);
    UnmaskRun run;
    run.before_request = c.before_request;
    ASSERT_NO_FATAL_FAILURE(distributed_dp_round_to_unmask(h, audit, c.attach, run));
    EXPECT_FALSE(h.last(wire::SecureAggregation::kSecaggUnmaskShares));
    EXPECT_EQ(h.records.size(), 1u);  // the upload's line only: nothing released
    ASSERT_TRUE(h.last(wire::Envelope::kError));
    EXPECT_NE(h.last(wire::Envelope::kError)->error().message().find(c.why), std::string::npos)
        << h.last(wire::Envelope::kError)->error().message();
  }
}

TEST(SecureClient, KeepsTheMaskedWordsOnlyFromAMaskingThatSucceeded) {
  SecureClient client(secure_client_config());
  auto failed = client.masked(MaskDone{.words = nullptr, .sha256 = "", .error = "the update does not fit the ring"});
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().message(), "the update does not fit the ring");
  EXPECT_FALSE(client.words());
  auto words = std::make_shared<protocol::MaskedVector>();
  auto sha = client.masked(MaskDone{.words = words, .sha256 = "abc", .error = ""});
  ASSERT_TRUE(sha);
  EXPECT_EQ(*sha, "abc");
  EXPECT_EQ(client.words(), words);
}

}  // namespace
}  // namespace xsilo::agent
