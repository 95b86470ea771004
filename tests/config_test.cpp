#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "common/config.h"
#include "common/fs.h"
#include "common/safetensors.h"
#include "tests/testlib.h"
#include "edge_aggregator/config.h"
#include "protocol/compression.h"
#include "server/config.h"
#include "silo_agent/config.h"
#include "tools/sim.h"
#include "tools/sim_stall.h"
#include "transport/config.h"
#include "tests/result_util.h"

namespace xsilo {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, UnknownKeyIsNamedWithFileAndPath) {
  auto j = nlohmann::json::parse(R"({"transport": {"heartbeat_s": 5, "heartbeet": 1}})");
  ConfigNode root(j, "server.json");
  auto msg = error_of([&] { transport::parse_channel_options(root.child("transport")); });
  EXPECT_EQ(msg, "config server.json: .transport.heartbeet: unknown key");
}

// Found by the CI fuzz run: a number too large for any JSON type escaped the loader as
// nlohmann's out_of_range instead of a ConfigError.
TEST(Config, ANumberTooLargeForAnyTypeIsAConfigError) {
  test::TempDir dir;
  atomic_write_file(dir / "e.json", R"({"federation": "f", "transport": {"x": 5555555555555555555E55555555555}})");
  const auto why = error_of([&] { ConfigNode::load_file(dir / "e.json"); });
  EXPECT_NE(why.find("number overflow"), std::string::npos) << why;
  EXPECT_NE(why.find("e.json"), std::string::npos) << why;
}

TEST(Config, WrongTypeAndRangeAreRefusedWithTheValue) {
  auto j = nlohmann::json::parse(R"({"a": "x", "b": 0, "c": 2.5})");
  ConfigNode root(j, "f.json");
  EXPECT_EQ(error_of([&] { root.number("a", 1); }), "config f.json: .a: must be a number, got string");
  EXPECT_EQ(error_of([&] { root.integer("b", 1, 2, 10); }), "config f.json: .b: must be >= 2, got 0");
  EXPECT_EQ(error_of([&] { root.integer("c", 1); }), "config f.json: .c: must be an integer, got 2.5");
}

TEST(Config, OneOfListsTheChoices) {
  auto j = nlohmann::json::parse(R"({"kind": "fedsgd"})");
  ConfigNode root(j, "f.json");
  EXPECT_EQ(error_of([&] { root.one_of("kind", "fedavg", {"fedavg", "fedadam"}); }),
            "config f.json: .kind: must be one of fedavg, fedadam, got \"fedsgd\"");
}

TEST(Config, InvalidJsonNamesTheFile) {
  test::TempDir dir;
  atomic_write_file(dir / "bad.json", "{\"a\": 1,, }");
  auto msg = error_of([&] { ConfigNode::load_file(dir / "bad.json"); });
  EXPECT_NE(msg.find("bad.json: not valid JSON"), std::string::npos) << msg;
}

// A key given twice is refused with its path (nlohmann keeps the last one silently; another
// reader of the same file might keep the first), and a folder named as the config is one line,
// not a stream error.
TEST(Config, AKeyGivenTwiceAndAFolderAreRefusedWithThePath) {
  test::TempDir dir;
  atomic_write_file(dir / "twice.json", R"({"federation": "f", "selection": {"min_silos": 2, "min_silos": 3}})");
  EXPECT_EQ(error_of([&] { ConfigNode::load_file(dir / "twice.json"); }),
            "config " + (dir / "twice.json").string() + ": .selection.min_silos: given twice in one object (only one may stay)");
  atomic_write_file(dir / "list.json", R"({"faults": [{"round": 1}, {"round": 2, "phase": "a", "phase": "b"}]})");
  EXPECT_EQ(error_of([&] { ConfigNode::load_file(dir / "list.json"); }),
            "config " + (dir / "list.json").string() + ": .faults[].phase: given twice in one object (only one may stay)");
  // The same key in two objects is fine.
  atomic_write_file(dir / "ok.json", R"({"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 1}, {"x": 2}]})");
  EXPECT_EQ(error_of([&] { ConfigNode::load_file(dir / "ok.json"); }), "");
  EXPECT_EQ(error_of([&] { ConfigNode::load_file(dir.path()); }), "config " + dir.path().string() + ": is a folder, not a file");
}

// Issue 37: a fault that names no process of the federation, or one that could never fire (a
// silo's crash after a secure step in a federation without secure aggregation), is refused
// with its key before anything is made or started.
TEST(Config, ASimFaultTheFederationCannotHaveIsRefusedWithItsKey) {
  test::TempDir dir;
  auto refused = [&](const nlohmann::json& fault, bool secure) {
    nlohmann::json sim = {{"silos", 3}, {"rounds", 2}, {"edges", 1}, {"faults", {fault}}};
    if (secure) sim["secure"] = {{"mode", "global"}};
    atomic_write_file(dir / "sim.json", sim.dump());
    return error_of([&] { tools::load_sim_config(dir / "sim.json"); });
  };
  EXPECT_NE(refused({{"process", "hospital-07"}, {"round", 1}}, false)
                .find(".faults[0].process: \"hospital-07\" is not a process of this federation (server, edge-01..edge-01, "
                      "hospital-01..hospital-03)"),
            std::string::npos);
  EXPECT_NE(refused({{"process", "edge-02"}, {"round", 1}}, false).find(".faults[0].process"), std::string::npos);
  EXPECT_NE(refused({{"process", "hospital-02"}, {"round", 1}, {"phase", "after_keys"}}, false)
                .find(".faults[0].phase: after_keys fires after a step of secure aggregation"),
            std::string::npos);
  EXPECT_EQ(refused({{"process", "hospital-02"}, {"round", 1}, {"phase", "after_keys"}}, true), "");
  EXPECT_EQ(refused({{"process", "edge-01"}, {"round", 2}, {"action", "restart"}}, false), "");
}

// Combinations a stranger's sim accepted and then hung on, aborted every round of, or ran as a
// test that tested nothing: each refused at load with its key, before anything is started.
TEST(Config, SimCombinationsThatCouldNeverRunAreRefusedAtLoad) {
  test::TempDir dir;
  auto refused = [&](nlohmann::json more) {
    nlohmann::json sim = {{"silos", 4}, {"rounds", 2}};
    sim.update(more);
    atomic_write_file(dir / "sim.json", sim.dump());
    return error_of([&] { tools::load_sim_config(dir / "sim.json"); });
  };
  const nlohmann::json buffered = {{"mode", "buffered"}, {"k", 2}};
  EXPECT_NE(refused({{"edges", 2}, {"schedule", buffered}}).find(".edges: buffered rounds take no edges"),
            std::string::npos);
  EXPECT_EQ(refused({{"schedule", buffered}}), "");
  // Hostile members that rewrite SecAgg's messages have nothing to rewrite under LightSecAgg,
  // nor an edge's key swap without secure aggregation; an edge's hijack needs neither.
  const nlohmann::json lsa = {{"mode", "global"}, {"protocol", "lightsecagg"}};
  for (const auto& [who, attack] : std::vector<std::pair<std::string, std::string>>{
           {"hospital-02", "garbage_shares"}, {"hospital-02", "bad_keys"}, {"edge-01", "swap_keys"},
           {"edge-01", "split_view"}, {"server", "split_view"}}) {
    const auto e = refused({{"edges", 1}, {"secure", lsa}, {"hostile", {{who, attack}}}});
    EXPECT_NE(e.find(".hostile." + who + ": \"" + attack + "\" rewrites SecAgg's messages"), std::string::npos) << e;
    EXPECT_EQ(refused({{"edges", 1}, {"secure", {{"mode", "global"}}}, {"hostile", {{who, attack}}}}), "") << who;
  }
  EXPECT_EQ(refused({{"edges", 1}, {"secure", lsa}, {"hostile", {{"edge-01", "hijack"}}}}), "");
  const auto keyless = refused({{"edges", 1}, {"hostile", {{"edge-01", "swap_keys"}}}});
  EXPECT_NE(keyless.find(".hostile.edge-01: \"swap_keys\" rewrites secure aggregation's messages, which this "
                         "federation does not send"),
            std::string::npos)
      << keyless;
  // A silo under a budget refuses a plan with silo momentum: every round would abort.
  const auto momentum = refused({{"training", {{"silo_momentum", 0.9}}},
                                 {"privacy", {{"level", "record"}, {"max_epsilon", 3}, {"delta", 1e-5}}}});
  EXPECT_NE(momentum.find(".privacy.max_epsilon: a silo under a privacy budget runs no silo momentum"),
            std::string::npos)
      << momentum;
  // A secure group the sim's silos cannot fill.
  const auto two = refused({{"silos", 2}, {"secure", {{"mode", "global"}}}});
  EXPECT_NE(two.find(".secure.min_group: a sum needs 3 silos, but the sim has 2"), std::string::npos) << two;
  EXPECT_EQ(refused({{"silos", 3}, {"secure", {{"mode", "global"}}}}), "");
  // A sum smaller than every silo's floor (secure_floor.min_sum, 3): each silo would refuse the
  // setup and every round abort, 65 s in.
  const auto floor = refused({{"silos", 2}, {"secure", {{"mode", "global"}, {"min_group", 2}}}});
  EXPECT_NE(floor.find(".secure.min_group: a setup would reveal sums of 2 silos, and every silo refuses sums of "
                       "fewer than 3"),
            std::string::npos)
      << floor;
  EXPECT_NE(refused({{"silos", 6}, {"selection", {{"silos_per_round", 2}}}, {"secure", {{"mode", "global"}, {"min_group", 2}}}})
                .find("a setup would reveal sums of 2 silos"),
            std::string::npos);
  EXPECT_EQ(refused({{"silos", 4}, {"secure", {{"mode", "global"}, {"min_group", 2}}}}), "")
      << "4 silos, threshold a majority: sums of 3";
  // The local block is the agents' loader's to judge, but before any process starts.
  EXPECT_NE(refused({{"local", {{"workerz", 3}}}}).find(".local.workerz: unknown key; did you mean workers?"),
            std::string::npos);
}

// The sim's min_silos is a majority, and under secure aggregation at least a secure group (a
// sum never covers fewer than min_group), so a min_group above a majority needs no selection
// block; at least the min_updates the user set, and a min_silos the user set is theirs.
TEST(Config, TheSimsMinSilosCoversASecureGroupWhereTheUserSetNone) {
  test::TempDir dir;
  auto min_silos = [&](const nlohmann::json& extra) {
    nlohmann::json sim = {{"silos", 6}, {"rounds", 1}, {"data", {{"dataset", "digits"}}}};
    if (extra.is_object()) sim.update(extra);
    atomic_write_file(dir / "sim.json", sim.dump());
    const auto out = dir / "out";
    std::filesystem::remove_all(out);
    tools::prepare_federation(tools::load_sim_config(dir / "sim.json"), out);
    return nlohmann::json::parse(read_file(out / "configs" / "server.json"))["selection"]["min_silos"].get<int>();
  };
  EXPECT_EQ(min_silos(nlohmann::json::object()), 4);
  EXPECT_EQ(min_silos({{"secure", {{"mode", "grouped"}, {"min_group", 5}}}}), 5);
  EXPECT_EQ(min_silos({{"secure", {{"mode", "global"}}}}), 4);  // min_group 3, below the majority
  EXPECT_EQ(min_silos({{"selection", {{"min_updates", 5}}}}), 5);  // a round starts with no fewer
  EXPECT_EQ(min_silos({{"secure", {{"mode", "grouped"}, {"min_group", 3}}}, {"selection", {{"min_updates", 3}}}}), 4);
  EXPECT_EQ(min_silos({{"secure", {{"mode", "global"}, {"min_group", 5}}}, {"selection", {{"min_silos", 6}}}}), 6);
}

