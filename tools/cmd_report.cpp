// xsilo report RUN_DIR | --audit LOG --key PUB: the run's report.html, or the auditor's part of
// it from the signed log alone.
#include <iostream>

#include "common/config.h"
#include "common/fs.h"
#include "tools/commands.h"
#include "tools/report.h"

namespace xsilo::tools {

void add_report(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "report", "write report.html: audit verdict, accuracy, who took part, robust decisions, time, bytes");
  auto run_dir = std::make_shared<std::string>();
  auto log = std::make_shared<std::string>();
  auto key = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  cmd->add_option("run_dir", *run_dir, "a run folder (xsilo sim --out) or a server's state_dir");
  auto* audit = cmd->add_option("--audit", *log, "an audit log alone (audit.jsonl): the auditor's part");
  cmd->add_option("--key", *key, "the server's audit public key (audit.pub), to verify the log with")->needs(audit);
  cmd->add_option("--out", *out, "where to write the page (default: RUN_DIR/report.html, or audit-report.html "
                                  "beside the log)");
  cmd->callback([run_dir, log, key, out, &exit_code] {
    if (run_dir->empty() == log->empty()) {
      throw ConfigError("report: give a run folder or --audit LOG --key PUB (one of the two)");
    }
    ReportSources sources;
    std::filesystem::path page;
    if (!run_dir->empty()) {
      sources = run_sources(*run_dir);
      page = out->empty() ? std::filesystem::path(*run_dir) / "report.html" : std::filesystem::path(*out);
    } else {
      if (key->empty()) throw ConfigError("report: --audit needs --key PUB, the key to verify the log with");
      for (const auto& p : {*log, *key}) {
        if (const auto why = why_absent(p); !why.empty()) throw ConfigError("report: " + p + " " + why);
      }
      sources.audit_log = *log;
      sources.audit_key = *key;
      page = out->empty() ? std::filesystem::path(*log).parent_path() / "audit-report.html" : std::filesystem::path(*out);
    }
    const auto run = write_report(sources, page);
    const auto& a = run.audit;
    std::cout << "wrote " << page.string() << ": " << run.rounds.size() << " rounds, " << run.silos.size() << " silos; "
              << (!a.attempted ? "audit log NOT VERIFIED (" + a.why_not + ")"
                  : a.ok       ? "audit log verified, " + std::to_string(a.records) + " records, head " + a.head_sha256
                               : "audit log FAILED verification: " + a.reason)
              << "\n";
    // As `xsilo audit verify`: 1 when a log was checked and failed (the page is written all the same).
    exit_code = a.attempted && !a.ok ? 1 : 0;
  });
}

}  // namespace xsilo::tools
