// The audit log catches every kind of tampering and names the first bad record.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>

#include "common/fs.h"
#include "common/process.h"
#include "crypto/hash.h"
#include "common/safetensors.h"
#include "server/audit.h"
#include "server/distributed_dp.h"
#include "server/metrics.h"
#include "server/state.h"
#include "protocol/secagg_wire.h"
#include "tests/testlib.h"
#include "tests/result_util.h"

namespace xsilo::server {
namespace {

std::vector<std::string> lines_of(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

void write_lines(const std::filesystem::path& p, const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  atomic_write_file(p, s);
}

class AuditTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto key = crypto::SigningKey::generate();
    pub_ = key.public_key();
    save_signing_key(key, dir_ / "k", dir_ / "k.pub");
    AuditLog log(dir_ / "audit.jsonl", std::move(key));
    for (int r = 1; r <= 5; ++r) {
      log.append({{"event", "round"}, {"round", r}, {"status", "committed"}, {"participants", {"a", "b"}}});
    }
    lines_ = lines_of(dir_ / "audit.jsonl");
  }
  AuditVerifyResult verify_with(const std::vector<std::string>& lines) {
    write_lines(dir_ / "t.jsonl", lines);
    return verify_audit_log(dir_ / "t.jsonl", pub_);
  }
  test::TempDir dir_;
  std::string pub_;
  std::vector<std::string> lines_;
};

TEST_F(AuditTest, IntactLogVerifies) {
  auto r = verify_with(lines_);
  EXPECT_TRUE(succeeded(r));
  EXPECT_EQ(r->records, 5u);
}

TEST_F(AuditTest, EditedRecordIsCaught) {
  auto l = lines_;
  l[2].replace(l[2].find("\"round\":3"), 9, "\"round\":9");
  auto r = verify_with(l);
  EXPECT_FALSE(r.has_value());
  EXPECT_EQ(r.error().first_bad, 3u);
  EXPECT_NE(r.error().message().find("signature"), std::string::npos);
}

TEST_F(AuditTest, DeletedRecordIsCaught) {
  auto l = lines_;
  l.erase(l.begin() + 1);
  auto r = verify_with(l);
  EXPECT_FALSE(r.has_value());
  EXPECT_EQ(r.error().first_bad, 2u);
}

TEST_F(AuditTest, InsertedRecordIsCaught) {
  auto l = lines_;
  l.insert(l.begin() + 3, l[1]);  // a replayed, validly signed record
  auto r = verify_with(l);
  EXPECT_FALSE(r.has_value());
  EXPECT_EQ(r.error().first_bad, 4u);
}

TEST_F(AuditTest, ReorderedRecordsAreCaught) {
  auto l = lines_;
  std::swap(l[3], l[4]);
  auto r = verify_with(l);
  EXPECT_FALSE(r.has_value());
  EXPECT_EQ(r.error().first_bad, 4u);
}

TEST_F(AuditTest, TruncatedLineAndForeignKeyAreCaught) {
  auto l = lines_;
  l[4] = l[4].substr(0, l[4].size() - 10);
  EXPECT_EQ(verify_with(l).error().first_bad, 5u);
  write_lines(dir_ / "t.jsonl", lines_);
  EXPECT_FALSE(verify_audit_log(dir_ / "t.jsonl", crypto::SigningKey::generate().public_key()).has_value());
}

TEST_F(AuditTest, SignedBytesAreTheLineWithoutItsSignature) {
  // The documented rule, checked by hand: strip ,"sig":"..."} and close the object.
  const auto& line = lines_[0];
  const std::string msg = line.substr(0, line.size() - 138) + "}";
  const std::string sig = crypto::from_hex(line.substr(line.size() - 130, 128));
  EXPECT_TRUE(crypto::verify_signature(pub_, msg, sig));
}

TEST_F(AuditTest, ServerRefusesToAppendToADamagedLog) {
  auto l = lines_;
  std::swap(l[0], l[1]);
  write_lines(dir_ / "audit.jsonl", l);
  EXPECT_THROW(AuditLog(dir_ / "audit.jsonl", load_signing_key(dir_ / "k")), std::runtime_error);
}


// A silo's witness (the heads the server signed for it) catches what the log alone cannot: a cut
// tail, and a log rewritten or forked under the same key. A witness entry the key did not sign
// is no evidence and is said to be so.
TEST_F(AuditTest, AWitnessCatchesACutTailAndARewrittenLog) {
  test::TempDir d;
  std::vector<AuditHead> heads;
  {
    AuditLog log(d / "audit.jsonl", load_signing_key(dir_ / "k"));
    for (int r = 1; r <= 5; ++r) heads.push_back(log.append({{"event", "round"}, {"round", r}, {"participants", {"a"}}}));
  }
  auto witness = [&](const std::vector<AuditHead>& hs) {
    std::string s;
    for (const auto& h : hs) {
      s += nlohmann::json{{"seq", h.seq}, {"head", h.sha256}, {"sig", h.signature}, {"key", key_hex(pub_)}}.dump() + "\n";
    }
    atomic_write_file(d / "heads.jsonl", s);
    return d / "heads.jsonl";
  };
  const auto full = verify_audit_log(d / "audit.jsonl", pub_);
  ASSERT_TRUE(full.has_value());
  auto w = check_witness(*full, witness({heads[1], heads[4]}));
  EXPECT_TRUE(succeeded(w));
  EXPECT_EQ(w->checked, 2u);

  // The tail cut: the shorter log verifies by itself, the witness of record 5 does not.
  auto lines = lines_of(d / "audit.jsonl");
  lines.pop_back();
  write_lines(d / "cut.jsonl", lines);
  const auto cut = verify_audit_log(d / "cut.jsonl", pub_);
  ASSERT_TRUE(cut.has_value());
  w = check_witness(*cut, witness({heads[1], heads[4]}));
  EXPECT_FALSE(w.has_value());
  EXPECT_NE(w.error().message().find("tail was cut"), std::string::npos) << w.error().message();

  // A fork: the same key re-signs a log whose round 3 lists another participant.
  {
    AuditLog fork(d / "fork.jsonl", load_signing_key(dir_ / "k"));
    for (int r = 1; r <= 5; ++r) {
      fork.append({{"event", "round"}, {"round", r}, {"participants", {r == 3 ? "mallory" : "a"}}});
    }
  }
  const auto forked = verify_audit_log(d / "fork.jsonl", pub_);
  ASSERT_TRUE(forked.has_value());
  w = check_witness(*forked, witness({heads[1]}));
  EXPECT_TRUE(succeeded(w));  // records 1-2 are the same in both
  w = check_witness(*forked, witness({heads[1], heads[4]}));
  EXPECT_FALSE(w.has_value());
  EXPECT_NE(w.error().message().find("rewritten or forked"), std::string::npos) << w.error().message();

  // A witness entry with a made-up head (an edge's forgery on the way to the silo) is no
  // evidence: it is counted and ignored, and neither discredits an honest log nor hides a cut.
  AuditHead forged = heads[4];
  forged.sha256 = std::string(64, 'a');
  w = check_witness(*full, witness({forged, heads[1]}));
  EXPECT_TRUE(succeeded(w));
  EXPECT_EQ(w->ignored, 1u);
  EXPECT_EQ(w->checked, 1u);
  EXPECT_NE(w->first_ignored.find("not signed by this log's audit key"), std::string::npos) << w->first_ignored;
  w = check_witness(*cut, witness({forged, heads[4]}));
  EXPECT_FALSE(w.has_value());
  EXPECT_NE(w.error().message().find("tail was cut"), std::string::npos) << w.error().message();
}

// Found by the 2026-12-04 review (N2): a silo's witness file checked against another server's
// log and key said OK, every genuine head "ignored" as signed by another key. Witnesses now name
// the key they checked each head under; a key the log never names fails, and so does a file of
// which no entry is signed by the log's keys (files kept before silos named keys).
TEST_F(AuditTest, AWitnessOfAnotherLogFailsWhetherOrNotItNamesTheKey) {
  test::TempDir d;
  auto other_key = crypto::SigningKey::generate();
  const std::string other_pub = other_key.public_key();
  std::vector<AuditHead> heads;
  {
    AuditLog other(d / "other.jsonl", std::move(other_key));
    for (int r = 1; r <= 3; ++r) heads.push_back(other.append({{"event", "round"}, {"round", r}}));
  }
  const auto ours = verify_audit_log(dir_ / "audit.jsonl", pub_);
  ASSERT_TRUE(ours.has_value());
  std::string named, unnamed;
  for (const auto& h : heads) {
    named += nlohmann::json{{"seq", h.seq}, {"head", h.sha256}, {"sig", h.signature}, {"key", key_hex(other_pub)}}.dump() + "\n";
    unnamed += nlohmann::json{{"seq", h.seq}, {"head", h.sha256}, {"sig", h.signature}}.dump() + "\n";
  }
  atomic_write_file(d / "named.jsonl", named);
  atomic_write_file(d / "unnamed.jsonl", unnamed);
  auto w = check_witness(*ours, d / "named.jsonl");
  EXPECT_FALSE(w.has_value());
  EXPECT_NE(w.error().message().find("which this log never names"), std::string::npos) << w.error().message();
  w = check_witness(*ours, d / "unnamed.jsonl");
  EXPECT_FALSE(w.has_value());
  EXPECT_NE(w.error().message().find("none of its 3 entries is signed by this log's audit key"), std::string::npos) << w.error().message();
}

// Rotating the key: the old key signs a record naming the next one, which signs from then on. A
// verifier starts from the first key and follows; heads signed by either key witness the log; a
// rotation record whose handover signature is not the old key's breaks the chain there.
TEST_F(AuditTest, ARotatedKeyIsFollowedFromTheFirstKey) {
  test::TempDir d;
  std::vector<AuditHead> heads;
  std::string next_pub;
  {
    AuditLog log(d / "audit.jsonl", load_signing_key(dir_ / "k"));
    heads.push_back(log.append({{"event", "round"}, {"round", 1}}));
    auto next = crypto::SigningKey::generate();
    next_pub = next.public_key();
    log.rotate(std::move(next), {{"by", "test"}});
    heads.push_back(log.append({{"event", "round"}, {"round", 2}}));
    EXPECT_EQ(log.public_key(), next_pub);
  }
  const auto v = verify_audit_log(d / "audit.jsonl", pub_);
  ASSERT_TRUE(succeeded(v));
  ASSERT_EQ(v->keys.size(), 2u);
  EXPECT_EQ(v->keys[1].public_key, next_pub);
  EXPECT_EQ(v->keys[1].from_seq, 3u);
  std::string s;
  s += nlohmann::json{{"seq", heads[0].seq}, {"head", heads[0].sha256}, {"sig", heads[0].signature}, {"key", key_hex(pub_)}}.dump() + "\n";
  s += nlohmann::json{{"seq", heads[1].seq}, {"head", heads[1].sha256}, {"sig", heads[1].signature}, {"key", key_hex(next_pub)}}.dump() + "\n";
  atomic_write_file(d / "heads.jsonl", s);
  const auto w = check_witness(*v, d / "heads.jsonl");
  EXPECT_TRUE(succeeded(w));
  EXPECT_EQ(w->checked, 2u);
  // The log goes on only with the key it is signed with now.
  EXPECT_THROW(AuditLog(d / "audit.jsonl", load_signing_key(dir_ / "k"), pub_), std::runtime_error);
  // A rotation whose handover signature is another key's: the old key signed the record, but the
  // statement a silo checks does not verify, so the chain breaks there.
  auto lines = lines_of(d / "audit.jsonl");
  {
    AuditLog bad(d / "bad.jsonl", load_signing_key(dir_ / "k"));
    bad.append({{"event", "round"}, {"round", 1}});
    auto mallory = crypto::SigningKey::generate();
    bad.append({{"event", "key_rotation"},
                {"next_public_key", key_hex(mallory.public_key())},
                {"rotation_signature", key_hex(mallory.sign("anything"))}});
  }
  const auto b = verify_audit_log(d / "bad.jsonl", pub_);
  EXPECT_FALSE(b.has_value());
  EXPECT_EQ(b.error().first_bad, 2u);
  EXPECT_NE(b.error().message().find("rotation_signature"), std::string::npos) << b.error().message();
}

// A line is appended only when it verifies under the log's key and chains to its head.
TEST_F(AuditTest, ASealedLineIsAppendedOnlyWhereItChains) {
  test::TempDir d;
  AuditLog log(d / "audit.jsonl", load_signing_key(dir_ / "k"));
  const std::string first = log.seal({{"event", "a"}});
  const std::string also_first = log.seal({{"event", "b"}});
  log.append_line(first);
  EXPECT_THROW(log.append_line(also_first), std::runtime_error);  // seq 1 again: does not chain
  std::string edited = log.seal({{"event", "c"}});
  edited.replace(edited.find("\"c\""), 3, "\"d\"");
  EXPECT_THROW(log.append_line(edited), std::runtime_error);
  EXPECT_EQ(log.size(), 1u);
  EXPECT_TRUE(verify_audit_log(d / "audit.jsonl", pub_).has_value());
}

// Recovery trusts a checkpoint only as far as the audit log does: one ahead of the log must
// carry its round's record as signed, chaining to the log, for exactly its model; one the log
// knows must hold the model the log names. The attack of issue 14 (cut the log's tail, edit
// the checkpoint to list mallory) leaves the server at the last round the log vouches for.
class RecoveryTest : public ::testing::Test {
 protected:
  static Model layout() {
    Model m;
    m.add("w", {4});
    return m;
  }
  static Model model(float v) {
    Model m = layout();
    for (auto& x : m.flat()) x = v;
    return m;
  }
  // Commits rounds 1..n as the server does.
  void commit_rounds(int n) {
    ServerState st(dir_.path(), 0);
    for (int r = 1; r <= n; ++r) {
      const Model m = model(static_cast<float>(r));
      st.commit(static_cast<std::uint64_t>(r), m, Model{}, record(r, m), MetricsRow{});
    }
  }
  static nlohmann::json record(int r, const Model& m, const std::string& who = "hospital-a") {
    return {{"event", "round"},
            {"round", r},
            {"status", "committed"},
            {"participants", {{{"silo", who}}}},
            {"model_sha256_after", crypto::sha256_hex(m.flat())}};
  }
  void cut_log(std::size_t keep) {
    auto lines = lines_of(dir_ / "audit.jsonl");
    lines.resize(keep);
    write_lines(dir_ / "audit.jsonl", lines);
  }
  std::filesystem::path checkpoint(int r) {
    char name[64];
    std::snprintf(name, sizeof name, "round_%06d.safetensors", r);
    return dir_ / "checkpoints" / name;
  }
  std::string log_text() { return read_file(dir_ / "audit.jsonl"); }
  // Silo-level distributed DP for the four coordinates of layout(), with room for several rounds.
  static DistributedDpConfig small_distributed_dp() {
    DistributedDpConfig dp;
    dp.epsilon = 40;
    dp.clip_norm = 0.5;
    dp.noise_multiplier = 1.2;
    dp.denominator = 5;
    dp.max_group = 5;
    finalize_distributed_dp(dp, 4);
    return dp;
  }
  // small_distributed_dp()'s signed setup, and one with a sixteenth of its variance (what a server
  // whose code was changed signs the silos while recording the configured one).
  struct WeakSetup {
    DistributedDpConfig dp;
    wire::SkellamSetup configured, weak;
  };
  static WeakSetup weak_setup() {
    WeakSetup w{small_distributed_dp(), {}, {}};
    w.configured = signed_part(w.dp, 11);
    w.weak = w.configured;
    w.weak.set_variance(w.dp.variance / 16);
    return w;
  }
  // Commits round 1 under the Skellam setup `k`, its record counting one upload `update` and one sum
  // revealed; returns the record's privacy part.
  nlohmann::json commit_skellam_round_one(ServerState& st, const DistributedDpConfig& dp, const wire::SkellamSetup& k,
                                          const std::string& update) {
    privacy::Ledger spent;
    spent.add(round_mechanism(as_signed(dp, k, dp.padded)), 1);
    auto part = round_privacy_record(dp, k, dp.padded, spent);
    part["sums_revealed"] = 1;
    const Model m = model(1.0f);
    auto rec = record(1, m);
    rec["participants"][0]["update_sha256"] = update;
    rec["privacy"] = part;
    st.commit(1, m, Model{}, rec, MetricsRow{});
    return part;
  }
  test::TempDir dir_;
};

TEST_F(RecoveryTest, ACheckpointAheadOfTheLogIsAppendedExactlyAsSigned) {
  commit_rounds(2);
  const auto line2 = lines_of(dir_ / "audit.jsonl").at(1);
  cut_log(1);  // the server died after checkpoint 2 and before its record
  ServerState st(dir_.path(), 0);
  const auto r = st.recover(layout());
  EXPECT_EQ(r.committed_round, 2u);
  const auto lines = lines_of(dir_ / "audit.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1], line2);  // byte for byte what was signed before the checkpoint
  EXPECT_TRUE(verify_audit_log(dir_ / "audit.jsonl", st.audit().public_key()).has_value());
}

// Found by the kill storm (issue 17): a server killed after appending a round's record and
// before its metrics row left metrics.csv without that committed round for good; the sim,
// which follows metrics.csv, never counted it. Recovery now appends the rows the log has and
// metrics.csv lacks, from the records, once.
// Review B2: buffered rounds' model versions count commits; a restart rebuilds the count from
// the log's committed rounds (Resume::commits), aborted rounds' numbers not among them.
TEST_F(RecoveryTest, ResumeCountsTheLogsCommittedRoundsNotItsRoundNumbers) {
  {
    ServerState st(dir_.path(), 0);
    const Model m1 = model(1.0f);
    st.commit(1, m1, Model{}, record(1, m1), MetricsRow{});
    st.record({{"event", "round"}, {"round", 2}, {"status", "aborted"}}, nullptr);
    const Model m3 = model(3.0f);
    st.commit(3, m3, Model{}, record(3, m3), MetricsRow{});
    st.record({{"event", "round"}, {"round", 4}, {"status", "aborted"}}, nullptr);
  }
  ServerState st(dir_.path(), 0);
  const auto r = st.recover(layout());
  EXPECT_EQ(r.committed_round, 3u);
  EXPECT_EQ(r.last_round, 4u);
  EXPECT_EQ(r.commits, 2u);
}

TEST_F(RecoveryTest, RoundsTheLogRecordsButTheMetricsLackGetTheirRowsBack) {
  {
    ServerState st(dir_.path(), 0);
    for (int r = 1; r <= 3; ++r) {
      const Model m = model(static_cast<float>(r));
      MetricsRow row;
      row.round = static_cast<std::uint64_t>(r);
      row.committed = true;
      row.reported = 1;
      st.commit(row.round, m, Model{}, record(r, m), row);
    }
  }
  auto rows = lines_of(dir_ / "metrics.csv");
  ASSERT_EQ(rows.size(), 4u);  // header + 3
  rows.resize(2);  // round 1's row only: killed after round 2's record, before its row
  write_lines(dir_ / "metrics.csv", rows);
  cut_log(2);      // and round 3 killed between its checkpoint and its record
  for (int restart = 0; restart < 2; ++restart) {
    ServerState st(dir_.path(), 0);
    EXPECT_EQ(st.recover(layout()).committed_round, 3u);
    const auto back = read_metrics(dir_ / "metrics.csv");
    ASSERT_EQ(back.size(), 3u) << "restart " << restart;
    for (std::uint64_t r = 1; r <= 3; ++r) {
      EXPECT_EQ(back[r - 1].round, r);
      EXPECT_TRUE(back[r - 1].committed);
      EXPECT_EQ(back[r - 1].reported, 1u);
    }
    EXPECT_TRUE(std::isnan(back[2].train_loss));  // not in the record
  }
}

TEST_F(RecoveryTest, AnEditedCheckpointIsNotTrustedAndNothingIsSignedForIt) {
  commit_rounds(2);
  cut_log(1);
  // Edit checkpoint 2's record to list mallory (its signature no longer verifies).
  Metadata meta;
  const Model m2 = load_safetensors(checkpoint(2), &meta);
  auto& line = meta.at("xsilo.audit_line");
  line.replace(line.find("hospital-a"), 10, "mallory");
  save_safetensors(checkpoint(2), m2, meta);
  {
    ServerState st(dir_.path(), 0);
    const auto r = st.recover(layout());
    EXPECT_EQ(r.committed_round, 1u);  // back to what the log vouches for
    EXPECT_EQ(log_text().find("mallory"), std::string::npos);
    EXPECT_EQ(lines_of(dir_ / "audit.jsonl").size(), 1u);
  }
  // A checkpoint whose model is not the one its (intact) signed record names: not trusted, and
  // the server does not fall back to an older model (issue 37): round 1's model is missing.
  commit_rounds(0);
  Metadata meta1;
  Model m1 = load_safetensors(checkpoint(1), &meta1);
  m1.flat()[0] = 42;
  save_safetensors(checkpoint(1), m1, meta1);
  ServerState st(dir_.path(), 0);
  const auto r = st.recover(layout());
  EXPECT_FALSE(r.model.has_value());
  ASSERT_TRUE(r.missing);
  EXPECT_EQ(r.missing->round, 1u);
  EXPECT_NE(r.missing->why.find("the log names"), std::string::npos) << r.missing->why;
}

// The config's model changed after rounds were committed (found by a stranger following the
// docs: "inputs" 30 -> 31): the last committed round's checkpoint is intact and is the model its
// record names, in another layout. The server says that the config is what changed, at once,
// instead of waiting for a silo to send that round's model and then advising a restore from
// backup or --resume-from-round. A checkpoint of another layout that is not the round's model
// (damage) still goes the missing-model way.
TEST_F(RecoveryTest, AModelChangedInTheConfigIsRefusedAsTheConfigsNotAsAMissingCheckpoint) {
  commit_rounds(2);
  Model wider;
  wider.add("w", {5});
  {
    ServerState st(dir_.path(), 0);
    try {
      st.recover(wider);
      ADD_FAILURE() << "recovered with another model than the committed rounds'";
    } catch (const StateError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("the config's .model is not the model of committed round 2"), std::string::npos) << what;
      EXPECT_NE(what.find("w [4] against w [5]"), std::string::npos) << what;
      EXPECT_NE(what.find("undo the change to .model"), std::string::npos) << what;
    }
  }
  // The same file, one value changed: not the round's model any more, so the copy is damaged.
  Metadata meta;
  Model other = load_safetensors(checkpoint(2), &meta);
  other.flat()[0] = 42;
  save_safetensors(checkpoint(2), other, meta);
  ServerState st(dir_.path(), 0);
  const auto r = st.recover(wider);
  ASSERT_TRUE(r.missing);
  EXPECT_EQ(r.missing->round, 2u);
  EXPECT_NE(r.missing->why.find("another model layout"), std::string::npos) << r.missing->why;
}

// Adaptive clipping goes on after a restart where the last committed round's record left it.
TEST_F(RecoveryTest, AdaptiveClippingResumesFromTheLastCommittedRecord) {
  {
    ServerState st(dir_.path(), 0);
    for (int r = 1; r <= 2; ++r) {
      const Model m = model(static_cast<float>(r));
      auto rec = record(r, m);
      rec["robust"] = {{"adaptive_clip", {{"clip_norm", 1.0}, {"next", 1.5 * r}}}};
      st.commit(static_cast<std::uint64_t>(r), m, Model{}, rec, MetricsRow{});
    }
  }
  ServerState st(dir_.path(), 0);
  const auto r = st.recover(layout());
  ASSERT_TRUE(r.clip_norm);
  EXPECT_DOUBLE_EQ(*r.clip_norm, 3.0);
}

// The server optimizer's state (momentum, say) is named in the signed record too: a checkpoint
// whose .opt file was changed is not trusted.
TEST_F(RecoveryTest, AnEditedOptimizerStateIsNotTrusted) {
  {
    ServerState st(dir_.path(), 0);
    for (int r = 1; r <= 2; ++r) {
      const Model m = model(static_cast<float>(r));
      st.commit(static_cast<std::uint64_t>(r), m, model(0.5f * static_cast<float>(r)), record(r, m), MetricsRow{});
    }
  }
  EXPECT_NE(log_text().find("optimizer_state_sha256"), std::string::npos);
  {
    ServerState st(dir_.path(), 0);
    const auto r = st.recover(layout());
    EXPECT_EQ(r.committed_round, 2u);
    ASSERT_TRUE(r.optimizer_state);
    EXPECT_EQ(r.optimizer_state->flat()[0], 1.0f);
  }
  auto opt = checkpoint(2);
  opt.replace_extension(".opt");
  save_safetensors(opt, model(9.0f));
  ServerState st(dir_.path(), 0);
  const auto r = st.recover(layout());
  ASSERT_TRUE(r.missing);  // round 2's momentum is not the one its record names: round 2 is not usable
  EXPECT_EQ(r.missing->round, 2u);
  EXPECT_NE(r.missing->why.find("optimizer state"), std::string::npos) << r.missing->why;
}

// A model restored from a silo's copy (restore_model) has lost its optimizer state: the next
// start takes that checkpoint (the model alone, its hash checked) instead of asking again, and
// the optimizer starts from zero as the repair said.
TEST_F(RecoveryTest, AModelRestoredFromASiloIsTheCheckpointOfTheNextStartWithoutItsOptimizerState) {
  {
    ServerState st(dir_.path(), 0);
    for (int r = 1; r <= 2; ++r) {
      const Model m = model(static_cast<float>(r));
      st.commit(static_cast<std::uint64_t>(r), m, model(0.5f * static_cast<float>(r)), record(r, m), MetricsRow{});
    }
  }
  std::filesystem::remove(checkpoint(2));
  {
    ServerState st(dir_.path(), 0);
    const auto r = st.recover(layout());
    ASSERT_TRUE(r.missing);
    EXPECT_THROW(st.restore_model(*r.missing, model(7.0f)), std::runtime_error);  // not the model the log names
    const auto repair = st.restore_model(*r.missing, model(2.0f));
    EXPECT_NE(repair.find("starts again from zero"), std::string::npos) << repair;
  }
  ServerState st(dir_.path(), 0);
  const auto r = st.recover(layout());
  EXPECT_FALSE(r.missing);
  EXPECT_EQ(r.committed_round, 2u);
  ASSERT_TRUE(r.model);
  EXPECT_EQ(r.model->flat()[0], 2.0f);
  EXPECT_FALSE(r.optimizer_state);  // round 1's .opt beside it or a stale one: never taken for round 2's
}

// ---- issue 37: whatever happens to the state folder, nothing committed is lost, forked or
// re-signed. Each damage the operator's experiment found, at the ServerState level (the daemon's
// part, and real processes, are in federation_test's RecoveryTable).

StateOptions with_mirror(const std::filesystem::path& dir, const std::filesystem::path& mirror,
                         std::optional<std::uint64_t> resume = {}) {
  return StateOptions{dir, mirror, 0, resume};
}

std::string state_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const StateError& e) {
    return e.what();
  }
  return "";
}