// An attack on a secure round's encoding (a member that skips its clipping or lies in its
// unclipped count) has nothing to attack without secure aggregation: refused, not run as if honest.
TEST(Config, ASimAttackOnTheSecureEncodingNeedsSecureAggregation) {
  test::TempDir dir;
  auto error = [&](const std::string& kind, bool secure) {
    nlohmann::json sim = {{"silos", 6}, {"rounds", 2}, {"attack", {{"silos", 1}, {"kind", kind}}}};
    if (secure) sim["secure"] = {{"mode", "grouped"}};
    atomic_write_file(dir / "sim.json", sim.dump());
    return error_of([&] { tools::load_sim_config(dir / "sim.json"); });
  };
  for (const std::string kind : {"skip_clipping", "unclipped_lie"}) {
    EXPECT_NE(error(kind, false).find(".attack.kind: \"" + kind + "\" attacks a secure round's encoding: set \"secure\""),
              std::string::npos)
        << error(kind, false);
    EXPECT_EQ(error(kind, true), "");
  }
}

// A hostile server (tools/sim_server.h) attacks secure aggregation with a split view: any other
// mode, or a federation without secure aggregation, is refused with the key and the reason.
TEST(Config, AHostileServerSplitsTheViewOfASecureRoundOnly) {
  test::TempDir dir;
  auto error = [&](const nlohmann::json& hostile, bool secure) {
    nlohmann::json sim = {{"silos", 4}, {"rounds", 1}, {"hostile", hostile}};
    if (secure) sim["secure"] = {{"mode", "global"}};
    atomic_write_file(dir / "sim.json", sim.dump());
    return error_of([&] { tools::load_sim_config(dir / "sim.json"); });
  };
  EXPECT_EQ(error({{"server", "split_view"}}, true), "");
  const auto without = error({{"server", "split_view"}}, false);
  EXPECT_NE(without.find(".hostile.server: a hostile server attacks secure aggregation: set \"secure\""),
            std::string::npos)
      << without;
  const auto other = error({{"server", "swap_keys"}}, true);
  EXPECT_NE(other.find(".hostile.server"), std::string::npos) << other;
  EXPECT_NE(other.find("split_view"), std::string::npos) << other;
  const auto nobody = error({{"coordinator", "split_view"}}, true);
  EXPECT_NE(nobody.find("names neither the server, an edge (edge-NN) nor a silo (hospital-NN)"), std::string::npos)
      << nobody;
}

TEST(Config, IdleTimeoutMustExceedHeartbeat) {
  auto j = nlohmann::json::parse(R"({"heartbeat_s": 10, "idle_timeout_s": 5})");
  ConfigNode node(j, "f.json", ".transport");
  EXPECT_EQ(error_of([&] { transport::parse_channel_options(node); }),
            "config f.json: .transport.idle_timeout_s: must exceed heartbeat_s, or peers are "
            "closed between heartbeats");
}

TEST(Config, EndpointsMustBeHostAndPort) {
  auto j = nlohmann::json::parse(R"({"listen": "localhost", "up": ["a:1", "b:70000"]})");
  ConfigNode root(j, "f.json");
  EXPECT_NE(error_of([&] { transport::parse_endpoint_key(root, "listen"); }).find(".listen:"),
            std::string::npos);
  EXPECT_NE(error_of([&] { transport::parse_endpoint_list(root, "up"); }).find("0..65535"),
            std::string::npos);
  EXPECT_EQ(parse_endpoint("[::1]:443").host, "::1");
}

TEST(Config, TlsKitMustExist) {
  auto j = nlohmann::json::parse(R"({"kit": "/nonexistent/kit"})");
  ConfigNode node(j, "f.json", ".tls");
  EXPECT_NE(error_of([&] { transport::parse_tls(node); }).find("does not exist"), std::string::npos);
}

// Found by fuzzing the config loaders: a path the system cannot look up (a name longer than a
// file name may be) made std::filesystem throw out of the loader instead of a config error.
TEST(Config, APathTheSystemCannotLookUpIsAConfigErrorThatSaysWhy) {
  const std::string name(300, 'k');
  nlohmann::json tls = {{"kit", "/tmp/" + name}};
  ConfigNode node(tls, "f.json", ".tls");
  const auto err = error_of([&] { transport::parse_tls(node); });
  EXPECT_NE(err.find(".tls.kit: file /tmp/" + name + "/key.pem cannot be looked up ("), std::string::npos) << err;
  EXPECT_EQ(error_text(reachable("/tmp/" + name)), "cannot be looked up (File name too long)");
  EXPECT_EQ(error_text(reachable("/nonexistent/file")), "does not exist");
  EXPECT_TRUE(succeeded(reachable("/tmp")));
  EXPECT_TRUE(succeeded(reachable("/tmp", true)));
  EXPECT_EQ(error_text(reachable("/proc/self/status", true)), "is not a folder");
}

// Every loader checks its files through ConfigNode::require_exists: one sentence, naming the
// key, the path and why, with the caller's hint after it.
TEST(Config, RequireExistsNamesTheKeyThePathAndWhy) {
  nlohmann::json j = {{"a", 1}};
  ConfigNode node(j, "f.json", ".trainer");
  node.require_exists("cwd", "/tmp", true);
  node.require_exists("cwd", "");  // not given: nothing to check
  EXPECT_EQ(error_of([&] { node.require_exists("cwd", "/proc/self/status", true); }),
            "config f.json: .trainer.cwd: folder /proc/self/status is not a folder");
  EXPECT_EQ(error_of([&] { node.require_exists("path", "/nonexistent/m.safetensors", false, " (init writes it)"); }),
            "config f.json: .trainer.path: file /nonexistent/m.safetensors does not exist (init writes it)");
  // A hand-written TLS block without a kit must name all three files.
  auto tls = nlohmann::json::parse(R"({"key": "/tmp"})");
  ConfigNode t(tls, "f.json", ".tls");
  EXPECT_EQ(error_of([&] { transport::parse_tls(t); }),
            "config f.json: .tls.cert: is required (or give kit, a folder made by xsilo pki issue)");
}

TEST(Config, AllowListNeedsNames) {
  auto j = nlohmann::json::parse(R"({"silo": []})");
  ConfigNode node(j, "f.json", ".allow");
  EXPECT_EQ(error_of([&] { transport::parse_allow(node); }),
            "config f.json: .allow.silo: must list at least one name, or \"*\"");
}

// The example configs of configs/ in `dir`, beside the data and a PKI they name.
void copy_example_configs(const test::TempDir& dir) {
  const std::filesystem::path src = XSILO_SOURCE_DIR;
  std::filesystem::create_directories(dir / "configs");
  std::filesystem::create_directories(dir / "data");
  for (const auto& e : std::filesystem::directory_iterator(src / "configs")) {
    std::filesystem::copy_file(e.path(), dir / "configs" / e.path().filename());
  }
  std::filesystem::copy_file(src / "data/breast_cancer.csv", dir / "data/breast_cancer.csv");
  test::make_pki(dir / "pki", "oncology-2026",
                 {{wire::SERVER, "server"}, {wire::SILO, "hospital-a"}, {wire::EDGE, "edge-west"}});
}

// The example configs in configs/ load as they are, next to a PKI and the data.
TEST(Config, ExampleConfigsAreValid) {
  test::TempDir dir;
  const std::filesystem::path src = XSILO_SOURCE_DIR;
  copy_example_configs(dir);
  const auto server = server::load_server_config(dir / "configs/server.json");
  EXPECT_EQ(server.federation, "oncology-2026");
  EXPECT_EQ(server.optimizer.kind, "fedadam");
  const auto agent = agent::load_agent_config(dir / "configs/agent.json");
  EXPECT_EQ(agent.upstreams.size(), 2u);
  const auto edge = edge::load_edge_config(dir / "configs/edge.json");
  EXPECT_EQ(edge.upstreams.size(), 1u);
  for (const char* sim : {"breast_cancer_logistic.json", "digits_mlp.json", "digits_local_workers.json",
                          "digits_robust_non_iid.json", "digits_compressed.json", "report_demo.json", "digits_stragglers.json",
                          "digits_stragglers_over.json", "digits_stragglers_buffered.json", "digits_distributed_dp.json"}) {
    EXPECT_NO_THROW(tools::load_sim_config(src / "configs" / sim)) << sim;
  }
}

// A server config of six silos with `extra` keys appended: the loader's error, "" when valid.
class SixSiloServer {
 public:
  SixSiloServer() { test::make_pki(dir_ / "pki", "f", {{wire::SERVER, "server"}}); }
  std::string operator()(const std::string& extra) const {
    atomic_write_file(dir_ / "s.json", R"({"federation": "f", "tls": {"kit": "pki/kits/server"},
      "allow": {"silo": ["a", "b", "c", "d", "e", "f"]}, "model": {"inputs": 4},
      "selection": {"min_silos": 6})" + extra + "}");
    return error_of([&] { server::load_server_config(dir_ / "s.json"); });
  }
  // The warnings of a config that loads, one per line.
  std::string warnings(const std::string& extra) const {
    (*this)(extra);
    std::string out;
    for (const auto& w : server::load_server_config(dir_ / "s.json").warnings) out += w + "\n";
    return out;
  }

 private:
  test::TempDir dir_;
};

// The compact rings hold a group's sum only with headroom: six silos x max_weight x clip_norm x
// 2^fraction_bits must stay below 2^15 (2^7), and the refusal says what would fit.
TEST(Config, ASixteenBitRingIsAcceptedOnlyWhenTheGroupsSumCannotOverflowIt) {
  const SixSiloServer load;
  EXPECT_EQ(load(R"(, "secure": {"mode": "global", "modulus_bits": 16, "fraction_bits": 9, "clip_norm": 10,
                                 "max_weight": 1})"),
            "");  // 6 x 10 x 512 = 30720
  const auto over = load(R"(, "secure": {"mode": "global", "modulus_bits": 16, "fraction_bits": 10, "clip_norm": 10,
                                         "max_weight": 1})");
  EXPECT_NE(over.find(".secure.modulus_bits: 6 silos x max_weight 1 x clip_norm 10 x 2^10 fraction bits = 61440 "
                      "can reach 2^15 (32768) in a 16-bit ring: lower fraction_bits to 9 or less, or use more "
                      "modulus bits"),
            std::string::npos)
      << over;
  // The defaults (max_weight 1000, 16 fraction bits) need a wider ring.
  const auto defaults = load(R"(, "secure": {"mode": "global", "modulus_bits": 16})");
  EXPECT_NE(defaults.find("6 silos x max_weight 1000 x clip_norm 1 x 2^16 fraction bits"), std::string::npos) << defaults;
  // Adaptive clipping's count needs room too.
  const auto count = load(R"(, "secure": {"mode": "global", "modulus_bits": 16, "fraction_bits": 13, "clip_norm": 0.5,
                                          "max_weight": 0.5}, "aggregation": {"adaptive_clip": {"initial": 0.5}})");
  EXPECT_NE(count.find("the unclipped count of adaptive clipping, 6 silos x 2^13"), std::string::npos) << count;
  EXPECT_EQ(load(R"(, "secure": {"mode": "global", "modulus_bits": 8, "fraction_bits": 4, "clip_norm": 1,
                                 "max_weight": 1})"),
            "");  // 6 x 16 = 96 < 128
  EXPECT_NE(load(R"(, "secure": {"mode": "global", "modulus_bits": 8, "fraction_bits": 5, "clip_norm": 1,
                                 "max_weight": 1})")
                .find("can reach 2^7 (128) in a 8-bit ring"),
            std::string::npos);
  for (const char* bits : {"24", "128", "4"}) {
    const auto why = load(std::string(R"(, "secure": {"mode": "global", "modulus_bits": )") + bits + "}");
    EXPECT_NE(why.find(".secure.modulus_bits: must be"), std::string::npos) << bits << ": " << why;
  }
}

