// The signed, hash-chained audit log (JSON Lines). Each record is one JSON object with
//   "seq":  1, 2, 3, ... (no gaps)
//   "prev": SHA-256 (hex) of the previous record's full line, 64 zeros for the first
//   "sig":  Ed25519 signature (hex) by the server's audit key
// and the event's own fields. The signed bytes are the line with its final
// `,"sig":"<128 hex>"}` replaced by `}`: byte-exact, so any JSON library can check a record.
//
// The key may change only by a rotation record, signed by the key before it:
//   {"event": "key_rotation", "next_public_key": HEX, "rotation_signature": HEX, ...}
// every record after it is signed by the next key. `rotation_signature` is the old key's
// signature over key_rotation_statement(old, next), which silos check without the log
// (protocol::AuditKey carries the chain to them). A verifier starts from the first key
// (audit.pub, which is never overwritten) and follows the chain.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "crypto/sign.h"

namespace xsilo::server {

// A key of the log and the first record it signs (the first key: record 1).
struct AuditKeySpan {
  std::string public_key;  // 32 raw bytes
  std::uint64_t from_seq = 1;
  std::string rotation_signature;  // the previous key's, over key_rotation_statement (raw); "" for the first
};

// The part of a log that verified: its first `records` records, each line's hash, and the keys
// that signed them (the first key, then each rotation's next key).
struct AuditChain {
  std::uint64_t records = 0;
  std::string head_sha256;               // hash of the last good line (64 zeros when none)
  std::vector<std::string> line_sha256;  // hash of each good line, record 1 first
  std::vector<AuditKeySpan> keys;
  bool has_key(const std::string& public_key) const;
};
// Where a log stops verifying, and what verified before it.
struct AuditBreak {
  std::string reason;
  std::uint64_t first_bad = 0;  // 1-based line of the first bad record, 0 when no record is at fault
  AuditChain verified;          // the records before it
  const std::string& message() const { return reason; }
};
// The whole log verified, or where it breaks.
using AuditVerifyResult = Result<AuditChain, AuditBreak>;
// The records that verified, whether or not the whole log did.
inline const AuditChain& verified_part(const AuditVerifyResult& r) { return r ? *r : r.error().verified; }

// Checks the whole chain, starting with `public_key` (32 raw bytes) and following rotations.
AuditVerifyResult verify_audit_log(const std::filesystem::path& path, const std::string& public_key);

// A key's fingerprint as witness files and messages name it: its 64 hex characters.
std::string key_hex(const std::string& public_key);

// A point of the log the server vouches for: record `seq`'s line hashes to `sha256`, and
// `signature` (hex) is the audit key's over protocol::audit_head_statement(seq, sha256) (the
// statements silos check: protocol/audit_key.h). The server sends
// one to each silo of a round with its RoundEnd; silos keep them (STATE_DIR/audit_heads.jsonl),
// so a log whose tail was cut, or that was rewritten or forked, shows against any one silo's.
struct AuditHead {
  std::uint64_t seq = 0;
  std::string sha256;
  std::string signature;
  std::string line;  // the record's line itself, where the store returns it (ServerState::record)
};

// A witness file consistent with the log: how many of its entries matched, and how many proved
// nothing (with where the first of those is); or, as the error, the first entry that contradicts it.
struct WitnessCheck {
  std::uint64_t checked = 0;  // witness entries that match the log
  std::uint64_t ignored = 0;  // entries not signed by the key (forged on the way, or damaged): no evidence
  std::string first_ignored;  // where the first of those is, and why
};
using WitnessResult = Result<WitnessCheck>;
// Checks a silo's witness file (JSON lines with "seq", "head", "sig" and "key", the hex public
// key the silo checked the head under) against a verified log:
// - an entry whose "key" is not one of the log's keys fails the check: the silo witnessed
//   another log (another server's, or one started again in a wiped state folder);
// - every entry signed by one of the log's keys must name a record the log has, with that hash;
// - entries no key of the log signed prove nothing either way (written before silos checked
//   heads: an edge could have injected them) and are counted; but a file in which no entry at
//   all is signed by the log's keys fails: it witnessed another log.
WitnessResult check_witness(const AuditChain& log, const std::filesystem::path& witness);

// Distributed DP, the silos' side (docs/privacy.md): each upload's line of a silo's sent.jsonl names
// the Skellam setup it was sent ("skellam_setup_sha256", the hash of the part the server signed),
// and the log must record that upload under that setup:
// - a round record that counts the upload (its update_sha256 among the participants) must name
//   the same setup_sha256;
// - an upload no record counts (an aborted round, a crash) needs some record of its round (the
//   round's, or its unmask_begun) naming that setup, when the log has any record of that round.
// The first line that fails is the error, naming the file, the round and both hashes; an upload to
// a round the log has no record of proves nothing either way (the server may have stopped before
// unmasking anything) and is counted.
// A line that says the silo released its unmask shares in a round (kind
// protocol::kUnmaskSharesReleased, written before the shares left) needs that round charged under
// its setup: the record that decides a run of the round (as above) must name the setup and spend
// (a committed round record, an aborted one with sums_revealed > 0 or right after its round's
// unmask_begun, or an unmask_begun no round record followed); "sums_revealed" is the server's own
// count, and this is the silo's. An honest server writes unmask_begun before it asks for shares,
// so every round a silo released shares in is charged, aborted or not. A release
// in a round the log has no record of fails: the server writes the round's unmask_begun before it
// asks for any share, so it deviated or this copy of the log predates the release. With
// log_may_be_stale (a live snapshot of the log) a release after the log's last record of a round
// is counted in `unrecorded` instead, unless a federation_end (no federation_start or
// operator_resume after it) ends the log: then no later round can have been recorded. An upload
// (sent before its round's unmask_begun) after the log's last round record proves nothing.
// A release that names its record ("unmask_begun_seq" and "unmask_begun_sha256": the signed head
// the server sent with the unmask request, since 2026-12-06) is held to that record: in the log
// with that hash, the unmask_begun of its round under its setup, readable (so charged once), and
// named by no other release line of the file (a second run of a round under one charge fails).
struct SentCheck {
  std::uint64_t compared = 0;    // uploads whose setup the log's records of their round name
  std::uint64_t releases = 0;    // releases of unmask shares whose round the log charges
  std::uint64_t bound = 0;       // of them, releases held to the unmask_begun record they name, each its own
  // Uploads to rounds after the log's last round record, and (log_may_be_stale) releases after its
  // last record of a round.
  std::uint64_t unrecorded = 0;
  std::uint64_t other_federation = 0;  // lines of another federation than the log's (skipped)
  bool torn_last_line = false;  // a last line cut off mid-append (the silo crashed): skipped
};
using SentResult = Result<SentCheck>;
struct SentOptions {
  bool log_may_be_stale = false;  // the log is a live snapshot: a release after its last record is not a failure
  // The verified chain's line hashes (AuditChain::line_sha256, record 1 first): a release names the
  // signed head of its unmask_begun, whose hash must be the log's. Empty: hashes not compared.
  std::vector<std::string> line_sha256;
};
SentResult check_sent_setups(const std::vector<nlohmann::json>& records, const std::filesystem::path& sent,
                             const SentOptions& options = {});

// Reads the records (signature not checked); throws std::runtime_error on unparsable lines.
std::vector<nlohmann::json> read_audit_log(const std::filesystem::path& path);

// Record-level privacy in the log (docs/privacy.md): every participant's "privacy" spend, silo by
// silo in the log's order, recomposed by the accountant from the recorded parameters. A record
// fails when its claimed epsilon is below what the parameters of that silo's rounds so far give
// (the silo may claim more: rounds whose update left it but that the log does not count), or
// above the silo's own max_epsilon, or when a spend cannot be read.
struct PrivacyAudit {
  std::uint64_t spends = 0;         // participant spends checked
  std::map<std::string, double> epsilon;  // each silo's recomputed epsilon at its last record's delta
  // Silo-level DP: "central", "distributed" (or "central and distributed" for a log with both;
  // "" where no record states a silo-level mechanism), and the rounds that spent, by kind:
  std::string silo_mode;
  std::uint64_t silo_committed = 0;   // committed rounds
  std::uint64_t silo_aborted = 0;     // aborted rounds whose unmasking began or sums were unmasked
  std::uint64_t silo_interrupted = 0; // unmask_begun records no record of their round closed
  double silo_epsilon = 0;            // their recomputed epsilon at the last record's delta
  std::uint64_t silo_rounds() const { return silo_committed + silo_aborted + silo_interrupted; }
};
// Record level: each silo's claims recomposed from its recorded DP-SGD parameters. Silo level
// (either mode): every round that spent (silo_level_mechanism_of, UnmaskingWatch) recomposed from
// its recorded parameters, in the log's order; a record claiming less epsilon than they give, or
// more than its own max_epsilon allows, fails (the error names the first such record), and so does
// a distributed-DP record whose parameters are not the setup it names (SetupMismatch).
Result<PrivacyAudit> check_privacy_claims(const std::vector<nlohmann::json>& records);

class AuditLog {
 public:
  // Opens (or creates) the log. An existing log must verify from `first_key` (audit.pub; empty:
  // `key`'s own) through its rotations, and `key` must be the key its last record names: a
  // server never appends to a damaged chain, nor with another key. Throws std::runtime_error
  // naming the first bad record.
  AuditLog(std::filesystem::path path, crypto::SigningKey key, std::string first_key = {});