void flip_byte(const std::filesystem::path& p, std::size_t at) {
  std::string b = read_file(p);
  b[std::min(at, b.size() - 1)] ^= 0x40;
  atomic_write_file(p, b);
}

TEST_F(RecoveryTest, ADamagedNewestCheckpointIsNeverReplacedByAnOlderModel) {
  commit_rounds(5);
  for (const std::string damage : {"truncated", "bit flipped", "garbage header", "deleted"}) {
    SCOPED_TRACE(damage);
    const std::string good = read_file(checkpoint(5));
    if (damage == "truncated") atomic_write_file(checkpoint(5), good.substr(0, good.size() / 2));
    if (damage == "bit flipped") flip_byte(checkpoint(5), good.size() - 3);  // in the values
    if (damage == "garbage header") atomic_write_file(checkpoint(5), "{garbage" + good.substr(8));
    if (damage == "deleted") std::filesystem::remove(checkpoint(5));
    {
      ServerState st(dir_.path(), 0);
      const auto r = st.recover(layout());
      EXPECT_FALSE(r.model);
      ASSERT_TRUE(r.missing);
      EXPECT_EQ(r.missing->round, 5u);
      const auto error = st.missing_model_error(*r.missing);
      EXPECT_NE(error.find("--resume-from-round"), std::string::npos) << error;
      EXPECT_NE(error.find("the newest checkpoint on disk is round 4"), std::string::npos) << error;
    }
    EXPECT_EQ(lines_of(dir_ / "audit.jsonl").size(), 5u);  // nothing signed
    atomic_write_file(checkpoint(5), good);
  }
}

