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

namespace xsilo::server {

namespace {

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

bool nonempty_file(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec) && std::filesystem::file_size(p, ec) > 0;
}

// Each record of the audit log in turn, one line in memory at a time: recovery must not hold
// the whole history (a 2,000-round log as JSON objects is tens of MiB, kept by the heap for the
// server's whole life).
template <class Fn>
void for_each_record(const std::filesystem::path& path, Fn&& fn) {
  std::ifstream in(path, std::ios::binary);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    nlohmann::json rec;
    try {
      rec = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      throw std::runtime_error(path.string() + ": record " + std::to_string(n) + " is not JSON");
    }
    fn(rec);
  }
}

// The metrics row of a round the audit log records but metrics.csv lacks (the server died
// between appending the record and the row): what the record says; the losses it does not
// hold are NaN, the duration is unknown (0).
MetricsRow metrics_row_of(const nlohmann::json& rec) {
  MetricsRow row;
  row.round = rec.value("round", std::uint64_t{0});
  row.committed = rec.value("status", "") == "committed";
  row.selected = rec.value("selected", nlohmann::json::array()).size();
  row.reported = rec.value("participants", nlohmann::json::array()).size();
  row.dropped = rec.value("dropouts", nlohmann::json::array()).size();
  row.train_loss = row.fed_eval_loss = row.fed_eval_accuracy = std::nan("");
  row.upload_bytes = rec.value("upload_bytes", std::uint64_t{0});
  std::set<std::string> edges;
  for (const auto& p : rec.value("participants", nlohmann::json::array())) {
    if (p.is_object() && p.contains("edge")) edges.insert(p.value("edge", ""));
  }
  row.edges = edges.size();
  return row;
}

// A checkpoint as recovery reads it: the model, its optimizer state, and their hashes; or why
// it cannot be read.
struct Checkpoint {
  std::optional<Model> model, optimizer;
  std::string model_sha, optimizer_sha, audit_line, error;
  // Restored from a silo's copy (restore_model): the round's optimizer state is lost, and the
  // model alone is the checkpoint (any .opt beside it is not this round's).
  bool optimizer_lost = false;
};

Checkpoint read_checkpoint(const std::filesystem::path& path, const Model& layout) {
  Checkpoint c;
  try {
    Metadata meta;
    c.model = load_safetensors(path, &meta);
    if (!c.model->same_layout(layout)) {
      c.error = "it holds another model layout";
      c.model.reset();
      return c;
    }
    c.model_sha = crypto::sha256_hex(c.model->flat());
    if (auto it = meta.find("xsilo.audit_line"); it != meta.end()) c.audit_line = it->second;
    if (auto it = meta.find("xsilo.optimizer_lost"); it != meta.end() && it->second == "1") {
      c.optimizer_lost = true;
      return c;
    }
    const auto opt = std::filesystem::path(path).replace_extension(".opt");
    if (std::filesystem::exists(opt)) {
      c.optimizer = load_safetensors(opt);
      c.optimizer_sha = crypto::sha256_hex(c.optimizer->flat());
    }
  } catch (const std::exception& e) {
    c.model.reset();
    c.error = std::string("unreadable (") + e.what() + ")";
  }
  return c;
}

