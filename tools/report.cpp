// The report's page: its sources, the audit verdict, the sections in order, what the files do
// not hold.
#include "tools/report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "common/config.h"
#include "common/fs.h"
#include "tools/report_sections.h"
#include "tools/sim.h"

namespace xsilo::tools {

namespace {

using report::esc;

constexpr const char* kStyle = R"(body{font-family:sans-serif;max-width:1000px;margin:1em auto;padding:0 1em;color:#111}
h1{font-size:1.5em}h2{border-bottom:1px solid #bbb;margin-top:1.6em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}th,td{border:1px solid #bbb;padding:2px 6px;text-align:left}
caption{text-align:left;font-weight:bold;padding:4px 0}code{font-size:.9em}svg{max-width:100%;height:auto}
.legend{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:4px 18px;font-size:.9em}
.verdict{padding:8px 12px;border:3px solid #888;background:#f3f3f3}.verdict.ok{border-color:#1b7837;background:#e7f4e4}
.verdict.failed{border-color:#b2182b;border-style:double;background:#fde0dd}.hash{font-family:monospace;word-break:break-all}
@media print{body{max-width:none}nav{display:none}svg,table{break-inside:avoid}}
)";

// `name` in `dir`, else in `dir/server` (xsilo sim keeps the server's state_dir there); empty
// when neither has it.
std::filesystem::path find(const std::filesystem::path& dir, const char* name) {
  for (const auto& where : {dir, dir / "server"}) {
    if (reachable(where / name)) return where / name;
  }
  return {};
}

std::string audit_section(const report::Run& run) {
  const auto& a = run.audit;
  std::ostringstream s;
  s << "<section id='audit' aria-labelledby='audit-h'><h2 id='audit-h'>Audit log</h2>\n";
  if (!a.verified) {
    s << "<p class='verdict'><strong>NOT VERIFIED:</strong> " << esc(a.why_not) << ".</p>\n";
  } else if (const auto& v = *a.verified) {
    s << "<p class='verdict ok'><strong>VERIFIED:</strong> " << v->records
      << " records, every signature valid, the hash chain intact (checked by the server's own verifier, as "
         "<code>xsilo audit verify</code> does).</p>\n<p>Head (SHA-256 of the last record's line): <span "
         "class='hash'>"
      << esc(v->head_sha256) << "</span><br>Audit public key: <span class='hash'>" << esc(a.key_hex)
      << "</span></p>\n<p>A log cut short after its last record still verifies: compare this head with one a silo "
         "witnessed (<code>xsilo audit verify --witness</code>, docs/audit.md).</p>\n";
  } else {
    const server::AuditBreak& b = a.verified->error();
    s << "<p class='verdict failed'><strong>FAILED VERIFICATION:</strong> " << esc(b.reason) << ".</p>\n<p>The first "
      << b.verified.records << " records verify"
      << (b.verified.records ? " (head of that part: <span class='hash'>" + esc(b.verified.head_sha256) + "</span>)"
                             : std::string())
      << ". The sections below also draw the records after them as read; nothing vouches for those (the round "
         "table marks them).</p>\n";
  }
  s << "<p>" << run.records << " records read.</p>\n";
  if (!run.admin.empty()) {
    s << "<p>Operators' commands recorded:</p><ul>";
    for (const auto& c : run.admin) s << "<li>" << esc(c) << "</li>";
    s << "</ul>\n";
  }
  s << "</section>\n";
  return s.str();
}

std::string overview(const report::Run& run, const report::Layout& l) {
  std::size_t committed = 0, secure = 0;
  std::set<std::string> rules;
  for (const auto* r : l.rounds) {
    committed += r->committed;
    secure += r->secure;
    if (!r->rule.empty()) rules.insert(r->rule);
  }
  std::ostringstream s;
  s << "<p>" << l.rounds.size() << " rounds recorded: " << committed << " committed, " << l.rounds.size() - committed
    << " aborted; " << run.silos.size() << " silos, " << run.edges.size() - 1 << " edges";
  if (secure) s << "; " << secure << " rounds under secure aggregation";
  if (run.model_parameters) s << "; a model of " << run.model_parameters << " parameters";
  s << ".</p>\n";
  return s.str();
}

// What the report would draw but no file read holds: said, not guessed.
std::string gaps(const report::Run& run, const report::Layout& l) {
  std::vector<std::string> g;
  const bool events = std::any_of(l.rounds.begin(), l.rounds.end(), [](auto* r) { return r->ev_started >= 0; });
  if (!events) {
    g.push_back("Phase timings: no events.jsonl was read, so the timeline shows each record's span (started_at to "
                "ended_at) only.");
  }
  g.push_back("When each silo received the model and when it finished training: the server records neither, so "
              "broadcast and training are one span.");
  const bool eval = std::any_of(l.rounds.begin(), l.rounds.end(), [](auto* r) {
    return std::any_of(r->silos.begin(), r->silos.end(), [](auto& s) { return std::isfinite(s.eval_accuracy); });
  });
  if (!eval) g.push_back("Each silo's own evaluation: only its weighted mean is kept (metrics.csv).");
  if (std::none_of(l.rounds.begin(), l.rounds.end(), [](auto* r) { return r->epsilon_spent.has_value(); })) {
    g.push_back("Privacy spent: no record carries privacy.epsilon_spent, a silo-level privacy.epsilon or a "
                "silo's participants[].privacy.epsilon (no differential privacy is recorded in this log), so there "
                "is no privacy section.");
  }
  if (run.records == 0) {
    g.push_back("Participation, decisions, bytes and the rounds' times: they come from the audit log's records, and "
                "none was read.");
  }
  std::ostringstream s;
  s << "<section id='gaps' aria-labelledby='gaps-h'><h2 id='gaps-h'>Not in these files</h2>\n<ul>";
  for (const auto& x : g) s << "<li>" << esc(x) << "</li>";
  s << "</ul>\n";
  if (!run.problems.empty()) {
    s << "<p>Could not be read:</p><ul>";
    for (std::size_t i = 0; i < run.problems.size() && i < 20; ++i) s << "<li>" << esc(run.problems[i]) << "</li>";
    if (run.problems.size() > 20) s << "<li>... and " << run.problems.size() - 20 << " more</li>";
    s << "</ul>\n";
  }
  s << "<p>Drawn from: ";
  for (std::size_t i = 0; i < run.read.size(); ++i) s << (i ? ", " : "") << "<code>" << esc(run.read[i]) << "</code>";
  s << ".</p>\n</section>\n";
  return s.str();
}

}  // namespace

ReportSources run_sources(const std::filesystem::path& run_dir) {
  if (const auto found = reachable(run_dir, true); !found) {
    throw ConfigError("report: run folder " + run_dir.string() + " " + found.error().message());
  }
  ReportSources s;
  s.audit_log = find(run_dir, "audit.jsonl");
  if (!s.audit_log.empty()) s.audit_key = find(s.audit_log.parent_path(), "audit.pub");
  s.metrics = find(run_dir, "metrics.csv");
  s.events = find(run_dir, "events.jsonl");
  if (s.audit_log.empty() && s.metrics.empty() && s.events.empty()) {
    throw ConfigError("report: " + run_dir.string() +
                      " holds no audit.jsonl, metrics.csv or events.jsonl (in it or in server/): it is neither a "
                      "run folder of xsilo sim nor a server's state_dir");
  }
  if (reachable(run_dir / "summary.json")) s.summary = run_dir / "summary.json";
  if (reachable(run_dir / "model.safetensors")) s.model = run_dir / "model.safetensors";
  return s;
}

report::Run load_run(const ReportSources& s) {
  report::Run run;
  if (!s.audit_log.empty()) {
    run.audit = report::check_audit(s.audit_log, s.audit_key);
    const auto& v = run.audit.verified;
    const std::uint64_t vouched = !v   ? 0
                                  : *v ? std::numeric_limits<std::uint64_t>::max()
                                       : server::verified_part(*v).records;
    report::read_audit(run, s.audit_log, vouched);
  } else {
    run.audit.why_not = "no audit log (audit.jsonl) was found";
  }
  if (!s.summary.empty()) report::read_summary(run, s.summary);
  if (!s.metrics.empty()) report::read_metrics(run, s.metrics);
  if (!s.events.empty()) report::read_events(run, s.events);
  if (!s.model.empty()) report::read_model_size(run, s.model);
  return run;
}

std::string render_report(const report::Run& run) {
  const report::Layout l = report::layout_of(run);
  const std::string privacy = report::privacy_section(l);
  const std::string title = "xsilo report: " + (run.title.empty() ? std::string("a federation") : run.title);
  std::ostringstream s;
  s << "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'><title>" << esc(title) << "</title>\n<style>"
    << kStyle << "</style></head>\n<body>\n"
    << report::fill_defs() << "<header><h1>" << esc(title) << "</h1>\n"
    << overview(run, l)
    << "<nav aria-label='sections'><a href='#audit'>audit log</a> | <a href='#curves'>accuracy</a> | <a "
       "href='#participation'>who took part</a> | <a href='#robust'>robust decisions</a> | <a "
       "href='#evaluation'>silos' evaluation</a> | <a href='#timeline'>time</a> | <a href='#silo-time'>each silo's time</a> | <a href='#bytes'>bytes</a> | "
    << (privacy.empty() ? "" : "<a href='#privacy'>privacy</a> | ")
    << "<a href='#rounds'>rounds</a> | <a href='#silos'>silos</a> | <a href='#gaps'>not recorded</a></nav></header>\n"
       "<main>\n"
    << audit_section(run) << report::curves_section(run) << report::participation_section(run, l)
    << report::decisions_section(run, l) << report::evaluation_section(l) << report::timeline_section(l)
    << report::silo_time_section(run, l)
    << report::bytes_section(run, l) << privacy << report::rounds_table(l)
    << report::silos_table(run, l) << gaps(run, l) << "</main>\n</body></html>\n";
  return s.str();
}

report::Run write_report(const ReportSources& sources, const std::filesystem::path& html,
                         const std::filesystem::path& svg) {
  report::Run run = load_run(sources);
  atomic_write_file(html, render_report(run));
  if (!svg.empty()) atomic_write_file(svg, report::curves_svg(run));
  return run;
}

// A round's metrics as TensorBoard scalars (sim.h).
std::vector<std::pair<std::string, double>> tensorboard_scalars(const server::MetricsRow& r, double test_accuracy,
                                                                double test_loss) {
  std::vector<std::pair<std::string, double>> s = {{"round/committed", r.committed ? 1 : 0},
                                                   {"round/silos_reporting", static_cast<double>(r.reported)},
                                                   {"round/dropped", static_cast<double>(r.dropped)},
                                                   {"round/seconds", r.seconds},
                                                   {"round/upload_bytes", static_cast<double>(r.upload_bytes)}};
  if (r.committed) s.emplace_back("train/loss", r.train_loss);
  if (!std::isnan(test_accuracy)) s.emplace_back("test/accuracy", test_accuracy);
  if (!std::isnan(test_loss)) s.emplace_back("test/loss", test_loss);
  if (r.fed_eval_accuracy > 0 || r.fed_eval_loss > 0) {
    s.insert(s.end(), {{"federated_eval/accuracy", r.fed_eval_accuracy}, {"federated_eval/loss", r.fed_eval_loss}});
  }
  return s;
}

}  // namespace xsilo::tools
