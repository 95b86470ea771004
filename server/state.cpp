#include "server/state.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <sodium.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "common/fs.h"
#include "common/safetensors.h"
#include "crypto/hash.h"
#include "server/metrics.h"
#include "server/round_record.h"
#include "server/state_files.h"

namespace xsilo::server {

namespace detail {

std::string round_file(std::uint64_t round) {
  char name[64];
  std::snprintf(name, sizeof name, "round_%06llu.safetensors", static_cast<unsigned long long>(round));
  return name;
}

std::vector<std::pair<std::uint64_t, std::filesystem::path>> list_checkpoints(const std::filesystem::path& dir) {
  std::vector<std::pair<std::uint64_t, std::filesystem::path>> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    // round_NNNNNN.safetensors, at least six digits
    const std::string name = e.path().filename().string();
    const std::string prefix = "round_", suffix = ".safetensors";
    if (name.size() < prefix.size() + 6 + suffix.size() || name.rfind(prefix, 0) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 18) continue;
    out.emplace_back(std::stoull(digits), e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string short_sha(const std::string& s) { return s.empty() ? std::string("none") : s.substr(0, 12); }

}  // namespace detail

namespace {

using detail::list_checkpoints;
using detail::round_file;
using detail::short_sha;

bool nonempty_file(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec) && std::filesystem::file_size(p, ec) > 0;
}

}  // namespace

std::uint64_t checkpoint_round(const std::filesystem::path& path) {
  Metadata meta;
  load_safetensors(path, &meta);
  return std::stoull(meta.at("xsilo.round"));
}

ServerState::ServerState(StateOptions opts) : opts_(std::move(opts)) {
  const auto& dir = opts_.dir;
  for (const auto& [folder, what] : {std::pair{dir, "state_dir"}, std::pair{opts_.mirror, "state_mirror"}}) {
    std::error_code ec;
    if (!folder.empty() && std::filesystem::exists(folder, ec) && !std::filesystem::is_directory(folder, ec)) {
      throw StateError(std::string(what) + " " + folder.string() + ": is a file, not a folder");
    }
  }
  try {
    std::filesystem::create_directories(dir / "checkpoints");
  } catch (const std::exception& e) {
    throw StateError("state_dir " + dir.string() + ": " + e.what());
  }
  if (!opts_.mirror.empty()) {
    // At a start the mirror may hold the only good copy of what the folder lost: a server that
    // cannot read it does not start beside it (one that fails mid-run goes on, and catches up).
    try {
      std::filesystem::create_directories(opts_.mirror / "checkpoints");
    } catch (const std::exception& e) {
      throw StateError("state_mirror " + opts_.mirror.string() + ": " + e.what() +
                       ": mend it (a folder this server can write) or remove state_mirror from the config; a server "
                       "does not start beside a mirror it cannot read, which may hold the only good copy");
    }
  }
  // One server per state folder: a second one would sign a second history beside the first.
  lock_.fd = ::open((dir / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_.fd < 0 || ::flock(lock_.fd, LOCK_EX | LOCK_NB) != 0) {
    throw StateError("state_dir " + dir.string() +
                     ": another xsilo server (or `xsilo audit rotate-key`) is using this state folder; stop it first");
  }
  crypto::SigningKey key = open_key();
  // The log's first key: audit.pub here or in the mirror (never overwritten), else this key's.
  std::string first_key;
  for (const auto& pub : {dir / "audit.pub", opts_.mirror.empty() ? std::filesystem::path() : opts_.mirror / "audit.pub"}) {
    if (!first_key.empty() || pub.empty() || !nonempty_file(pub)) continue;
    try {
      first_key = load_public_key(pub);
    } catch (const std::exception& e) {
      throw StateError("state_dir " + dir.string() + ": " + e.what() + "; restore audit.pub (the log's first key)");
    }
  }
  if (first_key.empty()) first_key = key.public_key();
  settle_log(first_key, key.public_key());
  try {
    audit_ = std::make_unique<AuditLog>(dir / "audit.jsonl", std::move(key), first_key);
  } catch (const std::exception& e) {
    throw StateError(std::string("state_dir ") + dir.string() + ": " + e.what());
  }
  if (!nonempty_file(dir / "audit.pub")) atomic_write_file(dir / "audit.pub", key_hex(first_key) + "\n");
  if (!opts_.mirror.empty() && !nonempty_file(opts_.mirror / "audit.pub")) mirror_file("audit.pub");
  // Checkpoints a broken mirror missed in an earlier run (settle_log has brought its log up).
  if (!opts_.mirror.empty() && !mirror_behind_) catch_up_mirror(false);
}

ServerState::~ServerState() = default;

ServerState::Lock::~Lock() {
  if (fd >= 0) ::close(fd);
}

crypto::SigningKey ServerState::open_key() {
  const auto& dir = opts_.dir;
  const auto sk = dir / "audit.key", pub = dir / "audit.pub", next = dir / "audit.key.next";
  const bool history = nonempty_file(dir / "audit.jsonl") || !list_checkpoints(dir / "checkpoints").empty() ||
                       (!opts_.mirror.empty() && (nonempty_file(opts_.mirror / "audit.jsonl") ||
                                                  !list_checkpoints(opts_.mirror / "checkpoints").empty()));
  if (!std::filesystem::exists(sk)) {
    if (history || nonempty_file(pub)) {
      std::string what = nonempty_file(dir / "audit.jsonl") ? "audit.jsonl"
                         : nonempty_file(pub)              ? "audit.pub"
                                                           : "checkpoints or the mirror's log";
      throw StateError("state_dir " + dir.string() + ": audit.key is missing while " + what +
                       " exists: only that key can go on with this history. Restore audit.key from your backup "
                       "(a new key would start a second history, which xsilo never does in one state folder)");
    }
    auto key = crypto::SigningKey::generate();
    save_signing_key(key, sk, pub);
    spdlog::info("created audit key {} (public key: {})", sk.string(), pub.string());
    return key;
  }
  crypto::SigningKey key = [&] {
    try {
      return load_signing_key(sk);
    } catch (const std::exception& e) {
      throw StateError("state_dir " + dir.string() + ": " + e.what() + "; restore audit.key from your backup");
    }
  }();
  // A rotation killed between its record and the key's rename: settle_log finishes it.
  if (std::filesystem::exists(next)) {
    try {
      auto k = load_signing_key(next);
      const auto v = verify_audit_log(dir / "audit.jsonl", nonempty_file(pub) ? load_public_key(pub) : key.public_key());
      if (v && v->keys.back().public_key == k.public_key()) {
        std::filesystem::rename(next, sk);
        fsync_dir(dir);
        repairs_.push_back("finished a key rotation a stop interrupted (audit.key.next became audit.key)");
        return k;
      }
      std::filesystem::remove(next);
      repairs_.push_back("removed audit.key.next: the rotation it was made for never reached the log");
    } catch (const std::exception& e) {
      throw StateError("state_dir " + dir.string() + ": audit.key.next: " + e.what());
    }
  }
  if (nonempty_file(pub)) {
    std::string first;
    try {
      first = load_public_key(pub);
    } catch (const std::exception& e) {
      throw StateError("state_dir " + dir.string() + ": " + e.what() + "; restore audit.pub (the log's first key)");
    }
    // The key signs now; audit.pub is the log's first key. They differ only after rotations,
    // which settle_log and AuditLog check against the log itself.
    if (first != key.public_key() && !nonempty_file(dir / "audit.jsonl") &&
        !(!opts_.mirror.empty() && nonempty_file(opts_.mirror / "audit.jsonl"))) {
      throw StateError("state_dir " + dir.string() + ": audit.key does not belong to audit.pub (" +
                       key_hex(key.public_key()).substr(0, 16) + " against " + key_hex(first).substr(0, 16) +
                       "), and no log shows a rotation between them: restore the pair from your backup");
    }
  }
  return key;
}

// Picks the log this start goes on from (docs in state.h), repairing what it safely can: the
// longest verified prefix among the copies, provided no copy claims records beyond it.
void ServerState::settle_log(const std::string& first_key, const std::string& signing_key) {
  const auto local = opts_.dir / "audit.jsonl";
  const auto mirror = opts_.mirror.empty() ? std::filesystem::path() : opts_.mirror / "audit.jsonl";
  struct View {
    std::string name;
    std::filesystem::path path;
    bool exists = false;
    std::uint64_t lines = 0;  // what the copy claims, good or not
    AuditVerifyResult v = AuditBreak{};  // until read: nothing verified
  };
  auto look = [&](const std::filesystem::path& p, std::string name) {
    View view{.name = std::move(name), .path = p, .exists = !p.empty() && nonempty_file(p), .lines = 0, .v = AuditBreak{}};
    if (!view.exists) return view;
    // A torn last line: what a crash or a full disk leaves of an append. Cut, and kept aside.
    if (const std::string torn = cut_torn_tail(p); !torn.empty()) {
      const auto kept = opts_.dir / ("audit.torn." + std::to_string(::time(nullptr)) + ".txt");
      try {
        atomic_write_file(kept, torn);
      } catch (const std::exception&) {
        // kept aside only for forensics
      }
      repairs_.push_back("cut a torn last line of " + std::to_string(torn.size()) + " bytes from " + view.name +
                         " (an append a crash or a full disk interrupted; kept in " + kept.filename().string() + ")");
    }
    std::ifstream in(p, std::ios::binary);
    for (std::string line; std::getline(in, line);) ++view.lines;
    view.v = verify_audit_log(p, first_key);
    return view;
  };
  const View l = look(local, "audit.jsonl");
  View m;
  try {
    m = look(mirror, "the mirror's audit.jsonl");
  } catch (const std::exception& e) {
    throw StateError("state_mirror " + opts_.mirror.string() + ": audit.jsonl cannot be read or mended (" + e.what() +
                     "): mend it (a folder this server can write) or remove state_mirror from the config");
  }
  if (!l.exists && !m.exists) {
    const auto cps = list_checkpoints(opts_.dir / "checkpoints");
    if (!cps.empty()) {
      throw StateError("state_dir " + opts_.dir.string() + ": audit.jsonl is missing but checkpoints of rounds " +
                       std::to_string(cps.front().first) + ".." + std::to_string(cps.back().first) +
                       " exist: the history they belong to cannot go on without its log. Restore audit.jsonl from a "
                       "backup (a new log would be a second history)");
    }
    return;  // a new federation
  }
  // Records both copies hold must be the same records.
  const auto& ll = verified_part(l.v).line_sha256;
  const auto& ml = verified_part(m.v).line_sha256;
  for (std::size_t i = 0; i < std::min(ll.size(), ml.size()); ++i) {
    if (ll[i] != ml[i]) {
      throw StateError("state_dir " + opts_.dir.string() + ": audit.jsonl and the mirror's (" + mirror.string() +
                       ") disagree from record " + std::to_string(i + 1) +
                       ": two histories. Keep the one the silos witnessed (xsilo audit verify --witness) and move the "
                       "other away");
    }
  }
  const View& best = ll.size() >= ml.size() ? l : m;
  const std::uint64_t claimed = std::max(l.lines, m.lines);
  const std::uint64_t best_records = verified_part(best.v).records;
  if (best_records < claimed) {
    // Not one record under audit.pub's key, every one under audit.key's: audit.pub is what changed.
    if (best_records == 0 && l.exists && signing_key != first_key) {
      if (verify_audit_log(local, signing_key)) {
        throw StateError("state_dir " + opts_.dir.string() + ": audit.pub (key " + key_hex(first_key).substr(0, 16) +
                         ") signed no record of audit.jsonl, and audit.key (" + key_hex(signing_key).substr(0, 16) +
                         ") signed all " + std::to_string(l.lines) +
                         ": audit.pub was replaced. Restore it from a backup or the mirror (the log and its key are intact)");
      }
    }
    const View& damaged = !l.v && l.exists ? l : m;
    const std::string why = damaged.v ? std::string() : damaged.v.error().reason;
    throw StateError("state_dir " + opts_.dir.string() + ": " + damaged.name + " is damaged (" + why +
                     "; " + std::to_string(best_records) + " records verify in the best copy, " +
                     std::to_string(claimed) + " were written) and " +
                     (mirror.empty() ? std::string("no state_mirror is set")
                                     : std::string("no copy holds the rest intact")) +
                     ": restore audit.jsonl from a backup");
  }
  if (&best != &l && best_records > 0) {
    const std::string had = !l.exists ? std::string("it was missing")
                            : !l.v    ? "its " + l.v.error().reason
                                      : "it had " + std::to_string(ll.size()) + " records";
    atomic_write_file(local, read_file(mirror));
    repairs_.push_back("restored audit.jsonl from the mirror (" + std::to_string(ml.size()) + " records; " + had + ")");
  } else if (!mirror.empty() && (!m.exists || ml.size() < ll.size() || m.lines > ml.size())) {
    if (mirror_file("audit.jsonl")) {
      repairs_.push_back("brought the mirror's audit.jsonl up to record " + std::to_string(ll.size()) + " (it had " +
                         (m.exists ? std::to_string(ml.size()) + " good records" : std::string("none")) + ")");
    }
  }
}

std::filesystem::path ServerState::checkpoint_path(std::uint64_t round) const {
  return opts_.dir / "checkpoints" / round_file(round);
}

AuditHead ServerState::commit(std::uint64_t round, const Model& model, const Model& optimizer_state,
                              const nlohmann::json& audit_record, const MetricsRow& row) {
  const auto path = checkpoint_path(round);
  const auto relative = std::filesystem::path("checkpoints") / round_file(round);
  if (optimizer_state.size() > 0) {
    save_safetensors(std::filesystem::path(path).replace_extension(".opt"), optimizer_state);
    mirror_file(std::filesystem::path(relative).replace_extension(".opt"));
  }
  // The record is signed before the checkpoint is written and the checkpoint keeps that line:
  // if the server dies before appending it, recovery appends exactly this line, after checking.
  // It names the optimizer state too, which recovery checks as it checks the model.
  nlohmann::json rec = audit_record;
  if (optimizer_state.size() > 0) rec["optimizer_state_sha256"] = crypto::sha256_hex(optimizer_state.flat());
  const std::string line = audit_->seal(rec);
  save_safetensors(path, model,
                   {{"xsilo.round", std::to_string(round)},
                    {"xsilo.model_sha256", audit_record.value("model_sha256_after", "")},
                    {"xsilo.audit_line", line}});
  mirror_file(relative);
  const AuditHead head = audit_->append_line(line);
  mirror_line(line);
  append_metrics(row);
  prune(opts_.dir);
  if (!opts_.mirror.empty()) {
    try {
      prune(opts_.mirror);
    } catch (const std::exception& e) {
      mirror_failed("the state mirror " + opts_.mirror.string(), e);  // the round is committed
    }
  }
  return head;
}

AuditHead ServerState::record(const nlohmann::json& audit_record, const MetricsRow* row) {
  const std::string line = audit_->seal(audit_record);
  AuditHead head = audit_->append_line(line);
  head.line = line;
  mirror_line(line);
  if (row) append_metrics(*row);
  return head;
}

Status ServerState::check_witness(const std::string& silo, std::uint64_t seq, const std::string& sha256,
                                  const std::string& public_key) const {
  const auto& keys = audit_->keys();
  const bool ours = std::any_of(keys.begin(), keys.end(), [&](const AuditKeySpan& k) { return k.public_key == public_key; });
  const std::string what = "silo " + silo + " witnessed audit record " + std::to_string(seq) + " (" + short_sha(sha256) +
                           ", key " + key_hex(public_key).substr(0, 16) + ")";
  if (!ours) {
    return Error(what + ", but this log is signed by key " + key_hex(keys.front().public_key).substr(0, 16) +
                 " with no rotation from that one: this state folder does not hold the history the federation ran "
                 "on (started again, or another server's). Restore state_dir (and audit.key) from a backup or the "
                 "mirror");
  }
  if (seq > audit_->size()) {
    return Error(what + ", but audit.jsonl has only " + std::to_string(audit_->size()) +
                 " records: its tail is lost. Restore audit.jsonl from the mirror or a backup");
  }
  if (audit_->line_sha256(seq) != sha256) {
    return Error(what + ", but this log's record " + std::to_string(seq) + " hashes to " +
                 short_sha(audit_->line_sha256(seq)) +
                 ": the log was rewritten or forked. Restore audit.jsonl from the mirror or a backup");
  }
  return {};
}

std::vector<AuditKeySpan> ServerState::audit_keys() const { return audit_->keys(); }

AuditHead ServerState::rotate_key(const std::string& by) {
  auto next = crypto::SigningKey::generate();
  const auto dir = opts_.dir;
  {
    std::string hex = next.secret_hex();
    atomic_write_file(dir / "audit.key.next", hex + "\n", 0600);
    sodium_memzero(hex.data(), hex.size());
  }
  const std::string next_public = next.public_key();
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
  const AuditHead head = audit_->rotate(std::move(next), {{"by", by}, {"time", iso_time(now)}});
  // The rotation record went to the log; the mirror gets the same line.
  mirror_file("audit.jsonl");
  std::filesystem::rename(dir / "audit.key.next", dir / "audit.key");
  fsync_dir(dir);
  return head;
}

void ServerState::append_metrics(const MetricsRow& r) {
  const auto path = opts_.dir / "metrics.csv";
  append_durable(path, (std::filesystem::exists(path) ? std::string() : metrics_header()) + to_csv(r));
}

void ServerState::prune(const std::filesystem::path& dir) {
  if (opts_.keep_checkpoints == 0) return;
  auto cps = list_checkpoints(dir / "checkpoints");
  while (cps.size() > opts_.keep_checkpoints) {
    std::error_code ec;
    std::filesystem::remove(cps.front().second, ec);
    std::filesystem::remove(std::filesystem::path(cps.front().second).replace_extension(".opt"), ec);
    cps.erase(cps.begin());
  }
}

void ServerState::mirror_failed(const std::string& what, const std::exception& e) {
  if (!mirror_behind_) {
    spdlog::error("{} could not be written ({}): the state folder alone holds the federation until the mirror can "
                  "be written again, and the mirror is then caught up",
                  what, e.what());
  }
  mirror_behind_ = true;
}

bool ServerState::catch_up_mirror(bool log) {
  try {
    std::filesystem::create_directories(opts_.mirror / "checkpoints");
    for (const auto& e : std::filesystem::directory_iterator(opts_.dir / "checkpoints")) {
      const auto name = e.path().filename();
      const auto ext = name.extension().string();
      if (!e.is_regular_file() || (ext != ".safetensors" && ext != ".opt")) continue;
      const auto copy = opts_.mirror / "checkpoints" / name;
      if (!std::filesystem::exists(copy)) atomic_write_file(copy, read_file(e.path()));
    }
    if (log) atomic_write_file(opts_.mirror / "audit.jsonl", read_file(opts_.dir / "audit.jsonl"));
    if (!nonempty_file(opts_.mirror / "audit.pub")) {
      atomic_write_file(opts_.mirror / "audit.pub", read_file(opts_.dir / "audit.pub"));
    }
  } catch (const std::exception& e) {
    mirror_failed("the state mirror " + opts_.mirror.string(), e);
    return false;
  }
  if (mirror_behind_) spdlog::info("the state mirror {} is written again and caught up", opts_.mirror.string());
  mirror_behind_ = false;
  return true;
}

bool ServerState::mirror_file(const std::filesystem::path& relative) {
  if (opts_.mirror.empty()) return false;
  if (mirror_behind_ && !catch_up_mirror(true)) return false;
  try {
    atomic_write_file(opts_.mirror / relative, read_file(opts_.dir / relative));
    return true;
  } catch (const std::exception& e) {
    mirror_failed("the state mirror " + opts_.mirror.string(), e);
    return false;
  }
}

void ServerState::mirror_line(const std::string& line) {
  if (opts_.mirror.empty()) return;
  if (mirror_behind_) {
    catch_up_mirror(true);  // the log whole, with what else it missed
    return;
  }
  const auto path = opts_.mirror / "audit.jsonl";
  try {
    cut_torn_tail(path);
    append_durable(path, line + "\n");
  } catch (const std::exception& e) {
    mirror_failed("the state mirror's audit log " + path.string(), e);
  }
}

}  // namespace xsilo::server
