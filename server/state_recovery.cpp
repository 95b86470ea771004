// ServerState's recovery at start (state.h: "the log", "the model"): what the audit log says was
// committed, the checkpoints ahead of it, the round to go on from, and its model from this folder,
// the mirror or a silo's copy.
#include <spdlog/spdlog.h>

#include <fstream>
#include <iterator>
#include <map>
#include <optional>

#include "common/fs.h"
#include "common/safetensors.h"
#include "crypto/hash.h"
#include "server/metrics.h"
#include "server/round_record.h"
#include "server/state.h"
#include "server/central_dp.h"
#include "server/distributed_dp.h"
#include "server/state_files.h"

namespace xsilo::server {

namespace {

using detail::list_checkpoints;
using detail::round_file;
using detail::short_sha;

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
  // Read whole but of another layout than the config's: how the two differ (model_sha is the
  // file's, so the caller can tell a committed model from a damaged copy).
  std::string other_layout;
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
      c.other_layout = layout_difference(*c.model, layout);
      c.model_sha = crypto::sha256_hex(c.model->flat());
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

// Distributed DP: a round whose unmasking began and whose record never followed (the server
// stopped in between) may have revealed a sum: it spent (server/distributed_dp.h, UnmaskingWatch).
void charge_interrupted(privacy::Ledger& spent, const privacy::Mechanism& m, std::uint64_t round) {
  spdlog::warn("round {}'s unmasking began but its record was never written (the server stopped in between): its "
               "privacy spend is charged",
               round);
  spent.add(m, 1);
}

}  // namespace

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
  // Silo-level central DP: every committed round's mechanism, in the log's order. An operator's
  // resume supersedes commits but not their spend: their models were released.
  privacy::Ledger central_dp;
  std::uint64_t committed_without_central_dp = 0;  // their models were released without its noise
  // Distributed DP: a round whose unmasking began and whose record has not followed (yet).
  UnmaskingWatch unmasking;

  std::uint64_t last_commit() const { return committed.empty() ? 0 : committed.rbegin()->first; }

  // Silo-level DP: what the record spends (a round's own mechanism, or its unmasking's when it
  // aborted after the unmasking began, and an earlier round whose unmasking it shows was
  // interrupted).
  void charge(const nlohmann::json& rec) {
    if (const auto c = unmasking.take(rec)) {
      if (c->interrupted) {
        charge_interrupted(central_dp, c->mechanism, c->round);
      } else {
        central_dp.add(c->mechanism, 1);  // aborted after its unmasking began, as its record states
      }
    }
    if (rec.value("event", "") != "round") return;
    if (const auto m = silo_level_mechanism_of(rec)) {
      central_dp.add(*m, 1);
    } else if (rec.value("status", "") == "committed") {
      ++committed_without_central_dp;
    }
  }

  void take(const nlohmann::json& rec) {
    const std::string event = rec.value("event", "");
    const auto n = rec.value("round", std::uint64_t{0});
    try {
      charge(rec);
    } catch (const std::exception& e) {  // invalid_argument, or a JSON type error in a damaged part
      throw StateError("audit log: round " + std::to_string(n) + ": " + e.what() +
                       "; the privacy spent cannot be rebuilt, so no round may start");
    }
    if (event == "operator_resume") {
      const auto from = rec.value("from_round", std::uint64_t{0});
      committed.erase(committed.upper_bound(from), committed.end());
      return;
    }
    if (event != "round") return;
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
                           " was checkpointed but its record is not in the log (the server stopped in between, or "
                           "the log lost its tail): its signed record appended");
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
// into `r`; what happened to each copy, when no copy holds it.
Status ServerState::load_committed_model(std::uint64_t round, const AuditHistory& history, const Model& layout,
                                         Resume& r) {
  const auto& want = history.committed.at(round);
  std::string why;  // what was wrong with the copies tried so far
  for (const auto& folder : {opts_.dir, opts_.mirror}) {
    if (folder.empty()) continue;
    const auto path = folder / "checkpoints" / round_file(round);
    const std::string where = folder == opts_.dir ? "checkpoints/" : "the mirror's checkpoints/";
    if (!std::filesystem::exists(path)) {
      why += (why.empty() ? "" : "; ") + where + round_file(round) + " is missing";
      continue;
    }
    Checkpoint c = read_checkpoint(path, layout);
    if (!c.model && !c.other_layout.empty() && c.model_sha == want.model) {
      // The round's own model, intact, as the log names it: the config's model is what changed.
      throw StateError("the config's .model is not the model of committed round " + std::to_string(round) + ": " +
                       where + round_file(round) + ", that round's model as the audit log names it, has " +
                       c.other_layout + " in the config. A federation keeps its model: undo the change to .model, "
                       "or start a new federation in a new state_dir");
    }
    if (!c.model) {
      why += (why.empty() ? "" : "; ") + where + round_file(round) + ": " + c.error;
    } else if (c.model_sha != want.model) {
      why += (why.empty() ? "" : "; ") + where + round_file(round) + " holds model " + short_sha(c.model_sha) +
             ", the log names " + short_sha(want.model);
    } else if (c.optimizer_sha != want.optimizer && !c.optimizer_lost) {
      // The model beside it is intact; the optimizer's state is not the one the record names.
      const auto opt = std::filesystem::path(round_file(round)).replace_extension(".opt").string();
      why += (why.empty() ? "" : "; ") + where + opt +
             (c.optimizer_sha.empty() ? std::string(" (the server optimizer's state) is missing")
                                      : " holds optimizer state " + short_sha(c.optimizer_sha)) +
             ", the log names " + short_sha(want.optimizer) + " (its model, " + round_file(round) + ", is intact)";
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
      return {};
    }
  }
  return Error(why);
}

void ServerState::append_missing_metrics(const AuditHistory& history) {
  for (const auto& [round, row] : history.missing_rows) {
    spdlog::warn("round {} is in the audit log but not in metrics.csv (the server stopped in between, or the file "
                 "lost rows); its row appended from the record",
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
  r.central_dp = history.central_dp;
  if (const auto m = history.unmasking.open()) charge_interrupted(r.central_dp, *m, history.unmasking.open_round());
  r.committed_without_central_dp = history.committed_without_central_dp;
  const std::uint64_t target = history.last_commit();
  const std::uint64_t from = resume_round(history);
  if (from > 0) {
    if (const auto loaded = load_committed_model(from, history, layout, r); !loaded) {
      const std::string& why = loaded.error().message();
      if (opts_.resume_from_round) {
        throw StateError("--resume-from-round " + std::to_string(from) + ": its checkpoint is not usable either (" +
                         why + ")");
      }
      r.committed_round = from;
      r.missing = Resume::Missing{.round = from,
                                  .model_sha256 = committed.at(from).model,
                                  .optimizer_sha256 = committed.at(from).optimizer,
                                  .why = why};
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
  r.commits = static_cast<std::uint64_t>(std::distance(committed.begin(), committed.upper_bound(r.committed_round)));
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
         "; and no silo offered it. Restore checkpoints/" + round_file(m.round) + " and its .opt" +
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

}  // namespace xsilo::server
