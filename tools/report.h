// report.html: what researchers and auditors read of a federation run. One self-contained file
// (inline SVG and CSS, no script, nothing fetched): whether the audit log verifies and its head,
// accuracy and loss, who took part in each round and why others did not, what the robust rule
// decided, each silo's evaluation where recorded, where each round's time went, the bytes that
// moved, and the privacy spent where records carry it. docs/audit.md, "The report", says which
// file each section is drawn from.
#pragma once

#include <filesystem>
#include <string>

#include "tools/report_data.h"

namespace xsilo::tools {

// The files a report is drawn from; an empty path is a file the report does without.
struct ReportSources {
  std::filesystem::path audit_log, audit_key, metrics, events, summary, model;
};

// The files of a run folder: `xsilo sim --out DIR` (its metrics.csv, summary.json,
// model.safetensors, audit.jsonl and audit.pub, and server/events.jsonl) or a server's
// state_dir. Throws ConfigError when the folder is missing or holds none of them.
ReportSources run_sources(const std::filesystem::path& run_dir);
// Reads and checks what the sources hold; never throws for a damaged or missing file (the run's
// `problems` say what could not be read).
report::Run load_run(const ReportSources& sources);
std::string render_report(const report::Run& run);
// Writes `html` (and `svg`, the accuracy and loss curves alone, unless empty); returns the run.
report::Run write_report(const ReportSources& sources, const std::filesystem::path& html,
                         const std::filesystem::path& svg = {});

}  // namespace xsilo::tools
