// xsilo audit verify | show: what an auditor runs, offline, on a copy of the log.
#include <iostream>
#include <string>
#include <vector>

#include "common/config.h"
#include "crypto/sign.h"
#include "server/audit.h"
#include "server/state.h"
#include "tools/commands.h"

namespace xsilo::tools {

namespace {

std::string short_hash(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>().substr(0, 12) : "-";
}

void show_record(const nlohmann::json& r) {
  const std::string event = r.value("event", "?");
  std::cout << "#" << r.value("seq", 0) << "  " << event;
  if (event == "round") {
    std::cout << " " << r.value("round", 0) << "  " << r.value("status", "?") << "  "
              << r.value("started_at", "") << " .. " << r.value("ended_at", "") << "\n";
    if (r.contains("reason")) std::cout << "    reason: " << r["reason"].get<std::string>() << "\n";
    std::cout << "    model " << short_hash(r["model_sha256_before"]) << " -> "
              << short_hash(r["model_sha256_after"]) << "   rule "
              << r["aggregation"].value("rule", "?") << " / optimizer "
              << r["aggregation"].value("optimizer", "?") << "\n";
    for (const auto& p : r.value("participants", nlohmann::json::array())) {
      std::cout << "    + " << p.value("silo", "?");
      if (p.contains("num_samples")) std::cout << "  samples " << p["num_samples"].get<std::uint64_t>();
      std::cout << "  update " << short_hash(p["update_sha256"]);
      if (p.contains("edge")) std::cout << "  via " << p["edge"].get<std::string>();
      std::cout << "\n";
    }
    for (const auto& d : r.value("dropouts", nlohmann::json::array())) {
      std::cout << "    - " << d.value("silo", "?") << "  dropped in " << d.value("phase", "?")
                << ": " << d.value("reason", "") << "\n";
    }
    for (const auto& s : r.value("surplus", nlohmann::json::array())) {
      std::cout << "    ~ " << s.get<std::string>() << "  not needed (over-selection)\n";
    }
    if (r.contains("robust")) std::cout << "    robust: " << r["robust"].dump() << "\n";
    if (r.contains("secure")) std::cout << "    secure: " << r["secure"].dump() << "\n";
  } else {
    std::cout << "  " << r.value("time", "") << "\n";
    for (auto it = r.begin(); it != r.end(); ++it) {
      if (it.key() == "event" || it.key() == "seq" || it.key() == "prev" || it.key() == "sig" ||
          it.key() == "time") {
        continue;
      }
      std::cout << "    " << it.key() << ": " << it.value().dump() << "\n";
    }
  }
}

// A check after the chain verified did not hold: why, and that the chain itself did. Returns false.
bool failed(const std::string& why, const server::AuditChain& r, const std::string& but) {
  std::cout << "FAILED: " << why << "\n"
            << "the log's " << r.records << " records verify; " << but << "\n";
  return false;
}

// `audit verify`, after the chain verified: every witness's signed heads are in the log. False
// (having said why) when one is not.
bool witnesses_consistent(const server::AuditChain& r, const std::vector<std::string>& witnesses) {
  for (const auto& w : witnesses) {
    const auto c = server::check_witness(r, w);
    if (!c) return failed(c.error().message(), r, "the witness shows it is not the log the server signed heads of");
    std::cout << "witness " << w << ": " << c->checked << " signed heads, all in the log\n";
    if (c->ignored) {
      std::cout << "  " << c->ignored << " entries not signed by this key were ignored (no evidence either way); "
                << "the first: " << c->first_ignored << "\n";
    }
  }
  return true;
}

// "2 committed noised rounds and 1 aborted round whose unmasking began": the silo-level rounds
// that spent, by kind.
std::string rounds_that_spent(const server::PrivacyAudit& a) {
  const auto count = [](std::uint64_t n, const char* one, const char* many) {
    return std::to_string(n) + " " + (n == 1 ? one : many);
  };
  std::vector<std::string> parts;
  if (a.silo_committed || (!a.silo_aborted && !a.silo_interrupted)) {
    parts.push_back(count(a.silo_committed, "committed noised round", "committed noised rounds"));
  }
  if (a.silo_aborted) {
    parts.push_back(count(a.silo_aborted, "aborted round whose unmasking began",
                          "aborted rounds whose unmasking began"));
  }
  if (a.silo_interrupted) {
    parts.push_back(count(a.silo_interrupted, "round whose unmasking began and no record of it followed",
                          "rounds whose unmasking began and no record of them followed"));
  }
  std::string s;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    s += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
  }
  return s;
}

// Record-level privacy: every claimed epsilon recomputed from its recorded parameters. False (having
// said why) when a claim is less than they give.
bool privacy_claims_hold(const server::AuditChain& r, const std::string& log) {
  const auto privacy = server::check_privacy_claims(server::read_audit_log(log));
  if (!privacy) return failed(privacy.error().message(), r, "a privacy claim in it does not");
  if (privacy->spends) {
    std::cout << "privacy: " << privacy->spends << " record-level spends of " << privacy->epsilon.size()
              << " silos recomputed from their parameters, every claim at least what they give\n";
    for (const auto& [silo, eps] : privacy->epsilon) std::cout << "  " << silo << ": epsilon " << eps << "\n";
  }
  if (privacy->silo_rounds()) {
    std::cout << "privacy: silo-level " << privacy->silo_mode << " DP, " << rounds_that_spent(*privacy)
              << " recomposed from their parameters: epsilon " << privacy->silo_epsilon
              << ", every claim at least what they give\n";
  }
  return true;
}

// Distributed DP: each silo's sent.jsonl names the Skellam setup of every upload, which the
// log's records of that round must name. False (having said why) when one does not.
bool sent_setups_recorded(const server::AuditChain& r, const std::string& log, const std::vector<std::string>& sent,
                          const server::SentOptions& options) {
  if (sent.empty()) return true;
  const auto records = server::read_audit_log(log);
  auto with_hashes = options;
  with_hashes.line_sha256 = r.line_sha256;
  for (const auto& file : sent) {
    const auto c = server::check_sent_setups(records, file, with_hashes);
    if (!c) return failed(c.error().message(), r, "it does not record the distributed-DP setup the silo was sent");
    std::cout << "sent " << file << ": " << c->compared
              << " distributed-DP uploads, each under the setup the log's records of its round name\n";
    if (c->releases) {
      std::cout << "  " << c->releases << " releases of its unmask shares, each in a round the log charges under the "
                << "setup released under; " << c->bound << " of them against the unmask_begun record the server showed, "
                << "each a record (a charge) of its own\n";
    }
    if (c->torn_last_line) std::cout << "  its last line was cut off mid-append (the silo crashed): skipped\n";
    if (c->other_federation) {
      std::cout << "  " << c->other_federation << " lines of another federation than the log's (skipped)\n";
    }
    if (c->unrecorded) {
      std::cout << "  " << c->unrecorded
                << (options.log_may_be_stale
                        ? " uploads or releases to rounds after the log's last record of a round (--log-may-be-stale: "
                          "this copy of the log may predate them; no evidence either way)\n"
                        : " uploads to rounds after the log's last round record (no evidence either way: an upload "
                          "leaves before its round's unmask_begun)\n");
    }
  }
  return true;
}

// `audit verify`: the signatures and the hash chain, then the witnesses, the privacy claims and
// the silos' sent setups. Returns the exit code: 0 when all hold, 1 when one does not.
int verify_audit(const std::string& log, const std::string& key, const std::vector<std::string>& witnesses,
                 const std::vector<std::string>& sent, const server::SentOptions& options) {
  std::string pk;
  try {
    pk = server::load_public_key(key);
  } catch (const std::exception& e) {
    throw ConfigError(std::string("audit verify: ") + e.what());
  }
  const auto v = server::verify_audit_log(log, pk);
  if (!v) {
    std::cout << "FAILED: " << v.error().reason << "\n";
    if (const auto n = v.error().verified.records) std::cout << "the first " << n << " records verify\n";
    return 1;
  }
  const server::AuditChain& r = *v;
  if (!witnesses_consistent(r, witnesses) || !privacy_claims_hold(r, log) || !sent_setups_recorded(r, log, sent, options)) {
    return 1;
  }
  if (r.keys.size() > 1) {
    std::cout << "the audit key was rotated " << r.keys.size() - 1 << " time(s); the log is signed by "
              << server::key_hex(r.keys.back().public_key) << " since record " << r.keys.back().from_seq << "\n";
  }
  std::cout << "OK: " << r.records << " records, every signature valid, chain intact"
            << (witnesses.empty() ? "" : ", every witness consistent")
            << (sent.empty() ? "" : ", every silo's distributed-DP setup recorded") << "\n"
            << "head " << r.head_sha256 << "\n";
  return 0;
}

}  // namespace

