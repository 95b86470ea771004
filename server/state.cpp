#include "server/state.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <fstream>

#include "common/fs.h"
#include "common/safetensors.h"

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
  // The audit log's view: last round and last committed round.
  std::uint64_t audited_commit = 0;
  for (const auto& rec : read_audit_log(audit_->path())) {
    if (rec.value("event", "") != "round") continue;
    const auto n = rec.value("round", std::uint64_t{0});
    r.last_round = std::max(r.last_round, n);
    if (rec.value("status", "") == "committed") audited_commit = std::max(audited_commit, n);
  }
  auto cps = list_checkpoints(dir_ / "checkpoints");
  for (auto it = cps.rbegin(); it != cps.rend(); ++it) {
    Metadata meta;
    try {
      Model m = load_safetensors(it->second, &meta);
      if (!m.same_layout(layout)) {
        spdlog::warn("checkpoint {} has another model layout; skipped", it->second.string());
        continue;
      }
      r.committed_round = it->first;
      r.model = std::move(m);
      const auto opt = std::filesystem::path(it->second).replace_extension(".opt");
      if (std::filesystem::exists(opt)) r.optimizer_state = load_safetensors(opt);
      if (r.committed_round > audited_commit && meta.count("xsilo.audit_record")) {
        // The server died after the checkpoint and before its audit record: write it now.
        auto rec = nlohmann::json::parse(meta.at("xsilo.audit_record"));
        rec["recovered_from_checkpoint"] = true;
        audit_->append(rec);
        spdlog::warn("round {} was checkpointed but not audited; audit record restored", r.committed_round);
      }
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
  return r;
}

void ServerState::commit(std::uint64_t round, const Model& model, const Model& optimizer_state,
                         const nlohmann::json& audit_record, const MetricsRow& row) {
  const auto path = checkpoint_path(round);
  if (optimizer_state.size() > 0) {
    save_safetensors(std::filesystem::path(path).replace_extension(".opt"), optimizer_state);
  }
  save_safetensors(path, model,
                   {{"xsilo.round", std::to_string(round)},
                    {"xsilo.model_sha256", audit_record.value("model_sha256_after", "")},
                    {"xsilo.audit_record", audit_record.dump()}});
  audit_->append(audit_record);
  append_metrics(row);
  prune();
}

void ServerState::record(const nlohmann::json& audit_record, const MetricsRow* row) {
  audit_->append(audit_record);
  if (row) append_metrics(*row);
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
