// Per-round charts: accuracy and loss, the silos' own evaluation, where each round's time went,
// the bytes that moved, the privacy spent; and the round table that says the same in words.
#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "server/round_record.h"
#include "tools/report_sections.h"

namespace xsilo::tools::report {

namespace {

double seconds(std::int64_t from, std::int64_t to) {
  return from >= 0 && to >= 0 ? std::max<double>(0, static_cast<double>(to - from) / 1000.0) : NAN;
}

// Where a round's time went. From events.jsonl: start -> first upload granted (the model's
// broadcast and the silos' training: not recorded apart), -> round closed (uploads), -> the
// record's ended_at (secure rounds: unmasking), -> committed or aborted (the aggregate, the
// optimizer, the checkpoint and the audit record). Without events: the record's span only.
std::array<double, 5> phases(const Round& r) {
  std::array<double, 5> p{};
  if (r.ev_started >= 0 && r.ev_closed >= 0 && r.ev_done >= 0) {
    const std::int64_t grant = r.ev_first_grant >= 0 ? r.ev_first_grant : r.ev_closed;
    p[0] = seconds(r.ev_started, grant);
    p[1] = seconds(grant, r.ev_closed);
    const std::int64_t decided = r.secure && r.ended_ms >= r.ev_closed ? r.ended_ms : r.ev_closed;
    p[2] = seconds(r.ev_closed, decided);
    p[3] = seconds(decided, r.ev_done);
  } else if (r.started_ms >= 0 && r.ended_ms >= 0) {
    p[4] = seconds(r.started_ms, r.ended_ms);
  }
  return p;
}

constexpr const char* kPhaseNames[5] = {"broadcast + train", "upload", "unmask (secure rounds)",
                                        "commit (aggregate, optimizer, checkpoint, audit record)",
                                        "round, as the record spans it (no events.jsonl)"};
constexpr const char* kPhaseFills[5] = {"phase0", "phase1", "phase2", "phase3", "plain"};

// A line chart of some per-round values of the rounds that have them.
template <class Get>
std::vector<double> per_round(const std::vector<const Round*>& rounds, Get get) {
  std::vector<double> v;
  for (const Round* r : rounds) v.push_back(get(*r));
  return v;
}

std::vector<const Round*> with_metrics(const Run& run) {
  std::vector<const Round*> out;
  for (const auto& [n, r] : run.rounds) {
    if (std::isfinite(r.accuracy) || std::isfinite(r.fed_eval_accuracy)) out.push_back(&r);
  }
  return out;
}

std::pair<LineChart, LineChart> curves(const Run& run) {
  const auto rounds = with_metrics(run);
  LineChart acc, loss;
  acc.frame = {"accuracy-chart", "Test accuracy per round",
               "Accuracy of each committed round's model: on the held-out rows (xsilo sim), and the federated "
               "evaluation (the silos' own test splits, weighted by their size).",
               "round", "accuracy"};
  loss.frame = {"loss-chart", "Test loss per round", "Loss of each committed round's model, as above.", "round", "loss"};
  acc.percent = true;
  acc.xs = loss.xs = per_round(rounds, [](const Round& r) { return static_cast<double>(r.round); });
  const bool held_out = std::any_of(rounds.begin(), rounds.end(), [](const Round* r) { return std::isfinite(r->accuracy); });
  if (held_out) {
    acc.series.push_back({"held-out rows", per_round(rounds, [](const Round& r) { return r.accuracy; }), 0});
    loss.series.push_back({"held-out rows", per_round(rounds, [](const Round& r) { return r.loss; }), 0});
  }
  acc.series.push_back({"federated evaluation", per_round(rounds, [](const Round& r) { return r.fed_eval_accuracy; }), 1});
  loss.series.push_back({"federated evaluation", per_round(rounds, [](const Round& r) { return r.fed_eval_loss; }), 1});
  if (run.baseline_accuracy >= 0) {
    acc.reference = run.baseline_accuracy;
    acc.reference_label = "centralized training: " + fmt(100 * run.baseline_accuracy, "%.2f") + "%";
  }
  return {acc, loss};
}

}  // namespace

std::string curves_section(const Run& run) {
  std::ostringstream s;
  s << "<section id='curves' aria-labelledby='curves-h'><h2 id='curves-h'>Accuracy and loss</h2>\n";
  if (with_metrics(run).empty()) {
    s << "<p><strong>Not drawn:</strong> accuracy and loss are in a run folder's <code>metrics.csv</code>, which this "
         "report did not have (the audit log does not record them).</p></section>\n";
    return s.str();
  }
  const auto [acc, loss] = curves(run);
  s << "<p>From <code>metrics.csv</code>. The federated evaluation is each round's incoming model evaluated by the "
       "silos on their own test splits, before training, weighted by their size.</p>\n"
    << line_chart(acc) << line_chart(loss) << "</section>\n";
  return s.str();
}

std::string curves_svg(const Run& run) {
  const auto [acc, loss] = curves(run);
  return "<svg xmlns='http://www.w3.org/2000/svg' width='900' height='630'>\n<svg y='0'>" + line_chart(acc) +
         "</svg>\n<svg y='318'>" + line_chart(loss) + "</svg>\n</svg>\n";
}

std::string evaluation_section(const Layout& l) {
  std::ostringstream s;
  s << "<section id='evaluation' aria-labelledby='evaluation-h'><h2 id='evaluation-h'>Each silo's evaluation</h2>\n";
  std::vector<double> lo, mid, hi, xs;
  for (const Round* r : l.rounds) {
    std::vector<double> v;
    for (const auto& x : r->silos) {
      if (std::isfinite(x.eval_accuracy)) v.push_back(x.eval_accuracy);
    }
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    xs.push_back(static_cast<double>(r->round));
    lo.push_back(v.front());
    mid.push_back(v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2);
    hi.push_back(v.back());
  }
  if (xs.empty()) {
    s << "<p><strong>Not recorded.</strong> Each silo evaluates the round's model on its own test split and sends "
         "the result with its update; the server records it per participant "
         "(<code>participants[].metrics.eval_accuracy</code>), but no round record of this log carries it (a log "
         "written before servers recorded it, or a federation whose silos do not evaluate), so a silo that does "
         "badly behind a good mean cannot be shown here. The weighted mean is in <code>metrics.csv</code>.</p>"
         "</section>\n";
    return s.str();
  }
  LineChart c;
  c.frame = {"evaluation-chart", "Silos' own test accuracy per round",
             "The lowest, median and highest accuracy among the silos that reported an evaluation.", "round",
             "accuracy"};
  c.percent = true;
  c.xs = xs;
  c.series = {{"highest silo", hi, 0}, {"median silo", mid, 1}, {"lowest silo", lo, 2}};
  s << "<p>From <code>participants[].metrics.eval_accuracy</code> of the round records.</p>\n" << line_chart(c)
    << "</section>\n";
  return s.str();
}

std::string timeline_section(const Layout& l) {
  std::ostringstream s;
  s << "<section id='timeline' aria-labelledby='timeline-h'><h2 id='timeline-h'>Where the time went</h2>\n";
  const Bins& b = l.columns;
  BarChart c;
  c.frame = {"timeline-chart", "Seconds per round, by phase",
             "Stacked: broadcast and training, uploads, unmasking, commit; from the server's events.jsonl and the "
             "records' started_at and ended_at.",
             b.per == 1 ? "round" : "rounds (mean per round)", "seconds"};
  std::array<double, 5> total{};
  for (std::size_t i = 0; i < b.count(); ++i) {
    std::array<double, 5> mean{};
    for (std::size_t k = b.first(i); k < b.end(i); ++k) {
      const auto p = phases(*l.rounds[k]);
      for (std::size_t j = 0; j < 5; ++j) mean[j] += p[j] / static_cast<double>(b.end(i) - b.first(i)), total[j] += p[j];
    }
    c.values.emplace_back(mean.begin(), mean.end());
    c.x_labels.push_back(std::to_string(l.rounds[b.first(i)]->round));
    std::string hover = (b.per == 1 ? "round " : "rounds ") + round_span(l, i) + ":";
    for (std::size_t j = 0; j < 5; ++j) {
      if (mean[j] > 0) hover += " " + std::string(kPhaseNames[j]) + " " + fmt(mean[j], "%.3f") + " s;";
    }
    c.hover.push_back(hover);
  }
  for (std::size_t j = 0; j < 5; ++j) {
    if (total[j] > 0) c.fills.push_back(kPhaseFills[j]), c.labels.push_back(kPhaseNames[j]);
  }
  // Keep only the segments that occur, in order.
  for (auto& bar : c.values) {
    std::vector<double> kept;
    for (std::size_t j = 0; j < 5; ++j) {
      if (total[j] > 0) kept.push_back(bar[j]);
    }
    bar = kept;
  }
  c.y_text = [](double v) { return fmt(v, "%.3g"); };
  if (c.fills.empty()) {
    s << "<p><strong>No timing recorded</strong> in the files read.</p></section>\n";
    return s.str();
  }
  s << "<p>Broadcast and training are one span here: the round's start to its first upload grant (silos "
       "train in parallel; each silo's own parts are in the next section). "
       "Unmasking runs from the round's close to the record's <code>ended_at</code> in secure rounds; the commit "
       "from there to the <code>round_committed</code> event.</p>\n"
    << bar_chart(c) << "<table><caption>Time per phase, all rounds</caption><tr><th scope='col'>phase</th><th "
                       "scope='col'>seconds</th><th scope='col'>share</th></tr>\n";
  double all = 0;
  for (double t : total) all += t;
  for (std::size_t j = 0; j < 5; ++j) {
    if (total[j] > 0) {
      s << "<tr><th scope='row'>" << esc(kPhaseNames[j]) << "</th><td>" << fmt(total[j], "%.3f") << "</td><td>"
        << fmt(100 * total[j] / all, "%.1f") << "%</td></tr>\n";
    }
  }
  s << "</table>\n</section>\n";
  return s.str();
}

namespace {

// A silo's round in parts, from its record timeline (seconds): the model received, training (the
// silo's own report), the rest before it was ready (set-up, secure key steps), waiting for its
// upload slot, uploading, then waiting for the round to end (the others, unmasking). NAN parts
// where the timeline lacks a step.
constexpr std::size_t kSiloParts = 6;
constexpr const char* kSiloPartNames[kSiloParts] = {
    "model received", "training (as the silo reports it)", "other work before ready (set-up, secure key steps)",
    "waiting for its upload slot (idle)", "uploading", "waiting for the round to close (idle)"};
constexpr const char* kSiloPartFills[kSiloParts] = {"phase0", "up", "plain", "phase1", "down", "phase2"};

std::array<double, kSiloParts> silo_parts(const Round& r, const SiloRound& s) {
  const auto& t = s.times;
  const double end = seconds(r.started_ms, r.ended_ms);
  const double trained = std::isfinite(t.train) ? t.train : 0.0;
  return {t.model_sent,
          t.train,
          std::max(0.0, static_cast<double>(t.ready) - (std::isfinite(t.model_sent) ? t.model_sent : 0.0) - trained),
          static_cast<double>(t.granted) - t.ready,
          static_cast<double>(t.received) - t.granted,
          end - t.received};
}

}  // namespace

// Each silo's share of its rounds: the mean of each part over the rounds whose record gives the
// silo a timeline (committed uploads), silos binned like the grids' rows.
std::string silo_time_section(const Run& run, const Layout& l) {
  std::ostringstream s;
  s << "<section id='silo-time' aria-labelledby='silo-time-h'><h2 id='silo-time-h'>Each silo's round</h2>\n";
  // Per silo id: sums of each part, and the rounds counted.
  std::vector<std::array<double, kSiloParts>> sum(run.silos.size());
  std::vector<std::size_t> counted(run.silos.size(), 0);
  std::vector<double> idle_sum(run.silos.size(), 0.0);
  for (const Round* r : l.rounds) {
    for (const auto& x : r->silos) {
      if (x.outcome != Outcome::Committed || !std::isfinite(x.times.received) || !std::isfinite(x.times.ready)) continue;
      const auto p = silo_parts(*r, x);
      for (std::size_t j = 0; j < kSiloParts; ++j) sum[x.silo][j] += std::isfinite(p[j]) ? std::max(0.0, p[j]) : 0.0;
      const auto& t = x.times;
      idle_sum[x.silo] += server::idle_seconds(t.ready, t.granted, t.received, seconds(r->started_ms, r->ended_ms));
      ++counted[x.silo];
    }
  }
  BarChart c;
  c.frame = {"silo-time-chart", "Seconds of a round, per silo, by part",
             "Stacked, the mean over the rounds each silo uploaded in: the model received, training, other work, "
             "waiting for an upload slot, uploading, waiting for the round to close; from the round records' "
             "participant timelines.",
             l.rows.per == 1 ? "silo" : "silos (mean)", "seconds"};
  std::ostringstream rows;
  for (std::size_t b = 0; b < l.rows.count(); ++b) {
    std::array<double, kSiloParts> mean{};
    std::size_t n = 0;
    for (std::size_t k = l.rows.first(b); k < l.rows.end(b); ++k) {
      const auto id = l.order[k];
      if (counted[id] == 0) continue;
      for (std::size_t j = 0; j < kSiloParts; ++j) mean[j] += sum[id][j] / static_cast<double>(counted[id]);
      ++n;
      const double idle = idle_sum[id] / static_cast<double>(counted[id]);
      double all = 0;
      for (double v : sum[id]) all += v / static_cast<double>(counted[id]);
      rows << "<tr><th scope='row'>" << esc(run.silos[id]) << "</th><td>" << counted[id] << "</td>";
      for (std::size_t j = 0; j < kSiloParts; ++j) rows << "<td>" << fmt(sum[id][j] / static_cast<double>(counted[id]), "%.3f") << "</td>";
      rows << "<td>" << fmt(all > 0 ? 100 * idle / all : 0, "%.1f") << "%</td></tr>\n";
    }
    if (n == 0) continue;
    std::string hover = l.rows.per == 1 ? run.silos[l.order[l.rows.first(b)]] + ":" : "silos " + std::to_string(l.rows.first(b) + 1) + "-" + std::to_string(l.rows.end(b)) + ":";
    for (std::size_t j = 0; j < kSiloParts; ++j) {
      mean[j] /= static_cast<double>(n);
      hover += " " + std::string(kSiloPartNames[j]) + " " + fmt(mean[j], "%.3f") + " s;";
    }
    c.values.emplace_back(mean.begin(), mean.end());
    c.x_labels.push_back(l.rows.per == 1 ? run.silos[l.order[l.rows.first(b)]] : std::to_string(l.rows.first(b) + 1));
    c.hover.push_back(hover);
  }
  if (c.values.empty()) {
    s << "<p><strong>No silo timelines</strong> in the records read (records written before 2026-12-05 have "
         "none).</p></section>\n";
    return s.str();
  }
  for (std::size_t j = 0; j < kSiloParts; ++j) c.fills.push_back(kSiloPartFills[j]), c.labels.push_back(kSiloPartNames[j]);
  c.y_text = [](double v) { return fmt(v, "%.3g"); };
  s << "<p>From each participant's <code>timeline</code> in the round records: when the server wrote the "
       "model's last byte to the silo (behind an edge: to its edge), the silo's reported training time, its "
       "<code>UpdateReady</code>, its upload's grant and its whole upload, against the record's "
       "<code>ended_at</code>. The idle parts are where the silo waits on the server or the other silos.</p>\n"
    << bar_chart(c) << "<table><caption>Mean seconds per round, per silo</caption><tr><th scope='col'>silo</th>"
    << "<th scope='col'>rounds</th>";
  for (const char* name : kSiloPartNames) s << "<th scope='col'>" << esc(name) << "</th>";
  s << "<th scope='col'>idle share</th></tr>\n" << rows.str() << "</table>\n</section>\n";
  return s.str();
}

std::string bytes_section(const Run& run, const Layout& l) {
  std::ostringstream s;
  s << "<section id='bytes' aria-labelledby='bytes-h'><h2 id='bytes-h'>Bytes moved</h2>\n";
  const Bins& b = l.columns;
  // The float32 equivalent of a round's uploads: one whole model per upload (upload_granted
  // events count them: a silo's update, or an edge's partial sum).
  const bool equivalent = run.model_parameters > 0 &&
                          std::any_of(l.rounds.begin(), l.rounds.end(), [](const Round* r) { return r->uploads > 0; });
  BarChart c;
  c.frame = {"bytes-chart", "Bytes per round", "Bytes uploaded to the server and model bytes broadcast, per round.",
             b.per == 1 ? "round" : "rounds (sum)", "bytes"};
  c.stacked = false;
  c.fills = {"up", "down"};
  c.labels = {"uploaded to the server (upload_bytes)", "broadcast to silos and edges (broadcast_bytes)"};
  if (equivalent) {
    c.fills.insert(c.fills.begin() + 1, "plain");
    c.labels.insert(c.labels.begin() + 1, "the same uploads as float32 models (uploads x " +
                                              std::to_string(run.model_parameters) + " parameters x 4 bytes)");
  }
  double up = 0, down = 0, dense = 0;
  std::set<std::string> schemes, broadcasts;
  bool any = false;
  for (std::size_t i = 0; i < b.count(); ++i) {
    double u = 0, d = 0, e = 0;
    for (std::size_t k = b.first(i); k < b.end(i); ++k) {
      const Round& r = *l.rounds[k];
      any = any || r.upload_bytes || r.broadcast_bytes;
      u += static_cast<double>(r.upload_bytes.value_or(0));
      d += static_cast<double>(r.broadcast_bytes.value_or(0));
      e += static_cast<double>(r.uploads * run.model_parameters * 4);
      if (!r.compression.empty()) schemes.insert(r.compression);
      if (!r.broadcast.empty()) broadcasts.insert(r.broadcast);
    }
    up += u, down += d, dense += e;
    c.values.push_back(equivalent ? std::vector<double>{u, e, d} : std::vector<double>{u, d});
    c.x_labels.push_back(std::to_string(l.rounds[b.first(i)]->round));
    c.hover.push_back((b.per == 1 ? "round " : "rounds ") + round_span(l, i) + ": up " + bytes_text(u) +
                      (equivalent ? " (float32: " + bytes_text(e) + ")" : "") + ", down " + bytes_text(d));
  }
  if (!any) {
    s << "<p><strong>Not recorded</strong> in these records (no <code>upload_bytes</code> or "
         "<code>broadcast_bytes</code>).</p></section>\n";
    return s.str();
  }
  c.y_text = [](double v) { return bytes_text(v); };
  auto list = [](const std::set<std::string>& v) {
    std::string out;
    for (const auto& x : v) out += (out.empty() ? "" : "; ") + x;
    return out;
  };
  s << "<p>From the records' <code>upload_bytes</code> and <code>broadcast_bytes</code>. Uploads: "
    << esc(schemes.empty() ? "uncompressed" : "compressed (" + list(schemes) + ")") << ". Broadcast: "
    << esc(broadcasts.empty() ? "whole float32 models" : "compressed deltas (" + list(broadcasts) + ")") << ".</p>\n"
    << bar_chart(c) << "<p>In all: " << bytes_text(up) << " up";
  if (equivalent && dense > 0) s << " (" << fmt(100 * up / dense, "%.1f") << "% of their float32 size, " << bytes_text(dense) << ")";
  s << ", " << bytes_text(down) << " down.</p>\n</section>\n";
  return s.str();
}

// The rounds' privacy spend: per round and in total, the federation's under silo-level DP
// (either mode: the records' epsilon so far), with the largest silo's own record-level total beside
// it where silos carry one; under record-level DP alone, the largest silo's.
std::string privacy_section(const Layout& l) {
  std::vector<double> xs, spent, total, record_level;
  bool totals = false;
  double sum = 0, delta = NAN, last_record_level = NAN, last_record_level_round = 0;
  std::string mode;
  for (const Round* r : l.rounds) {
    if (!r->epsilon_spent) continue;
    sum += *r->epsilon_spent;
    xs.push_back(static_cast<double>(r->round));
    spent.push_back(*r->epsilon_spent);
    totals = totals || r->epsilon_total.has_value();
    total.push_back(r->epsilon_total.value_or(sum));
    record_level.push_back(r->record_level_total.value_or(NAN));
    if (r->record_level_total) last_record_level = *r->record_level_total, last_record_level_round = xs.back();
    if (r->delta) delta = *r->delta;
    if (!r->privacy_mode.empty()) mode = r->privacy_mode;
  }
  if (xs.empty()) return "";
  const bool silo_records = std::isfinite(last_record_level);
  const bool silo_level = mode.rfind("silo-level", 0) == 0;
  const std::string source = silo_level ? "privacy.epsilon" : mode.empty() ? "privacy.epsilon_spent" : "participants[].privacy.epsilon";
  LineChart c;
  c.frame = {"privacy-chart", "Privacy spent per round",
             "Epsilon spent in each round and in total, from the records' privacy fields.", "round", "epsilon"};
  c.xs = xs;
  if (silo_level) {
    c.series = {{"the federation's epsilon this round (its growth)", spent, 0},
                {"the federation's epsilon in total (privacy.epsilon)", total, 1}};
    if (silo_records) c.series.push_back({"the largest silo's own record-level epsilon in total", record_level, 2});
  } else if (!mode.empty()) {
    c.series = {{"the largest silo's epsilon this round (its growth)", spent, 0},
                {"the largest silo's epsilon in total", total, 1}};
  } else {
    c.series = {{"epsilon this round (privacy.epsilon_spent)", spent, 0},
                {totals ? "epsilon in total (privacy.epsilon_total)" : "sum of the rounds' epsilons (an upper bound)",
                 total, 1}};
  }
  std::ostringstream s;
  s << "<section id='privacy' aria-labelledby='privacy-h'><h2 id='privacy-h'>Privacy spent</h2>\n<p>"
    << (mode.empty() ? "" : esc(mode) + ". ") << "From the records' <code>" << source << "</code>"
    << (!silo_level && mode.empty() && totals ? " and <code>privacy.epsilon_total</code>" : "")
    << (silo_level ? " (the federation's epsilon so far, in committed rounds and in aborted rounds whose sums were "
                     "unmasked; a round spent its growth)"
                   : "")
    << (std::isfinite(delta) ? "; delta " + fmt(delta, "%.3g") : "") << ". Total after round "
    << fmt(xs.back(), "%.0f") << ": epsilon " << fmt(total.back(), "%.4g") << ".";
  if (silo_records) {
    s << " The silos' own record-level budgets: the largest spent " << fmt(last_record_level, "%.4g")
      << " after round " << fmt(last_record_level_round, "%.0f") << " (<code>participants[].privacy.epsilon</code>).";
  }
  s << "</p>\n" << line_chart(c) << "</section>\n";
  return s.str();
}

std::string rounds_table(const Layout& l) {
  const Bins& b = l.columns;
  std::ostringstream s;
  s << "<section id='rounds' aria-labelledby='rounds-h'><h2 id='rounds-h'>Rounds in words</h2>\n<table><caption>"
    << (b.per == 1 ? "One row per round" : "One row per " + std::to_string(b.per) + " rounds (sums)")
    << "</caption>\n<tr><th scope='col'>round</th><th scope='col'>status</th><th scope='col'>selected</th><th "
       "scope='col'>committed</th><th scope='col'>dropped</th><th scope='col'>Byzantine</th><th "
       "scope='col'>filtered</th><th scope='col'>rule</th><th scope='col'>seconds</th><th scope='col'>up</th><th "
       "scope='col'>down</th><th scope='col'>record verified</th></tr>\n";
  for (std::size_t i = 0; i < b.count(); ++i) {
    std::size_t committed_rounds = 0, n = 0, in = 0, dropped = 0, byz = 0, filtered = 0, verified = 0;
    double secs = 0, up = 0, down = 0;
    std::set<std::string> rules, reasons;
    for (std::size_t k = b.first(i); k < b.end(i); ++k) {
      const Round& r = *l.rounds[k];
      committed_rounds += r.committed;
      verified += r.verified;
      n += r.silos.size();
      for (const auto& x : r.silos) {
        in += x.outcome == Outcome::Committed;
        dropped += x.outcome == Outcome::Dropped;
        byz += x.outcome == Outcome::Byzantine;
        filtered += x.decision == Decision::Filtered;
      }
      const auto p = phases(r);
      for (double t : p) secs += t;
      up += static_cast<double>(r.upload_bytes.value_or(0));
      down += static_cast<double>(r.broadcast_bytes.value_or(0));
      if (!r.rule.empty()) rules.insert(r.rule);
      if (!r.committed && !r.reason.empty()) reasons.insert(r.reason);
    }
    const std::size_t count = b.end(i) - b.first(i);
    std::string status = committed_rounds == count ? "committed" : std::to_string(count - committed_rounds) + " aborted";
    for (const auto& why : reasons) status += ": " + why;
    std::string rule;
    for (const auto& x : rules) rule += (rule.empty() ? "" : "; ") + x;
    s << "<tr><th scope='row'>" << round_span(l, i) << "</th><td>" << esc(status) << "</td><td>" << n << "</td><td>"
      << in << "</td><td>" << dropped << "</td><td>" << byz << "</td><td>" << filtered << "</td><td>" << esc(rule)
      << "</td><td>" << fmt(secs, "%.3f") << "</td><td>" << bytes_text(up) << "</td><td>" << bytes_text(down)
      << "</td><td>" << (verified == count ? "yes" : verified == 0 ? "NO" : std::to_string(verified) + " of " + std::to_string(count))
      << "</td></tr>\n";
  }
  s << "</table>\n</section>\n";
  return s.str();
}

}  // namespace xsilo::tools::report
