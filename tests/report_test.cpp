// The report (tools/report.h): drawn from signed logs the server's own record functions write,
// it says whether the log verified and why not, who took part and why others did not, what the
// robust rule decided, where the time went and what moved; it stays small at 400 silos and
// 2,000 rounds; it escapes what the log says; and it says what the files do not hold.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <regex>

#include "common/config.h"
#include "common/fs.h"
#include "common/process.h"
#include "common/safetensors.h"
#include "server/aggregator.h"
#include "server/audit.h"
#include "server/central_dp.h"
#include "server/distributed_dp.h"
#include "server/round_record.h"
#include "tests/testlib.h"
#include "tools/report.h"
#include "tests/result_util.h"

namespace xsilo::tools {
namespace {

using json = nlohmann::json;
using server::DropCause;
using server::DropPhase;
using server::Member;
using server::MemberState;

constexpr std::int64_t kStart = 1'800'000'000'000;  // a round's start, in unix ms: round r starts r seconds later

Member member(const std::string& silo, const std::string& edge, MemberState state = MemberState::Done) {
  Member m;
  m.silo = silo;
  m.edge = edge;
  m.state = state;
  m.num_samples = 10;
  m.weight = 10;
  m.update_sha256 = std::string(64, 'a');
  return m;
}

Member dropped(const std::string& silo, const std::string& edge, DropPhase phase, DropCause cause,
               const std::string& reason) {
  Member m = member(silo, edge, MemberState::Dropped);
  m.drop_phase = phase;
  m.drop_cause = cause;
  m.drop_reason = reason;
  return m;
}

// The record the server writes for a round of these members (server/round_record.h).
json record(std::uint64_t round, const std::vector<Member>& members, bool committed = true) {
  server::RoundSummary s;
  s.federation = "oncology";
  s.round = round;
  s.committed = committed;
  s.reason = committed ? "" : "only 1 updates arrived, 2 needed";
  s.started_ms = kStart + static_cast<std::int64_t>(round) * 1000;
  s.ended_ms = s.started_ms + 400;
  s.members = &members;
  s.target = members.size();
  s.rule = "fedavg";
  s.optimizer = "fedavg";
  s.upload_bytes = 1000;
  s.broadcast_bytes = 4000;
  return server::round_record(s);
}

// Decisions as the server's robust step records them: Multi-Krum with f = 1 over five silos (it
// keeps the four best), the last one's update far from the others (filtered), every norm above a
// clip_norm of 0.5 but the first.
json krum_decisions() {
  server::AggregationConfig a;
  a.rule.rule = robust::Rule::MultiKrum;
  a.rule.f = 1;
  a.clip_norm = 0.5;
  std::vector<float> rows = {0.1f, 0.1f, 0.2f, 0.1f, 0.1f, 0.2f, 0.2f, 0.2f, 50.0f, 50.0f};
  const std::vector<std::string> labels = {"hospital-01", "hospital-02", "hospital-03", "hospital-04", "hospital-05"};
  std::vector<float> out(2);
  server::CombineContext ctx;
  const auto c = server::combine_rows(a, rows, 2, labels, "silo", std::vector<double>(5, 1.0),
                                      {0.3, 0.6, 0.7, 0.8, 70.0}, ctx, out);
  return c.value().record;
}

class Report : public ::testing::Test {
 protected:
  void SetUp() override {
    auto key = crypto::SigningKey::generate();
    server::save_signing_key(key, dir_ / "audit.key", dir_ / "audit.pub");
    log_.emplace(dir_ / "audit.jsonl", std::move(key));
  }
  void append(json r) { log_->append(std::move(r)); }
  // Three rounds through two edges: a silo misses the upload deadline in round 2, another's
  // update is not finite in round 3.
  void three_rounds() {
    append({{"event", "federation_start"}, {"federation", "oncology"}, {"rounds", 3}});
    append(record(1, {member("hospital-01", "edge-01"), member("hospital-02", "edge-01"), member("hospital-03", "edge-02")}));
    append(record(2, {member("hospital-01", "edge-01"),
                      dropped("hospital-02", "edge-01", DropPhase::Upload, DropCause::Deadline, "missed the upload deadline"),
                      member("hospital-03", "edge-02")}));
    append(record(3, {member("hospital-01", "edge-01"), member("hospital-02", "edge-01"),
                      dropped("hospital-03", "edge-02", DropPhase::Validation, DropCause::NonFinite, "NaN in layer 0")}));
  }
  std::string page(ReportSources s) { return render_report(load_run(s)); }
  ReportSources audit_only() const { return {dir_ / "audit.jsonl", dir_ / "audit.pub", {}, {}, {}, {}}; }

