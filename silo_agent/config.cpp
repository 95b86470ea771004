#include "silo_agent/config.h"

#include "common/config.h"
#include "silo_agent/collective/gpu_info.h"
#include "transport/config.h"

namespace xsilo::agent {

AgentConfig load_agent_config(const std::filesystem::path& file) {
  const auto j = ConfigNode::load_file(file);
  ConfigNode root(j, file.string());
  AgentConfig c;
  c.file = file;
  c.federation = root.str_required("federation");
  c.upstreams = transport::parse_endpoint_list(root, "upstreams");
  c.tls = transport::parse_tls(root.child("tls"));
  c.channel = transport::parse_channel_options(root.child("transport"));
  c.reconnect = transport::parse_dial_options(root.child("reconnect"));
  const auto fo = root.child("failover");
  c.failover_probe = std::chrono::milliseconds(static_cast<long>(fo.number("probe_s", 10, 0.05, 86400) * 1000));
  fo.finish();
  c.chunk_bytes = static_cast<std::size_t>(root.integer("chunk_bytes", 1 << 20, 1024, std::int64_t{1} << 30));
  if (c.chunk_bytes + 4096 > c.channel.max_frame_bytes) {
    root.fail("chunk_bytes", "leaves no room for the envelope in transport.max_frame_bytes");
  }
  const auto data = root.child("data");
  c.trainer = data.one_of("trainer", "builtin", {"builtin", "synthetic"});
  if (c.trainer == "builtin") {
    c.train_data = data.path("train", "");
    c.test_data = data.path("test", "");
    if (c.train_data.empty()) data.fail("train", "is required (a CSV file, label last)");
    for (const auto& [key, p] : {std::pair{"train", c.train_data}, {"test", c.test_data}}) {
      if (!p.empty() && !std::filesystem::exists(p)) data.fail(key, "file " + p.string() + " does not exist");
    }
    const auto& st = data.raw("standardize");
    if (st.is_null() || (st.is_string() && st == "none")) {
      c.standardize = "none";
    } else if (st.is_string() && st == "local") {
      c.standardize = "local";
    } else if (st.is_object()) {
      ConfigNode s(st, file.string(), data.key_path("standardize"));
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
      data.fail("standardize", "must be \"none\", \"local\" or {\"mean\": [...], \"std\": [...]}");
    }
  } else {
    c.synthetic_samples = static_cast<std::uint64_t>(data.integer("samples", 100, 1));
  }
  data.finish();
  c.state_dir = root.path("state_dir", "agent-state");
  if (root.has("local")) {
    const auto lo = root.child("local");
    c.local.workers = static_cast<int>(lo.integer("workers", 1, 1, 256));
    c.local.hosts = lo.str_list("hosts");
    c.local.listen_host = lo.str("listen_host", "127.0.0.1");
    c.local.backend = lo.one_of("backend", "auto", {"ring", "hd", "auto", "nccl"});
    c.local.step_timeout = std::chrono::milliseconds(lo.integer("step_timeout_ms", 10000, 100, 3600000));
    c.local.buckets.first_bytes = static_cast<std::size_t>(lo.integer("first_bucket_bytes", 1 << 20, 4, std::int64_t{1} << 32));
    c.local.buckets.bytes = static_cast<std::size_t>(lo.integer("bucket_bytes", 25 << 20, 4, std::int64_t{1} << 32));
    lo.finish();
    if (c.local.backend == "nccl") {
      const auto gpu = collective::gpu_info();
      if (!gpu.built) lo.fail("backend", "nccl needs a build with CUDA and NCCL; this xsilo has neither");
      if (gpu.devices == 0) lo.fail("backend", "nccl needs a GPU, and none is visible (" + gpu.cuda_error + ")");
    }
    if (c.local.workers > 1 && c.trainer != "builtin") {
      lo.fail("workers", "data-parallel workers train the builtin trainer only");
    }
  }
  if (root.has("attack")) c.attack = parse_attack(root.child("attack"));
  if (root.has("crash")) {
    const auto cr = root.child("crash");
    c.crash_step = cr.one_of("after", "keys", {"keys", "shares"});
    c.crash_round = static_cast<std::uint64_t>(cr.integer("round", 1, 1));
    cr.finish();
  }
  c.log_level = root.one_of("log_level", "info", {"trace", "debug", "info", "warn", "error"});
  root.finish();
  return c;
}

}  // namespace xsilo::agent