// secure.graph (SecAgg+): the rates it is planned for, each within its range, and nothing else.
TEST(Config, ASecAggPlusGraphIsPlannedForStatedDropoutAndCorruptionRates) {
  const SixSiloServer load;
  EXPECT_EQ(load(R"(, "secure": {"mode": "global", "graph": {"dropout": 0.2, "corrupt": 0.05}})"), "");
  EXPECT_EQ(load(R"(, "secure": {"mode": "grouped", "graph": {}})"), "");  // the defaults
  EXPECT_NE(load(R"(, "secure": {"mode": "global", "graph": {"dropout": 0.95}})").find(".secure.graph.dropout"),
            std::string::npos);
  EXPECT_NE(load(R"(, "secure": {"mode": "global", "graph": {"dropout": 0}})").find(".secure.graph.dropout"),
            std::string::npos);
  EXPECT_NE(load(R"(, "secure": {"mode": "global", "graph": {"corrupt": 0.6}})").find(".secure.graph.corrupt"),
            std::string::npos);
  EXPECT_NE(load(R"(, "secure": {"mode": "global", "graph": {"degree": 4}})").find("degree"), std::string::npos);
}

// secure.protocol lightsecagg: 32-bit field words, no SecAgg+ graph, its own block only with it.
TEST(Config, LightSecAggIsChosenWithItsPrivacyAndRefusedWhereItCannotRun) {
  const SixSiloServer load;
  EXPECT_EQ(load(R"(, "secure": {"mode": "global", "protocol": "lightsecagg"})"), "");
  EXPECT_EQ(load(R"(, "secure": {"mode": "grouped", "protocol": "lightsecagg", "lightsecagg": {"corrupt": 0.2}})"), "");
  EXPECT_NE(load(R"(, "secure": {"mode": "global", "protocol": "lightsecagg", "modulus_bits": 64})")
                .find(".secure.modulus_bits: LightSecAgg masks in the field of p = 2^32 - 5"),
            std::string::npos);
  EXPECT_NE(load(R"(, "secure": {"mode": "global", "protocol": "lightsecagg", "graph": {}})").find(".secure.graph"),
            std::string::npos);
  EXPECT_NE(load(R"(, "secure": {"mode": "global", "lightsecagg": {"corrupt": 0.1}})").find(".secure.lightsecagg"),
            std::string::npos);
  EXPECT_NE(load(R"(, "secure": {"mode": "global", "protocol": "lightsecagg", "lightsecagg": {"corrupt": 0.9}})")
                .find(".secure.lightsecagg.corrupt"),
            std::string::npos);
  EXPECT_NE(load(R"(, "secure": {"mode": "global", "protocol": "secagg3"})").find(".secure.protocol"), std::string::npos);
}

TEST(Config, SecureAggregationSettingsAreChecked) {
  const SixSiloServer load;
  EXPECT_EQ(load(R"(, "secure": {"mode": "global"})"), "");
  EXPECT_NE(load(R"(, "secure": {"mode": "global"}, "aggregation": {"rule": "median"})").find("use secure.mode grouped"),
            std::string::npos);
  const auto overflow = load(R"(, "secure": {"mode": "global", "max_weight": 100000, "fraction_bits": 20})");
  EXPECT_NE(overflow.find("6 silos x max_weight 100000"), std::string::npos) << overflow;
  EXPECT_EQ(load(R"(, "secure": {"mode": "global", "max_weight": 100000, "fraction_bits": 20, "modulus_bits": 64})"), "");
  EXPECT_NE(load(R"(, "secure": {"mode": "global"}, "aggregation": {"clip_norm": 1})").find("never sees"),
            std::string::npos);
  // Adaptive clipping works inside the masked sums, below secure.clip_norm (the codec's bound).
  EXPECT_EQ(load(R"(, "secure": {"mode": "global", "clip_norm": 2}, "aggregation": {"adaptive_clip": {"initial": 1}})"), "");
  const auto above = load(R"(, "secure": {"mode": "global", "clip_norm": 2}, "aggregation": {"adaptive_clip": {"initial": 5}})");
  EXPECT_NE(above.find("is above secure.clip_norm"), std::string::npos) << above;
  const auto floor = load(R"(, "secure": {"mode": "global"}, "aggregation": {"adaptive_clip": {"initial": 1, "min": 2}})");
  EXPECT_NE(floor.find(".aggregation.adaptive_clip.min: is above initial"), std::string::npos) << floor;
  // The unclipped count reaches n, more than n x max_weight x clip_norm when max_weight < 1.
  EXPECT_EQ(load(R"(, "secure": {"mode": "global", "fraction_bits": 29, "max_weight": 0.5})"), "");
  const auto count = load(R"(, "secure": {"mode": "global", "fraction_bits": 29, "max_weight": 0.5},
                              "aggregation": {"adaptive_clip": {"initial": 1}})");
  EXPECT_NE(count.find("can reach 2^31"), std::string::npos) << count;
  EXPECT_NE(load(R"(, "secure": {"mode": "grouped", "min_group": 3}, "aggregation": {"rule": "krum", "f": 1})")
                .find("across secure groups"),
            std::string::npos);
  // Half a group or less could be split into two views of the survivors.
  const auto half = load(R"(, "secure": {"mode": "global", "threshold": 0.5})");
  EXPECT_NE(half.find(".secure.threshold: must be above 0.5"), std::string::npos) << half;
  // No sum of fewer than min_group silos: rounds that could commit with fewer are refused.
  const auto few = load(R"(, "secure": {"mode": "global", "min_group": 7})");
  EXPECT_NE(few.find(".secure.min_group: is 7 but selection.min_updates allows rounds of 6 silos"), std::string::npos)
      << few;
}

// Buffered rounds (server/schedule.h): k within the silos, the staleness function's keys by
// kind, and the modes a buffer of several versions cannot combine refused with the reason.
TEST(Config, ABufferedScheduleIsCheckedAgainstTheSilosAndThePlainModeItNeeds) {
  const SixSiloServer load;
  EXPECT_EQ(load(R"(, "schedule": {"mode": "synchronous"})"), "");
  EXPECT_EQ(load(R"(, "schedule": {"mode": "buffered", "k": 3, "max_staleness": 0})"), "");
  EXPECT_EQ(load(R"(, "schedule": {"mode": "buffered", "k": 6, "staleness": {"kind": "hinge", "a": 5, "b": 2}})"), "");
  EXPECT_NE(load(R"(, "schedule": {"mode": "async"})").find(".schedule.mode"), std::string::npos);
  EXPECT_NE(load(R"(, "schedule": {"mode": "buffered"})").find(".schedule.k: is required"), std::string::npos);
  EXPECT_NE(load(R"(, "schedule": {"mode": "buffered", "k": 0})").find(".schedule.k"), std::string::npos);
  EXPECT_NE(load(R"(, "schedule": {"mode": "buffered", "k": 7})").find("allow.silo names only 6 silos"),
            std::string::npos);
  EXPECT_NE(load(R"(, "schedule": {"mode": "buffered", "k": 2, "max_staleness": -1})").find(".schedule.max_staleness"),
            std::string::npos);
  EXPECT_NE(load(R"(, "schedule": {"k": 2})").find("applies to mode \"buffered\" only"), std::string::npos);
  EXPECT_NE(load(R"(, "schedule": {"mode": "buffered", "k": 2, "staleness": {"kind": "constant", "a": 1}})")
                .find(".schedule.staleness.a: has no meaning"),
            std::string::npos);
  EXPECT_NE(load(R"(, "schedule": {"mode": "buffered", "k": 2, "staleness": {"b": 1}})").find("hinge"),
            std::string::npos);
  const auto secure = load(R"(, "schedule": {"mode": "buffered", "k": 2}, "secure": {"mode": "global"})");
  EXPECT_NE(secure.find("plain mode only: secure aggregation's pairwise masks"), std::string::npos) << secure;
  const auto robust = load(R"(, "schedule": {"mode": "buffered", "k": 2}, "aggregation": {"rule": "median"})");
  EXPECT_NE(robust.find("staleness-weighted mean only"), std::string::npos) << robust;
  // Review B3: no commit of one silo's update alone, at k or at the deadline.
  const auto one = load(R"(, "schedule": {"mode": "buffered", "k": 1})");
  EXPECT_NE(one.find(".schedule.k: must be >= 2, got 1"), std::string::npos) << one;
  {
    test::TempDir dir;
    test::make_pki(dir / "pki", "f", {{wire::SERVER, "server"}});
    atomic_write_file(dir / "s.json", R"({"federation": "f", "tls": {"kit": "pki/kits/server"},
      "allow": {"silo": ["a", "b", "c"]}, "model": {"inputs": 4}, "selection": {"min_silos": 1},
      "schedule": {"mode": "buffered", "k": 2}})");
    const auto alone = error_of([&] { server::load_server_config(dir / "s.json"); });
    EXPECT_NE(alone.find("buffered rounds need selection.min_updates >= 2, got 1"), std::string::npos) << alone;
  }
  // Review B4: PowerSGD's per-round seed cannot follow a silo carried across commits.
  const auto psgd = load(R"(, "compression": {"scheme": "powersgd"}, "schedule": {"mode": "buffered", "k": 2})");
  EXPECT_NE(psgd.find("do not take compression \"powersgd\""), std::string::npos) << psgd;
}

// f counts what the rule sees: silos in plain mode, group means in grouped secure mode (a
// Byzantine silo spoils its group's mean). A rule that cannot outvote f of them is refused; one
// over two inputs (their mean) loads with a warning.
TEST(Config, RobustRulesAreCheckedAgainstTheInputsTheySeeSilosOrSecureGroups) {
  const SixSiloServer load;
  const auto plain = load(R"(, "aggregation": {"rule": "median", "f": 3})");
  EXPECT_NE(plain.find(".aggregation.f: a median withstands f = 3 Byzantine inputs only among at least 7"),
            std::string::npos)
      << plain;
  EXPECT_EQ(load(R"(, "aggregation": {"rule": "median", "f": 2})"), "");
  // Groups of 2 (6 silos: 3 groups) hold f = 1 group, not 2.
  const std::string pairs = R"(, "secure": {"mode": "grouped", "min_group": 2, "group_dropouts": 0}, )";
  EXPECT_EQ(load(pairs + R"("aggregation": {"rule": "median", "f": 1})"), "");
  const auto groups = load(pairs + R"("aggregation": {"rule": "centered_clip", "nnm": true, "f": 2})");
  EXPECT_NE(groups.find(".aggregation.f: counts secure groups (a Byzantine silo spoils its group's mean): "
                        "centered clipping after mixing withstands f = 2"),
            std::string::npos)
      << groups;
  EXPECT_NE(groups.find("6 silos make only 3 groups of 2"), std::string::npos) << groups;
  // Groups of 3: a median of 2 group means is their mean.
  const std::string triples = R"(, "secure": {"mode": "grouped", "min_group": 3, "group_dropouts": 0}, )";
  const auto warned = load.warnings(triples + R"("aggregation": {"rule": "median"})");
  EXPECT_NE(warned.find(".aggregation.rule: across secure groups median over 2 inputs is their mean"), std::string::npos)
      << warned;
  EXPECT_EQ(load.warnings(triples + R"("aggregation": {"rule": "fedavg"})"), "");
  EXPECT_EQ(load.warnings(pairs + R"("aggregation": {"rule": "median"})"), "");
  // One group: the message counts it as one.
  const auto one = load(R"(, "secure": {"mode": "grouped", "min_group": 4, "group_dropouts": 1}, )"
                        R"("aggregation": {"rule": "median", "f": 1})");
  EXPECT_NE(one.find("6 silos make only 1 group of "), std::string::npos) << one;
  EXPECT_NE(one.find("each surviving 1 dropout)"), std::string::npos) << one;
}

// centered_clip rejects inputs beyond 3.5 median distances by default; 0 turns it off, and a
// factor so near that honest updates past the median would go is refused.
TEST(Config, CenteredClippingsRejectionIsAFactorOfTheMedianDistanceOrOff) {
  const SixSiloServer load;
  EXPECT_EQ(load(R"(, "aggregation": {"rule": "centered_clip", "reject": 0})"), "");
  EXPECT_EQ(load(R"(, "aggregation": {"rule": "centered_clip", "reject": 6})"), "");
  const auto near = load(R"(, "aggregation": {"rule": "centered_clip", "reject": 1.2})");
  EXPECT_NE(near.find(".aggregation.reject"), std::string::npos) << near;
  EXPECT_NE(near.find("at least 1.5"), std::string::npos) << near;
  EXPECT_NE(load(R"(, "aggregation": {"rule": "centered_clip", "reject": -1})").find(".aggregation.reject"),
            std::string::npos);
}

