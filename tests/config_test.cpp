#include <gtest/gtest.h>

#include "common/config.h"
#include "common/fs.h"
#include "tests/testlib.h"
#include "edge_aggregator/config.h"
#include "server/config.h"
#include "silo_agent/config.h"
#include "tools/sim.h"
#include "transport/config.h"

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

TEST(Config, AllowListNeedsNames) {
  auto j = nlohmann::json::parse(R"({"silo": []})");
  ConfigNode node(j, "f.json", ".allow");
  EXPECT_EQ(error_of([&] { transport::parse_allow(node); }),
            "config f.json: .allow.silo: must list at least one name, or \"*\"");
}

// The example configs in configs/ load as they are, next to a PKI and the data.
TEST(Config, ExampleConfigsAreValid) {
  test::TempDir dir;
  const std::filesystem::path src = XSILO_SOURCE_DIR;
  std::filesystem::create_directories(dir / "configs");
  std::filesystem::create_directories(dir / "data");
  for (const auto& e : std::filesystem::directory_iterator(src / "configs")) {
    std::filesystem::copy_file(e.path(), dir / "configs" / e.path().filename());
  }
  std::filesystem::copy_file(src / "data/breast_cancer.csv", dir / "data/breast_cancer.csv");
  test::make_pki(dir / "pki", "oncology-2026",
                 {{wire::SERVER, "server"}, {wire::SILO, "hospital-a"}, {wire::EDGE, "edge-west"}});
  const auto server = server::load_server_config(dir / "configs/server.json");
  EXPECT_EQ(server.federation, "oncology-2026");
  EXPECT_EQ(server.optimizer.kind, "fedadam");
  const auto agent = agent::load_agent_config(dir / "configs/agent.json");
  EXPECT_EQ(agent.upstreams.size(), 2u);
  const auto edge = edge::load_edge_config(dir / "configs/edge.json");
  EXPECT_EQ(edge.upstreams.size(), 1u);
  for (const char* sim : {"breast_cancer_logistic.json", "digits_mlp.json", "digits_local_workers.json"}) {
    EXPECT_NO_THROW(tools::load_sim_config(src / "configs" / sim)) << sim;
  }
}

TEST(Config, SecureAggregationSettingsAreChecked) {
  test::TempDir dir;
  test::make_pki(dir / "pki", "f", {{wire::SERVER, "server"}});
  auto load = [&](const std::string& extra) {
    atomic_write_file(dir / "s.json", R"({"federation": "f", "tls": {"kit": "pki/kits/server"},
      "allow": {"silo": ["a", "b", "c", "d", "e", "f"]}, "model": {"inputs": 4},
      "selection": {"min_silos": 6})" + extra + "}");
    return error_of([&] { server::load_server_config(dir / "s.json"); });
  };
  EXPECT_EQ(load(R"(, "secure": {"mode": "global"})"), "");
  EXPECT_NE(load(R"(, "secure": {"mode": "global"}, "aggregation": {"rule": "median"})").find("use secure.mode grouped"),
            std::string::npos);
  const auto overflow = load(R"(, "secure": {"mode": "global", "max_weight": 100000, "fraction_bits": 20})");
  EXPECT_NE(overflow.find("6 silos x max_weight 100000"), std::string::npos) << overflow;
  EXPECT_EQ(load(R"(, "secure": {"mode": "global", "max_weight": 100000, "fraction_bits": 20, "modulus_bits": 64})"), "");
  EXPECT_NE(load(R"(, "secure": {"mode": "global"}, "aggregation": {"clip_norm": 1})").find("never sees"),
            std::string::npos);
  EXPECT_NE(load(R"(, "secure": {"mode": "grouped", "min_group": 3}, "aggregation": {"rule": "krum", "f": 1})")
                .find("across secure groups"),
            std::string::npos);
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

}  // namespace
}  // namespace xsilo
