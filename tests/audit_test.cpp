// The audit log catches every kind of tampering and names the first bad record.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "common/fs.h"
#include "crypto/hash.h"
#include "common/safetensors.h"
#include "server/audit.h"
#include "server/metrics.h"
#include "server/state.h"
#include "tests/testlib.h"

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
  EXPECT_TRUE(r.ok) << r.reason;
  EXPECT_EQ(r.records, 5u);
}

TEST_F(AuditTest, EditedRecordIsCaught) {
  auto l = lines_;
  l[2].replace(l[2].find("\"round\":3"), 9, "\"round\":9");
  auto r = verify_with(l);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.first_bad, 3u);
  EXPECT_NE(r.reason.find("signature"), std::string::npos);
}

TEST_F(AuditTest, DeletedRecordIsCaught) {
  auto l = lines_;
  l.erase(l.begin() + 1);
  auto r = verify_with(l);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.first_bad, 2u);
}

TEST_F(AuditTest, InsertedRecordIsCaught) {
  auto l = lines_;
  l.insert(l.begin() + 3, l[1]);  // a replayed, validly signed record
  auto r = verify_with(l);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.first_bad, 4u);
}

TEST_F(AuditTest, ReorderedRecordsAreCaught) {
  auto l = lines_;
  std::swap(l[3], l[4]);
  auto r = verify_with(l);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.first_bad, 4u);
}

TEST_F(AuditTest, TruncatedLineAndForeignKeyAreCaught) {
  auto l = lines_;
  l[4] = l[4].substr(0, l[4].size() - 10);
  EXPECT_EQ(verify_with(l).first_bad, 5u);
  write_lines(dir_ / "t.jsonl", lines_);
  EXPECT_FALSE(verify_audit_log(dir_ / "t.jsonl", crypto::SigningKey::generate().public_key()).ok);
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
    for (const auto& h : hs) s += nlohmann::json{{"seq", h.seq}, {"head", h.sha256}, {"sig", h.signature}}.dump() + "\n";
    atomic_write_file(d / "heads.jsonl", s);
    return d / "heads.jsonl";
  };
  const auto full = verify_audit_log(d / "audit.jsonl", pub_);
  ASSERT_TRUE(full.ok);
  auto w = check_witness(full, witness({heads[1], heads[4]}), pub_);
  EXPECT_TRUE(w.ok) << w.reason;
  EXPECT_EQ(w.checked, 2u);

  // The tail cut: the shorter log verifies by itself, the witness of record 5 does not.
  auto lines = lines_of(d / "audit.jsonl");
  lines.pop_back();
  write_lines(d / "cut.jsonl", lines);
  const auto cut = verify_audit_log(d / "cut.jsonl", pub_);
  ASSERT_TRUE(cut.ok);
  w = check_witness(cut, witness({heads[1], heads[4]}), pub_);
  EXPECT_FALSE(w.ok);
  EXPECT_NE(w.reason.find("tail was cut"), std::string::npos) << w.reason;

  // A fork: the same key re-signs a log whose round 3 lists another participant.
  {
    AuditLog fork(d / "fork.jsonl", load_signing_key(dir_ / "k"));
    for (int r = 1; r <= 5; ++r) {
      fork.append({{"event", "round"}, {"round", r}, {"participants", {r == 3 ? "mallory" : "a"}}});
    }
  }
  const auto forked = verify_audit_log(d / "fork.jsonl", pub_);
  ASSERT_TRUE(forked.ok);
  w = check_witness(forked, witness({heads[1]}), pub_);
  EXPECT_TRUE(w.ok) << w.reason;  // records 1-2 are the same in both
  w = check_witness(forked, witness({heads[1], heads[4]}), pub_);
  EXPECT_FALSE(w.ok);
  EXPECT_NE(w.reason.find("rewritten or forked"), std::string::npos) << w.reason;

  // A witness entry with a made-up head (an edge's forgery on the way to the silo) is no
  // evidence: it is counted and ignored, and neither discredits an honest log nor hides a cut.
  AuditHead forged = heads[4];
  forged.sha256 = std::string(64, 'a');
  w = check_witness(full, witness({forged, heads[1]}), pub_);
  EXPECT_TRUE(w.ok) << w.reason;
  EXPECT_EQ(w.ignored, 1u);
  EXPECT_EQ(w.checked, 1u);
  EXPECT_NE(w.first_ignored.find("not signed by this audit key"), std::string::npos) << w.first_ignored;
  w = check_witness(cut, witness({forged, heads[4]}), pub_);
  EXPECT_FALSE(w.ok);
  EXPECT_NE(w.reason.find("tail was cut"), std::string::npos) << w.reason;
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
  EXPECT_TRUE(verify_audit_log(d / "audit.jsonl", pub_).ok);
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
  EXPECT_TRUE(verify_audit_log(dir_ / "audit.jsonl", st.audit().public_key()).ok);
}

// Found by the kill storm (issue 17): a server killed after appending a round's record and
// before its metrics row left metrics.csv without that committed round for good; the sim,
// which follows metrics.csv, never counted it. Recovery now appends the rows the log has and
// metrics.csv lacks, from the records, once.
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
  // A checkpoint whose model is not the one its (intact) signed record names: not trusted.
  commit_rounds(0);
  Metadata meta1;
  Model m1 = load_safetensors(checkpoint(1), &meta1);
  m1.flat()[0] = 42;
  save_safetensors(checkpoint(1), m1, meta1);
  ServerState st(dir_.path(), 0);
  const auto r = st.recover(layout());
  EXPECT_EQ(r.committed_round, 0u);  // round 1's model is not the one the log records
  EXPECT_FALSE(r.model.has_value());
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
  EXPECT_EQ(r.committed_round, 1u);  // round 2's momentum is not the one its record names
  ASSERT_TRUE(r.optimizer_state);
  EXPECT_EQ(r.optimizer_state->flat()[0], 0.5f);
}

}  // namespace
}  // namespace xsilo::server