// centered_clip's opposition: a factor of the median alignment (0.5 by default), or 0 for none.
TEST(Config, CenteredClippingsOppositionIsAFactorOfTheMedianAlignmentOrOff) {
  const SixSiloServer load;
  EXPECT_EQ(load(R"(, "aggregation": {"rule": "centered_clip", "oppose": 0})"), "");
  EXPECT_EQ(load(R"(, "aggregation": {"rule": "centered_clip", "oppose": 1.5})"), "");
  for (const char* bad : {R"(, "aggregation": {"rule": "centered_clip", "oppose": -0.5})",
                          R"(, "aggregation": {"rule": "centered_clip", "oppose": 1000})",
                          R"(, "aggregation": {"rule": "centered_clip", "oppose": "yes"})"}) {
    EXPECT_NE(load(bad).find(".aggregation.oppose"), std::string::npos) << bad;
  }
}

// centered_clip's one-sided and lag tests take a number of spreads (2 by default), at least 1
// (below, the bound could cut into the closest half), or 0 for none.
void expect_a_spread_factor_or_off(const char* key) {
  const SixSiloServer load;
  const auto with = [&](const char* value) {
    return load(std::string(R"(, "aggregation": {"rule": "centered_clip", ")") + key + "\": " + value + "}");
  };
  const auto where = std::string(".aggregation.") + key;
  EXPECT_EQ(with("0"), "");
  EXPECT_EQ(with("3"), "");
  const auto inside = with("0.5");
  EXPECT_NE(inside.find(where), std::string::npos) << inside;
  EXPECT_NE(inside.find("at least 1"), std::string::npos) << inside;
  for (const char* bad : {"-1", "1000"}) EXPECT_NE(with(bad).find(where), std::string::npos) << key << " " << bad;
}

// The one-sided test's spreads are of the inputs' balances.
TEST(Config, CenteredClippingsOneSidedTestIsAtLeastOneSpreadOrOff) { expect_a_spread_factor_or_off("one_sided"); }

// The lag test's spreads are of the alignments with the last step.
TEST(Config, CenteredClippingsLagTestIsAtLeastOneSpreadOrOff) { expect_a_spread_factor_or_off("lag"); }

// centered_clip's radius: "auto" by default (measured on each round's inputs), or a number.
TEST(Config, CenteredClippingsRadiusIsAutomaticUnlessANumberFixesIt) {
  const SixSiloServer load;
  EXPECT_EQ(load(R"(, "aggregation": {"rule": "centered_clip"})"), "");
  EXPECT_EQ(load(R"(, "aggregation": {"rule": "centered_clip", "tau": "auto"})"), "");
  EXPECT_EQ(load(R"(, "aggregation": {"rule": "centered_clip", "tau": 0.05})"), "");
  EXPECT_NE(load(R"(, "aggregation": {"rule": "centered_clip", "tau": "fast"})").find(".aggregation.tau"),
            std::string::npos);
  EXPECT_NE(load(R"(, "aggregation": {"rule": "centered_clip", "tau": 0})").find(".aggregation.tau"), std::string::npos);
}

// Compression: each scheme's own keys, and only random-k with secure aggregation.
TEST(Config, CompressionSchemesAreCheckedAndOnlyRandomKIsSecure) {
  const SixSiloServer load;
  EXPECT_EQ(load(R"(, "compression": {"scheme": "quantize", "bits": 4, "block": 128})"), "");
  EXPECT_EQ(load(R"(, "compression": {"scheme": "sign"})"), "");
  EXPECT_EQ(load(R"(, "compression": {"scheme": "top_k", "fraction": 0.01, "error_feedback": false})"), "");
  EXPECT_EQ(load(R"(, "compression": {"scheme": "random_k", "fraction": 0.1}, "secure": {"mode": "global"})"), "");
  EXPECT_NE(load(R"(, "compression": {"scheme": "quantize", "bits": 5})").find(".compression.bits: must be 8 or 4"),
            std::string::npos);
  EXPECT_NE(load(R"(, "compression": {"scheme": "sign", "fraction": 0.1})").find("applies to schemes top_k and random_k"),
            std::string::npos);
  EXPECT_NE(load(R"(, "compression": {"scheme": "top_k", "fraction": 0})").find(".compression.fraction: must be >="),
            std::string::npos);
  EXPECT_NE(load(R"(, "compression": {"scheme": "topk"})").find("must be one of"), std::string::npos);
  EXPECT_EQ(load(R"(, "compression": {"scheme": "powersgd", "rank": 8})"), "");
  EXPECT_NE(load(R"(, "compression": {"scheme": "powersgd", "rank": 0})").find(".compression.rank: must be >= 1"),
            std::string::npos);
  EXPECT_NE(load(R"(, "compression": {"scheme": "powersgd"}, "secure": {"mode": "global"})")
                .find("PowerSGD over secure sums is not built"),
            std::string::npos);
  const auto secure = load(R"(, "compression": {"scheme": "top_k"}, "secure": {"mode": "global"})");
  EXPECT_NE(secure.find(".compression.scheme: top_k cannot be combined with secure aggregation"), std::string::npos)
      << secure;
  EXPECT_NE(load(R"(, "compression": {"scheme": "quantize"}, "secure": {"mode": "global"})").find("do not add up"),
            std::string::npos);
  EXPECT_NE(load(R"(, "compression": {"scheme": "random_k", "error_feedback": false}, "secure": {"mode": "global"})")
                .find(".compression.error_feedback: must be true for random_k with secure aggregation"),
            std::string::npos);
}

// Which tensors travel dense under compression: normalisation statistics unless the config says
// otherwise; the list survives the config's JSON (the sim hands it to its server that way).
TEST(Config, NormalisationStatisticsTravelDenseByDefaultAndTheListCanBeSet) {
  test::TempDir dir;
  test::make_pki(dir / "pki", "f", {{wire::SERVER, "server"}});
  auto load = [&](const std::string& compression) {
    atomic_write_file(dir / "s.json", R"({"federation": "f", "tls": {"kit": "pki/kits/server"},
      "allow": {"silo": ["*"]}, "model": {"inputs": 4}, "selection": {"min_silos": 2}, "compression": )" +
                                          compression + "}");
    return server::load_server_config(dir / "s.json");
  };
  auto dense = [](const server::ServerConfig& c) {
    return std::vector<std::string>(c.compression.dense().begin(), c.compression.dense().end());
  };
  EXPECT_EQ(dense(load(R"({"scheme": "top_k"})")), protocol::default_dense_patterns());
  const auto two = load(R"({"scheme": "random_k", "dense": ["*.bias", "bn*"]})");
  EXPECT_EQ(dense(two), (std::vector<std::string>{"*.bias", "bn*"}));
  EXPECT_TRUE(dense(load(R"({"scheme": "sign", "dense": []})")).empty());
  EXPECT_TRUE(dense(load(R"({"scheme": "none"})")).empty());
  atomic_write_file(dir / "back.json", server::to_json(two).dump());
  EXPECT_EQ(dense(server::load_server_config(dir / "back.json")), dense(two));
  // "No dense tensors" stays that, not the defaults (found in review: `[]` was not written back).
  atomic_write_file(dir / "back.json", server::to_json(load(R"({"scheme": "sign", "dense": []})")).dump());
  EXPECT_TRUE(dense(server::load_server_config(dir / "back.json")).empty());

  const SixSiloServer six;
  EXPECT_NE(six(R"(, "compression": {"scheme": "none", "dense": ["x"]})").find(".compression.dense: applies when a scheme is set"),
            std::string::npos);
  EXPECT_NE(six(R"(, "compression": {"scheme": "top_k", "dense": [""]})").find(".compression.dense: a dense pattern must be"),
            std::string::npos);
  EXPECT_NE(six(R"(, "compression": {"scheme": "top_k", "dense": "bn"})").find("must be a list of strings"),
            std::string::npos);
}

// The model broadcast: a quantized delta or nothing; it combines with every upload scheme and
// with secure aggregation, and its config survives the JSON the sim hands its server.
TEST(Config, ABroadcastIsAQuantizedDeltaWithItsOwnKeys) {
  const SixSiloServer six;
  EXPECT_EQ(six(R"(, "broadcast": {"scheme": "quantize"})"), "");
  EXPECT_EQ(six(R"(, "broadcast": {"scheme": "none"})"), "");
  EXPECT_EQ(six(R"(, "broadcast": {"scheme": "quantize", "bits": 4, "block": 64}, "compression": {"scheme": "top_k"})"),
            "");
  EXPECT_EQ(six(R"(, "broadcast": {"scheme": "quantize"}, "secure": {"mode": "global"})"), "");
  EXPECT_NE(six(R"(, "broadcast": {"scheme": "quantize", "bits": 6})").find(".broadcast.bits: must be 8 or 4"),
            std::string::npos);
  EXPECT_NE(six(R"(, "broadcast": {"scheme": "top_k"})").find(".broadcast.scheme: must be one of"), std::string::npos);
  EXPECT_NE(six(R"(, "broadcast": {"scheme": "none", "bits": 8})").find(".broadcast.bits: applies to scheme quantize"),
            std::string::npos);
  EXPECT_NE(six(R"(, "broadcast": {"scheme": "quantize", "error_feedback": true})").find("error_feedback"),
            std::string::npos);

  test::TempDir dir;
  test::make_pki(dir / "pki", "f", {{wire::SERVER, "server"}});
  atomic_write_file(dir / "s.json", R"({"federation": "f", "tls": {"kit": "pki/kits/server"},
      "allow": {"silo": ["*"]}, "model": {"inputs": 4}, "selection": {"min_silos": 2},
      "broadcast": {"scheme": "quantize", "bits": 4, "dense": ["*.bias"]}})");
  const auto c = server::load_server_config(dir / "s.json");
  EXPECT_EQ(protocol::describe(c.broadcast), "quantize-4/256");
  ASSERT_EQ(c.broadcast.dense_size(), 1);
  atomic_write_file(dir / "back.json", server::to_json(c).dump());
  const auto back = server::load_server_config(dir / "back.json");
  EXPECT_EQ(back.broadcast.SerializeAsString(), c.broadcast.SerializeAsString());
}

// Bucketing and nearest-neighbour mixing in front of a rule: the rule is checked on the buckets
// a round may commit with, and mixing needs an f.
TEST(Config, PreAggregationStepsAreCheckedWithTheRule) {
  test::TempDir dir;
  test::make_pki(dir / "pki", "f", {{wire::SERVER, "server"}});
  auto load = [&](const std::string& aggregation) {
    atomic_write_file(dir / "s.json", R"({"federation": "f", "tls": {"kit": "pki/kits/server"},
      "allow": {"silo": ["*"]}, "model": {"inputs": 4},
      "selection": {"min_silos": 10}, "aggregation": )" + aggregation + "}");
    return error_of([&] { server::load_server_config(dir / "s.json"); });
  };
  EXPECT_EQ(load(R"({"rule": "median", "bucket": 2, "nnm": true, "f": 2})"), "");
  EXPECT_EQ(load(R"({"rule": "krum", "f": 1, "bucket": 2})"), "");  // 5 buckets: 5 > 2f + 2
  const auto few = load(R"({"rule": "krum", "f": 2, "bucket": 2})");
  EXPECT_NE(few.find("10 inputs make 5 buckets of 2"), std::string::npos) << few;
  const auto few_buckets = load(R"({"rule": "median", "f": 3, "bucket": 2})");  // 5 buckets < 2f + 1
  EXPECT_NE(few_buckets.find("at least 2f + 1 = 7"), std::string::npos) << few_buckets;
  EXPECT_EQ(load(R"({"adaptive_clip": {"quantile": 0.5, "lr": 0.2, "initial": 2}})"), "");
  const auto both = load(R"({"clip_norm": 1, "adaptive_clip": {"quantile": 0.5}})");
  EXPECT_NE(both.find("adaptive_clip both set the clip norm"), std::string::npos) << both;
  const auto no_f = load(R"({"rule": "median", "nnm": true})");
  EXPECT_NE(no_f.find(".aggregation.nnm: mixes each input"), std::string::npos) << no_f;
}

