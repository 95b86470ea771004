// xsilo report RUN_DIR | --audit LOG --key PUB: the run's report.html, or the auditor's part of
// it from the signed log alone. xsilo report tensorboard METRICS OUT: a server's metrics.csv as
// TensorBoard event files (the scalars the sim's report.tensorboard writes).
#include <cmath>
#include <cstdio>
#include <iostream>

#include "common/config.h"
#include "common/fs.h"
#include "common/tensorboard.h"
#include "tools/commands.h"
#include "tools/report.h"
#include "tools/sim.h"

namespace xsilo::tools {

namespace {

void add_tensorboard(CLI::App& report, int& exit_code) {
  auto* tb = report.add_subcommand(
      "tensorboard", "write a server's metrics.csv (state_dir/metrics.csv) as TensorBoard event files, step = round");
  auto metrics = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  tb->add_option("metrics", *metrics, "the server's metrics.csv")->required();
  tb->add_option("out", *out, "the folder for the event files (tensorboard --logdir OUT)")->required();
  tb->callback([metrics, out, &exit_code] {
    std::vector<server::MetricsRow> rows;
    try {
      rows = server::read_metrics(*metrics);
    } catch (const std::exception& e) {
      throw ConfigError(std::string("report tensorboard: ") + e.what());
    }
    TensorBoardWriter writer(*out);
    for (const auto& r : rows) writer.write(static_cast<std::int64_t>(r.round), tensorboard_scalars(r, NAN, NAN));
    std::printf("wrote %zu rounds to %s\n", rows.size(), writer.file().string().c_str());
    exit_code = 0;
  });
}

}  // namespace

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
  add_tensorboard(*cmd, exit_code);
  cmd->callback([cmd, run_dir, log, key, out, &exit_code] {
    if (cmd->get_subcommands().size() > 0) return;  // report tensorboard did the work
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
        if (const auto found = reachable(p); !found) throw ConfigError("report: " + p + " " + found.error().message());
      }
      sources.audit_log = *log;
      sources.audit_key = *key;
      page = out->empty() ? std::filesystem::path(*log).parent_path() / "audit-report.html" : std::filesystem::path(*out);
    }
    const auto run = write_report(sources, page);
    const auto& v = run.audit.verified;
    std::cout << "wrote " << page.string() << ": " << run.rounds.size() << " rounds, " << run.silos.size() << " silos; "
              << (!v   ? "audit log NOT VERIFIED (" + run.audit.why_not + ")"
                  : *v ? "audit log verified, " + std::to_string((*v)->records) + " records, head " + (*v)->head_sha256
                       : "audit log FAILED verification: " + v->error().reason)
              << "\n";
    // As `xsilo audit verify`: 1 when a log was checked and failed (the page is written all the same).
    exit_code = v && !*v ? 1 : 0;
  });
}

}  // namespace xsilo::tools
