// xsilo sim's own config file (docs/configs.md, "Simulation").
#include "tools/sim.h"

#include <cstdlib>
#include <random>

#include "common/config.h"
#include "common/fs.h"
#include "server/config_secure.h"
#include "server/round_config.h"
#include "server/secure_round.h"
#include "tools/sim_attack.h"

namespace xsilo::tools {

namespace {

using json = nlohmann::json;

std::filesystem::path resolve_dataset(const std::string& name) {
  for (const char* ext : {".csv", ".csv.gz"}) {
    const auto p = data_dir() / (name + ext);
    if (reachable(p)) return p;
  }
  return {};
}

// "trainer": the silos' own training script (an external trainer in every silo).
SimConfig::Trainer parse_sim_trainer(const ConfigNode& root, const ConfigNode& model, const std::filesystem::path& file,
                                     const SimConfig& c) {
  const auto t = root.child("trainer");
  SimConfig::Trainer tr;
  tr.command = t.str_list("command");
  if (tr.command.empty()) t.fail("command", "is required: the training script's command line");
  tr.init = t.str_list("init");
  tr.cwd = t.path("cwd", "");
  if (tr.cwd.empty()) tr.cwd = std::filesystem::absolute(file).parent_path();
  tr.env = t.string_map("env");
  tr.startup_s = t.number("startup_s", 120, 0.1, 86400);
  tr.task_timeout_s = t.number("task_timeout_s", 0, 0, 7 * 86400);
  tr.max_failures = static_cast<int>(t.integer("max_failures", 3, 1, 1000));
  tr.evaluate = t.boolean("evaluate", true);
  for (const auto& d : t.child_list("silo_data")) {
    tr.silo_data.emplace_back(d.path("train", ""), d.path("test", ""));
    if (tr.silo_data.back().first.empty()) d.fail("train", "is required");
    d.finish();
  }
  t.finish();
  if (!tr.silo_data.empty() && tr.silo_data.size() != c.silos) {
    t.fail("silo_data", "names " + std::to_string(tr.silo_data.size()) + " silos' data, but silos is " +
                            std::to_string(c.silos));
  }
  if (c.model_kind != "file") {
    model.fail("kind", "an external trainer trains its own model: give \"kind\": \"file\" and the initial model's "
                       "\"path\" (trainer.init can write it)");
  }
  // A missing model file is asked of the script through the trainer protocol (or written by
  // trainer.init): tools/sim_files.cpp.
  return tr;
}

// "kill_storm": {"seed", "every_rounds": [min, max], "targets", "phases", "first_round"}.
SimConfig::KillStorm parse_kill_storm(const ConfigNode& root, const SimConfig& c) {
  const auto k = root.child("kill_storm");
  SimConfig::KillStorm s;
  s.seed = static_cast<std::uint64_t>(k.integer("seed", 1, 0));
  const auto every = k.int_list("every_rounds", 1, 100000);
  if (every.size() == 1) {
    s.min_every = s.max_every = static_cast<std::uint64_t>(every[0]);
  } else if (every.size() == 2) {
    s.min_every = static_cast<std::uint64_t>(every[0]);
    s.max_every = static_cast<std::uint64_t>(every[1]);
    if (s.min_every > s.max_every) k.fail("every_rounds", "must be [min, max] with min <= max");
  } else if (!every.empty()) {
    k.fail("every_rounds", "must be [min, max] (or [n])");
  }
  s.first_round = static_cast<std::uint64_t>(k.integer("first_round", 2, 1, static_cast<std::int64_t>(c.rounds)));
  s.targets = k.str_list("targets");
  if (s.targets.empty()) s.targets = {"server", "edges", "silos"};
  for (const auto& t : s.targets) {
    if (t != "server" && t != "edges" && t != "silos") {
      k.fail("targets", "\"" + t + "\" is none of \"server\", \"edges\", \"silos\"");
    }
    if (t == "edges" && c.edges == 0) k.fail("targets", "names \"edges\" but the federation has none (set \"edges\")");
  }
  s.phases = k.str_list("phases");
  if (s.phases.empty()) s.phases = {"train", "upload"};
  for (const auto& p : s.phases) {
    if (p != "train" && p != "upload") k.fail("phases", "\"" + p + "\" is neither \"train\" nor \"upload\"");
  }
  k.finish();
  return s;
}

}  // namespace

std::vector<SimConfig::Fault> kill_storm_faults(const SimConfig::KillStorm& storm, std::size_t silos, std::size_t edges,
                                                std::uint64_t rounds) {
  // mt19937_64's output is fixed by the standard; the distributions are not, so the draws
  // are plain remainders (their bias is nothing next to 2^64).
  std::mt19937_64 rng(storm.seed);
  auto draw = [&](std::uint64_t n) { return rng() % n; };
  std::vector<SimConfig::Fault> out;
  const std::uint64_t span = storm.max_every - storm.min_every + 1;
  for (std::uint64_t round = storm.first_round; round <= rounds; round += storm.min_every + draw(span)) {
    const auto& kind = storm.targets[draw(storm.targets.size())];
    SimConfig::Fault f;
    f.action = "restart";
    f.round = round;
    f.phase = storm.phases[draw(storm.phases.size())];
    if (kind == "server") f.process = "server";
    if (kind == "edges") f.process = edge_name(draw(edges));
    if (kind == "silos") f.process = silo_name(draw(silos));
    out.push_back(f);
  }
  return out;
}

std::filesystem::path data_dir() {
  if (const char* d = std::getenv("XSILO_DATA_DIR")) return d;
  return std::filesystem::path(XSILO_SOURCE_DIR) / "data";
}

SimConfig default_sim_config() {
  SimConfig c;
  c.data_path = resolve_dataset("breast_cancer");
  c.training = {{"local_epochs", 1}, {"batch_size", 16}, {"learning_rate", 0.1}};
  c.optimizer = {{"kind", "fedavg"}};
  return c;
}

// "privacy" of a sim: the record level gives every silo the agent's privacy block, lasting the
// sim's rounds unless a noise multiplier is fixed.
agent::PrivacyConfig parse_sim_privacy(const ConfigNode& p, const SimConfig& c) {
  auto j = p.json();
  j.erase("level");
  if (!j.contains("rounds") && !j.contains("noise_multiplier")) j["rounds"] = c.rounds;
  agent::LocalWorkersConfig local;
  if (c.local.is_object()) local.workers = static_cast<int>(c.local.value("workers", 1));
  return agent::parse_privacy(ConfigNode(j, p.file(), ".privacy"), c.trainer ? agent::TrainerKind::External
                                                                                 : agent::TrainerKind::Builtin, local);
}

// "privacy" at silo level: the server's block, whose loader checks the rest. Only the mode is
// checked here, so that distributed noise is refused before anything is made.
nlohmann::json parse_sim_silo_privacy(const ConfigNode& p, const SimConfig& c) {
  const auto mode = p.one_of("mode", "central", {"central", "distributed"});
  if (!p.has("epsilon")) p.fail("epsilon", "is required: the federation's privacy budget");
  auto j = p.json();
  j["level"] = "silo";
  j["mode"] = mode;
  if (!j.contains("rounds") && !j.contains("noise_multiplier")) j["rounds"] = c.rounds;
  return j;
}

namespace {

// "data": the dataset (a bundled one by name, or a CSV file) and how it is split.
void parse_sim_data(const ConfigNode& root, SimConfig& c) {
  const auto data = root.child("data");
  if (data.has("path")) {
    c.data_path = data.path("path", "");
    data.require_exists("path", c.data_path);
    data.str("dataset", "");
  } else {
    const auto name = data.one_of("dataset", "breast_cancer", {"breast_cancer", "digits"});
    c.data_path = resolve_dataset(name);
    if (c.data_path.empty()) {
      data.fail("dataset", "no " + name + ".csv(.gz) in " + data_dir().string() +
                               " (set XSILO_DATA_DIR to the folder holding the data)");
    }
  }
  c.test_fraction = data.number("test_fraction", 0.2, 0.01, 0.9);
  c.standardize = data.boolean("standardize", true);
  c.split = data.one_of("split", "dirichlet", {"dirichlet", "iid"});
  c.alpha = data.number("alpha", 0.5, 1e-3, 1e6);
  data.finish();
}

// "model", and "trainer" where the silos train with a script of their own.
void parse_sim_model(const ConfigNode& root, const std::filesystem::path& file, SimConfig& c) {
  const auto model = root.child("model");
  // A user's own script trains a model of its own: "file" unless said otherwise.
  c.model_kind = model.one_of("kind", root.has("trainer") ? "file" : "logistic", {"logistic", "mlp", "file"});
  for (auto h : model.int_list("hidden", 1, 1 << 16)) c.hidden.push_back(static_cast<std::size_t>(h));
  if (c.model_kind == "logistic" && !c.hidden.empty()) model.fail("hidden", "a logistic model has no hidden layers");
  if (c.model_kind == "file") {
    c.model_file = model.path("path", "");
    // With a trainer, a missing file is asked of the script (it is written to OUT/init.safetensors).
    if (c.model_file.empty() && !root.has("trainer")) {
      model.fail("path", "is required: the initial model as a safetensors file");
    }
  }
  model.finish();

  if (root.has("trainer")) {
    c.trainer = parse_sim_trainer(root, model, file, c);
  } else if (c.model_kind == "file") {
    model.require_exists("path", c.model_file);
  }
}

// The blocks handed on to the server and agent configs as they are (each must be an object).
void pass_sim_blocks(const ConfigNode& root, SimConfig& c) {
  auto pass = [&](const char* key, json& into) {
    const auto& v = root.raw(key);
    if (v.is_null()) return;
    if (!v.is_object()) root.fail(key, "must be an object");
    into = v;
  };
  pass("training", c.training);
  pass("optimizer", c.optimizer);
  pass("selection", c.selection);
  pass("deadlines", c.deadlines);
  pass("transport", c.transport);
  pass("aggregation", c.aggregation);
  pass("secure", c.secure);
  pass("compression", c.compression);
  pass("broadcast", c.broadcast);
  pass("schedule", c.schedule);
  pass("local", c.local);
}

// "faults": the processes to kill or restart, when and in which phase.
void parse_sim_faults(const ConfigNode& root, SimConfig& c) {
  // The processes a fault may name: checked here, before anything is made or started.
  auto names_a_process = [&](const std::string& p) {
    for (std::size_t i = 0; i < c.silos; ++i) {
      if (p == silo_name(i)) return true;
    }
    for (std::size_t e = 0; e < c.edges; ++e) {
      if (p == edge_name(e)) return true;
    }
    return p == "server";
  };
  for (const auto& fn : root.child_list("faults")) {
    SimConfig::Fault fault;
    fault.process = fn.str_required("process");
    if (!names_a_process(fault.process)) {
      fn.fail("process", "\"" + fault.process + "\" is not a process of this federation (server, " +
                             (c.edges ? "edge-01.." + edge_name(c.edges - 1) + ", " : std::string()) + "hospital-01.." +
                             silo_name(c.silos - 1) + ")");
    }
    fault.action = fn.one_of("action", "kill", {"kill", "restart"});
    fault.round = static_cast<std::uint64_t>(fn.integer("round", 1, 1, static_cast<std::int64_t>(c.rounds)));
    fault.phase = fn.one_of("phase", "train", {"train", "upload", "after_keys", "after_shares"});
    if (fault.phase.rfind("after_", 0) == 0 && fault.process.rfind("hospital-", 0) != 0) {
      fn.fail("phase", fault.phase + " applies to silos (hospital-NN) only");
    }
    if (c.trainer && fault.phase.rfind("after_", 0) == 0) {
      fn.fail("phase", fault.phase + " needs the built-in trainer (it is a hook inside the silo's simulated agent)");
    }
    if (fault.phase.rfind("after_", 0) == 0 && !c.secure.is_object()) {
      fn.fail("phase", fault.phase + " fires after a step of secure aggregation, which this federation does not run "
                                     "(set \"secure\"): it could never fire");
    }
    fn.finish();
    c.faults.push_back(fault);
  }
}

// "hostile": processes that attack the protocol, each by name.
void parse_sim_hostile(const ConfigNode& root, SimConfig& c) {
  if (!root.has("hostile")) return;
  const auto h = root.child("hostile");
  for (const auto& name : h.finish_open({})) {
    const bool edge = name.rfind("edge-", 0) == 0, server = name == "server";
    if (!edge && !server && name.rfind("hospital-", 0) != 0) {
      h.fail(name, "names neither the server, an edge (edge-NN) nor a silo (hospital-NN)");
    }
    c.hostile[name] = edge     ? h.one_of(name, "", {"hijack", "forge_join", "swap_keys", "split_view"})
                      : server ? h.one_of(name, "", {"split_view"})
                               : h.one_of(name, "", {"bad_keys", "garbage_shares"});
    if (!edge && !c.secure.is_object()) {
      h.fail(name, std::string("a hostile ") + (server ? "server" : "silo") +
                       " attacks secure aggregation: set \"secure\"");
    }
    // Every attack but an edge's hijack and forged join rewrites SecAgg's own messages (keys,
    // shares, survivor sets, unmask requests): without them it would do nothing, and a run that
    // tests the trust model would pass without a test.
    const std::string& attack = c.hostile[name];
    if (attack == "hijack" || attack == "forge_join") continue;
    if (!c.secure.is_object()) {
      h.fail(name, "\"" + attack + "\" rewrites secure aggregation's messages, which this federation does not send: "
                   "set \"secure\"");
    }
    if (c.secure.value("protocol", "secagg") == "lightsecagg") {
      h.fail(name, "\"" + attack + "\" rewrites SecAgg's messages (mask keys, shares, survivor sets), which "
                   "secure.protocol \"lightsecagg\" does not send; the sim has no hostile LightSecAgg member: "
                   "test this attack with protocol \"secagg\"");
    }
  }
}

// "attack": Byzantine silos and the attack they mount on their updates.
void parse_sim_attack(const ConfigNode& root, SimConfig& c) {
  const auto att = root.child("attack");
  if (root.has("attack")) {
    c.attackers = static_cast<std::size_t>(att.integer("silos", 1, 0, static_cast<std::int64_t>(c.silos) - 1));
    c.attack = nlohmann::json::object();
    for (const char* key : {"kind", "scale", "sigma", "factor", "z", "epsilon", "boost"}) {
      if (!att.raw(key).is_null()) c.attack[key] = att.raw(key);
    }
    att.finish();
    if (!c.attack.contains("kind")) att.fail("kind", "is required");
    const std::string kind = c.attack["kind"].is_string() ? c.attack["kind"].get<std::string>() : "";
    if ((kind == "skip_clipping" || kind == "unclipped_lie") && !c.secure.is_object()) {
      att.fail("kind", "\"" + kind + "\" attacks a secure round's encoding: set \"secure\"");
    }
  }
}

}  // namespace

SimConfig load_sim_config(const std::filesystem::path& file) {
  const auto j = ConfigNode::load_file(file);
  ConfigNode root(j, file.string());
  SimConfig c = default_sim_config();
  c.file = file;
  c.name = root.str("name", file.stem().string());
  c.federation = root.str("federation", c.federation);
  c.silos = static_cast<std::size_t>(root.integer("silos", 5, 1, 1000));
  c.rounds = static_cast<std::uint64_t>(root.integer("rounds", 20, 1, 100000));
  c.seed = static_cast<std::uint64_t>(root.integer("seed", 7, 0));
  c.baseline = root.boolean("baseline", true);
  c.log_format = root.one_of("log_format", "text", {"text", "json"});
  c.metrics = root.boolean("metrics", false);
  if (root.has("report")) {
    const auto report = root.child("report");
    c.tensorboard = report.path("tensorboard", "");
    report.finish();
  }

  parse_sim_data(root, c);
  parse_sim_model(root, file, c);
  pass_sim_blocks(root, c);
  // The blocks the generated configs' loaders would refuse once processes run: refused here,
  // before anything is made or started.
  if (c.local.is_object()) {
    (void)agent::parse_local(ConfigNode(c.local, file.string(), ".local"),
                             c.trainer ? agent::TrainerKind::External : agent::TrainerKind::Builtin);
  }
  if (c.secure.is_object() && c.secure.value("mode", "off") != "off") {
    // The server's loader checks the group against its selection; the sim knows its silos too.
    const json min_group = c.secure.value("min_group", json(server::SecureConfig{}.min_group));
    const auto g = min_group.is_number_integer() ? min_group.get<std::int64_t>() : 0;  // else the loader says
    if (g > static_cast<std::int64_t>(c.silos)) {
      root.child("secure").fail("min_group", "a sum needs " + std::to_string(g) + " silos, but the sim has " +
                                                 std::to_string(c.silos) + " (\"silos\")");
    }
    // Every silo refuses a setup that reveals a sum of fewer silos than its floor (the agents'
    // secure_floor.min_sum, the default here): every round would abort after the key phase.
    server::SecureConfig sc;
    server::parse_secure(ConfigNode(c.secure, file.string(), ".secure"), sc);
    std::size_t selected = c.silos;
    const auto per_round = c.selection.is_object() ? c.selection.value("silos_per_round", json(0)) : json(0);
    if (per_round.is_number_unsigned() && per_round.get<std::size_t>() > 0) {
      selected = std::min(selected, per_round.get<std::size_t>());
    }
    std::vector<std::string> names;
    for (std::size_t i = 0; i < selected; ++i) names.push_back(silo_name(i));
    const auto floor = sim_secure_floor(c);
    for (const auto& group : server::make_groups(names, sc, 0)) {
      if (const auto least = server::group_min_survivors(sc, group.size()); least < floor.min_sum) {
        root.child("secure").fail("min_group", "a setup would reveal sums of " + std::to_string(least) +
                                                   " silos, and every silo refuses sums of fewer than " +
                                                   std::to_string(floor.min_sum) +
                                                   " (an agent's secure_floor.min_sum): raise it to " +
                                                   std::to_string(floor.min_sum) + " or more");
      }
    }
  }
  if (root.has("privacy")) {
    const auto p = root.child("privacy");
    if (p.one_of("level", "record", {"record", "silo"}) == "silo") {
      c.silo_privacy = parse_sim_silo_privacy(p, c);
    } else {
      c.privacy = parse_sim_privacy(p, c);
      if (c.training.value("silo_momentum", 0.0) != 0.0) {
        p.fail("max_epsilon", "a silo under a privacy budget runs no silo momentum (docs/privacy.md): remove "
                              "training.silo_momentum");
      }
    }
  }
  c.edges = static_cast<std::size_t>(root.integer("edges", 0, 0, 64));
  if (c.edges > 0 && c.schedule.is_object() && c.schedule.value("mode", "") == "buffered") {
    // The server would close every edge's connection, and the edges' silos would never join.
    root.fail("edges", "buffered rounds take no edges: each silo uploads to the server itself (docs/buffered.md); "
                       "remove \"edges\" or the buffered schedule");
  }
  c.uploads_at_once = root.integer("uploads_at_once", 0, 0, 64);
  parse_sim_faults(root, c);
  if (root.has("train_ms")) {
    const auto [lo, hi] = root.int_range("train_ms", 0, 3600 * 1000, "milliseconds");
    c.train_min_ms = static_cast<std::uint64_t>(lo);
    c.train_max_ms = static_cast<std::uint64_t>(hi);
  }
  if (root.has("stragglers")) {
    const auto st = root.child("stragglers");
    c.straggler_silos = static_cast<std::size_t>(st.integer("silos", 1, 0, static_cast<std::int64_t>(c.silos)));
    c.straggler_factor = static_cast<std::uint64_t>(st.integer("factor", 10, 1, 1000));
    st.finish();
    if (!root.has("train_ms")) st.fail("silos", "slows the silos' train_ms: set train_ms too");
  }
  if (root.has("kill_storm")) {
    c.kill_storm = parse_kill_storm(root, c);
    if (!root.has("train_ms")) std::tie(c.train_min_ms, c.train_max_ms) = std::pair<std::uint64_t, std::uint64_t>{100, 300};
    const auto storm = kill_storm_faults(*c.kill_storm, c.silos, c.edges, c.rounds);
    c.faults.insert(c.faults.end(), storm.begin(), storm.end());
  }
  parse_sim_hostile(root, c);
  parse_sim_attack(root, c);
  root.finish();
  return c;
}

}  // namespace xsilo::tools