  test::TempDir dir_;
  std::optional<server::AuditLog> log_;
};

bool has(const std::string& page, const std::string& what) { return page.find(what) != std::string::npos; }

TEST_F(Report, SaysTheLogVerifiedAndNamesItsHead) {
  three_rounds();
  const auto v = server::verify_audit_log(dir_ / "audit.jsonl", server::load_public_key(dir_ / "audit.pub"));
  ASSERT_TRUE(v.has_value());
  const std::string p = page(audit_only());
  EXPECT_TRUE(has(p, "<strong>VERIFIED:</strong> 4 records")) << p;
  EXPECT_TRUE(has(p, v->head_sha256));
  EXPECT_TRUE(has(p, "xsilo report: oncology"));
  EXPECT_TRUE(has(p, "3 rounds recorded: 3 committed, 0 aborted; 3 silos, 2 edges"));
}

TEST_F(Report, ShowsWhoDroppedWhyAndBehindWhichEdgeOnHover) {
  three_rounds();
  const std::string p = page(audit_only());
  EXPECT_TRUE(has(p, "<title>round 2, hospital-02 via edge-01: dropped in upload (deadline): missed the upload "
                     "deadline</title>"))
      << p;
  EXPECT_TRUE(has(p, "<title>round 3, hospital-03 via edge-02: excluded as Byzantine in validation (non_finite): NaN "
                     "in layer 0</title>"));
  EXPECT_TRUE(has(p, "<title>round 1, hospital-01 via edge-01: committed</title>"));
  // Each outcome has its letter and a legend in words, not only a colour.
  EXPECT_TRUE(has(p, "X: excluded as Byzantine"));
  EXPECT_TRUE(has(p, "D: dropped"));
}

TEST_F(Report, SaysWhichRecordFailedAndStillDrawsWhatItCanRead) {
  three_rounds();
  // An edit of round 2's reason breaks its signature; a torn last line is not JSON.
  std::string text = read_file(dir_ / "audit.jsonl");
  text.replace(text.find("missed the upload deadline"), 6, "passed");
  text += "{\"event\":\"rou";
  atomic_write_file(dir_ / "audit.jsonl", text);
  const std::string p = page(audit_only());
  EXPECT_TRUE(has(p, "<strong>FAILED VERIFICATION:</strong> record 3: ")) << p;
  EXPECT_TRUE(has(p, "The first 2 records verify"));
  EXPECT_TRUE(has(p, "passed the upload deadline"));  // drawn as read, and marked unverified:
  EXPECT_TRUE(std::regex_search(p, std::regex("<th scope='row'>1</th>.*<td>yes</td></tr>")));
  EXPECT_TRUE(std::regex_search(p, std::regex("<th scope='row'>2</th>.*<td>NO</td></tr>")));
  EXPECT_TRUE(has(p, "audit.jsonl line 5: not JSON, skipped"));
}

TEST_F(Report, SaysTheLogIsNotVerifiedWithoutItsKey) {
  three_rounds();
  auto s = audit_only();
  s.audit_key = dir_ / "missing.pub";
  const std::string p = page(s);
  EXPECT_TRUE(has(p, "<strong>NOT VERIFIED:</strong> no public key to check it with")) << p;
  EXPECT_TRUE(std::regex_search(p, std::regex("<th scope='row'>1</th>.*<td>NO</td></tr>")));
}

// An emptied log once read as "verified, 0 records" beside rounds from elsewhere (the server
// itself refuses such a state folder).
TEST_F(Report, SaysAnEmptiedLogIsNotVerified) {
  three_rounds();
  atomic_write_file(dir_ / "audit.jsonl", "");
  const std::string p = page(audit_only());
  EXPECT_TRUE(has(p, "<strong>NOT VERIFIED:</strong> the audit log ")) << p;
  EXPECT_TRUE(has(p, "audit.jsonl is empty: no record vouches for the rounds")) << p;
}

TEST_F(Report, ShowsEachSilosRobustDecisionWithItsNormAndReason) {
  std::vector<Member> m;
  for (int i = 1; i <= 5; ++i) m.push_back(member("hospital-0" + std::to_string(i), ""));
  json r = record(1, m);
  r.merge_patch(krum_decisions());
  append(r);
  const std::string p = page(audit_only());
  EXPECT_TRUE(has(p, "<title>round 1, hospital-05 via the server directly: filtered by multi_krum: Krum score not "
                     "among the 4 lowest, norm 70, score "))
      << p;
  EXPECT_TRUE(has(p, "<title>round 1, hospital-02 via the server directly: clipped to clip_norm 0.5, then kept by "
                     "multi_krum, norm 0.6, score "));
  EXPECT_TRUE(has(p, "<title>round 1, hospital-01 via the server directly: kept by multi_krum, norm 0.3, score "));
  EXPECT_TRUE(has(p, "F: filtered out by the rule"));
}

TEST_F(Report, GivesEachMemberOfASecureGroupItsGroupsDecision) {
  json r = record(1, {member("hospital-01", "edge-01"), member("hospital-02", "edge-01"), member("hospital-03", "edge-01")});
  r["secure"] = {{"mode", "grouped"},
                 {"groups_outcome", {{{"group", 2}, {"ok", true}, {"survivors", {"hospital-01", "hospital-03"}}}}}};
  r["robust"] = {{"rule", "median"}, {"applied", "median"}, {"decisions", {{{"group", "2"}, {"kept", true}, {"score", 0.5}}}}};
  append(r);
  const std::string p = page(audit_only());
  EXPECT_TRUE(has(p, "<title>round 1, hospital-03 via edge-01: as a member of secure group 2 (the mean of 2 silos): "
                     "kept by median, score 0.5</title>"))
      << p;
  EXPECT_FALSE(has(p, "<title>round 1, hospital-02 via edge-01: as a member"));
}

TEST_F(Report, SaysNoDecisionsWereRecordedWithoutARobustRule) {
  three_rounds();
  EXPECT_TRUE(has(page(audit_only()), "No decisions recorded:</strong> the rounds ran fedavg"));
}

// A run folder: the log, events.jsonl, metrics.csv of xsilo sim, summary.json and the model.
TEST_F(Report, SplitsEachRoundsTimeByPhaseFromTheServersEvents) {
  json r = record(1, {member("hospital-01", ""), member("hospital-02", "")});
  r["secure"] = {{"mode", "global"}};
  append(r);
  auto at = [](std::int64_t ms) { return server::iso_time(kStart + 1000 + ms); };
  std::ofstream(dir_ / "events.jsonl")
      << json{{"time", at(0)}, {"event", "round_started"}, {"round", 1}}.dump() << "\n"
      << json{{"time", at(250)}, {"event", "upload_granted"}, {"round", 1}}.dump() << "\n"
      << json{{"time", at(270)}, {"event", "upload_granted"}, {"round", 1}}.dump() << "\n"
      << json{{"time", at(300)}, {"event", "round_closed"}, {"round", 1}}.dump() << "\n"
      << json{{"time", at(450)}, {"event", "round_committed"}, {"round", 1}}.dump() << "\n";
  // The record ends (unmasked, decided) at +400 ms: unmask 300 -> 400, commit 400 -> 450.
  const std::string p = page(run_sources(dir_.path()));
  EXPECT_TRUE(has(p, "<th scope='row'>broadcast + train</th><td>0.250</td>")) << p;
  EXPECT_TRUE(has(p, "<th scope='row'>upload</th><td>0.050</td>"));
  EXPECT_TRUE(has(p, "<th scope='row'>unmask (secure rounds)</th><td>0.100</td>"));
  EXPECT_TRUE(has(p, "<td>0.050</td><td>11.1%</td>"));  // the commit
}

// Each silo's round in parts, from the participants' timelines (the record ends at +0.4 s):
// hospital-01 got the model at 0.05 s, trained 0.1 s (ready at 0.2 s: 0.05 s of other work),
// waited 0.05 s for its slot and uploaded 0.05 s, then waited 0.1 s for the round to close:
// 0.15 of 0.4 s idle. Silos without a timeline are left out; records without any say so.
TEST_F(Report, SplitsEachSilosRoundIntoItsPartsAndItsIdleShare) {
  Member a = member("hospital-01", ""), b = member("hospital-02", "");
  a.times = {.model_sent = 50, .ready = 200, .granted = 250, .received = 300, .folded = 310};
  a.metrics.set_train_seconds(0.1);
  append(record(1, {a, b}));
  const std::string p = page(audit_only());
  EXPECT_TRUE(has(p, "<tr><th scope='row'>hospital-01</th><td>1</td><td>0.050</td><td>0.100</td><td>0.050</td>"
                     "<td>0.050</td><td>0.050</td><td>0.100</td><td>37.5%</td></tr>")) << p;
  EXPECT_FALSE(has(p, "<tr><th scope='row'>hospital-02</th><td>1</td>"));
  EXPECT_TRUE(has(p, "id='silo-time-chart'"));

  test::TempDir other;
  auto key = crypto::SigningKey::generate();
  server::save_signing_key(key, other / "audit.key", other / "audit.pub");
  server::AuditLog old(other / "audit.jsonl", std::move(key));
  old.append(record(1, {b}));
  EXPECT_TRUE(has(render_report(load_run({other / "audit.jsonl", other / "audit.pub", {}, {}, {}, {}})),
                  "No silo timelines"));
}

TEST_F(Report, DrawsTheRecordsSpanAloneWithoutEvents) {
  three_rounds();
  const std::string p = page(audit_only());
  EXPECT_TRUE(has(p, "<th scope='row'>round, as the record spans it (no events.jsonl)</th><td>1.200</td>")) << p;
  EXPECT_TRUE(has(p, "no events.jsonl was read"));
}

TEST_F(Report, ShowsCompressedUploadsAgainstTheirFloat32Size) {
  json r = record(1, {member("hospital-01", ""), member("hospital-02", "")});
  r["compression"] = {{"scheme", "top_k"}, {"fraction", 0.1}, {"error_feedback", true}};
  append(r);  // upload_bytes 1000
  std::ofstream(dir_ / "events.jsonl")
      << json{{"time", server::iso_time(kStart)}, {"event", "round_started"}, {"round", 1}}.dump() << "\n"
      << json{{"time", server::iso_time(kStart)}, {"event", "upload_granted"}, {"round", 1}}.dump() << "\n"
      << json{{"time", server::iso_time(kStart)}, {"event", "upload_granted"}, {"round", 1}}.dump() << "\n";
  Model model;
  model.add("w", {1250});  // 5,000 bytes as float32: two uploads 10,000
  save_safetensors(dir_ / "model.safetensors", model);
  const std::string p = page(run_sources(dir_.path()));
  EXPECT_TRUE(has(p, "Uploads: compressed (top_k fraction 0.1, error feedback)")) << p;
  EXPECT_TRUE(has(p, "In all: 1000 B up (10.0% of their float32 size, 9.77 KiB), 3.91 KiB down"));
}

TEST_F(Report, ReadsTheSimsAccuracyAndItsCentralizedBaseline) {
  three_rounds();
  std::ofstream(dir_ / "metrics.csv")
      << "round,committed,accuracy,loss,fed_eval_accuracy,fed_eval_loss,train_loss,silos_reporting,dropped,seconds\n"
      << "1,1,0.8,0.5,0.75,0.55,0.5,3,0,0.1\n2,1,0.85,0.4,0.8,0.45,0.4,2,1,0.1\n3,0,nan,nan,0.8,0.45,0.4,2,1,0.1\n";
  std::ofstream(dir_ / "summary.json") << json{{"name", "breast-cancer"}, {"centralized_accuracy", 0.9646}}.dump();
  const std::string p = page(run_sources(dir_.path()));
  EXPECT_TRUE(has(p, "id='accuracy-chart'")) << p;
  EXPECT_TRUE(has(p, "centralized training: 96.46%"));
  EXPECT_TRUE(has(p, "xsilo report: breast-cancer"));
}

TEST_F(Report, SaysPlainlyThatEachSilosEvaluationIsNotRecordedUntilRecordsCarryIt) {
  three_rounds();
  EXPECT_TRUE(has(page(audit_only()), "<strong>Not recorded.</strong> Each silo evaluates the round's model"));
  json r = record(4, {member("hospital-01", ""), member("hospital-02", "")});
  r["participants"][0]["metrics"] = {{"eval_accuracy", 0.9}};
  r["participants"][1]["metrics"] = {{"eval_accuracy", 0.6}};
  append(r);
  const std::string p = page(audit_only());
  EXPECT_TRUE(has(p, "id='evaluation-chart'")) << p;
  EXPECT_FALSE(has(p, "<strong>Not recorded.</strong> Each silo"));
}

TEST_F(Report, DrawsPrivacyOnlyWhenRecordsCarryEpsilon) {
  three_rounds();
  std::string p = page(audit_only());
  EXPECT_FALSE(has(p, "id='privacy'"));
  EXPECT_TRUE(has(p, "no record carries privacy.epsilon_spent"));
  for (std::uint64_t round = 4; round <= 5; ++round) {
    json r = record(round, {member("hospital-01", "")});
    r["privacy"] = {{"epsilon_spent", 0.25}, {"delta", 1e-5}};
    append(r);
  }
  p = page(audit_only());
  EXPECT_TRUE(has(p, "id='privacy'")) << p;
  EXPECT_TRUE(has(p, "Total after round 5: epsilon 0.5"));
}

// Silo-level DP in either mode: each record states the federation's epsilon so far; the page
// draws each round's growth and the total, and an aborted round counts as its record says (one
// whose sums were unmasked spent; one aborted before spent nothing). A silo's own record-level
// epsilon, in its participant entry, is kept beside the federation's.
TEST_F(Report, DrawsTheSpendOfDistributedDpRoundsAbortedOnesThatUnmaskedIncluded) {
  server::DistributedDpConfig dp;
  dp.epsilon = 8;
  dp.clip_norm = 0.5;
  dp.noise_multiplier = 1.2;
  dp.denominator = 5;
  dp.max_group = 5;
  server::finalize_distributed_dp(dp, 4);
  const auto setup = server::signed_part(dp, 7);
  privacy::Ledger spent;
  std::vector<double> totals;
  append({{"event", "federation_start"}, {"federation", "oncology"}, {"rounds", 4}});
  for (std::uint64_t round = 1; round <= 4; ++round) {
    const bool committed = round != 3 && round != 4;
    const bool revealed = round != 4;  // round 3 aborted after its sums were unmasked, round 4 before
    if (revealed) spent.add(server::round_mechanism(server::as_signed(dp, setup, dp.padded)), 1);
    json r = record(round, {member("hospital-01", ""), member("hospital-02", "")}, committed);
    r["privacy"] = server::round_privacy_record(dp, setup, dp.padded, spent);
    r["privacy"]["sums_revealed"] = revealed ? 1 : 0;
    if (round == 2) r["participants"][0]["privacy"] = {{"mechanism", "dp_sgd"}, {"epsilon", 1.5}, {"delta", 1e-5}};
    append(r);
    totals.push_back(server::epsilon_of(spent, dp.delta));
  }
  const report::Run run = load_run(audit_only());
  ASSERT_EQ(run.rounds.size(), 4u);
  for (std::uint64_t round = 1; round <= 4; ++round) {
    const report::Round& x = run.rounds.at(round);
    SCOPED_TRACE(round);
    EXPECT_EQ(x.privacy_mode, "silo-level distributed DP");
    ASSERT_TRUE(x.epsilon_total && x.epsilon_spent);
    EXPECT_NEAR(*x.epsilon_total, totals[round - 1], 1e-12);
    EXPECT_NEAR(*x.epsilon_spent, totals[round - 1] - (round == 1 ? 0 : totals[round - 2]), 1e-12);
  }
  EXPECT_GT(*run.rounds.at(3).epsilon_spent, 0);  // aborted after unmasking: spent
  EXPECT_EQ(*run.rounds.at(4).epsilon_spent, 0);  // aborted before: nothing
  EXPECT_EQ(run.rounds.at(2).record_level_total, 1.5);
  EXPECT_FALSE(run.rounds.at(1).record_level_total);

  const std::string p = render_report(run);
  EXPECT_TRUE(has(p, "id='privacy'")) << p;
  EXPECT_TRUE(has(p, "silo-level distributed DP. From the records' <code>privacy.epsilon</code>"));
  char total[64];
  std::snprintf(total, sizeof total, "Total after round 4: epsilon %.4g.", totals[3]);
  EXPECT_TRUE(has(p, total)) << total;
  EXPECT_TRUE(has(p, "the largest spent 1.5 after round 2"));
  EXPECT_FALSE(has(p, "no record carries privacy.epsilon_spent"));
}

TEST_F(Report, DrawsTheSpendOfCentralDpRounds) {
  server::CentralDpConfig dp;
  dp.epsilon = 8;
  dp.noise_multiplier = 1.1;
  dp.denominator = 5;
  privacy::Ledger spent;
  for (std::uint64_t round = 1; round <= 3; ++round) {
    if (round != 2) spent.add(server::round_mechanism(dp), 1);  // round 2 aborted: no model left it
    json r = record(round, {member("hospital-01", "")}, round != 2);
    r["privacy"] = server::round_privacy_record(dp, spent);
    append(r);
  }
  const report::Run run = load_run(audit_only());
  privacy::Ledger one;
  one.add(server::round_mechanism(dp), 1);
  ASSERT_TRUE(run.rounds.at(1).epsilon_spent && run.rounds.at(2).epsilon_spent && run.rounds.at(3).epsilon_total);
  EXPECT_EQ(run.rounds.at(1).privacy_mode, "silo-level central DP");
  EXPECT_NEAR(*run.rounds.at(1).epsilon_spent, server::epsilon_of(one, dp.delta), 1e-12);
  EXPECT_EQ(*run.rounds.at(2).epsilon_spent, 0);
  EXPECT_NEAR(*run.rounds.at(3).epsilon_total, server::epsilon_of(spent, dp.delta), 1e-12);
  EXPECT_TRUE(has(render_report(run), "silo-level central DP. From the records' <code>privacy.epsilon</code>"));
}

TEST_F(Report, EscapesWhatTheLogSays) {
  append(record(1, {dropped("<script>alert(1)</script>", "edge'01", DropPhase::Train, DropCause::Disconnected,
                            "a \"quoted\" <b>reason</b> & more")}));
  const std::string p = page(audit_only());
  EXPECT_FALSE(has(p, "<script")) << p;
  EXPECT_FALSE(has(p, "<b>reason"));
  EXPECT_TRUE(has(p, "&lt;script&gt;alert(1)&lt;/script&gt;"));
  EXPECT_TRUE(has(p, "a &quot;quoted&quot; &lt;b&gt;reason&lt;/b&gt; &amp; more"));
  EXPECT_TRUE(has(p, "edge&#39;01"));
}

// 400 silos behind 4 edges, 2,000 rounds, every tenth silo dropped each round: the page bins
// rounds and silos and stays small.
TEST(ReportAtScale, StaysUnderTwoMegabytesAtFourHundredSilosAndTwoThousandRounds) {
  report::Run run;
  std::vector<Member> members;
  for (int i = 0; i < 400; ++i) {
    char name[32], edge[16];
    std::snprintf(name, sizeof name, "hospital-%03d", i + 1);
    std::snprintf(edge, sizeof edge, "edge-%02d", i % 4 + 1);
    members.push_back(member(name, edge));
  }
  std::vector<json> records;  // the drops repeat every ten rounds: ten records, renumbered
  for (std::uint64_t round = 1; round <= 10; ++round) {
    for (std::size_t i = 0; i < members.size(); ++i) {
      members[i].state = (i + round) % 10 == 0 ? MemberState::Dropped : MemberState::Done;
      members[i].drop_cause = DropCause::Deadline;
      members[i].drop_reason = "missed the training deadline";
    }
    records.push_back(record(round, members));
  }
  for (std::uint64_t round = 1; round <= 2000; ++round) {
    json& r = records[(round - 1) % 10];
    r["round"] = round;
    report::fold_record(run, r, true);
  }
  const std::string p = render_report(run);
  EXPECT_LT(p.size(), 2u << 20);
  EXPECT_TRUE(has(p, "2000 rounds recorded: 2000 committed, 0 aborted; 400 silos, 4 edges"));
  EXPECT_TRUE(has(p, "each column is 50 round(s), each row 10 silo(s)")) << p.substr(0, 4000);
  // An aggregated cell counts what it holds (50 rounds x 10 silos, one in ten dropped), is filled
  // as its commonest outcome and lettered with its most severe.
  EXPECT_TRUE(has(p, "fill='url(#f-committed)'><title>rounds 1-50, hospital-001 ... hospital-037: 50 dropped, 450 "
                     "committed. Most often: 50 x dropped in train (deadline): missed the training deadline. Via "
                     "edge-01</title>"));
  EXPECT_TRUE(has(p, "fill='#fff'>D</text>"));
}

TEST(ReportSourcesOf, RefuseAFolderThatIsMissingOrHoldsNoRun) {
  test::TempDir dir;
  try {
    run_sources(dir / "nowhere");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "report: run folder " + (dir / "nowhere").string() + " does not exist");
  }
  try {
    run_sources(dir.path());
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(has(e.what(), "holds no audit.jsonl, metrics.csv or events.jsonl")) << e.what();
  }
}

// The command: the auditor's page from the log and key alone; exit 1 (page written) when the
// log fails verification, as `xsilo audit verify`.
TEST_F(Report, CommandWritesTheAuditorsPageAndExitsOneWhenTheLogFails) {
  three_rounds();
  const auto out = dir_ / "auditor.html";
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {test::xsilo_bin(), "report"});
    Process p(args, dir_ / "report.log");
    return p.wait(std::chrono::seconds(60)).value_or(-1);
  };
  const std::vector<std::string> audit = {"--audit", (dir_ / "audit.jsonl").string(), "--key",
                                          (dir_ / "audit.pub").string(), "--out", out.string()};
  ASSERT_EQ(run(audit), 0) << read_file(dir_ / "report.log");
  EXPECT_TRUE(has(read_file(out), "<strong>VERIFIED:</strong>"));
  EXPECT_TRUE(has(read_file(dir_ / "report.log"), "audit log verified, 4 records"));
  std::string text = read_file(dir_ / "audit.jsonl");
  text.replace(text.find("hospital-03"), 11, "hospital-99");
  atomic_write_file(dir_ / "audit.jsonl", text);
  EXPECT_EQ(run(audit), 1);
  EXPECT_TRUE(has(read_file(out), "<strong>FAILED VERIFICATION:</strong>"));
  EXPECT_EQ(run({(dir_ / "nowhere").string()}), 2);
  EXPECT_TRUE(has(read_file(dir_ / "report.log"), "does not exist"));
}

}  // namespace
}  // namespace xsilo::tools