TEST_F(RecoveryTest, TheOperatorsDecisionToGoOnFromAnEarlierRoundIsRecordedAndSupersedesTheRest) {
  commit_rounds(5);
  std::filesystem::remove(checkpoint(5));
  std::filesystem::remove(checkpoint(4));
  EXPECT_NE(state_error([&] { ServerState(with_mirror(dir_.path(), {}, 4)).recover(layout()); })
                .find("--resume-from-round 4: its checkpoint is not usable either"),
            std::string::npos);
  EXPECT_NE(state_error([&] { ServerState(with_mirror(dir_.path(), {}, 9)).recover(layout()); })
                .find("the last committed round is 5"),
            std::string::npos);
  {
    ServerState st(with_mirror(dir_.path(), {}, 3));
    const auto r = st.recover(layout());
    EXPECT_EQ(r.committed_round, 3u);
    ASSERT_TRUE(r.model);
    EXPECT_EQ(r.model->flat()[0], 3.0f);
    ASSERT_TRUE(r.decision);
    EXPECT_EQ((*r.decision)["superseded_rounds"], nlohmann::json({4, 5}));
    EXPECT_EQ(r.last_round, 5u);  // round numbers never go back: the next round is 6
    st.record(*r.decision, nullptr);
    const Model m6 = model(6.0f);
    st.commit(6, m6, Model{}, record(6, m6), MetricsRow{});
  }
  // From then on the log's last committed round is 6, and 4 and 5 count for nothing.
  ServerState st(dir_.path(), 0);
  const auto r = st.recover(layout());
  EXPECT_EQ(r.committed_round, 6u);
  EXPECT_FALSE(r.missing);
}

// Silo-level central DP: a restarted server's spend is what the audit chain's committed records
// state, every one of them: an operator's resume from an earlier round supersedes commits, not
// the spend of the models they released; a damaged spend stops the start.
TEST_F(RecoveryTest, CentralDpSpendIsRebuiltFromEveryCommittedRecordOfTheLog) {
  CentralDpConfig dp;
  dp.epsilon = 8;
  dp.noise_multiplier = 1.1;
  dp.denominator = 5;
  auto commit = [&](ServerState& st, int r, privacy::Ledger& spent) {
    const Model m = model(static_cast<float>(r));
    spent.add(round_mechanism(dp), 1);
    auto rec = record(r, m);
    rec["privacy"] = round_privacy_record(dp, spent);
    st.commit(static_cast<std::uint64_t>(r), m, Model{}, rec, MetricsRow{});
  };
  privacy::Ledger spent;
  {
    ServerState st(dir_.path(), 0);
    for (int r = 1; r <= 3; ++r) commit(st, r, spent);
    st.record({{"event", "round"}, {"round", 4}, {"status", "aborted"}}, nullptr);  // spends nothing
  }
  {
    ServerState st(dir_.path(), 0);
    const auto r = st.recover(layout());
    EXPECT_EQ(r.central_dp, spent);
    EXPECT_NEAR(epsilon_of(r.central_dp, dp.delta), epsilon_of(spent, dp.delta), 1e-12);
  }
  {
    ServerState st(with_mirror(dir_.path(), {}, 2));  // go on from round 2: round 3's model was released all the same
    const auto r = st.recover(layout());
    st.record(*r.decision, nullptr);
    EXPECT_EQ(r.central_dp, spent);
    commit(st, 5, spent);
  }
  ServerState st(dir_.path(), 0);
  const auto r = st.recover(layout());
  ASSERT_EQ(r.central_dp.steps.size(), 1u);
  EXPECT_EQ(r.central_dp.steps[0].count, 4u);
  // A committed record whose spend cannot be read: the server cannot know its budget.
  std::filesystem::create_directories(dir_ / "other");
  {
    ServerState damaged(dir_ / "other", 0);
    auto rec = record(1, model(1.0f));
    rec["privacy"] = {{"mechanism", "central"}, {"noise_multiplier", "much"}};
    damaged.commit(1, model(1.0f), Model{}, rec, MetricsRow{});
  }
  EXPECT_NE(state_error([&] { ServerState(dir_ / "other", 0).recover(layout()); }).find("the privacy spent cannot be rebuilt"),
            std::string::npos);
  // A mechanism that is not even a string (a JSON type error, not an invalid value): the same.
  std::filesystem::create_directories(dir_ / "typed");
  {
    ServerState damaged(dir_ / "typed", 0);
    auto rec = record(1, model(1.0f));
    rec["privacy"] = {{"mechanism", 7}};
    damaged.commit(1, model(1.0f), Model{}, rec, MetricsRow{});
  }
  EXPECT_NE(state_error([&] { ServerState(dir_ / "typed", 0).recover(layout()); }).find("the privacy spent cannot be rebuilt"),
            std::string::npos);
  // Committed rounds without its noise are counted: the daemon refuses central DP over them.
  std::filesystem::create_directories(dir_ / "noiseless");
  {
    ServerState plain(dir_ / "noiseless", 0);
    plain.commit(1, model(1.0f), Model{}, record(1, model(1.0f)), MetricsRow{});
    plain.commit(2, model(2.0f), Model{}, record(2, model(2.0f)), MetricsRow{});
  }
  EXPECT_EQ(ServerState(dir_ / "noiseless", 0).recover(layout()).committed_without_central_dp, 2u);
  EXPECT_EQ(r.committed_without_central_dp, 0u);  // every committed round of the first log was noised
}

