// `xsilo audit verify --sent`: the silos' sent.jsonl against the log's distributed-DP setups
// (server/audit.h, check_sent_setups).
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>
#include <map>
#include <optional>
#include <set>

#include "server/audit.h"
#include "protocol/secagg_wire.h"
#include "server/distributed_dp.h"

namespace xsilo::server {

namespace {

// A record of a round that states its Skellam setup: the round's own, or its unmask_begun.
struct SetupRecord {
  std::uint64_t seq = 0;
  std::string setup;                // its privacy part's setup_sha256 ("" when it names none)
  std::vector<std::string> counts;  // the participants' update_sha256 (a round record's)
  // The last record of its round in its run (up to the next federation_start or operator_resume):
  // the one that decides the charge (the round record that closes an unmask_begun, or an
  // unmask_begun no round record followed).
  bool decides = false;
  // Charged if it decides: a committed round record, an aborted one that revealed sums
  // (sums_revealed > 0) or that closes an unmask_begun of its round (the server asked for unmask
  // shares: UnmaskingWatch), or an unmask_begun (one that decides had no round record after it).
  bool spends = false;
  std::string outcome;  // what it is, for an error: "a committed round record", ...
};

// A record's spend, read by the functions the audit check and the recovery charge with
// (distributed_mechanism_of, recorded_skellam_mechanism through UnmaskingWatch): a record that
// names a setup but no Skellam mechanism, or "central" parameters, spends nothing here as there.
// `closes_unmask_begun`: the record closes an unmask_begun of its round (UnmaskingWatch::closes),
// so the watch charges its round though the record itself charges nothing. `unreadable`: why the
// watch or the accounting could not read the record ("" when they could).
void read_spend(const nlohmann::json& r, bool closes_unmask_begun, const std::string& unreadable, SetupRecord& s) {
  if (!unreadable.empty()) {
    s.spends = false;
    s.outcome = "a record whose distributed-DP spend cannot be read (" + unreadable + ")";
    return;
  }
  if (r.value("event", "") == kUnmaskBegun) {
    s.spends = true;  // the watch read its Skellam mechanism: charged if no round record closes it
    s.outcome = "an unmask_begun record";
    return;
  }
  std::optional<std::uint64_t> sums;
  if (const auto p = r.find("privacy"); p != r.end() && p->is_object()) {
    if (const auto v = p->find("sums_revealed"); v != p->end() && v->is_number_unsigned()) sums = v->get<std::uint64_t>();
  }
  const bool committed = r.value("status", "") == "committed";
  bool charged = false;
  try {
    charged = distributed_mechanism_of(r).has_value();
  } catch (const std::exception& e) {
    s.spends = false;
    s.outcome = std::string("a record whose distributed-DP spend cannot be read (") + e.what() + ")";
    return;
  }
  s.spends = charged || closes_unmask_begun;
  if (s.spends) {
    s.outcome = committed ? "a committed round record" : "an aborted round record that charges its round";
  } else if (committed) {
    const auto p = r.find("privacy");
    const std::string mech = p != r.end() && p->is_object() ? p->value("mechanism", "") : "";
    s.outcome = "a committed round record with " +
                (mech.empty() ? std::string("no distributed-DP (skellam) mechanism") : "mechanism \"" + mech + "\"");
  } else {
    s.outcome = "an aborted round record with sums_revealed " + (sums ? std::to_string(*sums) : "absent") +
                " and no unmask_begun before it";
  }
}

std::map<std::uint64_t, std::vector<SetupRecord>> setups_by_round(const std::vector<nlohmann::json>& records) {
  std::map<std::uint64_t, std::vector<SetupRecord>> out;
  std::map<std::uint64_t, std::size_t> last;  // this run's last record of each round: its index in out[round]
  // The unmask_begun the next record may close, as the accounting reads it (a round record of its
  // round right after it: no other round, unmask_begun or federation_start between).
  UnmaskingWatch watch;
  for (const auto& r : records) {
    const std::string event = r.value("event", "");
    if (event == "federation_start" || event == "operator_resume") last.clear();
    const bool closes = watch.closes(r);
    std::string unreadable;
    try {
      watch.take(r);
    } catch (const std::exception& e) {
      // check_privacy_claims fails on such a record; here it charges nothing, and the watch starts
      // over (an unmask_begun it could not read is open no longer).
      unreadable = e.what();
      watch = UnmaskingWatch{};
    }
    if (event != "round" && event != kUnmaskBegun) continue;
    SetupRecord s;
    s.seq = r.value("seq", std::uint64_t{0});
    if (const auto p = r.find("privacy"); p != r.end() && p->is_object()) s.setup = p->value("setup_sha256", "");
    for (const auto& who : r.value("participants", nlohmann::json::array())) {
      if (who.is_object()) s.counts.push_back(who.value("update_sha256", ""));
    }
    read_spend(r, closes, unreadable, s);
    const auto round = r.value("round", std::uint64_t{0});
    auto& of_round = out[round];
    if (const auto before = last.find(round); before != last.end()) of_round[before->second].decides = false;
    s.decides = true;
    last[round] = of_round.size();
    of_round.push_back(std::move(s));
  }
  return out;
}

std::string named(const std::string& setup) { return setup.empty() ? "no setup" : "setup " + setup; }

// How the log ends, for a release to a round it has no record of.
struct LogEnd {
  std::uint64_t last_recorded = 0;        // the largest round any round record or unmask_begun names
  std::optional<std::uint64_t> ended_at;  // the seq of a federation_end no federation_start or operator_resume follows
};

// A line that says the silo released its unmask shares in `round` under `setup`: with them the
// server could unmask the round's noisy sum, so the log must charge the round under that setup
// (a record that decides a run of the round, spends, and names it). Success, or why not.
Status check_release(const std::map<std::uint64_t, std::vector<SetupRecord>>& by_round, const LogEnd& end,
                     const SentOptions& options, std::uint64_t round, const std::string& setup, const std::string& at,
                     SentCheck& c) {
  const auto it = by_round.find(round);
  if (it == by_round.end() && round <= end.last_recorded) {
    return Error(fmt::format("{}, but the log has no record of that round, though it records round {} after it",
                             at, end.last_recorded));
  }
  if (it == by_round.end() && end.ended_at) {
    return Error(fmt::format("{}, but the log has no record of that round: its federation_end (record {}) ends the "
                             "federation after its last recorded round {}, so no copy of the log will ever charge it",
                             at, *end.ended_at, end.last_recorded));
  }
  if (it == by_round.end() && !options.log_may_be_stale) {
    return Error(fmt::format("{}, but the log has no record of that round (its last record of a round is of round {}): "
                             "the server writes a round's unmask_begun before it asks for any share, so it deviated, "
                             "or this copy of the log was taken before the release (a live snapshot: pass "
                             "--log-may-be-stale)",
                             at, end.last_recorded));
  }
  if (it == by_round.end()) {
    ++c.unrecorded;
    return {};
  }
  const SetupRecord* decider = nullptr;
  for (const auto& rec : it->second) {
    if (rec.decides && rec.spends && rec.setup == setup) {
      ++c.releases;
      return {};
    }
    if (rec.decides && !decider) decider = &rec;
  }
  const auto& first = decider ? *decider : it->second.back();
  const std::string what = first.setup != setup ? fmt::format("names {}", named(first.setup))
                                                : "is " + first.outcome + ", which charges nothing";
  return Error(fmt::format("{}, so the server could unmask that round's noisy sum, but the log does not charge it: "
                           "its record that decides the round's charge (record {}) {}",
                           at, first.seq, what));
}

// What the log says of itself that the silo file's lines are checked against.
struct LogFacts {
  // The round of the log's last round record: an honest server leaves no round up to it without a
  // record (after a crash it runs the same round number again), so an upload to such a round
  // without one shows a record was left out; one to a later round proves nothing either way.
  std::uint64_t last_round = 0;
  // The federations the log's federation_start records name: sent.jsonl is append-only across
  // federations, so a line of another federation (its round numbers, its setups) is skipped.
  std::set<std::string> federations;
  // The largest round any record of a round names (its round record or its unmask_begun), and a
  // federation_end that ends the log: the server writes a round's unmask_begun before it asks for
  // any share, so a release in a later round is a deviation, or (log_may_be_stale, and no
  // federation_end) one this copy of the log was taken before.
  LogEnd end;
};

LogFacts read_log_facts(const std::vector<nlohmann::json>& records) {
  LogFacts f;
  for (const auto& r : records) {
    const std::string event = r.value("event", "");
    if (event == "round") f.last_round = r.value("round", std::uint64_t{0});
    if (event == "round" || event == kUnmaskBegun) {
      f.end.last_recorded = std::max(f.end.last_recorded, r.value("round", std::uint64_t{0}));
    }
    if (event == "federation_end") f.end.ended_at = r.value("seq", std::uint64_t{0});
    if (event == "federation_start" || event == "operator_resume") f.end.ended_at.reset();
    if (event == "federation_start") f.federations.insert(r.value("federation", ""));
  }
  return f;
}

// A line that says the silo was sent setup `mine` for its upload `update` ("" when the line names
// none) to `round`: the log's records of the round must name that setup. Counts the line in c
// (compared, or unrecorded: a round after the log's last round record). Success, or why not.
Status check_upload(const std::map<std::uint64_t, std::vector<SetupRecord>>& by_round, std::uint64_t last_round,
                    std::uint64_t round, const std::string& mine, const std::string& update, const std::string& at,
                    SentCheck& c) {
  const auto it = by_round.find(round);
  if (it == by_round.end() && round <= last_round) {
    return Error(fmt::format("{}, but the log has no record of that round, though it records round {} after it "
                             "(an honest server leaves no round without a record)",
                             at, last_round));
  }
  if (it == by_round.end()) {
    ++c.unrecorded;
    return {};
  }
  // Named by a record that decides a run of the round: a setup only an earlier record of the same
  // run names (an unmask_begun its round record contradicts) is not what the round was charged at.
  bool counted = false, named_mine = false;
  const SetupRecord* decider = nullptr;
  for (const auto& rec : it->second) {
    if (rec.decides && !decider) decider = &rec;
    named_mine = named_mine || (rec.decides && rec.setup == mine);
    if (update.empty() || std::find(rec.counts.begin(), rec.counts.end(), update) == rec.counts.end()) continue;
    counted = true;
    if (rec.setup != mine) {
      return Error(fmt::format("{}, but record {}, which counts its upload, names {}", at, rec.seq, named(rec.setup)));
    }
  }
  if (!counted && !named_mine) {
    const auto& first = decider ? *decider : it->second.back();
    return Error(fmt::format("{}, but the log's record that decides that round's charge names {} (record {})", at,
                             named(first.setup), first.seq));
  }
  ++c.compared;
  return {};
}

// What the log holds at each seq: its event and round (records of a round and the others).
struct LogIndex {
  std::map<std::uint64_t, const nlohmann::json*> at;  // seq -> its record
  std::uint64_t last_seq = 0;
};

LogIndex index_log(const std::vector<nlohmann::json>& records) {
  LogIndex ix;
  for (const auto& r : records) {
    const auto seq = r.value("seq", std::uint64_t{0});
    ix.at[seq] = &r;
    ix.last_seq = std::max(ix.last_seq, seq);
  }
  return ix;
}

// Whether an unmask_begun record names the run a release was made in: its "keys" name the
// releasing silo (`silo`, the line's; any member where the line names none) with its keys of that
// run (`keys_sha256`, the line's), and every member once.
bool names_run(const nlohmann::json& begun, const std::string& silo, const std::string& keys_sha256) {
  const auto named = protocol::record_keys(begun);
  if (!named || keys_sha256.empty()) return false;
  return std::any_of(named->begin(), named->end(), [&](const auto& member) {
    return (silo.empty() || member.first == silo) && member.second == keys_sha256;
  });
}

// A release that names the record charging it (the signed head of its round's unmask_begun,
// SecureAggregation.unmask_begun): that record must be in the log with the hash the silo was
// shown, be an unmask_begun of the release's round under its setup, and charge (every readable
// unmask_begun is charged once: by itself, or by the round record that closes it); and the silo
// must not have released against it before in this file (`seen`: one run of a round per charge).
Status check_bound_release(const std::map<std::uint64_t, std::vector<SetupRecord>>& by_round, const LogIndex& ix,
                           const LogEnd& end, const SentOptions& options, const nlohmann::json& line,
                           const std::string& at, std::map<std::uint64_t, std::uint64_t>& seen, std::uint64_t n,
                           SentCheck& c) {
  const auto seq = line.at("unmask_begun_seq").get<std::uint64_t>();
  const auto sha = line.at("unmask_begun_sha256").get<std::string>();
  const auto round = line.value("round", std::uint64_t{0});
  const std::string setup = line.value("skellam_setup_sha256", "");
  if (const auto [before, fresh] = seen.emplace(seq, n); !fresh) {
    return Error(fmt::format("{} against audit record {}, as it did on line {}: two runs of the round under one "
                             "charge (each run writes an unmask_begun of its own)",
                             at, seq, before->second));
  }
  const auto rec = ix.at.find(seq);
  if (rec == ix.at.end() && seq > ix.last_seq && options.log_may_be_stale && !end.ended_at) {
    ++c.unrecorded;
    return {};
  }
  if (rec == ix.at.end()) {
    const std::string where = seq > ix.last_seq ? fmt::format(" (it ends at record {}{})", ix.last_seq,
                                                              end.ended_at ? ", its federation_end" : "")
                                                : " (a record left out of its chain)";
    return Error(fmt::format("{} against audit record {}, which the log does not hold{}: the server signed a head of "
                             "a record it did not keep, or this copy of the log predates it",
                             at, seq, where));
  }
  if (!options.line_sha256.empty() && (seq > options.line_sha256.size() || options.line_sha256[seq - 1] != sha)) {
    return Error(fmt::format("{} against audit record {} with hash {}, but the log's record {} hashes to {}: the "
                             "server showed the silo another record than the one it kept",
                             at, seq, sha, seq, seq <= options.line_sha256.size() ? options.line_sha256[seq - 1] : "?"));
  }
  const std::string event = rec->second->value("event", "");
  const auto its_round = rec->second->value("round", std::uint64_t{0});
  if (event != kUnmaskBegun || its_round != round) {
    return Error(fmt::format("{} against audit record {}, which is {} of round {}, not the unmask_begun of round {}",
                             at, seq, event.empty() ? "a record" : "the " + event + " record", its_round, round));
  }
  const SetupRecord* begun = nullptr;
  if (const auto of_round = by_round.find(round); of_round != by_round.end()) {
    for (const auto& s : of_round->second) {
      if (s.seq == seq) begun = &s;
    }
  }
  if (!begun || !begun->spends || begun->setup != setup) {
    return Error(fmt::format("{} against audit record {}, which {}", at, seq,
                             !begun || begun->spends ? "names " + named(begun ? begun->setup : "")
                                                     : "is " + begun->outcome + ", which charges nothing"));
  }
  if (!names_run(*rec->second, line.value("silo", ""), line.value("keys_sha256", ""))) {
    return Error(fmt::format("{} against audit record {}, which does not name the silo's keys of that run ({}) with "
                             "every member once: it charges another run of the round",
                             at, seq, line.value("keys_sha256", "")));
  }
  ++c.releases;
  ++c.bound;
  return {};
}

}  // namespace

SentResult check_sent_setups(const std::vector<nlohmann::json>& records, const std::filesystem::path& sent,
                             const SentOptions& options) {
  const std::string file = sent.string();
  if (!std::filesystem::exists(sent)) return Error(file + ": no such file");
  const auto by_round = setups_by_round(records);
  const auto [last_round, federations, end] = read_log_facts(records);
  const LogIndex index = index_log(records);
  std::map<std::uint64_t, std::uint64_t> released_against;  // an unmask_begun's seq -> the line that released against it
  SentCheck c;
  std::set<std::string> skipped;  // the federations the skipped lines name
  std::uint64_t n = 0;
  std::ifstream in(sent, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    ++n;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      // A last line without its newline was cut off mid-append (a crash or a full disk): the silo
      // repairs it at its next start; what it names never left.
      if (!text.empty() && text.back() != '\n' && lines.peek() == std::char_traits<char>::eof()) {
        c.torn_last_line = true;
        break;
      }
      return Error(fmt::format("{} line {}: not a line of a silo's sent.jsonl ({})", file, n, e.what()));
    }
    try {
      if (!j.is_object() || !j.contains("skellam_setup_sha256")) continue;  // no distributed-DP upload
      // A line without "federation" (written before silos named it) is compared as before.
      if (const auto f = j.find("federation");
          f != j.end() && f->is_string() && !federations.empty() && !federations.contains(f->get<std::string>())) {
        ++c.other_federation;
        skipped.insert(f->get<std::string>());
        continue;
      }
      const auto round = j.value("round", std::uint64_t{0});
      const std::string mine = j.value("skellam_setup_sha256", "");
      if (j.value("kind", "") == protocol::kUnmaskSharesReleased) {
        const std::string at =
            fmt::format("{} line {}, round {}: the silo released its unmask shares under setup {}", file, n, round, mine);
        const auto st = j.contains("unmask_begun_seq")
                            ? check_bound_release(by_round, index, end, options, j, at, released_against, n, c)
                            : check_release(by_round, end, options, round, mine, at, c);  // before releases named it
        if (!st) return Error(st.error().message());
        continue;
      }
      const std::string update = j.value("update_sha256", "");
      const std::string at = fmt::format("{} line {}, round {}: the silo was sent setup {}", file, n, round, mine);
      if (auto st = check_upload(by_round, last_round, round, mine, update, at, c); !st) return Error(st.error().message());
    } catch (const nlohmann::json::exception& e) {
      return Error(fmt::format("{} line {}: a field of the wrong type ({})", file, n, e.what()));
    }
  }
  // Every distributed-DP line skipped as another federation's, none compared: the file is another
  // federation's (or the log is), and passing would vouch for nothing.
  if (c.other_federation > 0 && c.compared + c.releases + c.unrecorded == 0) {
    auto listed = [](const std::set<std::string>& names) {
      std::string out;
      for (const auto& name : names) out += (out.empty() ? "\"" : ", \"") + name + "\"";
      return out;
    };
    return Error(fmt::format("{}: all {} of its distributed-DP lines name federation {}, but the log's federation_start "
                             "records name {}: no line was compared (a silo file or a log of another federation)",
                             file, c.other_federation, listed(skipped), listed(federations)));
  }
  return c;
}

}  // namespace xsilo::server