void add_audit(CLI::App& app, int& exit_code) {
  auto* audit = app.add_subcommand("audit", "verify or read a server's signed audit log");
  audit->require_subcommand(1);

  auto log = std::make_shared<std::string>();
  auto key = std::make_shared<std::string>();
  auto witnesses = std::make_shared<std::vector<std::string>>();
  auto sent = std::make_shared<std::vector<std::string>>();
  auto* verify = audit->add_subcommand("verify", "check every signature and the hash chain");
  verify->add_option("log", *log, "audit log (audit.jsonl)")->required();
  verify->add_option("--key", *key, "the server's audit public key (audit.pub)")->required();
  verify->add_option("--witness", *witnesses,
                     "a silo's audit_heads.jsonl: the heads the server signed for it must all be in the log")
      ->check(CLI::ExistingFile);
  verify->add_option("--sent", *sent,
                     "a silo's sent.jsonl: the distributed-DP setup each upload names (skellam_setup_sha256) must be "
                     "the setup_sha256 the log's records of its round name, and every round in which the silo "
                     "released its unmask shares must be charged by the log (a release to a round the log has no "
                     "record of fails)")
      ->check(CLI::ExistingFile);
  auto sent_options = std::make_shared<server::SentOptions>();
  verify->add_flag("--log-may-be-stale", sent_options->log_may_be_stale,
                   "with --sent: the log is a live snapshot that may predate a silo's last release, so a release to "
                   "a round after the log's last record is reported, not failed (unless a federation_end ends the log)");
  verify->callback([log, key, witnesses, sent, sent_options, &exit_code] {
    exit_code = verify_audit(*log, *key, *witnesses, *sent, *sent_options);
  });

  auto state_dir = std::make_shared<std::string>();
  auto rotate_by = std::make_shared<std::string>("operator");
  auto* rotate = audit->add_subcommand(
      "rotate-key",
      "replace the audit key: the old key signs a record naming the new one (the server must be stopped)");
  rotate->add_option("--state", *state_dir, "the server's state_dir")->required();
  rotate->add_option("--by", *rotate_by, "who rotates (written into the record)");
  rotate->callback([state_dir, rotate_by, &exit_code] {
    if (!std::filesystem::is_directory(*state_dir) || !std::filesystem::exists(std::filesystem::path(*state_dir) / "audit.key")) {
      throw ConfigError("audit rotate-key: " + *state_dir + " is not a server state folder (no audit.key)");
    }
    server::ServerState state(std::filesystem::path(*state_dir), 0);
    const auto old_key = state.audit().public_key();
    const auto head = state.rotate_key(*rotate_by);
    std::cout << "rotated the audit key: " << server::key_hex(old_key) << " -> " << server::key_hex(state.audit().public_key())
              << "\nrecord " << head.seq << " (signed by the old key) names the new one; audit.pub still holds the "
              << "first key, from which `xsilo audit verify` follows the rotations\n";
    exit_code = 0;
  });

  auto show_log = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto* show = audit->add_subcommand("show", "print the records readably (signatures not checked)");
  show->add_option("log", *show_log, "audit log (audit.jsonl)")->required();
  show->add_flag("--json", *json, "one pretty-printed JSON object per record");
  show->callback([show_log, json, &exit_code] {
    for (const auto& r : server::read_audit_log(*show_log)) {
      if (*json) {
        std::cout << r.dump(2) << "\n";
      } else {
        show_record(r);
      }
    }
    exit_code = 0;
  });
}

}  // namespace xsilo::tools
