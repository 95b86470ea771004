// The signed, hash-chained audit log (JSON Lines). Each record is one JSON object with
//   "seq":  1, 2, 3, ... (no gaps)
//   "prev": SHA-256 (hex) of the previous record's full line, 64 zeros for the first
//   "sig":  Ed25519 signature (hex) by the server's audit key
// and the event's own fields. The signed bytes are the line with its final
// `,"sig":"<128 hex>"}` replaced by `}`: byte-exact, so any JSON library can check a record.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "crypto/sign.h"

namespace xsilo::server {

struct AuditVerifyResult {
  bool ok = false;
  std::uint64_t records = 0;          // records that verified
  std::uint64_t first_bad = 0;        // 1-based line of the first bad record, 0 if none
  std::string reason;
  std::string head_sha256;            // hash of the last good line
  std::vector<std::string> line_sha256;  // hash of each good line, record 1 first
};

// Checks the whole chain with `public_key` (32 raw bytes).
AuditVerifyResult verify_audit_log(const std::filesystem::path& path, const std::string& public_key);

// A point of the log the server vouches for: record `seq`'s line hashes to `sha256`, and
// `signature` (hex) is the audit key's over audit_head_statement(seq, sha256). The server sends
// one to each silo of a round with its RoundEnd; silos keep them (STATE_DIR/audit_heads.jsonl),
// so a log whose tail was cut, or that was rewritten or forked, shows against any one silo's.
struct AuditHead {
  std::uint64_t seq = 0;
  std::string sha256;
  std::string signature;
};
std::string audit_head_statement(std::uint64_t seq, const std::string& sha256);

struct WitnessResult {
  bool ok = false;
  std::uint64_t checked = 0;  // witness entries that match the log
  std::uint64_t ignored = 0;  // entries not signed by the key (forged on the way, or damaged): no evidence
  std::string first_ignored;  // where the first of those is, and why
  std::string reason;
};
// Checks a silo's witness file (JSON lines with "seq", "head", "sig") against a verified log:
// every entry signed by the audit key `public_key` must name a record the log has, with that
// hash. Entries the key did not sign prove nothing either way and are counted, not held against
// the log (an edge could otherwise inject one to discredit an honest log).
WitnessResult check_witness(const AuditVerifyResult& log, const std::filesystem::path& witness,
                            const std::string& public_key);

// Reads the records (signature not checked); throws std::runtime_error on unparsable lines.
std::vector<nlohmann::json> read_audit_log(const std::filesystem::path& path);

class AuditLog {
 public:
  // Opens (or creates) the log. An existing log must verify under `key`: a server never
  // appends to a damaged chain. Throws std::runtime_error naming the first bad record.
  AuditLog(std::filesystem::path path, crypto::SigningKey key);

  // The line append(record) would write next: seq, prev and sig filled in, signed. A
  // checkpoint keeps it, so recovery appends exactly what was signed, after checking it.
  std::string seal(nlohmann::json record) const;
  // Appends a sealed line durably (fsync) after checking that it verifies under this log's key
  // and chains to its head; throws std::runtime_error (appending nothing) otherwise.
  AuditHead append_line(const std::string& line);
  AuditHead append(nlohmann::json record) { return append_line(seal(std::move(record))); }
  // The head now, signed.
  AuditHead signed_head() const;

  std::uint64_t size() const { return seq_; }
  const std::string& head() const { return head_; }
  const std::filesystem::path& path() const { return path_; }
  std::string public_key() const { return key_.public_key(); }

 private:
  std::filesystem::path path_;
  crypto::SigningKey key_;
  std::uint64_t seq_ = 0;
  std::string head_;
};

// The audit key on disk: the secret as hex text (0600), the public key beside it (0644).
crypto::SigningKey load_signing_key(const std::filesystem::path& path);
void save_signing_key(const crypto::SigningKey& key, const std::filesystem::path& secret_path,
                      const std::filesystem::path& public_path);
std::string load_public_key(const std::filesystem::path& path);

}  // namespace xsilo::server