TEST(Config, AnAgentsTrustListNamesItsUpstreams) {
  test::TempDir dir;
  test::make_pki(dir / "pki", "f", {{wire::SILO, "hospital-a"}});
  auto load = [&](const std::string& trust) {
    atomic_write_file(dir / "a.json", R"({"federation": "f", "upstreams": ["127.0.0.1:7443"],
      "tls": {"kit": "pki/kits/hospital-a"}, "data": {"train": "t.csv"})" + trust + "}");
    atomic_write_file(dir / "t.csv", "x,label\n1,0\n");
    return error_of([&] { agent::load_agent_config(dir / "a.json"); });
  };
  EXPECT_EQ(load(""), "");
  EXPECT_EQ(load(R"(, "trust": {"server": ["central"]})"), "");
  EXPECT_NE(load(R"(, "trust": {"silo": ["hospital-b"]})").find("trust.silo"), std::string::npos);
  EXPECT_NE(load(R"(, "trust": {})").find("must name a server or an edge"), std::string::npos);
}

TEST(Config, ServerConfigRefusesImpossibleSelections) {
  test::TempDir dir;
  test::make_pki(dir / "pki", "f", {{wire::SERVER, "server"}});
  auto write = [&](const std::string& selection) {
    atomic_write_file(dir / "s.json", R"({"federation": "f", "tls": {"kit": "pki/kits/server"},
      "allow": {"silo": ["a", "b", "c"]}, "model": {"inputs": 4}, "selection": )" + selection + "}");
    return error_of([&] { server::load_server_config(dir / "s.json"); });
  };
  EXPECT_NE(write(R"({"min_silos": 4})").find(".selection.min_silos: is 4 but allow.silo names only 3"),
            std::string::npos);
  EXPECT_NE(write(R"({"min_silos": 2, "min_updates": 3})").find(".selection.min_updates"), std::string::npos);
  EXPECT_NE(write(R"({"min_silos": 2, "silos_per_round": 1})").find("no round could ever commit"),
            std::string::npos);
  EXPECT_EQ(write(R"({"min_silos": 2})"), "");
  atomic_write_file(dir / "m.json", R"({"federation": "f", "tls": {"kit": "pki/kits/server"},
      "allow": {"silo": ["*"]}, "model": {"kind": "logistic", "inputs": 4, "hidden": [3]}})");
  EXPECT_NE(error_of([&] { server::load_server_config(dir / "m.json"); }).find("use kind \"mlp\""),
            std::string::npos);
}

// A server config with a kit, two silos and a state folder, plus `extra` keys (", \"k\": v").
class ServerKeys : public ::testing::Test {
 protected:
  ServerKeys() { test::make_pki(dir / "pki", "f", {{wire::SERVER, "server"}}); }
  server::ServerConfig load(const std::string& extra) {
    atomic_write_file(dir / "s.json", R"({"federation": "f", "tls": {"kit": "pki/kits/server"},
      "allow": {"silo": ["a", "b"]}, "model": {"inputs": 4}, "state_dir": "st")" + extra + "}");
    return server::load_server_config(dir / "s.json");
  }
  test::TempDir dir;
};

TEST_F(ServerKeys, UploadStagingDefaultsToModelsOverOneGibibyteInTheStateFolder) {
  const auto c = load("");
  EXPECT_EQ(c.staging.over_bytes, std::uint64_t{1024} << 20);
  EXPECT_EQ(c.staging.dir, c.state_dir);
  EXPECT_FALSE(c.staging.stages(std::uint64_t{1024} << 20));
  EXPECT_TRUE(c.staging.stages((std::uint64_t{1024} << 20) + 1));
  EXPECT_TRUE(load(R"(, "stage_uploads_over_mib": 0)").staging.stages(4));
  EXPECT_NE(error_of([&] { load(R"(, "stage_uploads_over_mib": -1)"); }).find(".stage_uploads_over_mib"),
            std::string::npos);
}

TEST_F(ServerKeys, UploadsAtOnceAndBroadcastsAtOnceHaveDefaultsAndRefuseWhatCannotWork) {
  const auto c = load("");
  EXPECT_EQ(c.uploads_at_once, static_cast<std::size_t>(server::kDefaultUploadsAtOnce));
  EXPECT_EQ(c.broadcasts_at_once, static_cast<std::size_t>(server::kDefaultBroadcastsAtOnce));
  EXPECT_EQ(load(R"(, "uploads_at_once": 1)").uploads_at_once, 1u);
  EXPECT_EQ(load(R"(, "broadcasts_at_once": 2)").broadcasts_at_once, 2u);
  for (const auto* bad : {R"(, "uploads_at_once": 0)", R"(, "uploads_at_once": 65)", R"(, "uploads_at_once": "4")"}) {
    EXPECT_NE(error_of([&] { load(bad); }).find(".uploads_at_once"), std::string::npos) << bad;
  }
  EXPECT_NE(error_of([&] { load(R"(, "broadcasts_at_once": -1)"); }).find(".broadcasts_at_once"), std::string::npos);
}

TEST_F(ServerKeys, NetworkThreadsDefaultToTheHardwareUpToFourAndRefuseZeroOrTooMany) {
  EXPECT_EQ(load("").network_threads, transport::default_network_threads());
  EXPECT_GE(transport::default_network_threads(), 1u);
  EXPECT_LE(transport::default_network_threads(), 4u);
  EXPECT_EQ(load(R"(, "network_threads": 1)").network_threads, 1u);
  EXPECT_EQ(load(R"(, "network_threads": 8)").network_threads, 8u);
  for (const auto* bad : {R"(, "network_threads": 0)", R"(, "network_threads": 65)", R"(, "network_threads": 2.5)"}) {
    const auto error = error_of([&] { load(bad); });
    EXPECT_NE(error.find(".network_threads"), std::string::npos) << bad << ": " << error;
  }
}

// Each loader has a to_json beside it: what it writes, it reads back to the same config.
TEST(Config, EveryRoleConfigRoundTripsThroughItsToJson) {
  test::TempDir dir;
  const std::filesystem::path src = XSILO_SOURCE_DIR;
  copy_example_configs(dir);
  const auto server = server::load_server_config(dir / "configs/server.json");
  atomic_write_file(dir / "server2.json", server::to_json(server).dump());
  const auto server2 = server::load_server_config(dir / "server2.json");
  EXPECT_EQ(server::to_json(server2), server::to_json(server));
  EXPECT_EQ(server2.optimizer.kind, "fedadam");
  EXPECT_EQ(server2.expected_silos, server.expected_silos);

  auto agent = agent::load_agent_config(dir / "configs/agent.json");
  agent.trainer = agent::TrainerKind::External;
  agent.external.command = {"python3", "train.py", "--fast"};
  agent.external.env = {{"OMP_NUM_THREADS", "2"}};
  agent.external.evaluate = true;
  atomic_write_file(dir / "agent2.json", agent::to_json(agent).dump());
  const auto agent2 = agent::load_agent_config(dir / "agent2.json");
  EXPECT_EQ(agent::to_json(agent2), agent::to_json(agent));
  EXPECT_EQ(agent2.external.command, agent.external.command);

  const auto edge = edge::load_edge_config(dir / "configs/edge.json");
  atomic_write_file(dir / "edge2.json", edge::to_json(edge).dump());
  EXPECT_EQ(edge::to_json(edge::load_edge_config(dir / "edge2.json")), edge::to_json(edge));
}

TEST(Config, AnExternalTrainerNeedsACommandAndTheBuiltinOneItsData) {
  test::TempDir dir;
  test::make_pki(dir / "pki", "f", {{wire::SILO, "a"}});
  auto load = [&](const std::string& body) {
    atomic_write_file(dir / "a.json", R"({"federation": "f", "upstreams": ["h:1"], "tls": {"kit": "pki/kits/a"})" + body + "}");
    return error_of([&] { agent::load_agent_config(dir / "a.json"); });
  };
  EXPECT_NE(load("").find(".data.train: is required for the built-in trainer"), std::string::npos);
  EXPECT_NE(load(R"(, "trainer": {"kind": "external"})").find(".trainer.command: is required"), std::string::npos);
  EXPECT_NE(load(R"(, "trainer": {"kind": "external", "command": ["x"], "env": {"A": 1}})").find("value of A"),
            std::string::npos);
  EXPECT_EQ(load(R"(, "trainer": {"kind": "external", "command": ["python3", "train.py"], "max_failures": 2})"), "");
  EXPECT_NE(load(R"(, "trainer": {"kind": "external", "command": ["x"]}, "local": {"workers": 2, "hosts": ["h"]})")
                .find("run on this host"),
            std::string::npos);
}

// An agent config with a federation, an upstream, a kit and a one-row t.csv beside it; load()
// writes it with `body` appended and returns the load error ("" when it loads), filling `out`.
struct LocalConfigFile {
  test::TempDir dir;
  LocalConfigFile() {
    test::make_pki(dir / "pki", "f", {{wire::SILO, "a"}});
    atomic_write_file(dir / "t.csv", "1,2,0\n");
  }
  std::string load(const std::string& body, agent::AgentConfig* out = nullptr) {
    atomic_write_file(dir / "a.json", R"({"federation": "f", "upstreams": ["h:1"], "tls": {"kit": "pki/kits/a"})" + body + "}");
    return error_of([&] {
      auto c = agent::load_agent_config(dir / "a.json");
      if (out) *out = c;
    });
  }
};

// local.checkpoint_ms: 30 s by default, 0 for none, a negative or absurd interval refused with
// its key; written back by to_json only when not the default.
TEST(Config, LocalCheckpointsAreEveryThirtySecondsUnlessSetOrOff) {
  LocalConfigFile file;
  const std::string data = R"(, "data": {"train": "t.csv"})";
  agent::AgentConfig c;
  EXPECT_EQ(file.load(data + R"(, "local": {"workers": 2})", &c), "");
  EXPECT_EQ(c.local.checkpoint_interval, std::chrono::milliseconds(30000));
  EXPECT_FALSE(agent::to_json(c)["local"].contains("checkpoint_ms"));
  EXPECT_EQ(file.load(data + R"(, "local": {"workers": 2, "checkpoint_ms": 0})", &c), "");
  EXPECT_EQ(c.local.checkpoint_interval.count(), 0);
  EXPECT_EQ(agent::to_json(c)["local"]["checkpoint_ms"], 0);
  for (const char* bad : {"-1", "1e12", "\"often\""}) {
    const auto err = file.load(data + R"(, "local": {"workers": 2, "checkpoint_ms": )" + bad + "}");
    EXPECT_NE(err.find("checkpoint_ms"), std::string::npos) << bad << ": " << err;
  }
}