// Central DP with adaptive clipping: a restart rebuilds the spend, the count's noise included, and
// the clip norm where the last committed record left it; a committed record that adapted C
// without its count's noise stops the start.
TEST_F(RecoveryTest, CentralDpWithAdaptiveClippingRebuildsTheClipNormAndTheSpendWithTheCount) {
  CentralDpConfig dp;
  dp.epsilon = 8;
  dp.noise_multiplier = 1.1;
  dp.denominator = 5;
  dp.count_stddev = 2;
  privacy::Ledger spent;
  auto commit = [&](ServerState& st, int r, double c, bool with_count) {
    const Model m = model(static_cast<float>(r));
    spent.add(round_mechanism(dp), 1);
    dp.clip_norm = c;
    auto rec = record(r, m);
    rec["privacy"] = round_privacy_record(dp, spent);
    if (!with_count) rec["privacy"].erase("count_stddev");
    rec["robust"]["adaptive_clip"] = {{"clip_norm", c}, {"unclipped_fraction", 0.2}, {"quantile", 0.5},
                                      {"count_stddev", 2}, {"next", c * 1.5}};
    st.commit(static_cast<std::uint64_t>(r), m, Model{}, rec, MetricsRow{});
  };
  {
    ServerState st(dir_.path(), 0);
    commit(st, 1, 0.3, true);
    commit(st, 2, 0.45, true);
  }
  const auto r = ServerState(dir_.path(), 0).recover(layout());
  EXPECT_EQ(r.central_dp, spent);
  ASSERT_TRUE(r.clip_norm);
  EXPECT_DOUBLE_EQ(*r.clip_norm, 0.45 * 1.5);
  auto without_count = dp;
  without_count.count_stddev = 0;
  privacy::Ledger less;
  less.add(round_mechanism(without_count), 2);
  EXPECT_GT(epsilon_of(r.central_dp, dp.delta), epsilon_of(less, dp.delta));
  std::filesystem::create_directories(dir_ / "uncounted");
  {
    ServerState st(dir_ / "uncounted", 0);
    commit(st, 1, 0.3, false);
  }
  EXPECT_NE(state_error([&] { ServerState(dir_ / "uncounted", 0).recover(layout()); }).find("states no count_stddev"),
            std::string::npos);
}

// Distributed DP with adaptive clipping (issue 42): a restart rebuilds the spend, each round's
// count word included (its count_scale in the signed setup each record names), and the clip norm
// where the last committed record left it; a committed record that adapted C without stating its
// count word stops the start.
TEST_F(RecoveryTest, DistributedDpWithAdaptiveClippingRebuildsTheClipNormAndTheSpendWithTheCount) {
  auto dp = small_distributed_dp();
  dp.counts_unclipped = true;
  dp.count_stddev = 0.5;
  finalize_distributed_dp(dp, 4);
  ASSERT_GT(dp.count_scale, 0u);
  privacy::Ledger spent;
  auto commit = [&](ServerState& st, int r, double c, bool with_count) {
    const Model m = model(static_cast<float>(r));
    const auto round = at_clip_norm(dp, c);
    const auto k = signed_part(round, 11);
    spent.add(round_mechanism(as_signed(round, k, round.padded)), 1);
    auto rec = record(r, m);
    rec["privacy"] = round_privacy_record(round, k, round.padded, spent);
    rec["privacy"]["sums_revealed"] = 1;
    if (!with_count) rec["privacy"].erase("count_scale");
    rec["robust"]["adaptive_clip"] = {{"clip_norm", c}, {"unclipped_fraction", 0.2}, {"quantile", 0.5},
                                      {"count_scale", dp.count_scale}, {"next", c * 1.5}};
    st.commit(static_cast<std::uint64_t>(r), m, Model{}, rec, MetricsRow{});
  };
  {
    ServerState st(dir_.path(), 0);
    commit(st, 1, 0.5, true);
    commit(st, 2, 0.75, true);
  }
  const auto r = ServerState(dir_.path(), 0).recover(layout());
  EXPECT_EQ(r.central_dp, spent);
  ASSERT_TRUE(r.clip_norm);
  EXPECT_DOUBLE_EQ(*r.clip_norm, 0.75 * 1.5);
  // C moves, the mechanism does not (gamma C is what the ring was sized for); the count costs.
  const auto moved = std::get<privacy::SkellamSum>(round_mechanism(at_clip_norm(dp, 0.75)));
  const auto first = std::get<privacy::SkellamSum>(round_mechanism(dp));
  EXPECT_NEAR(moved.l2, first.l2, 1e-12 * first.l2);
  EXPECT_NEAR(moved.l1, first.l1, 1e-12 * first.l1);
  EXPECT_EQ(moved.variance, first.variance);
  auto without_count = dp;
  without_count.count_scale = 0;
  privacy::Ledger less;
  less.add(round_mechanism(without_count), 2);
  EXPECT_GT(epsilon_of(r.central_dp, dp.delta), epsilon_of(less, dp.delta));
  std::filesystem::create_directories(dir_ / "uncounted");
  {
    ServerState st(dir_ / "uncounted", 0);
    commit(st, 1, 0.5, false);
  }
  EXPECT_NE(state_error([&] { ServerState(dir_ / "uncounted", 0).recover(layout()); }).find("states no count_scale"),
            std::string::npos);
}

// Silo-level distributed DP, as central DP's above (issue 42): the spend is rebuilt from the
// audit chain's records, committed rounds and a round aborted after its noisy sums were
// unmasked, whatever happened to the checkpoints (the newest one damaged and restored from the
// mirror, or lost); a restarted server with that spend refuses a round past the budget; a
// damaged privacy part stops the start.
TEST_F(RecoveryTest, DistributedDpSpendIsRebuiltFromTheAuditChainAfterADamagedCheckpoint) {
  const auto dp = small_distributed_dp();
  const auto k = signed_part(dp, 11);
  const auto mech = round_mechanism(as_signed(dp, k, dp.padded));
  privacy::Ledger spent;
  auto privacy_part = [&](bool spends, std::uint64_t revealed) {
    if (spends) spent.add(mech, 1);
    auto p = round_privacy_record(dp, k, dp.padded, spent);
    p["sums_revealed"] = revealed;
    return p;
  };
  test::TempDir mirror;
  {
    ServerState st(with_mirror(dir_.path(), mirror.path()));
    for (int r = 1; r <= 3; ++r) {
      const Model m = model(static_cast<float>(r));
      auto rec = record(r, m);
      rec["privacy"] = privacy_part(true, 1);
      st.commit(static_cast<std::uint64_t>(r), m, Model{}, rec, MetricsRow{});
    }
    // Round 4 aborted after its sums were unmasked (spent), round 5 before (nothing).
    st.record({{"event", "round"}, {"round", 4}, {"status", "aborted"}, {"privacy", privacy_part(true, 2)}}, nullptr);
    st.record({{"event", "round"}, {"round", 5}, {"status", "aborted"}, {"privacy", privacy_part(false, 0)}}, nullptr);
  }
  ASSERT_EQ(spent.count(), 4u);
  flip_byte(checkpoint(3), read_file(checkpoint(3)).size() - 2);
  {
    ServerState st(with_mirror(dir_.path(), mirror.path()));
    const auto r = st.recover(layout());
    ASSERT_TRUE(r.model);
    EXPECT_EQ(r.committed_round, 3u);
    EXPECT_FALSE(r.repairs.empty());
    EXPECT_EQ(r.central_dp, spent);
    // The restarted server's budget check: a budget the four rounds nearly fill takes no fifth.
    auto tight = dp;
    tight.epsilon = epsilon_of(spent, dp.delta) * 1.0001;
    EXPECT_FALSE(fits_another_round(tight, r.central_dp));
    tight.epsilon = 40;
    EXPECT_TRUE(fits_another_round(tight, r.central_dp));
  }
  // The newest checkpoint lost with no mirror: the model is missing, the spend is the chain's.
  std::filesystem::remove(checkpoint(3));
  {
    ServerState st(dir_.path(), 0);
    const auto r = st.recover(layout());
    EXPECT_FALSE(r.model);
    EXPECT_EQ(r.central_dp, spent);
  }
  // `xsilo audit verify` composes the same four rounds.
  std::vector<nlohmann::json> records;
  for (const auto& line : lines_of(dir_ / "audit.jsonl")) records.push_back(nlohmann::json::parse(line));
  const auto claims = check_privacy_claims(records);
  ASSERT_TRUE(succeeded(claims));
  EXPECT_EQ(claims->silo_rounds(), 4u);
  // A committed record whose parameters do not hash to its signed setup: no start.
  std::filesystem::create_directories(dir_ / "other");
  {
    ServerState damaged(dir_ / "other", 0);
    auto rec = record(1, model(1.0f));
    rec["privacy"] = round_privacy_record(dp, k, dp.padded, spent);
    rec["privacy"]["variance"] = dp.variance / 4;
    damaged.commit(1, model(1.0f), Model{}, rec, MetricsRow{});
  }
  const auto why = state_error([&] { ServerState(dir_ / "other", 0).recover(layout()); });
  EXPECT_NE(why.find("the privacy spent cannot be rebuilt"), std::string::npos) << why;
  EXPECT_NE(why.find("not the signed setup"), std::string::npos) << why;
}

// Issue 42: the server died between unmasking round 2 and writing its record; its unmask_begun
// record, written before anything was unmasked, is all the log holds of it. The restarted server
// charges round 2 (a budget the two rounds fill admits no third, where round 1 alone would admit
// one) and `xsilo audit verify` counts it; the round then run again under the same number, with
// its own unmask_begun record and its commit, is charged once more, and once.
TEST_F(RecoveryTest, ARoundWhoseUnmaskingBeganIsChargedAfterACrashBeforeItsRecordAndOnceWhereItsRecordFollows) {
  const auto dp = small_distributed_dp();
  const auto k = signed_part(dp, 11);
  const auto mech = round_mechanism(as_signed(dp, k, dp.padded));
  privacy::Ledger spent;
  auto begun = [&](std::uint64_t round) {
    auto if_charged = spent;
    if_charged.add(mech, 1);
    return nlohmann::json{{"event", kUnmaskBegun}, {"round", round},
                          {"privacy", round_privacy_record(dp, k, dp.padded, if_charged)}};
  };
  auto commit = [&](ServerState& st, int r) {
    st.record(begun(static_cast<std::uint64_t>(r)), nullptr);
    spent.add(mech, 1);
    const Model m = model(static_cast<float>(r));
    auto rec = record(r, m);
    rec["privacy"] = round_privacy_record(dp, k, dp.padded, spent);
    rec["privacy"]["sums_revealed"] = 1;
    st.commit(static_cast<std::uint64_t>(r), m, Model{}, rec, MetricsRow{});
  };
  {
    ServerState st(dir_.path(), 0);
    commit(st, 1);
    st.record(begun(2), nullptr);  // and the server dies: round 2's record is never written
  }
  const privacy::Ledger round_one = spent;
  spent.add(mech, 1);
  {
    const auto claims = check_privacy_claims(read_audit_log(dir_ / "audit.jsonl"));
    ASSERT_TRUE(succeeded(claims));
    EXPECT_EQ(claims->silo_rounds(), 2u);
  }
  {
    ServerState st(dir_.path(), 0);
    const auto r = st.recover(layout());
    EXPECT_EQ(r.committed_round, 1u);
    EXPECT_EQ(r.central_dp, spent);
    auto tight = dp;
    tight.epsilon = epsilon_of(spent, dp.delta) * 1.0001;
    EXPECT_FALSE(fits_another_round(tight, r.central_dp));
    EXPECT_TRUE(fits_another_round(tight, round_one));  // uncharged, a third round would start
    st.record({{"event", "federation_start"}, {"first_round", r.last_round + 1}}, nullptr);
    commit(st, 2);
  }
  ASSERT_EQ(spent.count(), 3u);
  ServerState st(dir_.path(), 0);
  EXPECT_EQ(st.recover(layout()).central_dp, spent);
  const auto claims = check_privacy_claims(read_audit_log(dir_ / "audit.jsonl"));
  ASSERT_TRUE(succeeded(claims));
  EXPECT_EQ(claims->silo_rounds(), 3u);
  EXPECT_NEAR(claims->silo_epsilon, epsilon_of(spent, dp.delta), 1e-12);
}

