#include "silo_agent/config.h"

#include "common/config.h"
#include "silo_agent/collective/communicator.h"
#include "silo_agent/collective/gpu_info.h"
#include "transport/config.h"

#include <map>

namespace xsilo::agent {

namespace {

std::string abs(const std::filesystem::path& p) { return std::filesystem::absolute(p).lexically_normal().string(); }
double secs(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

void parse_data(const ConfigNode& data, AgentConfig& c) {
  c.train_data = data.path("train", "");
  c.test_data = data.path("test", "");
  data.require_exists("train", c.train_data);
  data.require_exists("test", c.test_data);
  c.feature_stats_file = data.path("feature_stats", "");
  if (!c.feature_stats_file.empty()) {
    data.require_exists("feature_stats", c.feature_stats_file);
    try {
      c.feature_stats = load_feature_stats(c.feature_stats_file);
    } catch (const std::exception& e) {
      data.fail("feature_stats", e.what());
    }
  }
  const auto& st = data.raw("standardize");
  if (st.is_null() || (st.is_string() && st == "none")) {
    c.standardize = "none";
  } else if (st.is_string() && st == "local") {
    c.standardize = "local";
  } else if (st.is_string() && st == "federated") {
    if (c.feature_stats.empty()) {
      data.fail("standardize", "\"federated\" needs data.feature_stats: the federation's statistics "
                               "(xsilo sim computes them before round 1)");
    }
    c.standardize = "federated";
  } else if (st.is_object()) {
    ConfigNode s(st, data.file(), data.key_path("standardize"));
    const auto mean = s.number_list("mean");
    const auto sd = s.number_list("std");
    s.finish();
    if (mean.empty() || mean.size() != sd.size()) s.fail("std", "mean and std must be lists of equal, non-zero length");
    for (double v : sd) {
      if (!(v > 0)) s.fail("std", "every standard deviation must be > 0");
    }
    c.standardize = "given";
    c.given.mean.assign(mean.begin(), mean.end());
    c.given.stddev.assign(sd.begin(), sd.end());
  } else {
    data.fail("standardize", "must be \"none\", \"local\", \"federated\" or {\"mean\": [...], \"std\": [...]}");
  }
  data.finish();
}

void parse_trainer(const ConfigNode& t, AgentConfig& c) {
  const auto kind = t.one_of("kind", "builtin", {"builtin", "external", "feature_stats"});
  c.trainer = kind == "external"        ? TrainerKind::External
              : kind == "feature_stats" ? TrainerKind::FeatureStats
                                        : TrainerKind::Builtin;
  if (c.trainer == TrainerKind::External) {
    auto& e = c.external;
    e.command = t.str_list("command");
    if (e.command.empty()) t.fail("command", "is required: the trainer's command line, e.g. [\"python3\", \"train.py\"]");
    e.cwd = t.path("cwd", "");
    t.require_exists("cwd", e.cwd, true);
    e.env = t.string_map("env");
    e.startup = std::chrono::milliseconds(static_cast<long>(t.number("startup_s", 60, 0.1, 86400) * 1000));
    e.task_timeout = std::chrono::milliseconds(static_cast<long>(t.number("task_timeout_s", 0, 0, 7 * 86400) * 1000));
    e.max_failures = static_cast<int>(t.integer("max_failures", 3, 1, 1000));
    e.evaluate = t.boolean("evaluate", false);
  }
  t.finish();
}

}  // namespace

AgentConfig load_agent_config(const std::filesystem::path& file) {
  const auto j = ConfigNode::load_file(file);
  ConfigNode root(j, file.string());
  AgentConfig c;
  c.file = file;
  c.federation = root.str_required("federation");
  c.upstreams = transport::parse_endpoint_list(root, "upstreams");
  c.tls = transport::parse_tls(root.child("tls"));
  if (root.has("trust")) {
    c.trust = transport::parse_allow(root.child("trust"));
    if (c.trust.allows_role(wire::SILO)) root.fail("trust.silo", "a silo's upstream is a server or an edge");
    if (c.trust.allows_role(wire::ADMIN)) root.fail("trust.admin", "a silo's upstream is a server or an edge");
    if (!c.trust.allows_role(wire::SERVER) && !c.trust.allows_role(wire::EDGE)) {
      root.fail("trust", "must name a server or an edge (or leave \"trust\" out to accept any the CA certified)");
    }
  }
  c.channel = transport::parse_channel_options(root.child("transport"));
  c.reconnect = transport::parse_dial_options(root.child("reconnect"));
  const auto fo = root.child("failover");
  c.failover_probe = std::chrono::milliseconds(static_cast<long>(fo.number("probe_s", 10, 0.05, 86400) * 1000));
  fo.finish();
  c.chunk_bytes = static_cast<std::size_t>(root.integer("chunk_bytes", 1 << 20, 1024, std::int64_t{1} << 30));
  if (c.chunk_bytes + 4096 > c.channel.max_frame_bytes) {
    root.fail("chunk_bytes", "leaves no room for the envelope in transport.max_frame_bytes");
  }
  parse_trainer(root.child("trainer"), c);
  parse_data(root.child("data"), c);
  if (c.trainer != TrainerKind::External && c.train_data.empty()) {
    root.child("data").fail("train", "is required for the built-in trainer (a CSV file, label last)");
  }
  c.state_dir = root.path("state_dir", "agent-state");
  if (root.has("secure_floor")) {
    const auto f = root.child("secure_floor");
    c.secure_floor.min_sum = static_cast<std::uint32_t>(f.integer("min_sum", 3, 2, 1 << 20));
    c.secure_floor.corrupt = f.number("corrupt", 0.05, 0.0, 0.49);
    c.secure_floor.min_noise_multiplier = f.number("min_noise_multiplier", 0.0, 0.0, 1e6);
    f.finish();
  }
  if (root.has("local")) c.local = parse_local(root.child("local"), c.trainer);
  if (root.has("privacy")) c.privacy = parse_privacy(root.child("privacy"), c.trainer, c.local);
  c.log_level = root.one_of("log_level", "info", {"trace", "debug", "info", "warn", "error"});
  c.log_format = root.one_of("log_format", "text", {"text", "json"});
  c.metrics = transport::parse_metrics(root);
  root.finish();
  return c;
}

PrivacyConfig parse_privacy(const ConfigNode& p, TrainerKind trainer, const LocalWorkersConfig& local) {
  PrivacyConfig c;
  c.max_epsilon = p.number("max_epsilon", 0, 0, 1e6);
  c.delta = p.number("delta", 1e-5, 0, 0.1);
  c.clip_norm = p.number("clip_norm", 1.0, 0, 1e9);
  c.noise_multiplier = p.number("noise_multiplier", 0, 0, 1e6);
  c.rounds = static_cast<std::uint64_t>(p.integer("rounds", 0, 0, 100000000));
  p.finish();
  if (!(c.max_epsilon > 0)) p.fail("max_epsilon", "is required: the epsilon this silo's records may spend in all, e.g. 8");
  if (!(c.delta > 0)) p.fail("delta", "must be > 0: e.g. 1e-5, below one over the number of records");
  if (trainer == TrainerKind::FeatureStats) {
    p.fail("max_epsilon", "the feature-statistics trainer releases exact statistics: it runs without a privacy budget");
  }
  if (trainer == TrainerKind::Builtin) {
    if (!(c.clip_norm > 0)) p.fail("clip_norm", "must be > 0: each record's gradient is clipped to it");
    if (c.noise_multiplier == 0 && c.rounds == 0) {
      p.fail("rounds", "is required without a noise_multiplier: the rounds the budget must last, which set the noise");
    }
    if (local.workers > 1) {
      p.fail("max_epsilon", "DP-SGD runs in the agent's own process: set local.workers to 1 under a privacy budget");
    }
  }
  return c;
}

LocalWorkersConfig parse_local(const ConfigNode& lo, TrainerKind trainer) {
  LocalWorkersConfig local;
  {
    auto& c = local;
    c.workers = static_cast<int>(lo.integer("workers", 1, 1, 256));
    c.hosts = lo.str_list("hosts");
    if (lo.has("launcher")) {
      c.launcher = lo.str_list("launcher");
      if (c.launcher.empty() || c.launcher.front().empty()) {
        lo.fail("launcher", "must name a command, e.g. [\"ssh\", \"-o\", \"BatchMode=yes\", \"{host}\"]");
      }
    }
    c.listen_host = lo.str("listen_host", "127.0.0.1");
    c.algorithm = parse_local_algorithm(lo.one_of("algorithm", "data_parallel", local_algorithms()));
    auto backends = collective::tcp_backends();
    backends.push_back("nccl");
    c.backend = lo.one_of("backend", "auto", backends);
    c.step_timeout = std::chrono::milliseconds(lo.integer("step_timeout_ms", 10000, 100, 3600000));
    c.buckets.first_bytes = static_cast<std::size_t>(lo.integer("first_bucket_bytes", 1 << 20, 4, std::int64_t{1} << 32));
    c.buckets.bytes = static_cast<std::size_t>(lo.integer("bucket_bytes", 25 << 20, 4, std::int64_t{1} << 32));
    c.buckets.compression = lo.one_of("compression", "none", bucket_compressions());
    c.ranks_per_host = static_cast<int>(lo.integer("ranks_per_host", 0, 0, 256));
    const bool across_given = lo.has("across_hosts");
    c.across_hosts = lo.one_of("across_hosts", "ring", collective::across_host_algorithms());
    const bool intra_given = lo.has("intra_host");
    c.intra_host = lo.one_of("intra_host", "tcp", collective::intra_host_transports());
    c.backups = static_cast<int>(lo.integer("backups", 0, 0, 64));
    c.buckets.stragglers = static_cast<int>(lo.integer("stragglers", 0, 0, 255));
    c.checkpoint_interval = std::chrono::milliseconds(lo.integer("checkpoint_ms", 30000, 0, 86400000));
    const bool fraction_given = lo.has("topk_fraction");
    // What gossip does not use, or does not combine with yet, asked for anyway.
    std::vector<std::string> not_with_gossip;
    for (const char* key : {"backend", "first_bucket_bytes", "bucket_bytes", "compression", "topk_fraction",
                            "ranks_per_host", "across_hosts", "intra_host", "backups", "stragglers", "checkpoint_ms"}) {
      if (lo.has(key)) not_with_gossip.push_back(key);
    }
    c.buckets.topk_fraction = lo.number("topk_fraction", 0.01, 1e-6, 1.0);
    lo.finish();
    if (c.algorithm == LocalAlgorithm::gossip) {
      if (c.workers < 2) lo.fail("algorithm", "gossip is between local workers: set local.workers to 2 or more");
      if (trainer == TrainerKind::External) {
        lo.fail("algorithm", "an external trainer's steps and their communication are its script's own; gossip runs the built-in trainer's workers");
      }
      static const std::map<std::string, std::string> why{
          {"backend", "gossip sends models point to point over its own TCP links; there is no all-reduce to choose"},
          {"first_bucket_bytes", "gossip sends whole models, not gradient buckets"},
          {"bucket_bytes", "gossip sends whole models, not gradient buckets"},
          {"compression", "gossip's pushes are float32 models (a compressed push would lose mass); not combined"},
          {"topk_fraction", "gossip's pushes are float32 models (a compressed push would lose mass); not combined"},
          {"ranks_per_host", "is the hierarchical all-reduce's; gossip has no all-reduce"},
          {"across_hosts", "is the hierarchical all-reduce's; gossip has no all-reduce"},
          {"intra_host", "is the hierarchical all-reduce's; gossip has no all-reduce"},
          {"backups", "a standby replaces a worker after a re-formation; gossip never re-forms (a dead worker's mass is simply gone)"},
          {"stragglers", "gossip waits for no worker already: a slow one does fewer steps"},
          {"checkpoint_ms", "gossip keeps no checkpoints: a worker's death costs its mass, not the round"}};
      if (!not_with_gossip.empty()) lo.fail(not_with_gossip.front(), why.at(not_with_gossip.front()) + " (local.algorithm is gossip)");
    }
    if (fraction_given && c.buckets.compression != "topk") {
      lo.fail("topk_fraction", "applies to \"compression\": \"topk\" only, and compression is " + c.buckets.compression);
    }
    if (c.backups > 0 && c.workers < 2) {
      lo.fail("backups", "stand by for local workers: set local.workers to 2 or more (1 trains in the agent's process)");
    }
    if (c.backups > 0 && trainer == TrainerKind::External) {
      lo.fail("backups", "an external trainer's workers are its script's (torchrun's); the agent cannot swap them");
    }
    if (c.backups > 0 && c.backend == "nccl") {
      lo.fail("backups", "NCCL's communicator can only shrink (ncclCommShrink), not take a standby in; use a TCP backend");
    }
    if (c.buckets.stragglers > 0) {
      const int s = c.buckets.stragglers;
      if (c.workers < s + 1) {
        lo.fail("stragglers", "each group of workers computing the same rows needs " + std::to_string(s + 1) +
                                  " members to have one finisher with " + std::to_string(s) +
                                  " slow; set local.workers to at least " + std::to_string(s + 1));
      }
      if (trainer == TrainerKind::External) {
        lo.fail("stragglers", "an external trainer's steps are its script's own; the agent cannot repeat its shards");
      }
      if (c.backend == "nccl" || c.backend == "hierarchical") {
        lo.fail("stragglers", "the replicated all-reduce runs on the flat TCP backends (ring, hd, tree, butterfly, auto), and backend is " + c.backend);
      }
      if (c.buckets.compression != "none") {
        lo.fail("stragglers", "the groups' first finishers send float32 gradients; compression " + c.buckets.compression +
                                  " is for the plain all-reduce");
      }
      if (c.backups > 0) {
        lo.fail("stragglers", "and backups are not combined yet (a promoted standby's group is untested); give one or the other");
      }
    }
    if (c.ranks_per_host > 0 && c.backend != "hierarchical") {
      lo.fail("ranks_per_host", "only the hierarchical backend groups workers by host, and backend is " + c.backend);
    }
    if (across_given && c.backend != "hierarchical") {
      lo.fail("across_hosts", "is the hierarchical backend's algorithm among the hosts' leaders, and backend is " + c.backend);
    }
    if (intra_given && c.backend != "hierarchical") {
      lo.fail("intra_host", "is how the hierarchical backend reduces inside each host, and backend is " + c.backend);
    }
    if (c.ranks_per_host > 0 && !c.hosts.empty()) {
      lo.fail("ranks_per_host", "the hosts list already says which host each worker is on; give one or the other");
    }
    if (c.buckets.compression != "none") {
      if (trainer == TrainerKind::External) {
        lo.fail("compression", "an external trainer's all-reduce is its script's own (torch DDP communication hooks)");
      }
      if (c.backend == "nccl") {
        lo.fail("compression", c.buckets.compression +
                                   " buckets run on the TCP backends (ring, hd, tree, butterfly, hierarchical, auto); NCCL sums float32 on the GPUs");
      }
    }
    if (c.backend == "nccl" && trainer == TrainerKind::Builtin) {
      const auto gpu = collective::gpu_info();
      if (!gpu.built) lo.fail("backend", "nccl needs a build with CUDA and NCCL; this xsilo has neither");
      if (gpu.devices == 0) lo.fail("backend", "nccl needs a GPU, and none is visible (" + gpu.cuda_error + ")");
    }
    if (trainer == TrainerKind::External && !c.hosts.empty()) {
      lo.fail("hosts", "an external trainer's workers run on this host (its script's torch.distributed spans hosts)");
    }
  }
  return local;
}

nlohmann::json to_json(const AgentConfig& c) {
  using json = nlohmann::json;
  json ups = json::array();
  for (const auto& u : c.upstreams) ups.push_back(u.str());
  json data = json::object();
  if (!c.train_data.empty()) data["train"] = abs(c.train_data);
  if (!c.test_data.empty()) data["test"] = abs(c.test_data);
  if (c.standardize == "given") data["standardize"] = {{"mean", c.given.mean}, {"std", c.given.stddev}};
  else data["standardize"] = c.standardize;
  if (!c.feature_stats_file.empty()) data["feature_stats"] = abs(c.feature_stats_file);
  json j = {{"federation", c.federation},
            {"upstreams", ups},
            {"tls", transport::to_json(c.tls)},
            {"trust", transport::to_json(c.trust)},
            {"transport", transport::to_json(c.channel)},
            {"reconnect", transport::to_json(c.reconnect)},
            {"failover", {{"probe_s", secs(c.failover_probe)}}},
            {"chunk_bytes", c.chunk_bytes},
            {"data", data},
            {"state_dir", abs(c.state_dir)},
            {"secure_floor",
             {{"min_sum", c.secure_floor.min_sum},
              {"corrupt", c.secure_floor.corrupt},
              {"min_noise_multiplier", c.secure_floor.min_noise_multiplier}}},
            {"local",
             {{"workers", c.local.workers},
              {"hosts", c.local.hosts},
              {"listen_host", c.local.listen_host},
              {"backend", c.local.backend},
              {"step_timeout_ms", c.local.step_timeout.count()},
              {"first_bucket_bytes", c.local.buckets.first_bytes},
              {"bucket_bytes", c.local.buckets.bytes},
              {"compression", c.local.buckets.compression}}},
            {"log_level", c.log_level}, {"log_format", c.log_format}};
  if (c.metrics.listen) j["metrics"] = transport::to_json(c.metrics);
  // Only where they apply: the loader refuses them elsewhere.
  if (c.local.buckets.compression == "topk") j["local"]["topk_fraction"] = c.local.buckets.topk_fraction;
  if (c.local.ranks_per_host > 0) j["local"]["ranks_per_host"] = c.local.ranks_per_host;
  if (c.local.across_hosts != "ring") j["local"]["across_hosts"] = c.local.across_hosts;
  if (c.local.intra_host != "tcp") j["local"]["intra_host"] = c.local.intra_host;
  if (c.local.backups > 0) j["local"]["backups"] = c.local.backups;
  if (c.local.buckets.stragglers > 0) j["local"]["stragglers"] = c.local.buckets.stragglers;
  if (c.local.checkpoint_interval != LocalWorkersConfig{}.checkpoint_interval) {
    j["local"]["checkpoint_ms"] = c.local.checkpoint_interval.count();
  }
  if (c.local.launcher != default_launcher()) j["local"]["launcher"] = c.local.launcher;
  if (c.local.algorithm == LocalAlgorithm::gossip) {
    // The loader refuses the all-reduce's keys with gossip.
    auto& lo = j["local"];
    for (const char* key : {"backend", "first_bucket_bytes", "bucket_bytes", "compression", "checkpoint_ms"}) lo.erase(key);
    lo["algorithm"] = "gossip";
  }
  if (c.privacy.on()) {
    j["privacy"] = {{"max_epsilon", c.privacy.max_epsilon}, {"delta", c.privacy.delta}, {"clip_norm", c.privacy.clip_norm},
                    {"noise_multiplier", c.privacy.noise_multiplier}, {"rounds", c.privacy.rounds}};
  }
  if (c.trainer == TrainerKind::External) {
    const auto& e = c.external;
    json env = json::object();
    for (const auto& [k, v] : e.env) env[k] = v;
    j["trainer"] = {{"kind", "external"},
                    {"command", e.command},
                    {"env", env},
                    {"startup_s", secs(e.startup)},
                    {"task_timeout_s", secs(e.task_timeout)},
                    {"max_failures", e.max_failures},
                    {"evaluate", e.evaluate}};
    if (!e.cwd.empty()) j["trainer"]["cwd"] = abs(e.cwd);
  } else {
    j["trainer"] = {{"kind", c.trainer == TrainerKind::FeatureStats ? "feature_stats" : "builtin"}};
  }
  return j;
}

}  // namespace xsilo::agent