// local.across_hosts: the hierarchical backend's algorithm among the leaders (ring by default);
// refused with another backend, and an unknown algorithm refused with the ones there are.
TEST(Config, AcrossHostsIsTheHierarchicalBackendsChoiceOfAlgorithm) {
  LocalConfigFile file;
  const std::string data = R"(, "data": {"train": "t.csv"})";
  agent::AgentConfig c;
  EXPECT_EQ(file.load(data + R"(, "local": {"workers": 4, "backend": "hierarchical", "ranks_per_host": 2})", &c), "");
  EXPECT_EQ(c.local.across_hosts, "ring");
  EXPECT_FALSE(agent::to_json(c)["local"].contains("across_hosts"));
  EXPECT_EQ(file.load(data + R"(, "local": {"workers": 4, "backend": "hierarchical", "across_hosts": "tree"})", &c), "");
  EXPECT_EQ(c.local.across_hosts, "tree");
  EXPECT_EQ(agent::to_json(c)["local"]["across_hosts"], "tree");
  const auto elsewhere = file.load(data + R"(, "local": {"workers": 4, "backend": "ring", "across_hosts": "tree"})");
  EXPECT_NE(elsewhere.find("across_hosts"), std::string::npos) << elsewhere;
  EXPECT_NE(elsewhere.find("hierarchical"), std::string::npos) << elsewhere;
  const auto unknown = file.load(data + R"(, "local": {"workers": 4, "backend": "hierarchical", "across_hosts": "star"})");
  EXPECT_NE(unknown.find("butterfly"), std::string::npos) << unknown;
}

TEST(Config, Int8BucketsAreForTheBuiltinTrainerOnTheTcpBackends) {
  LocalConfigFile file;
  auto load = [&](const std::string& body, agent::AgentConfig* out = nullptr) { return file.load(body, out); };
  const std::string data = R"(, "data": {"train": "t.csv"})";
  agent::AgentConfig c;
  EXPECT_EQ(load(data + R"(, "local": {"workers": 2, "compression": "int8"})", &c), "");
  EXPECT_EQ(c.local.buckets.compression, "int8");
  EXPECT_EQ(load(data + R"(, "local": {"workers": 2})", &c), "");
  EXPECT_EQ(c.local.buckets.compression, "none");
  EXPECT_NE(load(data + R"(, "local": {"workers": 2, "compression": "int4"})").find("compression"), std::string::npos);
  EXPECT_NE(load(R"(, "trainer": {"kind": "external", "command": ["x"]}, "local": {"workers": 2, "compression": "int8"})")
                .find("torch DDP communication hooks"),
            std::string::npos);
}

TEST(Config, TheLocalAllReduceIsOneOfTheTcpAlgorithmsOrNccl) {
  LocalConfigFile file;
  auto load = [&](const std::string& body, agent::AgentConfig* out = nullptr) { return file.load(body, out); };
  const std::string data = R"(, "data": {"train": "t.csv"})";
  agent::AgentConfig c;
  for (const std::string backend : {"ring", "hd", "tree", "butterfly", "hierarchical", "auto"}) {
    EXPECT_EQ(load(data + R"(, "local": {"workers": 3, "backend": ")" + backend + R"("})", &c), "") << backend;
    EXPECT_EQ(c.local.backend, backend);
    EXPECT_EQ(load(data + R"(, "local": {"workers": 3, "compression": "int8", "backend": ")" + backend + R"("})"), "")
        << "int8 runs on every TCP backend: " << backend;
  }
  const auto typo = load(data + R"(, "local": {"workers": 3, "backend": "trees"})");
  EXPECT_NE(typo.find(".local.backend"), std::string::npos) << typo;
  EXPECT_NE(typo.find("butterfly"), std::string::npos) << "the choices are listed: " << typo;
}

// hierarchical takes its hosts from local.hosts or, on one machine, from ranks_per_host; topk
// takes a fraction; backups need local workers. Each key is refused, by name, where it cannot
// apply.
TEST(Config, HierarchicalTopkAndBackupsTakeTheirOwnKeysAndRefuseThemElsewhere) {
  LocalConfigFile file;
  auto load = [&](const std::string& body, agent::AgentConfig* out = nullptr) { return file.load(body, out); };
  const std::string data = R"(, "data": {"train": "t.csv"})";
  agent::AgentConfig c;
  EXPECT_EQ(load(data + R"(, "local": {"workers": 6, "backend": "hierarchical", "ranks_per_host": 2})", &c), "");
  EXPECT_EQ(c.local.backend, "hierarchical");
  EXPECT_EQ(c.local.ranks_per_host, 2);
  EXPECT_EQ(load(data + R"(, "local": {"workers": 4, "backend": "hierarchical", "hosts": ["10.0.0.1", "10.0.0.2"]})"), "");
  const auto not_hier = load(data + R"(, "local": {"workers": 4, "backend": "ring", "ranks_per_host": 2})");
  EXPECT_NE(not_hier.find(".local.ranks_per_host: only the hierarchical backend"), std::string::npos) << not_hier;
  const auto both = load(data + R"(, "local": {"workers": 4, "backend": "hierarchical", "ranks_per_host": 2, "hosts": ["10.0.0.1"]})");
  EXPECT_NE(both.find(".local.ranks_per_host"), std::string::npos) << both;
  EXPECT_NE(load(data + R"(, "local": {"workers": 4, "backend": "hierarchical", "ranks_per_host": -1})").find(".local.ranks_per_host"),
            std::string::npos);

  EXPECT_EQ(load(data + R"(, "local": {"workers": 4, "compression": "topk", "topk_fraction": 0.05})", &c), "");
  EXPECT_EQ(c.local.buckets.compression, "topk");
  EXPECT_EQ(c.local.buckets.topk_fraction, 0.05);
  EXPECT_EQ(load(data + R"(, "local": {"workers": 4, "compression": "topk"})", &c), "");
  EXPECT_EQ(c.local.buckets.topk_fraction, 0.01);
  const auto zero = load(data + R"(, "local": {"workers": 4, "compression": "topk", "topk_fraction": 0})");
  EXPECT_NE(zero.find(".local.topk_fraction"), std::string::npos) << zero;
  const auto big = load(data + R"(, "local": {"workers": 4, "compression": "topk", "topk_fraction": 1.5})");
  EXPECT_NE(big.find(".local.topk_fraction"), std::string::npos) << big;
  const auto stray = load(data + R"(, "local": {"workers": 4, "compression": "int8", "topk_fraction": 0.1})");
  EXPECT_NE(stray.find(".local.topk_fraction: applies to"), std::string::npos) << stray;
  EXPECT_EQ(load(data + R"(, "local": {"workers": 4, "backups": 2})", &c), "");
  EXPECT_EQ(c.local.backups, 2);
  const auto lone = load(data + R"(, "local": {"backups": 1})");
  EXPECT_NE(lone.find(".local.backups: stand by for local workers"), std::string::npos) << lone;
  const auto many = load(data + R"(, "local": {"workers": 2, "backups": 65})");
  EXPECT_NE(many.find(".local.backups"), std::string::npos) << many;
  EXPECT_EQ(load(data + R"(, "local": {"workers": 4, "backend": "hierarchical", "ranks_per_host": 2, "intra_host": "nccl"})", &c), "");
  EXPECT_EQ(c.local.intra_host, "nccl");
  EXPECT_EQ(agent::to_json(c)["local"]["intra_host"], "nccl");
  const auto flat = load(data + R"(, "local": {"workers": 4, "backend": "ring", "intra_host": "nccl"})");
  EXPECT_NE(flat.find(".local.intra_host: is how the hierarchical backend reduces inside each host"), std::string::npos) << flat;
  const auto odd = load(data + R"(, "local": {"workers": 4, "backend": "hierarchical", "ranks_per_host": 2, "intra_host": "shm"})");
  EXPECT_NE(odd.find(".local.intra_host"), std::string::npos) << odd;
  EXPECT_EQ(load(data + R"(, "local": {"workers": 5, "stragglers": 1})", &c), "");
  EXPECT_EQ(c.local.buckets.stragglers, 1);
  EXPECT_EQ(agent::to_json(c)["local"]["stragglers"], 1);
  const auto few = load(data + R"(, "local": {"workers": 2, "stragglers": 2})");
  EXPECT_NE(few.find(".local.stragglers: each group of workers computing the same rows needs 3"), std::string::npos) << few;
  for (const std::string other : {R"("backend": "nccl")", R"("backend": "hierarchical")", R"("compression": "int8")",
                                  R"("backups": 1)"}) {
    const auto refused = load(data + R"(, "local": {"workers": 4, "stragglers": 1, )" + other + "}");
    EXPECT_NE(refused.find(".local.stragglers"), std::string::npos) << other << ": " << refused;
  }
  // Written back and read again: the keys that apply, and only those.
  EXPECT_EQ(load(data + R"(, "local": {"workers": 4, "compression": "topk", "topk_fraction": 0.05})", &c), "");
  const auto j = agent::to_json(c);
  EXPECT_EQ(j["local"]["topk_fraction"], 0.05);
  EXPECT_FALSE(j["local"].contains("ranks_per_host"));
  EXPECT_FALSE(j["local"].contains("stragglers"));
}

// local.algorithm: data_parallel by default, gossip on request; gossip refuses, each with its
// key and reason, what belongs to the all-reduce or is not combined with it, and one worker.
TEST(Config, GossipIsALocalAlgorithmAndRefusesTheAllReducesKeys) {
  LocalConfigFile file;
  const std::string data = R"(, "data": {"train": "t.csv"})";
  agent::AgentConfig c;
  EXPECT_EQ(file.load(data + R"(, "local": {"workers": 4})", &c), "");
  EXPECT_EQ(c.local.algorithm, agent::LocalAlgorithm::data_parallel);
  EXPECT_FALSE(agent::to_json(c)["local"].contains("algorithm"));
  EXPECT_EQ(file.load(data + R"(, "local": {"workers": 4, "algorithm": "gossip", "step_timeout_ms": 5000})", &c), "");
  EXPECT_EQ(c.local.algorithm, agent::LocalAlgorithm::gossip);
  // Written back, it loads again: to_json leaves out the keys gossip refuses.
  const auto j = agent::to_json(c);
  EXPECT_EQ(j["local"]["algorithm"], "gossip");
  EXPECT_FALSE(j["local"].contains("backend"));
  EXPECT_EQ(file.load(data + R"(, "local": )" + j["local"].dump(), &c), "") << j["local"].dump();
  EXPECT_EQ(c.local.algorithm, agent::LocalAlgorithm::gossip);
  EXPECT_EQ(c.local.step_timeout.count(), 5000);

  const auto unknown = file.load(data + R"(, "local": {"workers": 4, "algorithm": "allreduce"})");
  EXPECT_NE(unknown.find(".local.algorithm"), std::string::npos) << unknown;
  const auto lone = file.load(data + R"(, "local": {"algorithm": "gossip"})");
  EXPECT_NE(lone.find(".local.algorithm: gossip is between local workers"), std::string::npos) << lone;
  const std::vector<std::pair<std::string, std::string>> refused{
      {R"("backend": "ring")", ".local.backend: gossip sends models point to point"},
      {R"("compression": "int8")", ".local.compression: gossip's pushes are float32"},
      {R"("stragglers": 1)", ".local.stragglers: gossip waits for no worker already"},
      {R"("backups": 1)", ".local.backups: a standby replaces a worker after a re-formation"},
      {R"("checkpoint_ms": 1000)", ".local.checkpoint_ms: gossip keeps no checkpoints"},
      {R"("backend": "hierarchical", "ranks_per_host": 2)", ".local.backend"}};
  for (const auto& [key, why] : refused) {
    const auto e = file.load(data + R"(, "local": {"workers": 4, "algorithm": "gossip", )" + key + "}");
    EXPECT_NE(e.find(why), std::string::npos) << key << ": " << e;
    EXPECT_NE(e.find("(local.algorithm is gossip)"), std::string::npos) << e;
  }
  const auto external = file.load(data + R"(, "trainer": {"kind": "external", "command": ["python3", "t.py"]},
                                           "local": {"workers": 2, "algorithm": "gossip"})");
  EXPECT_NE(external.find(".local.algorithm: an external trainer's steps"), std::string::npos) << external;
}

