// The audit log catches every kind of tampering and names the first bad record.
#include <gtest/gtest.h>

#include <fstream>

#include "common/fs.h"
#include "crypto/hash.h"
#include "server/audit.h"
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

}  // namespace
}  // namespace xsilo::server