// `xsilo audit verify` on a distributed-DP log says its mode and counts the rounds that spent by
// kind: a committed round, and a round aborted after its sums were unmasked (not "committed").
TEST_F(RecoveryTest, AuditVerifySaysDistributedDpAndCountsAbortedRoundsThatSpentApart) {
  const auto dp = small_distributed_dp();
  const auto setup = signed_part(dp, 11);
  {
    ServerState st(dir_.path(), 0);
    commit_skellam_round_one(st, dp, setup, "u1");
    privacy::Ledger spent;
    spent.add(round_mechanism(as_signed(dp, setup, dp.padded)), 2);
    auto part = round_privacy_record(dp, setup, dp.padded, spent);
    part["sums_revealed"] = 1;  // a group sum was unmasked, then too few updates were left
    st.record({{"event", "round"}, {"round", 2}, {"status", "aborted"}, {"privacy", part}}, nullptr);
  }
  Process p({test::xsilo_bin(), "audit", "verify", (dir_ / "audit.jsonl").string(), "--key", (dir_ / "audit.pub").string()},
            dir_ / "verify.log");
  EXPECT_EQ(p.wait(std::chrono::seconds(30)).value_or(-1), 0) << read_file(dir_ / "verify.log");
  const std::string said = read_file(dir_ / "verify.log");
  EXPECT_NE(said.find("privacy: silo-level distributed DP, 1 committed noised round and 1 aborted round whose unmasking "
                      "began recomposed from their parameters"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("central DP"), std::string::npos) << said;
}

// Issue 42, a server whose code was changed: it signed the silos a setup with a sixteenth of the
// configured variance, and recorded the configured parameters with their own hash. The log alone
// is consistent (the privacy claims verify); `xsilo audit verify --sent` with the silo's
// sent.jsonl, whose lines name the setup it was sent, fails naming the file, the round and both
// hashes, for an upload the record counts and for one an aborted round's record does not. The
// honest silo's file passes; an upload to a round the log has no record of proves nothing.
TEST_F(RecoveryTest, AuditVerifyWithASilosSentLogCatchesARecordOfAnotherSetupThanTheSiloWasSent) {
  const auto setups = weak_setup();
  const auto& dp = setups.dp;
  const auto& configured = setups.configured;
  const auto& weak = setups.weak;
  const std::string recorded = protocol::skellam_sha256(configured, dp.padded);
  const std::string sent_weak = protocol::skellam_sha256(weak, dp.padded);
  {
    ServerState st(dir_.path(), 0);
    auto part = commit_skellam_round_one(st, dp, configured, "u1");
    part["sums_revealed"] = 0;
    st.record({{"event", "round"}, {"round", 2}, {"status", "aborted"}, {"privacy", part}}, nullptr);
  }
  ASSERT_TRUE(succeeded(check_privacy_claims(read_audit_log(dir_ / "audit.jsonl"))));
  auto sent = [&](const char* name, std::vector<std::tuple<int, const char*, std::string>> uploads) {
    std::vector<std::string> lines;
    for (const auto& [round, update, setup] : uploads) {
      lines.push_back(nlohmann::json{{"round", round}, {"update_sha256", update}, {"skellam_setup_sha256", setup}}.dump());
    }
    write_lines(dir_ / name, lines);
    return (dir_ / name).string();
  };
  const auto honest = sent("honest.jsonl", {{1, "u1", recorded}, {2, "u2", recorded}, {3, "u3", recorded}});
  const auto lied_to = sent("lied.jsonl", {{1, "u1", sent_weak}});
  const auto aborted = sent("aborted.jsonl", {{2, "u2", sent_weak}});
  const auto records = read_audit_log(dir_ / "audit.jsonl");
  const auto ok = check_sent_setups(records, honest);
  ASSERT_TRUE(succeeded(ok));
  EXPECT_EQ(ok->compared, 2u);
  EXPECT_EQ(ok->unrecorded, 1u);
  const std::string why = error_text(check_sent_setups(records, aborted));
  EXPECT_NE(why.find("aborted.jsonl line 1, round 2: the silo was sent setup " + sent_weak +
                     ", but the log's record that decides that round's charge names setup " + recorded),
            std::string::npos)
      << why;
  // The command an auditor runs.
  auto verify = [&](std::vector<std::string> sent_files, const std::string& out) {
    std::vector<std::string> argv{test::xsilo_bin(), "audit", "verify", (dir_ / "audit.jsonl").string(), "--key",
                                  (dir_ / "audit.pub").string()};
    for (const auto& f : sent_files) argv.insert(argv.end(), {"--sent", f});
    Process p(argv, dir_ / out);
    return p.wait(std::chrono::seconds(30)).value_or(-1);
  };
  EXPECT_EQ(verify({honest}, "honest.log"), 0) << read_file(dir_ / "honest.log");
  EXPECT_NE(read_file(dir_ / "honest.log").find("2 distributed-DP uploads, each under the setup"), std::string::npos)
      << read_file(dir_ / "honest.log");
  EXPECT_EQ(verify({honest, lied_to}, "lied.log"), 1) << read_file(dir_ / "lied.log");
  const std::string said = read_file(dir_ / "lied.log");
  EXPECT_NE(said.find("FAILED: " + lied_to + " line 1, round 1: the silo was sent setup " + sent_weak +
                      ", but record 1, which counts its upload, names setup " + recorded),
            std::string::npos)
      << said;
}

// Review of issue 42: the server sent the silos a weak setup and wrote round 1's unmask_begun
// naming it, then round 1's commit naming the strong setup, with made-up participant hashes. The
// silo's upload is named only by the unmask_begun, which the commit closes: not what the round was
// charged at, so `--sent` fails on it; the log's claims fail, and the restarted server refuses
// to start (the spend cannot be rebuilt).
TEST_F(RecoveryTest, AnUnmaskBegunNamingTheSetupTheSiloWasSentDoesNotCoverARoundRecordOfAnother) {
  const auto w = weak_setup();
  const std::string sent_weak = protocol::skellam_sha256(w.weak, w.dp.padded);
  {
    ServerState st(dir_.path(), 0);
    privacy::Ledger spent;
    spent.add(round_mechanism(as_signed(w.dp, w.weak, w.dp.padded)), 1);
    st.record({{"event", kUnmaskBegun}, {"round", 1}, {"privacy", round_privacy_record(w.dp, w.weak, w.dp.padded, spent)}},
              nullptr);
    commit_skellam_round_one(st, w.dp, w.configured, "made-up");
  }
  const auto records = read_audit_log(dir_ / "audit.jsonl");
  write_lines(dir_ / "sent.jsonl",
              {nlohmann::json{{"round", 1}, {"update_sha256", "u1"}, {"skellam_setup_sha256", sent_weak}}.dump()});
  const std::string why = error_text(check_sent_setups(records, dir_ / "sent.jsonl"));
  EXPECT_NE(why.find("round 1: the silo was sent setup " + sent_weak +
                     ", but the log's record that decides that round's charge names setup " +
                     protocol::skellam_sha256(w.configured, w.dp.padded) + " (record 2)"),
            std::string::npos)
      << why;
  const auto claims = check_privacy_claims(records);
  ASSERT_FALSE(claims.has_value());
  EXPECT_NE(claims.error().message().find("the unmask_begun record it closes names setup " + sent_weak),
            std::string::npos)
      << claims.error().message();
  const auto refused = state_error([&] { ServerState(dir_.path(), 0).recover(layout()); });
  EXPECT_NE(refused.find("the privacy spent cannot be rebuilt"), std::string::npos) << refused;
  EXPECT_NE(refused.find("the unmask_begun record it closes names setup " + sent_weak), std::string::npos) << refused;
}

// Review of issue 42, item 2: an honest server leaves no round without a record (after a crash
// it runs the same round number again), so a silo's upload to a round the log skips, below its
// last round record, fails `--sent`; one after the last round record proves nothing either way,
// and one to a round aborted before its unmasking has that abort's record.
TEST_F(RecoveryTest, AnUploadToARoundTheLogSkipsBelowItsLastRoundRecordFailsSent) {
  const std::string setup(64, 'a');
  const nlohmann::json part = {{"mechanism", "skellam"}, {"setup_sha256", setup}};
  const std::vector<nlohmann::json> records = {
      {{"event", "federation_start"}},
      {{"event", "round"}, {"round", 1}, {"seq", 2}, {"status", "committed"}, {"privacy", part}},
      {{"event", "round"}, {"round", 3}, {"seq", 3}, {"status", "aborted"}, {"privacy", part}}};
  auto line = [&](int round) {
    return nlohmann::json{{"round", round}, {"update_sha256", "u"}, {"skellam_setup_sha256", setup}}.dump();
  };
  write_lines(dir_ / "ok.jsonl", {line(1), line(3), line(4)});
  const auto ok = check_sent_setups(records, dir_ / "ok.jsonl");
  ASSERT_TRUE(succeeded(ok)) << error_text(ok);
  EXPECT_EQ(ok->compared, 2u);
  EXPECT_EQ(ok->unrecorded, 1u);
  write_lines(dir_ / "gap.jsonl", {line(1), line(2)});
  const std::string why = error_text(check_sent_setups(records, dir_ / "gap.jsonl"));
  EXPECT_NE(why.find("gap.jsonl line 2, round 2: the silo was sent setup " + setup +
                     ", but the log has no record of that round, though it records round 3 after it"),
            std::string::npos)
      << why;
}

// Review of issue 42, item 3: a silo's sent.jsonl is append-only across federations, so a line
// of an earlier federation's round 3 under its own setup is skipped, not compared with this
// log's round 3. Lines that name no federation (written before silos named it) are compared as
// before.
TEST_F(RecoveryTest, SentSkipsLinesOfAnotherFederationThanTheLogs) {
  const std::string now(64, 'a'), before(64, 'b');
  const std::vector<nlohmann::json> records = {
      {{"event", "federation_start"}, {"federation", "fed"}},
      {{"event", "round"}, {"round", 3}, {"seq", 2}, {"status", "aborted"},
       {"privacy", {{"mechanism", "skellam"}, {"setup_sha256", now}}}}};
  auto line = [&](const char* federation, const std::string& setup) {
    nlohmann::json j{{"round", 3}, {"update_sha256", "u"}, {"skellam_setup_sha256", setup}};
    if (federation) j["federation"] = federation;
    return j.dump();
  };
  write_lines(dir_ / "sent.jsonl", {line("old", before), line("fed", now), line(nullptr, now)});
  const auto ok = check_sent_setups(records, dir_ / "sent.jsonl");
  ASSERT_TRUE(succeeded(ok)) << error_text(ok);
  EXPECT_EQ(ok->compared, 2u);
  EXPECT_EQ(ok->other_federation, 1u);
  // Review of issue 42 (h42v), item 3: a log (or a file) of another federation, so that every line
  // is skipped and none compared, fails naming both federations.
  write_lines(dir_ / "old.jsonl", {line("old", before), line("old", now)});
  const std::string none = error_text(check_sent_setups(records, dir_ / "old.jsonl"));
  EXPECT_NE(none.find("old.jsonl: all 2 of its distributed-DP lines name federation \"old\", but the log's "
                      "federation_start records name \"fed\": no line was compared"),
            std::string::npos)
      << none;
  write_lines(dir_ / "unnamed.jsonl", {line(nullptr, before)});
  EXPECT_NE(error_text(check_sent_setups(records, dir_ / "unnamed.jsonl")).find("unnamed.jsonl line 1, round 3"),
            std::string::npos);
}

// A damaged sent.jsonl: a last line cut off mid-append (the silo crashed; its upload never left)
// is skipped and said; a torn line before the end, or a field of the wrong type, is a clear
// failure naming the file and line, never an exception out of the check.
TEST_F(RecoveryTest, SentSkipsATornLastLineAndRefusesOtherDamageByFileAndLine) {
  const std::string setup(64, 'a');
  const std::vector<nlohmann::json> records = {
      {{"event", "federation_start"}, {"federation", "fed"}},
      {{"event", "round"}, {"round", 3}, {"seq", 2}, {"status", "aborted"},
       {"privacy", {{"mechanism", "skellam"}, {"setup_sha256", setup}}}}};
  const std::string good = nlohmann::json{{"round", 3}, {"update_sha256", "u"}, {"skellam_setup_sha256", setup}}.dump();
  atomic_write_file(dir_ / "torn.jsonl", good + "\n" + good.substr(0, good.size() / 2));
  const auto torn = check_sent_setups(records, dir_ / "torn.jsonl");
  ASSERT_TRUE(succeeded(torn)) << error_text(torn);
  EXPECT_EQ(torn->compared, 1u);
  EXPECT_TRUE(torn->torn_last_line);
  atomic_write_file(dir_ / "middle.jsonl", good.substr(0, good.size() / 2) + "\n" + good + "\n");
  EXPECT_NE(error_text(check_sent_setups(records, dir_ / "middle.jsonl")).find("middle.jsonl line 1"), std::string::npos);
  const std::string wrong = nlohmann::json{{"round", "three"}, {"update_sha256", 7}, {"skellam_setup_sha256", setup}}.dump();
  atomic_write_file(dir_ / "wrong.jsonl", wrong + "\n");
  const auto typed = check_sent_setups(records, dir_ / "wrong.jsonl");
  EXPECT_NE(error_text(typed).find("wrong.jsonl line 1: a field of the wrong type"), std::string::npos) << error_text(typed);
}

// Issue 42: "sums_revealed" is the server's own count; a silo's sent.jsonl says, in a line written
// before its unmask shares left, each round in which it released them. `--sent` holds the log to
// it: the round must be charged under the setup the silo released under (a committed round, an
// aborted one that revealed sums or that follows its unmask_begun, or an unmask_begun no round
// record followed). A server that left out the unmask_begun and whose record says it revealed no
// sum after the silos had released their shares fails, naming the silo's file, line and round, as
// does a log that leaves out the round's records.
// A distributed-DP log built record by record as an honest server writes it (federation_start,
// then each round's unmask_begun and round records, charged as the accounting charges them), and
// the lines a silo's sent.jsonl holds for it.
class SkellamLog {
 public:
  explicit SkellamLog(DistributedDpConfig dp)
      : dp_(std::move(dp)), k_(signed_part(dp_, 11)), setup(protocol::skellam_sha256(k_, dp_.padded)),
        mechanism_(round_mechanism(as_signed(dp_, k_, dp_.padded))) {}
  // The round's unmask_begun record; its seq.
  std::uint64_t begun(std::uint64_t round) {
    auto if_charged = spent_;
    if_charged.add(mechanism_, 1);
    records.push_back({{"event", kUnmaskBegun}, {"round", round}, {"seq", ++seq},
                       {"privacy", round_privacy_record(dp_, k_, dp_.padded, if_charged)},
                       {"keys", {{{"silo", "hospital-a"}, {"keys_sha256", keys_of(seq)}}}}});
    return seq;
  }
  void round(std::uint64_t r, const char* status, std::uint64_t revealed) {
    if (std::string(status) == "committed" || revealed > 0) spent_.add(mechanism_, 1);
    auto part = round_privacy_record(dp_, k_, dp_.padded, spent_);
    part["sums_revealed"] = revealed;
    records.push_back({{"event", "round"}, {"round", r}, {"seq", ++seq}, {"status", status}, {"privacy", part},
                       {"participants", nlohmann::json::array({{{"silo", "hospital-a"}, {"update_sha256", "u" + std::to_string(r)}}})}});
  }
  std::string upload(std::uint64_t r) const {
    return nlohmann::json{{"federation", "fed"}, {"round", r}, {"update_sha256", "u" + std::to_string(r)},
                          {"skellam_setup_sha256", setup}}.dump();
  }
  // A release of unmask shares in round `r`; against the unmask_begun record `against` (its seq
  // and the hash `sha`) when `against` is not 0, as silos write since releases name it.
  std::string released(std::uint64_t r, std::uint64_t against = 0, const std::string& sha = "") const {
    nlohmann::json j{{"kind", protocol::kUnmaskSharesReleased}, {"federation", "fed"}, {"round", r},
                     {"skellam_setup_sha256", setup}};
    if (against) j["unmask_begun_seq"] = against, j["unmask_begun_sha256"] = sha, j["keys_sha256"] = keys_of(against);
    return j.dump();
  }
  // hospital-a's keys in the run whose unmask_begun is record `seq` (fresh keys each run).
  static std::string keys_of(std::uint64_t seq) { return std::string(64, static_cast<char>('0' + seq % 10)); }

 private:
  DistributedDpConfig dp_;
  wire::SkellamSetup k_;

 public:
  const std::string setup;
  std::vector<nlohmann::json> records = {{{"event", "federation_start"}, {"federation", "fed"}, {"seq", 1}}};
  std::uint64_t seq = 1;

 private:
  privacy::Mechanism mechanism_;
  privacy::Ledger spent_;
};

TEST_F(RecoveryTest, SentFailsARoundWhoseUnmaskSharesASiloReleasedButTheLogDoesNotCharge) {
  SkellamLog log(small_distributed_dp());
  auto& records = log.records;
  auto& seq = log.seq;
  const std::string& setup = log.setup;
  log.begun(1);
  log.round(1, "committed", 1);
  log.begun(2);
  log.round(2, "aborted", 1);  // a group sum unmasked, then too few updates left: charged
  log.begun(3);                // the log ends while round 3 unmasks: charged
  auto upload = [&](std::uint64_t r) { return log.upload(r); };
  auto released = [&](std::uint64_t r) { return log.released(r); };
  write_lines(dir_ / "sent.jsonl", {upload(1), released(1), upload(2), released(2), upload(3), released(3), upload(4),
                                    released(4)});
  // Round 4's release, after the log's last record: the server writes unmask_begun before it asks
  // for any share, so it fails, naming the file, line and round, unless the log is a live
  // snapshot (--log-may-be-stale), and even then when a federation_end ends the log.
  const std::string stale = error_text(check_sent_setups(records, dir_ / "sent.jsonl"));
  EXPECT_NE(stale.find((dir_ / "sent.jsonl").string() + " line 8, round 4: the silo released its unmask shares under "
                       "setup " + setup + ", but the log has no record of that round (its last record of a round is "
                       "of round 3)"),
            std::string::npos)
      << stale;
  EXPECT_NE(stale.find("--log-may-be-stale"), std::string::npos) << stale;
  const auto honest = check_sent_setups(records, dir_ / "sent.jsonl", {.log_may_be_stale = true, .line_sha256 = {}});
  ASSERT_TRUE(succeeded(honest)) << error_text(honest);
  EXPECT_EQ(honest->releases, 3u);
  EXPECT_EQ(honest->unrecorded, 2u);  // round 4's upload and release: after the log's last record
  auto ended = records;
  ended.push_back({{"event", "federation_end"}, {"federation", "fed"}, {"seq", ++seq}});
  const std::string after_end = error_text(check_sent_setups(ended, dir_ / "sent.jsonl", {.log_may_be_stale = true, .line_sha256 = {}}));
  EXPECT_NE(after_end.find("sent.jsonl line 8, round 4: the silo released its unmask shares under setup " + setup +
                           ", but the log has no record of that round: its federation_end (record " +
                           std::to_string(seq) + ") ends the federation after its last recorded round 3"),
            std::string::npos)
      << after_end;
  // Without round 4's release, the upload after the last record still proves nothing either way.
  write_lines(dir_ / "uploaded.jsonl", {upload(3), released(3), upload(4)});
  const auto uploaded = check_sent_setups(ended, dir_ / "uploaded.jsonl");
  ASSERT_TRUE(succeeded(uploaded)) << error_text(uploaded);
  EXPECT_EQ(uploaded->unrecorded, 1u);

  // Round 2 aborted with no sum revealed (fewer than the threshold answered the unmask request)
  // right after its unmask_begun, written before any share was asked for: charged, and the
  // release passes (the false alarm before the server wrote unmask_begun first).
  auto asked = records;
  asked[4]["privacy"]["sums_revealed"] = 0u;
  const auto too_few = check_sent_setups(asked, dir_ / "sent.jsonl", {.log_may_be_stale = true, .line_sha256 = {}});
  ASSERT_TRUE(succeeded(too_few)) << error_text(too_few);
  EXPECT_EQ(too_few->releases, 3u);
  // The same, but the server left out round 2's unmask_begun: its record says no sum was revealed
  // (and so charges nothing), though the silo had released its shares.
  auto hidden = asked;
  hidden.erase(hidden.begin() + 3);
  const std::string why = error_text(check_sent_setups(hidden, dir_ / "sent.jsonl"));
  EXPECT_NE(why.find((dir_ / "sent.jsonl").string() + " line 4, round 2: the silo released its unmask shares under "
                     "setup " + setup + ", so the server could unmask that round's noisy sum, but the log does not "
                     "charge it: its record that decides the round's charge (record 5) is an aborted round record "
                     "with sums_revealed 0 and no unmask_begun before it, which charges nothing"),
            std::string::npos)
      << why;
  // Round 2's records left out altogether, while round 3's unmasking is recorded: the upload to
  // round 2 proves nothing (the log's last round record is round 1's), the release does.
  auto dropped = records;
  dropped.erase(dropped.begin() + 3, dropped.begin() + 5);
  const std::string gap = error_text(check_sent_setups(dropped, dir_ / "sent.jsonl"));
  EXPECT_NE(gap.find("sent.jsonl line 4, round 2: the silo released its unmask shares under setup " + setup +
                     ", but the log has no record of that round, though it records round 3 after it"),
            std::string::npos)
      << gap;
  // A release under another setup than the one that decides the charge.
  write_lines(dir_ / "other.jsonl", {nlohmann::json{{"kind", protocol::kUnmaskSharesReleased}, {"federation", "fed"},
                                                    {"round", 1}, {"skellam_setup_sha256", std::string(64, 'b')}}.dump()});
  EXPECT_NE(error_text(check_sent_setups(records, dir_ / "other.jsonl")).find("(record 3) names setup " + setup),
            std::string::npos);
}

// Issue 42, the review's remaining finding: one charge covered every run of a round. Since
// 2026-12-06 a release names the unmask_begun record the server showed with its unmask request
// (seq and hash, signed), and `--sent` holds it there: that record, with that hash, the
// unmask_begun of the release's round under its setup, and no other release of the file against
// it. A server that unmasked a round, dropped every connection and ran it again under the same
// record (two noisy sums of nearly the same inputs, one charge) fails; an honest rerun, with an
// unmask_begun of its own, passes.
TEST_F(RecoveryTest, SentHoldsEachReleaseToTheUnmaskBegunRecordItNamesSoEachRunOfARoundIsChargedOnce) {
  SkellamLog log(small_distributed_dp());
  const auto crashed = log.begun(1);  // the server crashed while round 1 unmasked: charged by itself
  const auto rerun = log.begun(1);    // the same round again, after the restart
  log.round(1, "committed", 1);
  std::vector<std::string> hashes(log.seq);
  for (std::size_t i = 0; i < hashes.size(); ++i) hashes[i] = std::string(64, static_cast<char>('a' + i));
  const SentOptions with_hashes{.log_may_be_stale = false, .line_sha256 = hashes};
  const auto file = dir_ / "sent.jsonl";
  write_lines(file, {log.upload(1), log.released(1, crashed, hashes[crashed - 1]), log.released(1, rerun, hashes[rerun - 1])});
  const auto honest = check_sent_setups(log.records, file, with_hashes);
  ASSERT_TRUE(succeeded(honest)) << error_text(honest);
  EXPECT_EQ(honest->releases, 2u);
  EXPECT_EQ(honest->bound, 2u);

  // Both runs against one record: two noisy sums under one charge.
  write_lines(file, {log.released(1, rerun, hashes[rerun - 1]), log.released(1, rerun, hashes[rerun - 1])});
  EXPECT_NE(error_text(check_sent_setups(log.records, file, with_hashes))
                .find(file.string() + " line 2, round 1: the silo released its unmask shares under setup " + log.setup +
                      " against audit record 3, as it did on line 1: two runs of the round under one charge"),
            std::string::npos)
      << error_text(check_sent_setups(log.records, file, with_hashes));
  // A record the log holds with another hash than the one the silo was shown.
  write_lines(file, {log.released(1, rerun, std::string(64, 'f'))});
  EXPECT_NE(error_text(check_sent_setups(log.records, file, with_hashes))
                .find("against audit record 3 with hash " + std::string(64, 'f') + ", but the log's record 3 hashes to " +
                      hashes[2] + ": the server showed the silo another record than the one it kept"),
            std::string::npos);
  // A head of the round record, not of an unmask_begun.
  write_lines(file, {log.released(1, log.seq, hashes[log.seq - 1])});
  EXPECT_NE(error_text(check_sent_setups(log.records, file, with_hashes))
                .find("against audit record 4, which is the round record of round 1, not the unmask_begun of round 1"),
            std::string::npos);
  // Round 2's unmask_begun shown for a release in round 1.
  auto two = log;
  const auto of_two = two.begun(2);
  hashes.push_back(std::string(64, 'z'));
  write_lines(file, {log.released(1, of_two, hashes[of_two - 1])});
  EXPECT_NE(error_text(check_sent_setups(two.records, file, {.log_may_be_stale = false, .line_sha256 = hashes}))
                .find("which is the unmask_begun record of round 2, not the unmask_begun of round 1"),
            std::string::npos);
  // A record past the log's end: a head of a record the server did not keep, or a stale copy.
  write_lines(file, {log.released(2, 9, std::string(64, 'e'))});
  EXPECT_NE(error_text(check_sent_setups(log.records, file, with_hashes))
                .find("against audit record 9, which the log does not hold (it ends at record 4)"),
            std::string::npos);
  const auto stale = check_sent_setups(log.records, file, {.log_may_be_stale = true, .line_sha256 = hashes});
  ASSERT_TRUE(succeeded(stale)) << error_text(stale);
  EXPECT_EQ(stale->unrecorded, 1u);
  // A record of another run (it names other keys of the silo than those it released under), and
  // one that names a member twice (two runs' keys under one charge).
  auto line = nlohmann::json::parse(log.released(1, rerun, hashes[rerun - 1]));
  line["keys_sha256"] = std::string(64, 'k');
  write_lines(file, {line.dump()});
  EXPECT_NE(error_text(check_sent_setups(log.records, file, with_hashes))
                .find("against audit record 3, which does not name the silo's keys of that run (" +
                      std::string(64, 'k') + ") with every member once"),
            std::string::npos);
  // The silo's keys under another member's name.
  line = nlohmann::json::parse(log.released(1, rerun, hashes[rerun - 1]));
  line["silo"] = "hospital-b";
  write_lines(file, {line.dump()});
  EXPECT_NE(error_text(check_sent_setups(log.records, file, with_hashes)).find("does not name the silo's keys"),
            std::string::npos);
  auto twice = log;
  twice.records[rerun - 1]["keys"].push_back({{"silo", "hospital-a"}, {"keys_sha256", std::string(64, 'k')}});
  write_lines(file, {log.released(1, rerun, hashes[rerun - 1])});
  EXPECT_NE(error_text(check_sent_setups(twice.records, file, with_hashes)).find("with every member once"),
            std::string::npos);
}

// Review of issue 42 (h42v), item 1: a server asked the silos for unmask shares without writing
// unmask_begun, then wrote a committed round record whose privacy part names the setup the silos
// were sent but no mechanism (the accounting charges it nothing, and it claims nothing), or
// "central" parameters far cheaper than that setup beside it. `--sent` reads the record's spend
// as the accounting does and finds the release uncharged; the log's claims fail on a record that
// names a setup as anything but its Skellam mechanism. The honest record passes both.
TEST_F(RecoveryTest, SentAndTheClaimsFailARecordNamingTheSetupWithoutItsSkellamMechanism) {
  const auto dp = small_distributed_dp();
  const auto k = signed_part(dp, 11);
  const std::string setup = protocol::skellam_sha256(k, dp.padded);
  privacy::Ledger spent;
  spent.add(round_mechanism(as_signed(dp, k, dp.padded)), 1);
  auto log = [&](const nlohmann::json& part) {
    return std::vector<nlohmann::json>{
        {{"event", "federation_start"}, {"federation", "fed"}, {"seq", 1}},
        {{"event", "round"}, {"round", 1}, {"seq", 2}, {"status", "committed"}, {"privacy", part},
         {"participants", nlohmann::json::array({{{"silo", "hospital-a"}, {"update_sha256", "u1"}}})}}};
  };
  write_lines(dir_ / "sent.jsonl",
              {nlohmann::json{{"federation", "fed"}, {"round", 1}, {"update_sha256", "u1"}, {"skellam_setup_sha256", setup}}.dump(),
               nlohmann::json{{"kind", protocol::kUnmaskSharesReleased}, {"federation", "fed"}, {"round", 1},
                              {"skellam_setup_sha256", setup}}.dump()});
  const auto honest = log(round_privacy_record(dp, k, dp.padded, spent));
  const auto claims = check_privacy_claims(honest);
  ASSERT_TRUE(succeeded(claims)) << error_text(claims);
  const auto ok = check_sent_setups(honest, dir_ / "sent.jsonl");
  ASSERT_TRUE(succeeded(ok)) << error_text(ok);
  EXPECT_EQ(ok->releases, 1u);

  const std::string released = (dir_ / "sent.jsonl").string() + " line 2, round 1: the silo released its unmask "
                               "shares under setup " + setup + ", so the server could unmask that round's noisy sum, "
                               "but the log does not charge it: its record that decides the round's charge (record 2) ";
  const auto bare = log({{"setup_sha256", setup}});
  std::string why = error_text(check_sent_setups(bare, dir_ / "sent.jsonl"));
  EXPECT_NE(why.find(released + "is a committed round record with no distributed-DP (skellam) mechanism, which "
                                "charges nothing"),
            std::string::npos)
      << why;
  why = error_text(check_privacy_claims(bare));
  EXPECT_NE(why.find("record 2 (round 1): its privacy part names setup_sha256 \"" + setup + "\" but no mechanism"),
            std::string::npos)
      << why;

  const auto central = log({{"mechanism", "central"}, {"sample_rate", 0.001}, {"noise_multiplier", 50.0},
                            {"clip_norm", 1.0}, {"delta", 1e-5}, {"epsilon", 0.001}, {"max_epsilon", 10.0},
                            {"rounds_spent", 1}, {"setup_sha256", setup}});
  why = error_text(check_sent_setups(central, dir_ / "sent.jsonl"));
  EXPECT_NE(why.find(released + "is a committed round record with mechanism \"central\", which charges nothing"),
            std::string::npos)
      << why;
  why = error_text(check_privacy_claims(central));
  EXPECT_NE(why.find("record 2 (round 1): its privacy part names setup_sha256 \"" + setup + "\" but mechanism "
                     "\"central\""),
            std::string::npos)
      << why;
}

TEST_F(RecoveryTest, AMirrorRestoresTheLogAndTheCheckpointAndIsKeptUpToDate) {
  test::TempDir mirror;
  {
    ServerState st(with_mirror(dir_.path(), mirror.path()));
    for (int r = 1; r <= 3; ++r) {
      const Model m = model(static_cast<float>(r));
      st.commit(static_cast<std::uint64_t>(r), m, Model{}, record(r, m), MetricsRow{});
    }
  }
  EXPECT_EQ(read_file(mirror / "audit.jsonl"), log_text());
  EXPECT_EQ(read_file(mirror / "audit.pub"), read_file(dir_ / "audit.pub"));
  EXPECT_FALSE(std::filesystem::exists(mirror / "audit.key"));  // the secret stays on its own disk
  // The log emptied and the newest checkpoint bit-flipped: both come back from the mirror.
  const std::string log = log_text();
  atomic_write_file(dir_ / "audit.jsonl", "");
  flip_byte(checkpoint(3), read_file(checkpoint(3)).size() - 2);
  {
    ServerState st(with_mirror(dir_.path(), mirror.path()));
    const auto r = st.recover(layout());
    EXPECT_EQ(r.committed_round, 3u);
    ASSERT_TRUE(r.model);
    EXPECT_EQ(r.model->flat()[0], 3.0f);
    ASSERT_EQ(r.repairs.size(), 2u) << ::testing::PrintToString(r.repairs);
    EXPECT_NE(r.repairs[0].find("restored audit.jsonl from the mirror"), std::string::npos);
    EXPECT_NE(r.repairs[1].find("restored the checkpoint of round 3 from the mirror"), std::string::npos);
    st.record({{"event", "state_repair"}, {"repairs", r.repairs}}, nullptr);
  }
  EXPECT_EQ(log_text().rfind(log, 0), 0u);  // the same history, one record longer
  EXPECT_EQ(read_file(mirror / "audit.jsonl"), log_text());
  // The mirror lagging behind (a disk that was away) is brought up to date.
  auto lines = lines_of(mirror / "audit.jsonl");
  lines.resize(2);
  write_lines(mirror / "audit.jsonl", lines);
  {
    ServerState st(with_mirror(dir_.path(), mirror.path()));
    EXPECT_EQ(st.recover(layout()).repairs.size(), 1u);
  }
  EXPECT_EQ(read_file(mirror / "audit.jsonl"), log_text());
  // Two histories (the mirror's record 2 re-signed differently): refused, naming the record.
  {
    auto key = load_signing_key(dir_ / "audit.key");
    AuditLog other(mirror / "other.jsonl", std::move(key));
    other.append(nlohmann::json::parse(lines_of(dir_ / "audit.jsonl")[0]));
    other.append({{"event", "round"}, {"round", 2}, {"status", "committed"}, {"participants", {{{"silo", "mallory"}}}}});
  }
  std::filesystem::rename(mirror / "other.jsonl", mirror / "audit.jsonl");
  EXPECT_NE(state_error([&] { ServerState st(with_mirror(dir_.path(), mirror.path())); }).find("disagree from record"),
            std::string::npos);
}

// A mirror that fails mid-run (its checkpoints folder a file, a disk away) is never the reason a
// round is lost, and is caught up once it can be written: the checkpoints it missed and the log
// whole at the next write, the checkpoints it lacks at the next start. (It once said "written
// again" when only the log was.) At a start, a mirror the server cannot read may hold the only
// good copy: the start is refused, naming state_mirror.
TEST_F(RecoveryTest, ABrokenMirrorIsCaughtUpOnceItCanBeWritten) {
  test::TempDir mirror;
  {
    ServerState st(with_mirror(dir_.path(), mirror.path()));
    const Model m1 = model(1.0f);
    st.commit(1, m1, Model{}, record(1, m1), MetricsRow{});
    std::filesystem::remove_all(mirror / "checkpoints");
    atomic_write_file(mirror / "checkpoints", "not a folder");
    for (int r = 2; r <= 3; ++r) {
      const Model m = model(static_cast<float>(r));
      st.commit(static_cast<std::uint64_t>(r), m, model(0.5f), record(r, m), MetricsRow{});  // commits
    }
    EXPECT_FALSE(std::filesystem::is_directory(mirror / "checkpoints"));
    // The mirror mended while the server runs: the next record catches it all up.
    std::filesystem::remove(mirror / "checkpoints");
    st.record({{"event", "admin"}, {"action", "pause"}}, nullptr);
    for (int r = 1; r <= 3; ++r) {
      EXPECT_TRUE(std::filesystem::exists(mirror / "checkpoints" / checkpoint(r).filename())) << r;
    }
    EXPECT_TRUE(std::filesystem::exists(mirror / "checkpoints" / checkpoint(3).filename().replace_extension(".opt")));
    EXPECT_EQ(read_file(mirror / "audit.jsonl"), log_text());
  }
  // Broken at a start: refused, naming the key; the folder is untouched.
  const std::string log = log_text();
  std::filesystem::rename(mirror / "checkpoints", mirror / "checkpoints.saved");
  atomic_write_file(mirror / "checkpoints", "not a folder");
  const auto why = state_error([&] { ServerState st(with_mirror(dir_.path(), mirror.path())); });
  EXPECT_NE(why.find("state_mirror " + mirror.path().string() + ": "), std::string::npos) << why;
  EXPECT_NE(why.find("remove state_mirror from the config"), std::string::npos) << why;
  EXPECT_EQ(log_text(), log);
  std::filesystem::remove(mirror / "checkpoints");
  std::filesystem::rename(mirror / "checkpoints.saved", mirror / "checkpoints");
  // Checkpoints the mirror missed in an earlier run come back at the next start, and the
  // mirror's own copies are never overwritten by the folder's.
  std::filesystem::remove(mirror / "checkpoints" / checkpoint(2).filename());
  const std::string mirrors_three = read_file(mirror / "checkpoints" / checkpoint(3).filename());
  flip_byte(checkpoint(3), read_file(checkpoint(3)).size() - 2);
  {
    ServerState st(with_mirror(dir_.path(), mirror.path()));
    EXPECT_TRUE(std::filesystem::exists(mirror / "checkpoints" / checkpoint(2).filename()));
    EXPECT_EQ(read_file(mirror / "checkpoints" / checkpoint(3).filename()), mirrors_three);
    const auto r = st.recover(layout());  // round 3 from the mirror's good copy
    EXPECT_EQ(r.committed_round, 3u);
    ASSERT_TRUE(r.model);
    EXPECT_EQ(r.model->flat()[0], 3.0f);
  }
}

TEST_F(RecoveryTest, ATornLastLineIsCutAndKeptAsideAndTheRepairSaidSo) {
  commit_rounds(2);
  const std::string intact = log_text();
  append_durable(dir_ / "audit.jsonl", "{\"seq\":3,\"prev\":\"ab");  // a full disk mid-append
  ServerState st(dir_.path(), 0);
  const auto r = st.recover(layout());
  EXPECT_EQ(r.committed_round, 2u);
  EXPECT_EQ(log_text(), intact);
  ASSERT_EQ(r.repairs.size(), 1u);
  EXPECT_NE(r.repairs[0].find("cut a torn last line of 19 bytes"), std::string::npos) << r.repairs[0];
  bool kept = false;
  for (const auto& e : std::filesystem::directory_iterator(dir_.path())) {
    kept = kept || (e.path().filename().string().rfind("audit.torn.", 0) == 0 && read_file(e.path()) == "{\"seq\":3,\"prev\":\"ab");
  }
  EXPECT_TRUE(kept);
  // A line appended after a torn one starts a line of its own (a full disk during this run).
  append_durable(dir_ / "audit.jsonl", "{\"torn");
  st.record({{"event", "state_repair"}, {"repairs", r.repairs}}, nullptr);
  EXPECT_TRUE(verify_audit_log(dir_ / "audit.jsonl", st.audit().public_key()).has_value());
}

TEST_F(RecoveryTest, ALostLogOrKeyIsNeverReplacedByANewHistory) {
  commit_rounds(3);
  const std::string pub = read_file(dir_ / "audit.pub");
  // The key deleted: no new key, audit.pub untouched.
  std::filesystem::rename(dir_ / "audit.key", dir_ / "audit.key.saved");
  auto why = state_error([&] { ServerState st(dir_.path(), 0); });
  EXPECT_NE(why.find("audit.key is missing while audit.jsonl exists"), std::string::npos) << why;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "audit.key"));
  EXPECT_EQ(read_file(dir_ / "audit.pub"), pub);
  std::filesystem::rename(dir_ / "audit.key.saved", dir_ / "audit.key");
  // audit.pub replaced by another server's: named as what changed (it once blamed the log).
  atomic_write_file(dir_ / "audit.pub", key_hex(crypto::SigningKey::generate().public_key()) + "\n");
  why = state_error([&] { ServerState st(dir_.path(), 0); });
  EXPECT_NE(why.find("audit.jsonl, and audit.key ("), std::string::npos) << why;
  EXPECT_NE(why.find("signed all 3: audit.pub was replaced. Restore it from a backup or the mirror"), std::string::npos)
      << why;
  atomic_write_file(dir_ / "audit.pub", pub);
  // The log deleted or emptied while checkpoints exist.
  const std::string log = log_text();
  for (const std::string how : {"deleted", "emptied"}) {
    if (how == "deleted") std::filesystem::remove(dir_ / "audit.jsonl");
    if (how == "emptied") atomic_write_file(dir_ / "audit.jsonl", "");
    why = state_error([&] { ServerState st(dir_.path(), 0); });
    EXPECT_NE(why.find("audit.jsonl is missing but checkpoints of rounds 1..3 exist"), std::string::npos) << why;
  }
  atomic_write_file(dir_ / "audit.jsonl", log);
  // Records cut from the end: those a checkpoint carries come back from it (each checkpoint
  // keeps its round's signed record); a record no checkpoint carries (an aborted round's) leaves a
  // gap the newer checkpoint shows, and the server refuses.
  cut_log(1);
  {
    ServerState st(dir_.path(), 0);
    const auto r = st.recover(layout());
    EXPECT_EQ(r.committed_round, 3u);
    EXPECT_EQ(r.repairs.size(), 2u) << ::testing::PrintToString(r.repairs);
    st.record({{"event", "round"}, {"round", 4}, {"status", "aborted"}}, nullptr);
    const Model m5 = model(5.0f);
    st.commit(5, m5, Model{}, record(5, m5), MetricsRow{});
  }
  const std::string longer = log_text();
  cut_log(3);
  why = state_error([&] { ServerState(dir_.path(), 0).recover(layout()); });
  EXPECT_NE(why.find("carries audit record 5, but audit.jsonl has only 3 records"), std::string::npos) << why;
  atomic_write_file(dir_ / "audit.jsonl", longer);
  // A damaged record in the middle, no mirror.
  auto lines = lines_of(dir_ / "audit.jsonl");
  lines[1][lines[1].size() / 2] ^= 1;
  write_lines(dir_ / "audit.jsonl", lines);
  why = state_error([&] { ServerState st(dir_.path(), 0); });
  EXPECT_NE(why.find("audit.jsonl is damaged"), std::string::npos) << why;
  EXPECT_NE(why.find("no state_mirror is set"), std::string::npos) << why;
  atomic_write_file(dir_ / "audit.jsonl", log);
  // A key that is not the one the log is signed with.
  save_signing_key(crypto::SigningKey::generate(), dir_ / "audit.key", dir_ / "other.pub");
  why = state_error([&] { ServerState st(dir_.path(), 0); });
  EXPECT_NE(why.find("is not the key"), std::string::npos) << why;
}

