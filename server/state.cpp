#include "server/state.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "common/fs.h"
#include "crypto/hash.h"
#include "common/safetensors.h"
#include "server/metrics.h"

namespace xsilo::server {

namespace {

std::vector<std::pair<std::uint64_t, std::filesystem::path>> list_checkpoints(
    const std::filesystem::path& dir) {
  std::vector<std::pair<std::uint64_t, std::filesystem::path>> out;
  if (!std::filesystem::exists(dir)) return out;
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

crypto::SigningKey open_key(const std::filesystem::path& dir) {
  const auto sk = dir / "audit.key";
  if (std::filesystem::exists(sk)) return load_signing_key(sk);
  auto key = crypto::SigningKey::generate();
  save_signing_key(key, sk, dir / "audit.pub");
  spdlog::info("created audit key {} (public key: {})", sk.string(), (dir / "audit.pub").string());
  return key;
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

}  // namespace

std::uint64_t checkpoint_round(const std::filesystem::path& path) {
  Metadata meta;
  load_safetensors(path, &meta);
  return std::stoull(meta.at("xsilo.round"));
}

ServerState::ServerState(std::filesystem::path dir, std::size_t keep_checkpoints)
    : dir_(std::move(dir)), keep_(keep_checkpoints) {
  std::filesystem::create_directories(dir_ / "checkpoints");
  audit_ = std::make_unique<AuditLog>(dir_ / "audit.jsonl", open_key(dir_));
}

std::filesystem::path ServerState::checkpoint_path(std::uint64_t round) const {
  char name[64];
  std::snprintf(name, sizeof name, "round_%06llu.safetensors", static_cast<unsigned long long>(round));
  return dir_ / "checkpoints" / name;
}

Resume ServerState::recover(const Model& layout) {
  Resume r;
  // The audit log's view (verified when it was opened): last round, and the model each
  // committed round left.
  std::uint64_t audited_commit = 0;
  struct Committed {
    std::string model, optimizer;  // SHA-256s the record names ("" optimizer: none)
  };
  std::map<std::uint64_t, Committed> committed;
  // Rounds the log records after the last row of metrics.csv: their rows are appended below.
  std::uint64_t metrics_round = 0;
  if (const auto rows = read_metrics(dir_ / "metrics.csv"); !rows.empty()) metrics_round = rows.back().round;
  std::map<std::uint64_t, MetricsRow> missing_rows;
  for_each_record(audit_->path(), [&](const nlohmann::json& rec) {
    if (rec.value("event", "") != "round") return;
    const auto n = rec.value("round", std::uint64_t{0});
    if (n > metrics_round) missing_rows[n] = metrics_row_of(rec);
    r.last_round = std::max(r.last_round, n);
    if (rec.value("status", "") == "committed") {
      audited_commit = std::max(audited_commit, n);
      if (const auto ac = rec.value("robust", nlohmann::json::object()).value("adaptive_clip", nlohmann::json());
          ac.is_object() && ac.contains("next")) {
        r.clip_norm = ac["next"].get<double>();
      }
      committed[n] = {rec.value("model_sha256_after", ""), rec.value("optimizer_state_sha256", "")};
    }
  });
  auto cps = list_checkpoints(dir_ / "checkpoints");
  for (auto it = cps.rbegin(); it != cps.rend(); ++it) {
    Metadata meta;
    const std::uint64_t round = it->first;
    try {
      Model m = load_safetensors(it->second, &meta);
      if (!m.same_layout(layout)) {
        spdlog::warn("checkpoint {} has another model layout; skipped", it->second.string());
        continue;
      }
      const std::string sha = crypto::sha256_hex(m.flat());
      std::optional<Model> optimizer_state;
      const auto opt = std::filesystem::path(it->second).replace_extension(".opt");
      if (std::filesystem::exists(opt)) optimizer_state = load_safetensors(opt);
      const std::string opt_sha = optimizer_state ? crypto::sha256_hex(optimizer_state->flat()) : std::string();
      std::string untrusted;
      std::optional<std::string> line;
      Committed named;
      if (round <= audited_commit) {
        auto c = committed.find(round);
        if (c == committed.end()) {
          untrusted = "the audit log has no committed record of round " + std::to_string(round);
        } else {
          named = c->second;
        }
      } else if (!meta.count("xsilo.audit_line")) {
        untrusted = "it is ahead of the audit log and carries no signed record";
      } else {
        line = meta.at("xsilo.audit_line");
        const auto rec = nlohmann::json::parse(*line);
        named = {rec.value("model_sha256_after", ""), rec.value("optimizer_state_sha256", "")};
        if (rec.value("event", "") != "round" || rec.value("round", std::uint64_t{0}) != round ||
            rec.value("status", "") != "committed") {
          untrusted = "its signed record is not the commit of round " + std::to_string(round);
        }
      }
      if (untrusted.empty() && named.model != sha) {
        untrusted = "its model (" + sha.substr(0, 12) + ") is not the one the audit record of round " +
                    std::to_string(round) + " names (" + named.model.substr(0, 12) + ")";
      } else if (untrusted.empty() && named.optimizer != opt_sha) {
        untrusted = "its optimizer state (" + (opt_sha.empty() ? std::string("none") : opt_sha.substr(0, 12)) +
                    ") is not the one the audit record of round " + std::to_string(round) + " names (" +
                    (named.optimizer.empty() ? std::string("none") : named.optimizer.substr(0, 12)) + ")";
      }
      if (untrusted.empty() && line) {
        try {
          audit_->append_line(*line);  // checks signature and chain before writing a byte
          spdlog::warn("round {} was checkpointed but not audited; its signed record appended", round);
          if (round > metrics_round) missing_rows[round] = metrics_row_of(nlohmann::json::parse(*line));
        } catch (const std::exception& e) {
          untrusted = e.what();
        }
      }
      if (!untrusted.empty()) {
        spdlog::error("checkpoint {} not trusted: {}; trying an older one", it->second.string(), untrusted);
        continue;
      }
      r.committed_round = round;
      r.model = std::move(m);
      r.optimizer_state = std::move(optimizer_state);
      break;
    } catch (const std::exception& e) {
      spdlog::warn("checkpoint {} unreadable ({}); trying an older one", it->second.string(), e.what());
    }
  }
  if (audited_commit > r.committed_round) {
    spdlog::warn("the audit log records round {} as committed but its checkpoint is missing; "
                 "resuming from round {}", audited_commit, r.committed_round);
  }
  r.last_round = std::max(r.last_round, r.committed_round);
  for (const auto& [round, row] : missing_rows) {
    spdlog::warn("round {} is in the audit log but not in metrics.csv (the server died in between); its row "
                 "appended from the record", round);
    append_metrics(row);
  }
  return r;
}

AuditHead ServerState::commit(std::uint64_t round, const Model& model, const Model& optimizer_state,
                         const nlohmann::json& audit_record, const MetricsRow& row) {
  const auto path = checkpoint_path(round);
  if (optimizer_state.size() > 0) {
    save_safetensors(std::filesystem::path(path).replace_extension(".opt"), optimizer_state);
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
  const AuditHead head = audit_->append_line(line);
  append_metrics(row);
  prune();
  return head;
}

AuditHead ServerState::record(const nlohmann::json& audit_record, const MetricsRow* row) {
  const AuditHead head = audit_->append(audit_record);
  if (row) append_metrics(*row);
  return head;
}

void ServerState::append_metrics(const MetricsRow& r) {
  const auto path = dir_ / "metrics.csv";
  append_durable(path, (std::filesystem::exists(path) ? std::string() : metrics_header()) + to_csv(r));
}

void ServerState::prune() {
  if (keep_ == 0) return;
  auto cps = list_checkpoints(dir_ / "checkpoints");
  while (cps.size() > keep_) {
    std::error_code ec;
    std::filesystem::remove(cps.front().second, ec);
    std::filesystem::remove(std::filesystem::path(cps.front().second).replace_extension(".opt"), ec);
    cps.erase(cps.begin());
  }
}

}  // namespace xsilo::server