  // The line append(record) would write next: seq, prev and sig filled in, signed. A
  // checkpoint keeps it, so recovery appends exactly what was signed, after checking it.
  std::string seal(nlohmann::json record) const;
  // Appends a sealed line durably (fsync) after checking that it verifies under this log's key
  // and chains to its head; throws std::runtime_error (appending nothing) otherwise.
  AuditHead append_line(const std::string& line);
  AuditHead append(nlohmann::json record) { return append_line(seal(std::move(record))); }
  // The head now, signed.
  AuditHead signed_head() const;

  // Appends the rotation record (signed by the key now) and signs with `next` from then on.
  AuditHead rotate(crypto::SigningKey next, nlohmann::json fields);

  std::uint64_t size() const { return seq_; }
  const std::string& head() const { return head_; }
  const std::filesystem::path& path() const { return path_; }
  std::string public_key() const { return key_.public_key(); }
  // The keys of the log, the first one first (the last signs now).
  const std::vector<AuditKeySpan>& keys() const { return keys_; }
  // The SHA-256 of record `seq`'s line ("" past the head); kept for every record (32 bytes of
  // hex each), so that a silo's witnessed head can be checked at its join.
  std::string line_sha256(std::uint64_t seq) const { return seq >= 1 && seq <= lines_.size() ? lines_[seq - 1] : ""; }

 private:
  std::filesystem::path path_;
  crypto::SigningKey key_;
  std::uint64_t seq_ = 0;
  std::string head_;
  std::vector<AuditKeySpan> keys_;
  std::vector<std::string> lines_;
};

// The audit key on disk: the secret as hex text (0600), the public key beside it (0644).
crypto::SigningKey load_signing_key(const std::filesystem::path& path);
void save_signing_key(const crypto::SigningKey& key, const std::filesystem::path& secret_path,
                      const std::filesystem::path& public_path);
std::string load_public_key(const std::filesystem::path& path);

}  // namespace xsilo::server