TEST_F(RecoveryTest, OneServerPerStateFolderAndAFileIsNotAFolder) {
  ServerState first(dir_.path(), 0);
  EXPECT_NE(state_error([&] { ServerState second(dir_.path(), 0); }).find("another xsilo server"), std::string::npos);
  atomic_write_file(dir_ / "afile", "x");
  EXPECT_NE(state_error([&] { ServerState st(dir_ / "afile", 0); }).find("is a file, not a folder"), std::string::npos);
}

TEST_F(RecoveryTest, ASiloWitnessIsCheckedAgainstTheLog) {
  commit_rounds(3);
  ServerState st(dir_.path(), 0);
  const auto key = st.audit().public_key();
  const auto lines = lines_of(dir_ / "audit.jsonl");
  EXPECT_EQ(error_text(st.check_witness("h1", 2, crypto::sha256_hex(lines[1]), key)), "");
  EXPECT_NE(error_text(st.check_witness("h1", 5, std::string(64, 'a'), key)).find("has only 3 records"),
            std::string::npos);
  EXPECT_NE(error_text(st.check_witness("h1", 2, std::string(64, 'a'), key)).find("rewritten or forked"),
            std::string::npos);
  EXPECT_NE(error_text(st.check_witness("h1", 2, crypto::sha256_hex(lines[1]), crypto::SigningKey::generate().public_key()))
                .find("does not hold the history"),
            std::string::npos);
}

}  // namespace
}  // namespace xsilo::server