std::string short_sha(const std::string& s) { return s.empty() ? std::string("none") : s.substr(0, 12); }

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
    if (!opts_.mirror.empty()) std::filesystem::create_directories(opts_.mirror / "checkpoints");
  } catch (const std::exception& e) {
    throw StateError(std::string("state folder: ") + e.what());
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
  settle_log(first_key);
  try {
    audit_ = std::make_unique<AuditLog>(dir / "audit.jsonl", std::move(key), first_key);
  } catch (const std::exception& e) {
    throw StateError(std::string("state_dir ") + dir.string() + ": " + e.what());
  }
  if (!nonempty_file(dir / "audit.pub")) atomic_write_file(dir / "audit.pub", key_hex(first_key) + "\n");
  if (!opts_.mirror.empty() && !nonempty_file(opts_.mirror / "audit.pub")) mirror_file("audit.pub");
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
      if (v.ok && v.keys.back().public_key == k.public_key()) {
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
void ServerState::settle_log(const std::string& first_key) {
  const auto local = opts_.dir / "audit.jsonl";
  const auto mirror = opts_.mirror.empty() ? std::filesystem::path() : opts_.mirror / "audit.jsonl";
  struct View {
    std::string name;
    std::filesystem::path path;
    bool exists = false;
    std::uint64_t lines = 0;  // what the copy claims, good or not
    AuditVerifyResult v;
  };
  auto look = [&](const std::filesystem::path& p, std::string name) {
    View view{std::move(name), p, !p.empty() && nonempty_file(p), 0, {}};
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
  const View m = look(mirror, "the mirror's audit.jsonl");
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
  const auto& ll = l.v.line_sha256;
  const auto& ml = m.v.line_sha256;
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
  if (best.v.records < claimed) {
    const View& damaged = !l.v.ok && l.exists ? l : m;
    throw StateError("state_dir " + opts_.dir.string() + ": " + damaged.name + " is damaged (" + damaged.v.reason +
                     "; " + std::to_string(best.v.records) + " records verify in the best copy, " +
                     std::to_string(claimed) + " were written) and " +
                     (mirror.empty() ? std::string("no state_mirror is set")
                                     : std::string("no copy holds the rest intact")) +
                     ": restore audit.jsonl from a backup");
  }
  if (&best != &l && best.v.records > 0) {
    const std::string had = !l.exists ? std::string("it was missing")
                            : !l.v.ok ? "its " + l.v.reason
                                      : "it had " + std::to_string(ll.size()) + " records";
    atomic_write_file(local, read_file(mirror));
    repairs_.push_back("restored audit.jsonl from the mirror (" + std::to_string(ml.size()) + " records; " + had + ")");
  } else if (!mirror.empty() && (!m.exists || ml.size() < ll.size() || m.lines > ml.size())) {
    mirror_file("audit.jsonl");
    repairs_.push_back("brought the mirror's audit.jsonl up to record " + std::to_string(ll.size()) + " (it had " +
                       (m.exists ? std::to_string(ml.size()) + " good records" : std::string("none")) + ")");
  }
}

std::filesystem::path ServerState::checkpoint_path(std::uint64_t round) const {
  return opts_.dir / "checkpoints" / round_file(round);
}

// The audit log's view (verified when it was opened): last round, and the model each
// committed round left; an operator's resume decision supersedes the commits after its round.
struct ServerState::AuditHistory {
  struct Committed {
    std::string model, optimizer;  // SHA-256s the record names ("" optimizer: none)
    std::optional<double> clip_norm;
  };
  std::map<std::uint64_t, Committed> committed;
  std::uint64_t last_round = 0;
  // Rounds the log records after the last row of metrics.csv: their rows are appended at the end.
  std::uint64_t metrics_round = 0;
  std::map<std::uint64_t, MetricsRow> missing_rows;

  std::uint64_t last_commit() const { return committed.empty() ? 0 : committed.rbegin()->first; }

  void take(const nlohmann::json& rec) {
    const std::string event = rec.value("event", "");
    if (event == "operator_resume") {
      const auto from = rec.value("from_round", std::uint64_t{0});
      committed.erase(committed.upper_bound(from), committed.end());
      return;
    }
    if (event != "round") return;
    const auto n = rec.value("round", std::uint64_t{0});
    if (n > metrics_round) missing_rows[n] = metrics_row_of(rec);
    last_round = std::max(last_round, n);
    if (rec.value("status", "") == "committed") {
      Committed c{rec.value("model_sha256_after", ""), rec.value("optimizer_state_sha256", ""), std::nullopt};
      if (const auto ac = rec.value("robust", nlohmann::json::object()).value("adaptive_clip", nlohmann::json());
          ac.is_object() && ac.contains("next")) {
        c.clip_norm = ac["next"].get<double>();
      }
      committed[n] = c;
    }
  }
};

ServerState::AuditHistory ServerState::read_audit_history() const {
  AuditHistory history;
  if (const auto rows = read_metrics(opts_.dir / "metrics.csv"); !rows.empty()) {
    history.metrics_round = rows.back().round;
  }
  for_each_record(audit_->path(), [&](const nlohmann::json& rec) { history.take(rec); });
  return history;
}

// A checkpoint ahead of the log: the server died between writing it and appending its record,
// which the checkpoint carries as signed. Appended exactly, after checking; a checkpoint whose
// record is further ahead shows the log lost records; one that contradicts a record is a fork.
void ServerState::append_checkpointed_records(AuditHistory& history, const Model& layout) {
  const std::uint64_t last_commit = history.last_commit();
  for (const auto& folder : {opts_.dir, opts_.mirror}) {
    if (folder.empty()) continue;
    for (const auto& [round, path] : list_checkpoints(folder / "checkpoints")) {
      if (round <= last_commit) continue;
      const Checkpoint c = read_checkpoint(path, layout);
      if (c.audit_line.empty() || !c.model) continue;  // unreadable, or from before records were kept: no claim
      nlohmann::json rec;
      try {
        rec = nlohmann::json::parse(c.audit_line);
      } catch (const std::exception&) {
        continue;
      }
      const auto seq = rec.value("seq", std::uint64_t{0});
      if (seq <= audit_->size()) {
        if (audit_->line_sha256(seq) != crypto::sha256_hex(c.audit_line) && history.committed.count(round) == 0) {
          // Not this log's record (a checkpoint a superseded history left, or one edited): no claim.
          spdlog::warn("checkpoint {} carries a record {} this log does not hold; ignored", path.string(), seq);
        }
        continue;
      }
      if (seq > audit_->size() + 1) {
        throw StateError("state_dir " + opts_.dir.string() + ": checkpoint " + path.string() + " carries audit record " +
                         std::to_string(seq) + ", but audit.jsonl has only " + std::to_string(audit_->size()) +
                         " records: records were lost. Restore audit.jsonl from the mirror or a backup");
      }
      // One ahead: the record as signed, chaining to the head, naming this round and model.
      const bool names_it = rec.value("event", "") == "round" && rec.value("round", std::uint64_t{0}) == round &&
                            rec.value("status", "") == "committed" && rec.value("model_sha256_after", "") == c.model_sha &&
                            rec.value("optimizer_state_sha256", "") == c.optimizer_sha;
      if (!names_it) {
        spdlog::error("checkpoint {} not trusted: its signed record is not the commit of its model; ignored", path.string());
        continue;
      }
      try {
        const std::string line = c.audit_line;
        audit_->append_line(line);  // checks signature and chain before writing a byte
        mirror_line(line);
        repairs_.push_back("round " + std::to_string(round) +
                           " was checkpointed but not audited (the server stopped in between): its signed record "
                           "appended");
        history.take(rec);
        if (round > history.metrics_round) history.missing_rows[round] = metrics_row_of(rec);
      } catch (const std::exception& e) {
        spdlog::error("checkpoint {} not trusted: {}; ignored", path.string(), e.what());
      }
    }
  }
}

// The committed round to go on from: the last one, or the operator's `--resume-from-round`
// once the log shows it committed and not superseded.
std::uint64_t ServerState::resume_round(const AuditHistory& history) const {
  const std::uint64_t target = history.last_commit();
  if (!opts_.resume_from_round) return target;
  const std::uint64_t from = *opts_.resume_from_round;
  if (from > target) {
    throw StateError("--resume-from-round " + std::to_string(from) + ": the last committed round is " +
                     std::to_string(target));
  }
  if (from > 0 && history.committed.count(from) == 0) {
    throw StateError("--resume-from-round " + std::to_string(from) + ": the audit log has no committed round " +
                     std::to_string(from) + " (or an earlier decision superseded it)");
  }
  return from;
}

// The model of committed round `round`, from this folder or the mirror, as its record names it,
// into `r`; false, with what happened to each copy in `why`, when no copy holds it.
bool ServerState::load_committed_model(std::uint64_t round, const AuditHistory& history, const Model& layout,
                                       Resume& r, std::string& why) {
  const auto& want = history.committed.at(round);
  for (const auto& folder : {opts_.dir, opts_.mirror}) {
    if (folder.empty()) continue;
    const auto path = folder / "checkpoints" / round_file(round);
    const std::string where = folder == opts_.dir ? "checkpoints/" : "the mirror's checkpoints/";
    if (!std::filesystem::exists(path)) {
      why += (why.empty() ? "" : "; ") + where + round_file(round) + " is missing";
      continue;
    }
    Checkpoint c = read_checkpoint(path, layout);
    if (!c.model) {
      why += (why.empty() ? "" : "; ") + where + round_file(round) + ": " + c.error;
    } else if (c.model_sha != want.model) {
      why += (why.empty() ? "" : "; ") + where + round_file(round) + " holds model " + short_sha(c.model_sha) +
             ", the log names " + short_sha(want.model);
    } else if (c.optimizer_sha != want.optimizer && !c.optimizer_lost) {
      why += (why.empty() ? "" : "; ") + where + round_file(round) + "'s optimizer state is " +
             short_sha(c.optimizer_sha) + ", the log names " + short_sha(want.optimizer);
    } else {
      if (folder != opts_.dir) {
        Metadata meta{{"xsilo.round", std::to_string(round)}, {"xsilo.model_sha256", c.model_sha}};
        if (c.optimizer_lost) meta["xsilo.optimizer_lost"] = "1";
        save_safetensors(checkpoint_path(round), *c.model, meta);
        if (c.optimizer) {
          save_safetensors(std::filesystem::path(checkpoint_path(round)).replace_extension(".opt"), *c.optimizer);
        }
        repairs_.push_back("restored the checkpoint of round " + std::to_string(round) + " from the mirror (" + why +
                           ")");
      }
      r.committed_round = round;
      r.model = std::move(c.model);
      r.optimizer_state = std::move(c.optimizer);
      return true;
    }
  }
  return false;
}

void ServerState::append_missing_metrics(const AuditHistory& history) {
  for (const auto& [round, row] : history.missing_rows) {
    spdlog::warn("round {} is in the audit log but not in metrics.csv (the server died in between); its row "
                 "appended from the record",
                 round);
    append_metrics(row);
  }
}

Resume ServerState::recover(const Model& layout) {
  Resume r;
  AuditHistory history = read_audit_history();
  append_checkpointed_records(history, layout);

  const auto& committed = history.committed;
  if (!committed.empty()) r.clip_norm = committed.rbegin()->second.clip_norm;
  const std::uint64_t target = history.last_commit();
  const std::uint64_t from = resume_round(history);
  if (from > 0) {
    std::string why;
    if (!load_committed_model(from, history, layout, r, why)) {
      if (opts_.resume_from_round) {
        throw StateError("--resume-from-round " + std::to_string(from) + ": its checkpoint is not usable either (" +
                         why + ")");
      }
      r.committed_round = from;
      r.missing = Resume::Missing{from, committed.at(from).model, committed.at(from).optimizer, why};
    }
  }
  if (opts_.resume_from_round && from < target) {
    nlohmann::json superseded = nlohmann::json::array();
    for (auto it = committed.upper_bound(from); it != committed.end(); ++it) superseded.push_back(it->first);
    r.decision = nlohmann::json{{"event", "operator_resume"},
                                {"from_round", from},
                                {"model_sha256", from == 0 ? std::string() : committed.at(from).model},
                                {"superseded_rounds", superseded}};
    r.clip_norm = from == 0 ? std::nullopt : committed.at(from).clip_norm;
  }
  r.last_round = std::max(history.last_round, r.committed_round);
  append_missing_metrics(history);
  r.repairs = repairs_;
  return r;
}

std::string ServerState::missing_model_error(const Resume::Missing& m) const {
  std::uint64_t usable = 0;
  for (const auto& folder : {opts_.dir, opts_.mirror}) {
    if (folder.empty()) continue;
    for (const auto& [round, path] : list_checkpoints(folder / "checkpoints")) {
      if (round < m.round) usable = std::max(usable, round);
    }
  }
  return "state_dir " + opts_.dir.string() + ": the model of committed round " + std::to_string(m.round) + " (" +
         short_sha(m.model_sha256) + ") is in no copy: " + m.why +
         "; and no silo offered it. Restore checkpoints/" + round_file(m.round) +
         " from a backup, or decide to go on from an earlier committed round with `--resume-from-round N`" +
         (usable ? " (the newest checkpoint on disk is round " + std::to_string(usable) + ")" : std::string()) +
         ": the rounds after N are then superseded, and the audit log says so";
}

std::string ServerState::restore_model(const Resume::Missing& m, const Model& model) {
  const std::string sha = crypto::sha256_hex(model.flat());
  if (sha != m.model_sha256) {
    throw std::runtime_error("the model offered is " + short_sha(sha) + ", round " + std::to_string(m.round) +
                             "'s is " + short_sha(m.model_sha256));
  }
  Metadata meta{{"xsilo.round", std::to_string(m.round)}, {"xsilo.model_sha256", sha}};
  if (!m.optimizer_sha256.empty()) meta["xsilo.optimizer_lost"] = "1";  // a later start takes the model alone
  save_safetensors(checkpoint_path(m.round), model, meta);
  mirror_file(std::filesystem::path("checkpoints") / round_file(m.round));
  std::string repair = "restored the model of committed round " + std::to_string(m.round) + " (" + short_sha(sha) +
                       ") from a copy a silo held, checked against its record" +
                       (m.optimizer_sha256.empty() ? std::string()
                                                   : "; its optimizer state (" + short_sha(m.optimizer_sha256) +
                                                         ") was lost with the checkpoint and starts again from zero");
  repairs_.push_back(repair);
  return repair;
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
  if (!opts_.mirror.empty()) prune(opts_.mirror);
  return head;
}

AuditHead ServerState::record(const nlohmann::json& audit_record, const MetricsRow* row) {
  const std::string line = audit_->seal(audit_record);
  const AuditHead head = audit_->append_line(line);
  mirror_line(line);
  if (row) append_metrics(*row);
  return head;
}

std::string ServerState::check_witness(const std::string& silo, std::uint64_t seq, const std::string& sha256,
                                       const std::string& public_key) const {
  const auto& keys = audit_->keys();
  const bool ours = std::any_of(keys.begin(), keys.end(), [&](const AuditKeySpan& k) { return k.public_key == public_key; });
  const std::string what = "silo " + silo + " witnessed audit record " + std::to_string(seq) + " (" + short_sha(sha256) +
                           ", key " + key_hex(public_key).substr(0, 16) + ")";
  if (!ours) {
    return what + ", but this log is signed by key " + key_hex(keys.front().public_key).substr(0, 16) +
           " with no rotation from that one: this state folder does not hold the history the federation ran on "
           "(started again, or another server's). Restore state_dir (and audit.key) from a backup or the mirror";
  }
  if (seq > audit_->size()) {
    return what + ", but audit.jsonl has only " + std::to_string(audit_->size()) +
           " records: its tail is lost. Restore audit.jsonl from the mirror or a backup";
  }
  if (audit_->line_sha256(seq) != sha256) {
    return what + ", but this log's record " + std::to_string(seq) + " hashes to " + short_sha(audit_->line_sha256(seq)) +
           ": the log was rewritten or forked. Restore audit.jsonl from the mirror or a backup";
  }
  return "";
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

void ServerState::mirror_file(const std::filesystem::path& relative) {
  if (opts_.mirror.empty()) return;
  try {
    const std::string bytes = read_file(opts_.dir / relative);
    atomic_write_file(opts_.mirror / relative, bytes);
    if (mirror_failed_) spdlog::info("the state mirror {} is written again", opts_.mirror.string());
    mirror_failed_ = false;
  } catch (const std::exception& e) {
    if (!mirror_failed_) {
      spdlog::error("the state mirror {} could not be written ({}): the state folder alone holds the federation "
                    "until it can",
                    opts_.mirror.string(), e.what());
    }
    mirror_failed_ = true;
  }
}

void ServerState::mirror_line(const std::string& line) {
  if (opts_.mirror.empty()) return;
  const auto path = opts_.mirror / "audit.jsonl";
  try {
    if (mirror_failed_) {
      mirror_file("audit.jsonl");  // catch up whole after a failure
      return;
    }
    cut_torn_tail(path);
    append_durable(path, line + "\n");
  } catch (const std::exception& e) {
    spdlog::error("the state mirror's audit log {} could not be appended to ({}); it is copied whole at the next record",
                  path.string(), e.what());
    mirror_failed_ = true;
  }
}

}  // namespace xsilo::server