// The training block passes keys of its own to external trainers, but a near-miss of a known
// key is a typo, not a user key.
TEST(Config, TrainingKeysOfTheUsersOwnPassThroughAndTyposAreCaught) {
  test::TempDir dir;
  test::make_pki(dir / "pki", "f", {{wire::SERVER, "server"}});
  auto load = [&](const std::string& training, server::ServerConfig* out = nullptr) {
    atomic_write_file(dir / "s.json", R"({"federation": "f", "tls": {"kit": "pki/kits/server"},
      "allow": {"silo": ["*"]}, "model": {"inputs": 4}, "training": )" + training + "}");
    return error_of([&] {
      auto c = server::load_server_config(dir / "s.json");
      if (out) *out = c;
    });
  };
  server::ServerConfig c;
  EXPECT_EQ(load(R"({"learning_rate": 0.05, "schedule": {"kind": "cosine"}, "momentum": 0.9})", &c), "");
  EXPECT_EQ(c.training_user_keys, (std::vector<std::string>{"momentum", "schedule"}));
  const auto j = nlohmann::json::parse(c.plan.config_json());
  EXPECT_EQ(j["schedule"]["kind"], "cosine");
  EXPECT_FLOAT_EQ(c.plan.learning_rate(), 0.05f);
  EXPECT_NE(load(R"({"learing_rate": 0.05})").find(".training.learing_rate: unknown key; did you mean learning_rate?"),
            std::string::npos);
}

// xsilo sim's config: a misspelled top-level key is told "did you mean" as training keys are,
// and a misspelled required key is named where the key it stands for is said to be required.
TEST(Config, SimConfigTyposAreNamedWithTheKeyMeant) {
  test::TempDir dir;
  auto load = [&](const std::string& body) {
    atomic_write_file(dir / "sim.json", body);
    return error_of([&] { tools::load_sim_config(dir / "sim.json"); });
  };
  EXPECT_NE(load(R"({"silos": 3, "rouds": 5})").find(".rouds: unknown key; did you mean rounds?"), std::string::npos)
      << load(R"({"silos": 3, "rouds": 5})");
  EXPECT_NE(load(R"({"silos": 3, "zzz_not_a_key": 5})").find(".zzz_not_a_key: unknown key"), std::string::npos);
  EXPECT_EQ(load(R"({"silos": 3, "zzz_not_a_key": 5})").find("did you mean"), std::string::npos);
  const std::string comand =
      load(R"({"silos": 3, "model": {"kind": "file"}, "trainer": {"comand": ["python3", "train.py"]}})");
  EXPECT_NE(comand.find(".trainer.command: is required"), std::string::npos) << comand;
  EXPECT_NE(comand.find("(the config has \"comand\": a misspelling of command?)"), std::string::npos) << comand;
}

TEST(Config, AServerStartsFromAUsersModelFileOfFloatTensors) {
  test::TempDir dir;
  test::make_pki(dir / "pki", "f", {{wire::SERVER, "server"}});
  Model m;
  m.add("conv.weight", {2, 1, 3, 3});
  m.add("fc.bias", {10});
  save_safetensors(dir / "init.safetensors", m);
  auto load = [&](const std::string& model) {
    atomic_write_file(dir / "s.json", R"({"federation": "f", "tls": {"kit": "pki/kits/server"},
      "allow": {"silo": ["*"]}, "model": )" + model + "}");
    return error_of([&] { server::load_server_config(dir / "s.json"); });
  };
  EXPECT_EQ(load(R"({"kind": "file", "path": "init.safetensors"})"), "");
  EXPECT_NE(load(R"({"kind": "file", "path": "nope.safetensors"})").find(".model.path"), std::string::npos);
  // An integer tensor (a BatchNorm counter saved by hand) is named.
  const std::string header = R"({"n":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})";
  std::string f(8, '\0');
  const std::uint64_t hn = header.size();
  std::memcpy(f.data(), &hn, 8);
  f += header + std::string(8, '\0');
  atomic_write_file(dir / "int.safetensors", f);
  EXPECT_NE(load(R"({"kind": "file", "path": "int.safetensors"})").find("tensor n in"), std::string::npos);
}


// The deterministic counterpart of ExternalTrainers.TheSimEndsWithTheReasonWhenEveryAgentHasExited:
// the sim gives up 5 s after the last agent exits (a restart comes back within a second), 20 s
// after fewer than a round needs remain, and never while enough run.
TEST(SimStall, TheSimGivesUpFiveSecondsAfterTheLastAgentAndTwentyAfterTooFewRemain) {
  using namespace std::chrono_literals;
  const auto t0 = tools::StallWatch::Clock::time_point{} + 1h;
  tools::StallWatch w(2);
  EXPECT_EQ(error_text(w.check(3, 3, t0)), "");
  EXPECT_EQ(error_text(w.check(0, 3, t0 + 1s)), "");  // every agent gone: the grace starts
  EXPECT_EQ(error_text(w.check(0, 3, t0 + 5999ms)), "");
  EXPECT_EQ(error_text(w.check(0, 3, t0 + 6s)), "every agent has exited");
  tools::StallWatch restart(2);
  EXPECT_EQ(error_text(restart.check(0, 3, t0)), "");
  EXPECT_EQ(error_text(restart.check(3, 3, t0 + 900ms)), "");  // a restart brought them back: the grace ends
  EXPECT_EQ(error_text(restart.check(0, 3, t0 + 4s)), "");     // and starts again from here
  EXPECT_EQ(error_text(restart.check(0, 3, t0 + 8999ms)), "");
  EXPECT_EQ(error_text(restart.check(0, 3, t0 + 9s)), "every agent has exited");
  tools::StallWatch few(2);
  EXPECT_EQ(error_text(few.check(1, 3, t0)), "");
  EXPECT_EQ(error_text(few.check(1, 3, t0 + 19s)), "");
  EXPECT_EQ(error_text(few.check(1, 3, t0 + 20s)), "only 1 of the 3 agents run, and a round needs 2 (selection.min_silos)");
}

// Silo-level central DP: the server's "privacy" block, and every combination that would void
// its guarantee refused with the key and the reason.
TEST(Config, CentralDpIsConfiguredWithItsBudgetAndRefusedWhereItsGuaranteeWouldNotHold) {
  const SixSiloServer six;
  EXPECT_EQ(six(R"(, "privacy": {"level": "silo", "mode": "central", "epsilon": 3, "delta": 1e-5, "rounds": 20})"), "");
  EXPECT_EQ(six(R"(, "privacy": {"epsilon": 3, "noise_multiplier": 2, "clip_norm": 0.5})"), "");
  // The noise: chosen for the rounds, or fixed; not both, and a fixed one must fit one round.
  EXPECT_NE(six(R"(, "privacy": {"epsilon": 3, "rounds": 5, "noise_multiplier": 1})").find(".privacy.noise_multiplier: and rounds both"),
            std::string::npos);
  EXPECT_NE(six(R"(, "privacy": {"epsilon": 0.01, "noise_multiplier": 0.01})").find(".privacy.noise_multiplier: 0.01 is too small for even one round"),
            std::string::npos);
  EXPECT_NE(six(R"(, "privacy": {"delta": 1e-5})").find(".privacy.epsilon: is required"), std::string::npos);
  EXPECT_NE(six(R"(, "privacy": {"epsilon": 3, "delta": 2})").find(".privacy.delta"), std::string::npos);
  EXPECT_NE(six(R"(, "privacy": {"epsilon": 3, "typo": 1})").find(".privacy.typo"), std::string::npos);
  // Modes and levels that are not this block's.
  // Distributed mode without secure aggregation: each silo's share protects nothing.
  const auto distributed = six(R"(, "privacy": {"mode": "distributed", "epsilon": 3})");
  EXPECT_NE(distributed.find(".privacy.mode: distributed needs secure aggregation"), std::string::npos) << distributed;
  EXPECT_NE(six(R"(, "privacy": {"level": "record", "epsilon": 3})").find(".privacy.level: record-level budgets belong to each silo"),
            std::string::npos);
  // Secure aggregation: the server never sees an update to clip.
  const auto secure = six(R"(, "privacy": {"epsilon": 3}, "secure": {"mode": "global"})");
  EXPECT_NE(secure.find(".privacy.mode: central needs the server to clip each silo's update"), std::string::npos) << secure;
  EXPECT_NE(secure.find("\"distributed\""), std::string::npos) << secure;
  // Rules whose output one silo moves by more than C / W.
  for (const char* rule : {R"("rule": "krum", "f": 1)", R"("rule": "multi_krum", "f": 1, "m": 3)", R"("rule": "median", "f": 1)",
                           R"("rule": "trimmed_mean", "f": 1)", R"("rule": "centered_clip", "f": 1)"}) {
    const auto why = six(std::string(R"(, "privacy": {"epsilon": 3}, "aggregation": {)") + rule + "}");
    EXPECT_NE(why.find(".aggregation.rule:"), std::string::npos) << rule << ": " << why;
    EXPECT_NE(why.find("cannot be combined with central DP"), std::string::npos) << rule << ": " << why;
  }
  EXPECT_NE(six(R"(, "privacy": {"epsilon": 3}, "aggregation": {"bucket": 2})").find(".aggregation.bucket"), std::string::npos);
  EXPECT_NE(six(R"(, "privacy": {"epsilon": 3}, "aggregation": {"clip_norm": 1})").find(".aggregation.clip_norm: central DP clips"),
            std::string::npos);
  // Adaptive clipping is accepted, its count accounted (the next test).
  EXPECT_EQ(six(R"(, "privacy": {"epsilon": 3}, "aggregation": {"adaptive_clip": {"quantile": 0.5}})"), "");

  // The block as loaded: W is the silos the allow-list names (or a round's silos_per_round), the
  // noise is chosen for the rounds, and the config reads back with the same noise.
  test::TempDir dir;
  test::make_pki(dir / "pki", "f", {{wire::SERVER, "server"}});
  atomic_write_file(dir / "s.json", R"({"federation": "f", "tls": {"kit": "pki/kits/server"},
      "allow": {"silo": ["a", "b", "c", "d"]}, "model": {"inputs": 4}, "rounds": 12, "selection": {"min_silos": 3},
      "privacy": {"level": "silo", "mode": "central", "epsilon": 2, "delta": 1e-6, "clip_norm": 0.3}})");
  const auto c = server::load_server_config(dir / "s.json");
  ASSERT_TRUE(c.central_dp);
  EXPECT_EQ(c.central_dp->denominator, 4);
  EXPECT_EQ(c.central_dp->rounds, 12u);
  EXPECT_EQ(c.central_dp->sample_rate, 1.0);
  EXPECT_NEAR(c.central_dp->noise_multiplier, privacy::noise_multiplier_for(2, 1e-6, 1.0, 12), 1e-12);
  atomic_write_file(dir / "back.json", server::to_json(c).dump());
  const auto back = server::load_server_config(dir / "back.json");
  ASSERT_TRUE(back.central_dp);
  EXPECT_EQ(back.central_dp->noise_multiplier, c.central_dp->noise_multiplier);
  EXPECT_EQ(back.central_dp->denominator, 4);
  // Any silo may join: W must be given.
  atomic_write_file(dir / "any.json", R"({"federation": "f", "tls": {"kit": "pki/kits/server"},
      "allow": {"silo": ["*"]}, "model": {"inputs": 4}, "selection": {"min_silos": 3}, "privacy": {"epsilon": 2}})");
  EXPECT_NE(error_of([&] { server::load_server_config(dir / "any.json"); }).find(".privacy.denominator: is required"),
            std::string::npos);
  // The sim's block maps to the server's; distributed noise is refused before anything runs.
  atomic_write_file(dir / "sim.json", R"({"silos": 3, "rounds": 4, "privacy": {"level": "silo", "epsilon": 3, "delta": 1e-5}})");
  const auto sim = tools::load_sim_config(dir / "sim.json");
  EXPECT_FALSE(sim.privacy);
  EXPECT_EQ(sim.silo_privacy.value("mode", ""), "central");
  EXPECT_EQ(sim.silo_privacy.value("rounds", 0), 4);
  atomic_write_file(dir / "sim.json", R"({"silos": 3, "privacy": {"level": "silo", "mode": "distributed", "epsilon": 3}})");
  const auto distributed_sim = tools::load_sim_config(dir / "sim.json");
  EXPECT_EQ(distributed_sim.silo_privacy.value("mode", ""), "distributed");
}

