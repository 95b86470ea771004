// Rounds x silos: who took part (participation) and what the robust rule did with each update
// (decisions); and the per-silo table that says the same in words.
#include <algorithm>
#include <cmath>
#include <array>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "tools/report_sections.h"

namespace xsilo::tools::report {

namespace {

// What a grid bin holds: how many cells of each level, the notes behind them, the edges.
struct Tally {
  std::array<std::uint32_t, 5> n{};
  std::map<std::uint32_t, std::uint32_t> notes;
  std::set<std::uint32_t> edges;
  const SiloRound* one = nullptr;  // the cell itself when a bin is one round of one silo
};

// level(s): 1..4, or 0 to leave the cell out; note(s): the words behind it (0: none).
std::vector<Tally> tally(const Layout& l, const std::function<int(const SiloRound&)>& level,
                         const std::function<std::uint32_t(const SiloRound&)>& note) {
  std::vector<Tally> t(l.rows.count() * l.columns.count());
  for (std::size_t c = 0; c < l.rounds.size(); ++c) {
    for (const auto& s : l.rounds[c]->silos) {
      const int lv = level(s);
      if (lv <= 0) continue;
      Tally& x = t[(l.row_of[s.silo] / l.rows.per) * l.columns.count() + c / l.columns.per];
      ++x.n[static_cast<std::size_t>(lv)];
      if (const auto id = note(s)) ++x.notes[id];
      x.edges.insert(s.edge);
      x.one = &s;
    }
  }
  return t;
}

std::string row_span(const Run& run, const Layout& l, std::size_t bin) {
  const std::size_t first = l.rows.first(bin), last = l.rows.end(bin) - 1;
  return first == last ? run.silos[l.order[first]] : run.silos[l.order[first]] + " ... " + run.silos[l.order[last]];
}

std::string edge_name(const Run& run, std::uint32_t edge) { return edge ? run.edges[edge] : "the server directly"; }

// The row labels and their edge groups.
void label_rows(const Run& run, const Layout& l, Grid& g) {
  for (std::size_t r = 0; r < l.rows.count(); ++r) {
    g.rows.push_back(row_span(run, l, r));
    std::set<std::uint32_t> edges;
    for (std::size_t i = l.rows.first(r); i < l.rows.end(r); ++i) edges.insert(l.primary_edge[l.order[i]]);
    g.row_groups.push_back(edges.size() > 1 ? "mixed" : *edges.begin() ? run.edges[*edges.begin()] : "direct");
  }
  for (std::size_t c = 0; c < l.columns.count(); ++c) g.columns.push_back(round_span(l, c));
}

// A bin's hover text: where it is, the count of each level, the commonest notes, the edges.
std::string hover(const Run& run, const Layout& l, std::size_t row, std::size_t column, const Tally& t,
                  const char* const names[5]) {
  std::string s = (l.columns.per == 1 ? "round " : "rounds ") + round_span(l, column) + ", " + row_span(run, l, row);
  if (l.columns.per == 1 && l.rows.per == 1 && t.one) {  // one cell: its note says it all, else its level
    s += " via " + edge_name(run, t.one->edge) + ": ";
    if (t.notes.empty()) {
      for (int k = 4; k >= 1; --k) {
        if (t.n[static_cast<std::size_t>(k)]) s += names[k];
      }
    } else {
      s += run.notes[t.notes.begin()->first];
    }
    if (std::isfinite(t.one->norm)) s += ", norm " + fmt(t.one->norm);
    if (std::isfinite(t.one->score)) s += ", score " + fmt(t.one->score);
    return s;
  }
  s += ":";
  for (int k = 4; k >= 1; --k) {
    if (t.n[static_cast<std::size_t>(k)]) s += " " + std::to_string(t.n[static_cast<std::size_t>(k)]) + " " + names[k] + ",";
  }
  s.pop_back();
  // The two commonest notes, cut short: an aggregated cell is one of up to 1,600.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> notes(t.notes.begin(), t.notes.end());
  std::sort(notes.begin(), notes.end(), [](auto& a, auto& b) { return a.second > b.second; });
  for (std::size_t i = 0; i < notes.size() && i < 2; ++i) {
    const std::string& note = run.notes[notes[i].first];
    s += (i ? "; " : ". Most often: ") + std::to_string(notes[i].second) + " x " +
         (note.size() > 90 ? note.substr(0, 87) + "..." : note);
  }
  std::string edges;
  for (auto e : t.edges) edges += (edges.empty() ? "" : ", ") + edge_name(run, e);
  return s + ". Via " + edges;
}

// A grid of tallies: each bin is filled as its commonest level and lettered with its highest (a
// problem stands out however many rounds a bin holds, without hiding that most went well).
Grid make_grid(const Run& run, const Layout& l, const std::vector<Tally>& t, const char* const names[5],
               const char* const fills[5], const char* const letters[5]) {
  Grid g;
  label_rows(run, l, g);
  for (std::size_t r = 0; r < l.rows.count(); ++r) {
    for (std::size_t c = 0; c < l.columns.count(); ++c) {
      const Tally& x = t[r * l.columns.count() + c];
      int top = 4;
      while (top > 0 && !x.n[static_cast<std::size_t>(top)]) --top;
      if (top == 0) continue;
      int common = top;
      for (int k = top - 1; k >= 1; --k) {
        if (x.n[static_cast<std::size_t>(k)] > x.n[static_cast<std::size_t>(common)]) common = k;
      }
      g.cells.push_back({r, c, fills[common], letters[top], hover(run, l, r, c, x, names)});
    }
  }
  return g;
}

std::string scale_note(const Layout& l) {
  if (l.columns.per == 1 && l.rows.per == 1) return "";
  return "<p>Aggregated to stay readable: each column is " + std::to_string(l.columns.per) + " round(s), each row " +
         std::to_string(l.rows.per) +
         " silo(s). A cell's pattern is the commonest outcome in it and its letter the most severe one; its hover "
         "text gives the counts and the commonest reasons.</p>\n";
}

constexpr const char* kOutcomeNames[5] = {"", "committed", "surplus (not needed)", "dropped", "excluded as Byzantine"};
constexpr const char* kOutcomeFills[5] = {"", "committed", "surplus", "dropped", "byzantine"};
constexpr const char* kOutcomeLetters[5] = {"", "C", "S", "D", "X"};
constexpr const char* kDecisionNames[5] = {"", "kept", "clipped", "filtered", ""};
constexpr const char* kDecisionFills[5] = {"", "kept", "clipped", "filtered", ""};
constexpr const char* kDecisionLetters[5] = {"", "K", "C", "F", ""};

int outcome_level(const SiloRound& s) {
  switch (s.outcome) {
    case Outcome::Committed: return 1;
    case Outcome::Surplus: return 2;
    case Outcome::Dropped: return 3;
    case Outcome::Byzantine: return 4;
    case Outcome::NotSelected: return 0;
  }
  return 0;
}

int decision_level(const SiloRound& s) {
  switch (s.decision) {
    case Decision::Kept: return 1;
    case Decision::Clipped: return 2;
    case Decision::Filtered: return 3;
    case Decision::None: return 0;
  }
  return 0;
}

}  // namespace

Layout layout_of(const Run& run) {
  Layout l;
  std::vector<std::map<std::uint32_t, std::size_t>> seen(run.silos.size());
  for (const auto& [number, round] : run.rounds) {
    if (!round.has_record) continue;
    l.rounds.push_back(&round);
    for (const auto& s : round.silos) ++seen[s.silo][s.edge];
  }
  l.primary_edge.assign(run.silos.size(), 0);
  for (std::size_t i = 0; i < seen.size(); ++i) {
    std::size_t most = 0;
    for (const auto& [edge, n] : seen[i]) {
      if (edge && n > most) most = n, l.primary_edge[i] = edge;
    }
  }
  l.order.resize(run.silos.size());
  for (std::uint32_t i = 0; i < l.order.size(); ++i) l.order[i] = i;
  std::sort(l.order.begin(), l.order.end(), [&](auto a, auto b) {
    const auto ea = l.primary_edge[a], eb = l.primary_edge[b];
    if ((ea == 0) != (eb == 0)) return eb == 0;  // silos behind edges first
    if (ea != eb) return run.edges[ea] < run.edges[eb];
    return run.silos[a] < run.silos[b];
  });
  l.row_of.resize(run.silos.size());
  for (std::size_t r = 0; r < l.order.size(); ++r) l.row_of[l.order[r]] = r;
  l.columns = bins(l.rounds.size(), kMostColumns);
  l.rows = bins(l.order.size(), kMostRows);
  return l;
}

std::string round_span(const Layout& l, std::size_t bin) {
  const auto first = l.rounds[l.columns.first(bin)]->round, last = l.rounds[l.columns.end(bin) - 1]->round;
  return first == last ? std::to_string(first) : std::to_string(first) + "-" + std::to_string(last);
}

std::string participation_section(const Run& run, const Layout& l) {
  std::ostringstream s;
  s << "<section id='participation' aria-labelledby='participation-h'><h2 id='participation-h'>Who took part</h2>\n"
       "<p>Each round's audit record names the silos selected, the participants (whose updates were aggregated, and "
       "the edge that carried them), the dropouts with the phase, cause and reason, and the surplus of "
       "over-selection. A dropout for cause <code>non_finite</code> or <code>excluded</code> (caught misbehaving, "
       "with evidence) is drawn as excluded as Byzantine. Hover over a cell for the reason. Rows are grouped by the "
       "edge that carried the silo most often.</p>\n";
  if (l.rounds.empty() || l.order.empty()) {
    s << "<p><strong>No round records to draw.</strong></p></section>\n";
    return s.str();
  }
  s << scale_note(l);
  Grid g = make_grid(run, l, tally(l, outcome_level, [](const SiloRound& x) { return x.why; }), kOutcomeNames,
                     kOutcomeFills, kOutcomeLetters);
  g.frame = {"participation-grid", "Participation: rounds x silos",
             "For each round and silo: committed (C), surplus (S), dropped (D) or excluded as Byzantine (X); "
             "blank where the silo was not selected.",
             l.columns.per == 1 ? "round" : "rounds", "silo (by edge)"};
  s << grid_chart(g)
    << legend({{"committed", "C: committed (its update is in the round's aggregate)"},
               {"surplus", "S: surplus (over-selected, not needed)"},
               {"dropped", "D: dropped (reason on hover)"},
               {"byzantine", "X: excluded as Byzantine (non-finite update, or caught in secure aggregation)"}})
    << "<p>Blank: not selected that round.</p>\n</section>\n";
  return s.str();
}

std::string decisions_section(const Run& run, const Layout& l) {
  std::ostringstream s;
  s << "<section id='robust' aria-labelledby='robust-h'><h2 id='robust-h'>What the robust rule decided</h2>\n"
       "<p>From each record's <code>robust.decisions</code>: every input of the rule, kept or filtered (with the "
       "rule's reason and score), and clipped when its norm exceeded <code>clip_norm</code>. Under secure "
       "aggregation the rule sees only each secure group's mean: a silo carries its group's decision "
       "(<code>secure.groups_outcome</code> names the group's survivors).</p>\n";
  std::set<std::string> rules;
  for (const Round* r : l.rounds) {
    if (!r->rule.empty()) rules.insert(r->rule);
  }
  const auto decided = tally(l, decision_level, [](const SiloRound& x) { return x.decided; });
  const bool any = std::any_of(decided.begin(), decided.end(), [](const Tally& t) { return t.one != nullptr; });
  if (!any) {
    std::string names;
    for (const auto& r : rules) names += (names.empty() ? "" : ", ") + r;
    s << "<p><strong>No decisions recorded:</strong> the rounds ran "
      << esc(names.empty() ? "no recorded rule" : names)
      << " without a robust rule or clipping, so every participant's update was averaged as it came.</p></section>\n";
    return s.str();
  }
  s << scale_note(l);
  Grid g = make_grid(run, l, decided, kDecisionNames, kDecisionFills, kDecisionLetters);
  g.frame = {"robust-grid", "Robust decisions: rounds x silos",
             "For each round and silo whose update (or secure group's mean) reached the rule: kept (K), clipped (C) "
             "or filtered (F).",
             l.columns.per == 1 ? "round" : "rounds", "silo (by edge)"};
  s << grid_chart(g)
    << legend({{"kept", "K: kept"}, {"clipped", "C: clipped to clip_norm, then kept (norm on hover)"},
               {"filtered", "F: filtered out by the rule (reason on hover)"}})
    << "<p>Rules applied: ";
  std::string names;
  for (const auto& r : rules) names += (names.empty() ? "" : "; ") + r;
  s << esc(names) << ".</p>\n</section>\n";
  return s.str();
}

std::string silos_table(const Run& run, const Layout& l) {
  std::vector<std::array<std::uint32_t, 8>> n(run.silos.size());  // outcome 0..4, kept, clipped, filtered
  std::vector<std::map<std::uint32_t, std::uint32_t>> why(run.silos.size());
  for (const Round* r : l.rounds) {
    for (const auto& s : r->silos) {
      ++n[s.silo][static_cast<std::size_t>(s.outcome)];
      if (s.decision != Decision::None) ++n[s.silo][4 + static_cast<std::size_t>(s.decision)];
      if (s.why) ++why[s.silo][s.why];
    }
  }
  std::ostringstream s;
  s << "<section id='silos' aria-labelledby='silos-h'><h2 id='silos-h'>Silos in words</h2>\n<table><caption>Rounds "
       "per silo by outcome, from the round records</caption>\n<tr><th scope='col'>silo</th><th scope='col'>edge "
       "(most often)</th><th scope='col'>selected</th><th scope='col'>committed</th><th scope='col'>surplus</th>"
       "<th scope='col'>dropped</th><th scope='col'>excluded as Byzantine</th><th scope='col'>kept / clipped / "
       "filtered</th><th scope='col'>commonest reason</th></tr>\n";
  for (auto id : l.order) {
    const auto& c = n[id];
    std::string reason;
    std::uint32_t most = 0;
    for (const auto& [note, count] : why[id]) {
      if (count > most) most = count, reason = std::to_string(count) + " x " + run.notes[note];
    }
    s << "<tr><th scope='row'>" << esc(run.silos[id]) << "</th><td>"
      << esc(l.primary_edge[id] ? run.edges[l.primary_edge[id]] : "direct") << "</td><td>" << c[1] + c[2] + c[3] + c[4]
      << "</td><td>" << c[1] << "</td><td>" << c[2] << "</td><td>" << c[3] << "</td><td>" << c[4] << "</td><td>" << c[5]
      << " / " << c[6] << " / " << c[7] << "</td><td>" << esc(reason) << "</td></tr>\n";
  }
  s << "</table>\n</section>\n";
  return s.str();
}

}  // namespace xsilo::tools::report
