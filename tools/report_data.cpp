#include "tools/report_data.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include "common/fs.h"
#include "common/safetensors.h"
#include "server/audit.h"

namespace xsilo::tools::report {

namespace {

using json = nlohmann::json;

std::string text(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::optional<double> number(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

std::string fixed(double v, const char* format = "%.4g") {
  char b[48];
  std::snprintf(b, sizeof b, format, v);
  return b;
}

// "random_k fraction 0.2, error feedback"; "" when none.
std::string describe_scheme(const json& c) {
  if (!c.is_object()) return "";
  const std::string scheme = text(c, "scheme");
  if (scheme.empty() || scheme == "none") return "";
  std::string s = scheme;
  for (const char* k : {"bits", "block", "fraction", "rank"}) {
    if (const auto v = number(c, k)) s += std::string(" ") + k + " " + fixed(*v);
  }
  if (c.value("error_feedback", false)) s += ", error feedback";
  return s;
}

// The rule as applied this round, with a fallback and its reason.
std::string describe_rule(const json& r) {
  const json robust = r.value("robust", json::object());
  std::string rule = text(robust, "applied");
  if (rule.empty()) rule = text(r.value("aggregation", json::object()), "rule");
  const std::string fallback_reason = text(robust, "fallback_reason");
  if (!fallback_reason.empty()) rule += " (fallback from " + text(robust, "rule") + ": " + fallback_reason + ")";
  return rule;
}

// The decision in words, without its numbers (score, norm), which the page adds where it shows
// one cell.
std::string describe_decision(const json& d, const json& robust) {
  const std::string rule = text(robust, "applied");
  if (!d.value("kept", true)) {
    const std::string why = text(d, "reason");
    return "filtered by " + rule + (why.empty() ? "" : ": " + why);
  }
  if (d.value("clipped", false)) {
    return "clipped to clip_norm " + fixed(number(robust, "clip_norm").value_or(NAN)) + ", then kept by " + rule;
  }
  return "kept by " + rule;
}

Decision decision_of(const json& d) {
  if (!d.value("kept", true)) return Decision::Filtered;
  return d.value("clipped", false) ? Decision::Clipped : Decision::Kept;
}

// The robust rule's decisions: per silo, or per secure group (then each surviving member of
// the group carries its group's decision).
// A participant's or dropout's "timeline" (round_record.h's member_timeline).
void fold_times(const json& t, SiloRound::Times& out) {
  if (!t.is_object()) return;
  const auto at = [&](const char* key, float& v) {
    if (const auto x = number(t, key); x && std::isfinite(*x) && *x >= 0) v = static_cast<float>(*x);
  };
  at("model_sent", out.model_sent);
  at("train", out.train);
  at("ready", out.ready);
  at("granted", out.granted);
  at("received", out.received);
}

void fold_decisions(Run& run, Round& x, const json& r, const std::unordered_map<std::string, std::size_t>& where) {
  const json robust = r.value("robust", json::object());
  const json decisions = robust.value("decisions", json::array());
  if (!decisions.is_array()) return;
  std::map<std::string, std::vector<std::string>> members;  // group -> survivors
  for (const auto& g : r.value("secure", json::object()).value("groups_outcome", json::array())) {
    if (!g.is_object() || !g.contains("group") || !g["group"].is_number_integer()) continue;
    auto& list = members[std::to_string(g["group"].get<std::int64_t>())];
    for (const auto& s : g.value("survivors", json::array())) {
      if (s.is_string()) list.push_back(s.get<std::string>());
    }
  }
  auto decide = [&](const std::string& silo, const json& d, const std::string& words) {
    const auto it = where.find(silo);
    if (it == where.end()) return;
    SiloRound& s = x.silos[it->second];
    s.decision = decision_of(d);
    s.decided = run.note_id(words);
    s.score = static_cast<float>(number(d, "score").value_or(NAN));
    s.norm = static_cast<float>(number(d, "norm").value_or(NAN));
  };
  for (const auto& d : decisions) {
    if (!d.is_object()) continue;
    if (const auto silo = text(d, "silo"); !silo.empty()) {
      decide(silo, d, describe_decision(d, robust));
    } else if (const auto group = text(d, "group"); !group.empty()) {
      const auto& survivors = members[group];
      const std::string words = "as a member of secure group " + group + " (the mean of " +
                                std::to_string(survivors.size()) + " silos): " + describe_decision(d, robust);
      for (const auto& s : survivors) decide(s, d, words);
    }
  }
}

// "silo-level central DP" or "silo-level distributed DP" for a round record's privacy part that
// states a silo-level mechanism (server/central_dp.h, server/distributed_dp.h); "" otherwise.
std::string silo_level_mode(const json& p) {
  const std::string mechanism = text(p, "mechanism");
  if (mechanism == "central") return "silo-level central DP";
  if (mechanism == "skellam") return "silo-level distributed DP";
  return text(p, "level") == "silo" ? "silo-level DP (" + mechanism + ")" : "";
}

// The largest epsilon the round's participants state for their own records (record-level DP).
std::optional<double> largest_silo_epsilon(const json& r, std::optional<double>& delta) {
  std::optional<double> most;
  const auto parts = r.find("participants");
  if (parts == r.end() || !parts->is_array()) return most;
  for (const auto& who : *parts) {
    const auto p = who.is_object() ? who.find("privacy") : who.end();
    if (p == who.end() || !p->is_object()) continue;
    if (const auto e = number(*p, "epsilon")) most = std::max(most.value_or(0.0), *e);
    if (const auto d = number(*p, "delta")) delta = d;
  }
  return most;
}

// A round's privacy spend. Both silo-level modes state the federation's epsilon so far, this
// round included ("epsilon"), in committed rounds and in aborted ones (unchanged where nothing
// was spent, grown where sums were unmasked): the round spent its growth. Record-level silos
// state their own in their participant entries: the largest is the round's total where no
// silo-level mode runs, and is kept beside the federation's where one does.
void fold_privacy(Run& run, Round& x, const json& r) {
  std::optional<double> silo_delta;
  const auto most = largest_silo_epsilon(r, silo_delta);
  std::optional<double> most_spent;
  if (most) {
    most_spent = std::max(0.0, *most - run.record_epsilon);
    run.record_epsilon = std::max(run.record_epsilon, *most);
  }
  const auto p = r.find("privacy");
  const bool has_part = p != r.end() && p->is_object();
  if (const std::string mode = has_part ? silo_level_mode(*p) : ""; !mode.empty()) {
    x.privacy_mode = mode;
    if (const auto e = number(*p, "epsilon")) {
      x.epsilon_total = *e;
      x.epsilon_spent = std::max(0.0, *e - run.silo_epsilon);
      run.silo_epsilon = std::max(run.silo_epsilon, *e);
    }
    x.delta = number(*p, "delta");
    x.record_level_total = most;
  } else if (has_part) {
    x.epsilon_spent = number(*p, "epsilon_spent");
    x.epsilon_total = number(*p, "epsilon_total");
    x.delta = number(*p, "delta");
  } else if (most) {
    x.privacy_mode = "record-level DP";
    x.epsilon_total = most;
    x.epsilon_spent = most_spent;
    x.delta = silo_delta;
  }
}

void fold_round(Run& run, const json& r, bool verified) {
  const auto round = r.find("round");
  if (round == r.end() || !round->is_number_unsigned()) {
    run.problems.push_back("record " + std::to_string(run.records) + ": a round record without a round number");
    return;
  }
  Round& x = run.at(round->get<std::uint64_t>());
  x.has_record = true;
  x.verified = verified;
  x.committed = text(r, "status") == "committed";
  x.reason = text(r, "reason");
  x.started_ms = parse_time(text(r, "started_at")).value_or(-1);
  x.ended_ms = parse_time(text(r, "ended_at")).value_or(-1);
  x.secure = r.contains("secure");
  if (const auto v = number(r, "upload_bytes")) x.upload_bytes = static_cast<std::uint64_t>(*v);
  if (const auto v = number(r, "broadcast_bytes")) x.broadcast_bytes = static_cast<std::uint64_t>(*v);
  if (const auto v = number(r, "broadcast_delta_bytes")) x.broadcast_delta_bytes = static_cast<std::uint64_t>(*v);
  x.compression = describe_scheme(r.value("compression", json()));
  x.broadcast = describe_scheme(r.value("broadcast", json()));
  x.rule = describe_rule(r);
  fold_privacy(run, x, r);
  x.silos.clear();
  std::unordered_map<std::string, std::size_t> where;
  auto add = [&](const json& who, Outcome o, const std::string& why) -> SiloRound* {
    const std::string silo = who.is_string() ? who.get<std::string>() : text(who, "silo");
    if (silo.empty() || where.count(silo)) return nullptr;
    where[silo] = x.silos.size();
    SiloRound s;
    s.silo = run.silo_id(silo);
    s.outcome = o;
    if (who.is_object()) s.edge = run.edge_id(text(who, "edge"));
    s.why = why.empty() ? 0 : run.note_id(why);
    if (who.is_object()) fold_times(who.value("timeline", json::object()), s.times);
    x.silos.push_back(s);
    return &x.silos.back();
  };
  for (const auto& p : r.value("participants", json::array())) {
    SiloRound* s = add(p, Outcome::Committed, "");
    if (!s || !p.is_object()) continue;
    if (const auto m = p.find("metrics"); m != p.end() && m->is_object()) {
      if (const auto acc = number(*m, "eval_accuracy")) s->eval_accuracy = static_cast<float>(*acc);
    }
  }
  for (const auto& d : r.value("dropouts", json::array())) {
    if (!d.is_object()) continue;
    const std::string cause = text(d, "cause");
    const bool byzantine = cause == "non_finite" || cause == "excluded";
    add(d, byzantine ? Outcome::Byzantine : Outcome::Dropped,
        (byzantine ? "excluded as Byzantine in " : "dropped in ") + text(d, "phase") +
            (cause.empty() ? "" : " (" + cause + ")") + ": " + text(d, "reason"));
  }
  for (const auto& s : r.value("surplus", json::array())) add(s, Outcome::Surplus, "");
  fold_decisions(run, x, r, where);
}

// Calls on_line(number, value) for each line of a JSON Lines file (a line that is not JSON comes
// as a discarded value); an unreadable file is named in problems.
template <class OnLine>
void each_json_line(Run& run, const std::filesystem::path& path, OnLine on_line) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    run.problems.push_back(path.string() + ": cannot be read");
    return;
  }
  run.read.push_back(path.string());
  std::uint64_t n = 0;
  for (std::string line; std::getline(in, line);) on_line(++n, json::parse(line, nullptr, false));
}

}  // namespace

std::uint32_t Run::silo_id(const std::string& name) {
  auto [it, added] = silo_ids_.try_emplace(name, static_cast<std::uint32_t>(silos.size()));
  if (added) silos.push_back(name);
  return it->second;
}

std::uint32_t Run::edge_id(const std::string& name) {
  if (name.empty()) return 0;
  auto [it, added] = edge_ids_.try_emplace(name, static_cast<std::uint32_t>(edges.size()));
  if (added) edges.push_back(name);
  return it->second;
}

std::uint32_t Run::note_id(const std::string& text) {
  auto [it, added] = note_ids_.try_emplace(text, static_cast<std::uint32_t>(notes.size()));
  if (added) notes.push_back(text);
  return it->second;
}

Round& Run::at(std::uint64_t round) {
  Round& x = rounds[round];
  x.round = round;
  return x;
}

std::optional<std::int64_t> parse_time(const std::string& iso) {
  std::tm tm{};
  int ms = 0;
  char zone = 0;
  if (std::sscanf(iso.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                  &tm.tm_min, &tm.tm_sec, &ms, &zone) != 8 ||
      zone != 'Z') {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<std::int64_t>(timegm(&tm)) * 1000 + ms;
}

void fold_record(Run& run, const json& record, bool verified) {
  ++run.records;
  if (!record.is_object()) return;
  const std::string event = text(record, "event");
  if (event == "round") {
    fold_round(run, record, verified);
  } else if (event == "federation_start") {
    if (run.title.empty()) run.title = text(record, "federation");
  } else if (event == "admin") {
    run.admin.push_back(text(record, "time") + ": " + text(record, "command") + " by " + text(record, "admin"));
  }
}

void read_audit(Run& run, const std::filesystem::path& log, std::uint64_t verified_records) {
  each_json_line(run, log, [&](std::uint64_t n, const json& record) {
    if (record.is_discarded()) {
      run.problems.push_back(log.filename().string() + " line " + std::to_string(n) + ": not JSON, skipped");
    } else {
      fold_record(run, record, n <= verified_records);
    }
  });
}

AuditCheck check_audit(const std::filesystem::path& log, const std::filesystem::path& key) {
  AuditCheck c;
  if (const auto found = reachable(log); !found) {
    c.why_not = "no audit log: " + log.string() + " " + found.error().message();
    return c;
  }
  if (std::error_code ec; std::filesystem::file_size(log, ec) == 0 && !ec) {
    // A server signs a record as it starts: an empty log was emptied, and vouches for nothing.
    c.why_not = "the audit log " + log.string() + " is empty: no record vouches for the rounds";
    return c;
  }
  if (key.empty()) {
    c.why_not = "no public key to check it with";
    return c;
  }
  if (const auto found = reachable(key); !found) {
    c.why_not = "no public key to check it with: " + key.string() + " " + found.error().message();
    return c;
  }
  std::string pk;
  try {
    pk = server::load_public_key(key);
  } catch (const std::exception& e) {
    c.why_not = std::string("the public key cannot be read: ") + e.what();
    return c;
  }
  c.verified = server::verify_audit_log(log, pk);
  c.key_hex = read_file(key);
  while (!c.key_hex.empty() && std::isspace(static_cast<unsigned char>(c.key_hex.back()))) c.key_hex.pop_back();
  return c;
}

// metrics.csv by its header: xsilo sim's (accuracy, loss on held-out rows, and the federated
// evaluation) or the server's (the federated evaluation only).
void read_metrics(Run& run, const std::filesystem::path& csv) {
  std::ifstream in(csv);
  std::string line;
  if (!in || !std::getline(in, line)) {
    run.problems.push_back(csv.string() + ": cannot be read");
    return;
  }
  run.read.push_back(csv.string());
  std::map<std::string, std::size_t> col;
  {
    std::istringstream h(line);
    std::string name;
    for (std::size_t i = 0; std::getline(h, name, ','); ++i) col[name] = i;
  }
  if (!col.count("round")) {
    run.problems.push_back(csv.string() + ": no round column");
    return;
  }
  while (std::getline(in, line)) {
    std::vector<double> v;
    std::istringstream s(line);
    std::string cell;
    while (std::getline(s, cell, ',')) v.push_back(std::strtod(cell.c_str(), nullptr));  // "nan" reads as NaN
    auto get = [&](const char* name) { return col.count(name) && col[name] < v.size() ? v[col[name]] : NAN; };
    const double round = get("round");
    if (!(round >= 1)) continue;
    Round& x = run.at(static_cast<std::uint64_t>(round));
    x.accuracy = get("accuracy");
    x.loss = get("loss");
    x.fed_eval_accuracy = get("fed_eval_accuracy");
    x.fed_eval_loss = get("fed_eval_loss");
  }
}

void read_events(Run& run, const std::filesystem::path& events) {
  each_json_line(run, events, [&](std::uint64_t, const json& e) {
    if (!e.is_object() || !e.contains("round") || !e["round"].is_number_unsigned()) return;
    const auto t = parse_time(text(e, "time"));
    if (!t) return;
    Round& x = run.at(e["round"].get<std::uint64_t>());
    const std::string name = text(e, "event");
    if (name == "round_started") {  // a restarted server runs the round again: its last start counts
      x.ev_started = *t;
      x.ev_first_grant = x.ev_closed = x.ev_done = -1;
      x.uploads = 0;
    } else if (name == "upload_granted") {
      if (x.ev_first_grant < 0) x.ev_first_grant = *t;
      ++x.uploads;
    } else if (name == "round_closed") {
      x.ev_closed = *t;
    } else if (name == "round_committed" || name == "round_aborted") {
      x.ev_done = *t;
    }
  });
}

void read_summary(Run& run, const std::filesystem::path& summary) {
  const json s = json::parse(read_file(summary), nullptr, false);
  if (!s.is_object()) {
    run.problems.push_back(summary.string() + ": not JSON");
    return;
  }
  run.read.push_back(summary.string());
  if (const auto name = text(s, "name"); !name.empty()) run.title = name;
  run.baseline_accuracy = number(s, "centralized_accuracy").value_or(-1);
}

// The parameter count: the file is mapped, not read (parse_safetensors looks at its header and
// sizes only).
void read_model_size(Run& run, const std::filesystem::path& safetensors) {
  try {
    const MappedFile file(safetensors);
    std::uint64_t params = 0;
    for (const auto& t : parse_safetensors(file.bytes()).tensors) params += t.elements;
    run.model_parameters = params;
    run.read.push_back(safetensors.string());
  } catch (const std::exception& e) {
    run.problems.push_back(safetensors.string() + ": " + e.what());
  }
}

}  // namespace xsilo::tools::report
