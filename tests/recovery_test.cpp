// Damage to the server's state folder between two runs of a real federation (server, edges and
// agents as processes over mutual TLS), each damage in two set-ups: plain FedAvg straight to the
// server with no mirror, and grouped secure aggregation through two edges with a state mirror.
// Every outcome is one of two (issue 37): the federation goes on from the last committed model
// with the same history (the log before the damage is a prefix of the log after, and the silos'
// witnesses verify), or the server refuses to start with exit code 2 and the reason, having
// signed nothing. The unit-level cases are RecoveryTest.* in audit_test.cpp.
#include <gtest/gtest.h>

#include <fstream>

#include "common/fs.h"
#include "server/audit.h"
#include "tests/federation_util.h"

namespace xsilo::tools {
namespace {

using json = nlohmann::json;

enum class Expect { Continues, Refuses, SilosRefuse };

struct Damage {
  std::string name;
  std::function<void(const std::filesystem::path& state)> apply;
  Expect without_mirror, with_mirror;
  std::string reason;  // a piece of the refusal (or of the server's log, for SilosRefuse)
  std::string mirror_reason = {};  // with the mirror, when it differs
};

std::filesystem::path newest_checkpoint(const std::filesystem::path& state) {
  std::filesystem::path newest;
  for (const auto& e : std::filesystem::directory_iterator(state / "checkpoints")) {
    if (e.path().extension() == ".safetensors" && e.path() > newest) newest = e.path();
  }
  return newest;
}

std::vector<std::string> lines_of(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::vector<Damage> damages() {
  auto rewrite = [](const std::filesystem::path& p, const std::function<void(std::string&)>& f) {
    std::string b = read_file(p);
    f(b);
    atomic_write_file(p, b);
  };
  return {
      {"NewestCheckpointTruncated",
       [=](const auto& s) { rewrite(newest_checkpoint(s), [](std::string& b) { b.resize(b.size() / 2); }); },
       Expect::Refuses, Expect::Continues, "is in no copy"},
      {"NewestCheckpointBitFlipped",
       [=](const auto& s) { rewrite(newest_checkpoint(s), [](std::string& b) { b[b.size() - 5] ^= 0x10; }); },
       Expect::Refuses, Expect::Continues, "is in no copy"},
      {"NewestCheckpointGarbageHeader",
       [=](const auto& s) { rewrite(newest_checkpoint(s), [](std::string& b) { b.replace(0, 12, "GARBAGEGARBA"); }); },
       Expect::Refuses, Expect::Continues, "is in no copy"},
      {"AllCheckpointsDeleted", [](const auto& s) { std::filesystem::remove_all(s / "checkpoints"); }, Expect::Refuses,
       Expect::Continues, "is in no copy"},
      {"AuditLogEmptied", [](const auto& s) { atomic_write_file(s / "audit.jsonl", ""); }, Expect::Refuses,
       Expect::Continues, "audit.jsonl is missing but checkpoints"},
      {"AuditLogDeleted", [](const auto& s) { std::filesystem::remove(s / "audit.jsonl"); }, Expect::Refuses,
       Expect::Continues, "audit.jsonl is missing but checkpoints"},
      {"LastTwoRecordsRemoved",
       [](const auto& s) {
         auto lines = lines_of(s / "audit.jsonl");
         lines.resize(lines.size() - 2);
         std::string text;
         for (const auto& l : lines) text += l + "\n";
         atomic_write_file(s / "audit.jsonl", text);
       },
       Expect::Continues, Expect::Continues, ""},
      {"TornLastLine", [](const auto& s) { append_durable(s / "audit.jsonl", R"({"seq":99,"prev":"00)"); },
       Expect::Continues, Expect::Continues, ""},
      {"AuditKeyDeleted", [](const auto& s) { std::filesystem::remove(s / "audit.key"); }, Expect::Refuses,
       Expect::Refuses, "audit.key is missing"},
      // A fresh folder with a new key: the silos' witnesses are under the old one. Without a
      // mirror the server cannot know: the silos refuse its rounds and it leaves them out; with
      // a mirror, the mirror's log shows a history whose key is gone.
      {"StateFolderDeleted", [](const auto& s) { std::filesystem::remove_all(s); }, Expect::SilosRefuse,
       Expect::Refuses, "witnessed audit record", "audit.key is missing"},
  };
}

struct Case {
  Damage damage;
  bool secure_edges_mirror;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << c.damage.name << (c.secure_edges_mirror ? "GroupedSecureEdgesMirror" : "Plain");
}

class RecoveryTable : public ::testing::TestWithParam<Case> {};

SimConfig config(bool secure_edges_mirror) {
  SimConfig cfg = small_config(6, 2);
  if (secure_edges_mirror) {
    cfg.edges = 2;
    cfg.selection = {{"min_silos", 6}, {"min_updates", 6}};
    cfg.secure = {{"mode", "grouped"}, {"min_group", 3}, {"keys_s", 10}, {"unmask_s", 10}};
  } else {
    cfg.selection = {{"min_silos", 6}, {"min_updates", 3}};
  }
  return cfg;
}

// The server's config for the second run: more rounds (and the mirror where the case has one).
void set_rounds(const Fed& fed, std::uint64_t rounds, const std::filesystem::path& mirror) {
  auto j = json::parse(read_file(fed.files.server_config));
  j["rounds"] = rounds;
  if (!mirror.empty()) j["state_mirror"] = mirror.string();
  atomic_write_file(fed.files.server_config, j.dump(2));
}

void run_all(Fed& fed) {
  fed.start_server();
  if (fed.cfg.edges) fed.start_edges();
  fed.start_agents();
}

TEST_P(RecoveryTable, ContinuesFromTheLastCommittedModelOrRefusesWithTheReason) {
  const Case& c = GetParam();
  Fed fed(config(c.secure_edges_mirror));
  const auto mirror = c.secure_edges_mirror ? fed.dir / "mirror" : std::filesystem::path();
  set_rounds(fed, 2, mirror);
  run_all(fed);
  auto code = fed.server->wait(120s);
  ASSERT_TRUE(code) << fed.logs();
  ASSERT_EQ(*code, 0) << fed.logs();
  for (auto& a : fed.agents) a->wait(10s);
  for (auto& e : fed.edges) e->wait(10s);
  const auto before = fed.rounds();
  ASSERT_EQ(before.size(), 2u);
  const std::string model_2 = before[1]["model_sha256_after"];
  const std::string log_before = read_file(fed.files.state / "audit.jsonl");
  const std::string pub = read_file(fed.files.state / "audit.pub");

  c.damage.apply(fed.files.state);
  set_rounds(fed, 4, mirror);
  fed.agents.clear();
  fed.edges.clear();
  const Expect expect = c.secure_edges_mirror ? c.damage.with_mirror : c.damage.without_mirror;
  if (expect == Expect::Refuses) {
    std::filesystem::remove(fed.files.port_file);
    Process server(server_argv(fed.files, test::xsilo_bin()), fed.files.logs / "server.restart.log");
    code = server.wait(60s);
    ASSERT_TRUE(code) << log_tail(fed.files.logs / "server.restart.log");
    EXPECT_EQ(*code, 2) << log_tail(fed.files.logs / "server.restart.log");
    const std::string out = read_file(fed.files.logs / "server.restart.log");
    const auto& reason = c.secure_edges_mirror && !c.damage.mirror_reason.empty() ? c.damage.mirror_reason : c.damage.reason;
    EXPECT_NE(out.find(reason), std::string::npos) << out;
    // Nothing signed: the log is what the damage left (or absent), and audit.pub is untouched.
    if (std::filesystem::exists(fed.files.state / "audit.jsonl") && !log_before.empty()) {
      const std::string after = read_file(fed.files.state / "audit.jsonl");
      EXPECT_TRUE(after.empty() || log_before.rfind(after, 0) == 0 || after.size() <= log_before.size()) << after;
    }
    if (std::filesystem::exists(fed.files.state / "audit.pub")) {
      EXPECT_EQ(read_file(fed.files.state / "audit.pub"), pub);
    }
    return;
  }
  run_all(fed);
  if (expect == Expect::SilosRefuse) {
    // The server's new key is not the one the silos witnessed: they refuse its rounds, it leaves
    // them out and says why; no round is recorded in the new log.
    EXPECT_TRUE(wait_until(
        [&] { return read_file(fed.files.logs / "server.log").find(c.damage.reason) != std::string::npos; }, 60s))
        << fed.logs();
    std::this_thread::sleep_for(1s);
    EXPECT_TRUE(fed.rounds().empty()) << fed.logs();
    EXPECT_TRUE(fed.server->running());
    return;
  }
  code = fed.server->wait(120s);
  ASSERT_TRUE(code) << fed.logs();
  EXPECT_EQ(*code, 0) << fed.logs();
  const auto after = fed.rounds();
  // The same history, one run longer: rounds 3 and 4 start from round 2's model.
  const std::string log_after = read_file(fed.files.state / "audit.jsonl");
  const auto kept = log_before.substr(0, log_before.rfind('\n', log_before.size() - 2) + 1);  // federation_end may be lost
  EXPECT_EQ(log_after.rfind(c.damage.name == "LastTwoRecordsRemoved" && !c.secure_edges_mirror ? kept : log_before, 0), 0u)
      << "the log before the damage is not a prefix of the log after";
  ASSERT_EQ(after.size(), 4u) << fed.logs();
  EXPECT_EQ(after[2]["model_sha256_before"], model_2);
  for (const auto& r : after) EXPECT_EQ(r["status"], "committed") << r.dump();
  // Every silo's witness verifies against the log (the heads from both runs).
  for (const auto& s : fed.files.silos) {
    const auto heads = fed.files.out / "silos" / s / "state" / "audit_heads.jsonl";
    const auto v = server::verify_audit_log(fed.files.state / "audit.jsonl", server::load_public_key(fed.files.state / "audit.pub"));
    ASSERT_TRUE(v.ok) << v.reason;
    const auto w = server::check_witness(v, heads);
    EXPECT_TRUE(w.ok) << s << ": " << w.reason;
    EXPECT_GE(w.checked, 2u) << s;
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto& d : damages()) {
    out.push_back({d, false});
    out.push_back({d, true});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Recovery, RecoveryTable, ::testing::ValuesIn(cases()), [](const auto& info) {
  return info.param.damage.name + (info.param.secure_edges_mirror ? "GroupedSecureEdgesMirror" : "Plain");
});

// Start-up errors keep the promise (one line naming file, key and reason; exit 2) and write
// nothing to the audit log: a port in use, a state_dir that is a file, a key that does not
// belong to its certificate, --config naming a folder, a key given twice in the config.
TEST(StartupErrors, AreOneLineAndExitTwoAndSignNothing) {
  Fed fed(small_config(3, 1));
  fed.start_server();  // holds its port
  const auto cfg = fed.files.server_config;
  auto start = [&](const std::vector<std::string>& args, const std::string& log) {
    std::vector<std::string> argv = {test::xsilo_bin(), "server"};
    argv.insert(argv.end(), args.begin(), args.end());
    Process p(argv, fed.files.logs / log);
    return p.wait(30s).value_or(-1);
  };
  const auto records = lines_of(fed.files.state / "audit.jsonl").size();
  // The same port, from another state folder.
  auto j = json::parse(read_file(cfg));
  j["state_dir"] = (fed.dir / "other-state").string();
  j["listen"] = "127.0.0.1:" + std::to_string(fed.port);
  atomic_write_file(fed.dir / "port.json", j.dump());
  EXPECT_EQ(start({"--config", (fed.dir / "port.json").string()}, "port.log"), 2);
  EXPECT_NE(read_file(fed.files.logs / "port.log").find(".listen: cannot listen on 127.0.0.1:" + std::to_string(fed.port)),
            std::string::npos)
      << read_file(fed.files.logs / "port.log");
  EXPECT_FALSE(std::filesystem::exists(fed.dir / "other-state" / "audit.jsonl"));  // no federation_start
  // The state folder a running server holds.
  j["state_dir"] = fed.files.state.string();
  j["listen"] = "127.0.0.1:0";
  atomic_write_file(fed.dir / "locked.json", j.dump());
  EXPECT_EQ(start({"--config", (fed.dir / "locked.json").string()}, "locked.log"), 2);
  EXPECT_NE(read_file(fed.files.logs / "locked.log").find("another xsilo server"), std::string::npos);
  // state_dir a file.
  atomic_write_file(fed.dir / "afile", "x");
  j["state_dir"] = (fed.dir / "afile").string();
  atomic_write_file(fed.dir / "file.json", j.dump());
  EXPECT_EQ(start({"--config", (fed.dir / "file.json").string()}, "file.log"), 2);
  EXPECT_NE(read_file(fed.files.logs / "file.log").find("is a file, not a folder"), std::string::npos);
  // A TLS key that is not its certificate's (the server's kit with a silo's key).
  std::filesystem::copy(fed.files.pki / "kits" / "server", fed.dir / "badkit");
  std::filesystem::copy_file(fed.files.pki / "kits" / "hospital-01" / "key.pem", fed.dir / "badkit" / "key.pem",
                             std::filesystem::copy_options::overwrite_existing);
  j["state_dir"] = (fed.dir / "tls-state").string();
  j["tls"] = {{"kit", (fed.dir / "badkit").string()}};
  atomic_write_file(fed.dir / "tls.json", j.dump());
  EXPECT_EQ(start({"--config", (fed.dir / "tls.json").string()}, "tls.log"), 2);
  const std::string tls = read_file(fed.files.logs / "tls.log");
  EXPECT_NE(tls.find("tls.json: .tls: "), std::string::npos) << tls;
  EXPECT_NE(tls.find("does not belong to the certificate"), std::string::npos) << tls;
  EXPECT_FALSE(std::filesystem::exists(fed.dir / "tls-state" / "audit.jsonl"));
  // --config naming a folder; a key given twice.
  EXPECT_EQ(start({"--config", fed.dir.path().string()}, "folder.log"), 2);
  EXPECT_NE(read_file(fed.files.logs / "folder.log").find("is a folder, not a file"), std::string::npos);
  std::string twice = read_file(cfg);
  twice.insert(twice.find('{') + 1, "\"rounds\": 7,");
  atomic_write_file(fed.dir / "twice.json", twice);
  EXPECT_EQ(start({"--config", (fed.dir / "twice.json").string()}, "twice.log"), 2);
  EXPECT_NE(read_file(fed.files.logs / "twice.log").find(".rounds: given twice"), std::string::npos)
      << read_file(fed.files.logs / "twice.log");
  EXPECT_EQ(lines_of(fed.files.state / "audit.jsonl").size(), records);  // the running server's log untouched
}

}  // namespace
}  // namespace xsilo::tools