// Central DP with adaptive clipping: the round's noise multiplier (the one that lasts the rounds)
// is shared between the update and the unclipped count (server/central_dp.h), count_stddev by
// default the paper's W / 20 or a tenth of the round's RDP; the first C is adaptive_clip.initial.
TEST(Config, CentralDpWithAdaptiveClippingSharesTheRoundsNoiseWithTheUnclippedCount) {
  const SixSiloServer six;
  const std::string adaptive = R"(, "aggregation": {"adaptive_clip": {"quantile": 0.5, "initial": 0.3}})";
  EXPECT_EQ(six(R"(, "privacy": {"epsilon": 8, "rounds": 10, "count_stddev": 4})" + adaptive), "");
  EXPECT_EQ(six(R"(, "privacy": {"epsilon": 8, "noise_multiplier": 2, "count_stddev": 4})" + adaptive), "");
  // The count's noise only with a count; the first C from one key only.
  EXPECT_NE(six(R"(, "privacy": {"epsilon": 8, "count_stddev": 4})").find(".privacy.count_stddev: is the noise of adaptive clipping"),
            std::string::npos);
  EXPECT_NE(six(R"(, "privacy": {"epsilon": 8, "clip_norm": 0.5})" + adaptive).find(".privacy.clip_norm: and aggregation.adaptive_clip.initial"),
            std::string::npos);
  // A count's noise so small that it alone would spend the round's budget.
  const auto tiny = six(R"(, "privacy": {"epsilon": 1, "rounds": 10, "count_stddev": 0.1})" + adaptive);
  EXPECT_NE(tiny.find(".privacy.count_stddev: count_stddev 0.1 leaves no room for the update's noise"), std::string::npos) << tiny;
  // A fixed update noise whose count makes one round too expensive.
  EXPECT_NE(six(R"(, "privacy": {"epsilon": 1, "noise_multiplier": 5, "count_stddev": 0.05})" + adaptive)
                .find(".privacy.noise_multiplier:"),
            std::string::npos);

  test::TempDir dir;
  test::make_pki(dir / "pki", "f", {{wire::SERVER, "server"}});
  atomic_write_file(dir / "s.json", R"({"federation": "f", "tls": {"kit": "pki/kits/server"},
      "allow": {"silo": ["a", "b", "c", "d"]}, "model": {"inputs": 4}, "rounds": 12, "selection": {"min_silos": 3},
      "aggregation": {"adaptive_clip": {"quantile": 0.5, "initial": 0.3}},
      "privacy": {"level": "silo", "mode": "central", "epsilon": 2, "delta": 1e-6}})");
  const auto c = server::load_server_config(dir / "s.json");
  ASSERT_TRUE(c.central_dp);
  const double z_round = privacy::noise_multiplier_for(2, 1e-6, 1.0, 12);
  EXPECT_EQ(c.central_dp->clip_norm, 0.3);
  EXPECT_NEAR(c.central_dp->count_stddev, server::default_count_stddev(4, z_round), 1e-12);
  EXPECT_GT(c.central_dp->count_stddev, 4.0 / 20);  // at 4 silos the paper's W / 20 would cost too much
  EXPECT_NEAR(server::round_noise_multiplier(c.central_dp->noise_multiplier, c.central_dp->count_stddev), z_round,
              1e-9 * z_round);
  EXPECT_GT(c.central_dp->noise_multiplier, z_round);
  atomic_write_file(dir / "back.json", server::to_json(c).dump());
  const auto back = server::load_server_config(dir / "back.json");
  ASSERT_TRUE(back.central_dp);
  EXPECT_EQ(back.central_dp->noise_multiplier, c.central_dp->noise_multiplier);
  EXPECT_EQ(back.central_dp->count_stddev, c.central_dp->count_stddev);
  EXPECT_EQ(back.central_dp->clip_norm, 0.3);
}

// Silo-level distributed DP: needs secure aggregation (SecAgg, a ring of 16 bits or more), and
// is refused with the reason wherever its guarantee would not hold; with the model's size
// known, too few bits for the sum are refused at load.
TEST(Config, DistributedDpNeedsSecureAggregationAndIsRefusedWhereItsGuaranteeWouldNotHold) {
  const SixSiloServer six;
  const std::string secure = R"(, "secure": {"mode": "global", "max_weight": 1})";
  auto with = [&](const std::string& privacy, const std::string& more = "") {
    return six(R"(, "privacy": {"level": "silo", "mode": "distributed", )" + privacy + "}" + secure + more);
  };
  EXPECT_EQ(with(R"("epsilon": 3, "rounds": 20, "clip_norm": 0.5)"), "");
  EXPECT_EQ(with(R"("epsilon": 3, "rounds": 20, "bits": 16, "dim": 4810)"), "");
  const auto few = with(R"("epsilon": 3, "rounds": 20, "bits": 8, "dim": 4810)");
  EXPECT_NE(few.find(".privacy.bits: 8 bits cannot hold the sum"), std::string::npos) << few;
  const auto wide = with(R"("epsilon": 3, "bits": 40)");
  EXPECT_NE(wide.find(".privacy.bits: 40 does not fit the masking ring of secure.bits = 32"), std::string::npos) << wide;
  EXPECT_NE(with(R"("epsilon": 3, "rounds": 5, "noise_multiplier": 1)").find("and rounds both"), std::string::npos);
  // max_silos (gamma's n) may raise the bound of a round's six silos, never lower it: a larger
  // group could wrap the ring more often than gamma's bound states.
  EXPECT_EQ(with(R"("epsilon": 3, "rounds": 20, "max_silos": 10)"), "");
  const auto small = with(R"("epsilon": 3, "rounds": 20, "max_silos": 4)");
  EXPECT_NE(small.find(".privacy.max_silos: 4 is below the 6 silos a round may select"), std::string::npos) << small;
  // A robust rule, nnm or bucketing across secure groups is post-processing of the noisy group
  // sums the round releases anyway (docs/privacy.md): accepted in grouped mode (three groups of
  // two), refused in global mode, which reveals one sum and has nothing to compare.
  const std::string grouped = R"(, "privacy": {"mode": "distributed", "epsilon": 3}, "secure": {"mode": "grouped", )"
                              R"("min_group": 2, "group_dropouts": 0, "max_weight": 1}, "aggregation": {)";
  for (const char* rule : {R"("rule": "median", "f": 1)", R"("rule": "trimmed_mean", "f": 1)",
                           R"("rule": "centered_clip", "f": 1)", R"("rule": "median", "f": 1, "nnm": true)"}) {
    EXPECT_EQ(six(grouped + rule + "}"), "") << rule;
    const auto global = with(R"("epsilon": 3)", std::string(R"(, "aggregation": {)") + rule + "}");
    EXPECT_NE(global.find(".aggregation.rule: secure.mode global shows the server only the total, so a robust rule "
                          "has nothing to choose from"),
              std::string::npos)
        << rule << ": " << global;
  }
  // The rule's own conditions still count groups: Krum needs more than three.
  EXPECT_NE(six(grouped + R"("rule": "multi_krum", "f": 1, "m": 2})").find(".aggregation."), std::string::npos);
  // Twelve silos in six groups of two: Multi-Krum and bucketing across them load, and the
  // privacy block is the one fedavg gets (the rule changes nothing of the noise or the spend).
  {
    test::TempDir dir;
    test::make_pki(dir / "pki", "f", {{wire::SERVER, "server"}});
    auto twelve = [&](const std::string& aggregation) {
      atomic_write_file(dir / "s.json", R"({"federation": "f", "tls": {"kit": "pki/kits/server"}, "model": {"inputs": 4},
          "allow": {"silo": ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"]}, "selection": {"min_silos": 12},
          "secure": {"mode": "grouped", "min_group": 2, "group_dropouts": 0, "max_weight": 1},
          "privacy": {"level": "silo", "mode": "distributed", "epsilon": 3, "rounds": 20, "dim": 4810},
          "aggregation": {)" + aggregation + "}}");
      return server::load_server_config(dir / "s.json");
    };
    const auto fedavg = twelve(R"("rule": "fedavg")");
    for (const char* rule : {R"("rule": "multi_krum", "f": 1, "m": 3)", R"("rule": "trimmed_mean", "f": 2)",
                             R"("rule": "median", "f": 1, "bucket": 2)"}) {
      server::ServerConfig c;
      ASSERT_NO_THROW(c = twelve(rule)) << rule;
      ASSERT_TRUE(c.distributed_dp) << rule;
      EXPECT_EQ(c.distributed_dp->gamma, fedavg.distributed_dp->gamma) << rule;
      EXPECT_EQ(c.distributed_dp->variance, fedavg.distributed_dp->variance) << rule;
      EXPECT_EQ(c.distributed_dp->denominator, 12) << rule;
    }
    EXPECT_EQ(twelve(R"("rule": "multi_krum", "f": 1, "m": 3)").aggregation.rule.rule, robust::Rule::MultiKrum);
  }
  // Adaptive clipping (issue 42): its count word is noised by the silos and accounted, with fedavg
  // and no compression; with a rule across the groups or random-k it is not built, and refused.
  const std::string adaptive = R"(, "aggregation": {"adaptive_clip": {"quantile": 0.5, "initial": 0.5}})";
  EXPECT_EQ(with(R"("epsilon": 3, "rounds": 20, "count_stddev": 20, "dim": 4810)", adaptive), "");
  EXPECT_EQ(with(R"("epsilon": 3, "rounds": 20, "dim": 4810)", adaptive), "");  // sigma_b: central mode's default
  EXPECT_NE(with(R"("epsilon": 3, "count_stddev": 2)").find(".privacy.count_stddev: is the noise of adaptive clipping"),
            std::string::npos);
  EXPECT_NE(with(R"("epsilon": 3, "clip_norm": 0.5)", adaptive).find(".privacy.clip_norm: and aggregation.adaptive_clip"),
            std::string::npos);
  const auto tiny = with(R"("epsilon": 1, "rounds": 20, "count_stddev": 0.05, "dim": 4810)", adaptive);
  EXPECT_NE(tiny.find("leaves no room for the update's noise"), std::string::npos) << tiny;
  const auto random_k = with(R"("epsilon": 3)", R"(, "aggregation": {"adaptive_clip": {"initial": 0.5}}, "compression": {"scheme": "random_k", "fraction": 0.1})");
  EXPECT_NE(random_k.find(".aggregation.adaptive_clip: with compression is not built"), std::string::npos) << random_k;
  const auto ruled = six(grouped + R"("rule": "median", "f": 1, "adaptive_clip": {"initial": 0.5}})");
  EXPECT_NE(ruled.find(".aggregation.adaptive_clip: with a robust rule"), std::string::npos) << ruled;
  EXPECT_NE(with(R"("epsilon": 3)", R"(, "aggregation": {"clip_norm": 1})").find(".aggregation.clip_norm"), std::string::npos);
  // Random-k (the only compression secure aggregation takes) combines: its kept set is public.
  EXPECT_EQ(with(R"("epsilon": 3)", R"(, "compression": {"scheme": "random_k", "fraction": 0.1})"), "");
  const auto quantized = with(R"("epsilon": 3)", R"(, "compression": {"scheme": "quantize", "bits": 8})");
  EXPECT_NE(quantized.find(".compression."), std::string::npos) << quantized;
  const auto lsa = six(R"(, "privacy": {"mode": "distributed", "epsilon": 3}, "secure": {"mode": "global", "protocol": "lightsecagg", "max_weight": 1})");
  EXPECT_NE(lsa.find(".secure.protocol: lightsecagg masks in the field"), std::string::npos) << lsa;
  const auto graph = six(R"(, "privacy": {"mode": "distributed", "epsilon": 3}, "secure": {"mode": "global", "graph": {}, "max_weight": 1})");
  EXPECT_NE(graph.find(".secure.graph: SecAgg+'s neighbour graphs"), std::string::npos) << graph;
}

}  // namespace
}  // namespace xsilo
