#include "silo_agent/silo_state.h"

#include <fstream>
#include <optional>
#include <regex>

#include "common/fs.h"
#include "common/safetensors.h"
#include "crypto/hash.h"
#include "protocol/secagg_wire.h"

namespace xsilo::agent {

namespace {

constexpr const char* kLogs[] = {"sent.jsonl", "audit_heads.jsonl"};

// The last line of sent.jsonl that names a residual: its hash ("" when none does).
std::string last_residual_named(const std::filesystem::path& sent) {
  std::ifstream in(sent);
  std::string named;
  for (std::string line; std::getline(in, line);) {
    try {
      const auto rec = nlohmann::json::parse(line);
      if (rec.contains("error_feedback_sha256")) named = rec["error_feedback_sha256"].get<std::string>();
    } catch (const nlohmann::json::exception&) {
      // a damaged line names nothing; the lines around it still count
    }
  }
  return named;
}

}  // namespace

std::filesystem::path staged_path(const std::filesystem::path& residual_file) {
  auto p = residual_file;
  p.replace_extension(".staged.safetensors");
  return p;
}

void commit_record(const std::filesystem::path& log, const nlohmann::json& entry, const std::filesystem::path& staged,
                   const std::filesystem::path& onto) {
  cut_torn_tail(log);
  append_durable(log, entry.dump() + "\n");
  if (staged.empty()) return;
  std::filesystem::rename(staged, onto);
  fsync_dir(onto.parent_path());
}

std::optional<wire::Witness> last_witnessed(const std::filesystem::path& dir) {
  std::ifstream in(dir / "audit_heads.jsonl");
  std::optional<wire::Witness> last;
  for (std::string line; std::getline(in, line);) {
    try {
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("key")) continue;  // kept before silos checked heads: no key to go by
      wire::Witness w;
      w.mutable_head()->set_seq(j.at("seq").get<std::uint64_t>());
      w.mutable_head()->set_sha256(j.at("head").get<std::string>());
      w.mutable_head()->set_signature(j.at("sig").get<std::string>());
      w.set_public_key(crypto::from_hex(j.at("key").get<std::string>()));
      last = std::move(w);
    } catch (const std::exception&) {
      // a damaged line witnesses nothing
    }
  }
  return last;
}

std::set<std::string> unmask_releases(const std::filesystem::path& dir, const std::string& federation) {
  std::ifstream in(dir / "sent.jsonl");
  std::set<std::string> out;
  for (std::string line; std::getline(in, line);) {
    try {
      const auto j = nlohmann::json::parse(line);
      if (j.value("kind", "") != protocol::kUnmaskSharesReleased || j.value("federation", "") != federation) continue;
      if (!j.contains("unmask_begun_seq")) continue;  // written before releases named their record
      out.insert(std::to_string(j.at("unmask_begun_seq").get<std::uint64_t>()) + ":" +
                 j.at("unmask_begun_sha256").get<std::string>());
    } catch (const std::exception&) {
      // a damaged line names no record (a torn last line is cut at start: repair_state)
    }
  }
  return out;
}

std::string residual_sha256(const std::filesystem::path& file) {
  const Model m = load_safetensors(file);
  return crypto::sha256_hex(m.flat());
}

std::vector<std::string> repair_state(const std::filesystem::path& dir) {
  std::vector<std::string> did;
  if (!std::filesystem::is_directory(dir)) return did;
  for (const char* name : kLogs) {
    const auto torn = cut_torn_tail(dir / name);
    if (!torn.empty()) {
      did.push_back(std::string(name) + ": cut a torn last line of " + std::to_string(torn.size()) +
                    " bytes (a write that a crash or a full disk interrupted)");
    }
  }
  // atomic_write_parts names its temporaries NAME.tmpDIGITS; safetensors' plain writer NAME.tmp.
  static const std::regex temporary(R"(.+\.tmp[0-9]*)");
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    if (e.is_regular_file() && std::regex_match(name, temporary)) {
      std::filesystem::remove(e.path());
      did.push_back(name + ": removed (the temporary file of a write that did not finish)");
    }
  }
  const auto residual = dir / "error_feedback.safetensors";
  const auto staged = staged_path(residual);
  if (std::filesystem::exists(staged)) {
    const std::string named = last_residual_named(dir / "sent.jsonl");
    std::string staged_sha;
    try {
      staged_sha = residual_sha256(staged);
    } catch (const std::exception&) {
      // unreadable: it cannot be the one a line names
    }
    if (!named.empty() && staged_sha == named) {
      std::filesystem::rename(staged, residual);
      fsync_dir(dir);
      did.push_back(staged.filename().string() + ": became the error feedback (its upload's line of sent.jsonl "
                                                 "was written before the last run ended)");
    } else {
      std::filesystem::remove(staged);
      did.push_back(staged.filename().string() + ": removed (its upload never left)");
    }
  }
  return did;
}

}  // namespace xsilo::agent
