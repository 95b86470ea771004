#include "server/config.h"
#include "server/config_privacy.h"
#include "server/config_secure.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "common/config.h"
#include "common/fs.h"
#include "common/safetensors.h"
#include "crypto/hash.h"
#include "protocol/codec.h"
#include "protocol/compression.h"
#include "robust/rule.h"
#include "transport/config.h"

namespace xsilo::server {

namespace {

std::chrono::milliseconds secs(const ConfigNode& n, const std::string& key, double def) {
  return std::chrono::milliseconds(static_cast<long>(n.number(key, def, 0.01, 7 * 86400.0) * 1000));
}

ModelSpec parse_model(const ConfigNode& n) {
  ModelSpec m;
  m.kind = n.one_of("kind", "logistic", {"logistic", "mlp", "synthetic", "file"});
  if (m.kind == "file") {
    // A user's own model (xsilo_client.save_initial writes one from a PyTorch module).
    m.file = n.path("path", "");
    if (m.file.empty()) n.fail("path", "is required: a safetensors file with the initial model");
    try {
      const MappedFile f(m.file);
      const auto view = parse_safetensors(f.bytes());
      if (view.tensors.empty()) n.fail("path", m.file.string() + " holds no tensors");
      for (const auto& t : view.tensors) {
        if (!t.is_float()) {
          n.fail("path", "tensor " + t.name + " in " + m.file.string() + " is " + t.dtype +
                             ": only floating-point tensors are federated (save the model with xsilo_client.save_initial)");
        }
      }
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      n.fail("path", e.what());
    }
  } else if (m.kind == "synthetic") {
    m.parameters = static_cast<std::size_t>(n.integer("parameters", 0, 1, std::int64_t{1} << 31));
    if (!n.has("parameters")) n.fail("parameters", "is required for a synthetic model");
  } else {
    if (!n.has("inputs")) n.fail("inputs", "is required (the number of features)");
    m.inputs = static_cast<std::size_t>(n.integer("inputs", 0, 1, 1 << 24));
    m.classes = static_cast<std::size_t>(n.integer("classes", 2, 2, 1 << 20));
    for (auto h : n.int_list("hidden", 1, 1 << 20)) m.hidden.push_back(static_cast<std::size_t>(h));
    if (m.kind == "logistic" && !m.hidden.empty()) {
      n.fail("hidden", "a logistic model has no hidden layers; use kind \"mlp\"");
    }
  }
  m.seed = static_cast<std::uint64_t>(n.integer("init_seed", 1, 0));
  n.finish();
  return m;
}

// "selection", checked against the allow-list.
void parse_selection(const ConfigNode& root, ServerConfig& c) {
  const auto sel = root.child("selection");
  c.selection.min_silos = static_cast<std::size_t>(sel.integer("min_silos", 2, 1, 1 << 20));
  c.selection.min_updates = static_cast<std::size_t>(
      sel.integer("min_updates", static_cast<std::int64_t>(c.selection.min_silos), 1, 1 << 20));
  c.selection.silos_per_round = static_cast<std::size_t>(sel.integer("silos_per_round", 0, 0, 1 << 20));
  c.selection.over_selection = sel.number("over_selection", 0.0, 0.0, 10.0);
  sel.finish();
  if (c.selection.silos_per_round && c.selection.silos_per_round < c.selection.min_updates) {
    sel.fail("silos_per_round", "is " + std::to_string(c.selection.silos_per_round) +
                                    ", fewer than min_updates " +
                                    std::to_string(c.selection.min_updates) +
                                    ": no round could ever commit");
  }
  if (c.selection.min_updates > c.selection.min_silos) {
    sel.fail("min_updates", "is " + std::to_string(c.selection.min_updates) +
                                " but rounds start with min_silos " +
                                std::to_string(c.selection.min_silos) + " silos");
  }
  if (!c.expected_silos.empty() && c.expected_silos.size() < c.selection.min_silos) {
    sel.fail("min_silos", "is " + std::to_string(c.selection.min_silos) + " but allow.silo names only " +
                              std::to_string(c.expected_silos.size()) + " silos");
  }
}

// "deadlines" (seconds).
void parse_deadlines(const ConfigNode& root, ServerConfig& c) {
  const auto dl = root.child("deadlines");
  c.deadlines.join = secs(dl, "join_s", 30);
  c.deadlines.train = secs(dl, "train_s", 120);
  c.deadlines.upload = secs(dl, "upload_s", 60);
  dl.finish();
  c.plan.set_train_timeout_ms(static_cast<std::uint64_t>(c.deadlines.train.count()));
}

// "training": the plan the silos follow; keys of the user's own pass through.
void parse_training(const ConfigNode& root, ServerConfig& c) {
  const auto tr = root.child("training");
  c.plan.set_train(true);
  c.plan.set_local_epochs(static_cast<std::uint32_t>(tr.integer("local_epochs", 1, 1, 10000)));
  c.plan.set_batch_size(static_cast<std::uint32_t>(tr.integer("batch_size", 32, 1, 1 << 20)));
  c.plan.set_learning_rate(static_cast<float>(tr.number("learning_rate", 0.1, 1e-9, 1e3)));
  c.plan.set_weight_decay(static_cast<float>(tr.number("weight_decay", 0.0, 0.0, 1.0)));
  // The most one silo's update may weigh (its sample count is capped at it by the silo; an upload
  // claiming more is refused by the server): a silo that lies about its count, or a trainer
  // that reports 2^64 - 1 samples, cannot decide a step alone (review N5).
  c.plan.set_max_weight(static_cast<float>(tr.number("max_weight", 1e6, 1.0, 1e12)));
  c.plan.set_silo_momentum(static_cast<float>(tr.number("silo_momentum", 0.0, 0.0, 0.999)));
  c.plan.set_seed(c.seed);
  c.plan.set_model_kind(c.model.kind);
  // Keys of its own go to external trainers as they are (a schedule, momentum, ...).
  const auto user_keys =
      tr.finish_open({"local_epochs", "batch_size", "learning_rate", "weight_decay", "silo_momentum", "max_weight"});
  c.plan.set_config_json(tr.json().is_object() ? tr.json().dump() : "{}");
  c.training_user_keys = user_keys;
}

// "optimizer": the server's.
void parse_optimizer(const ConfigNode& root, ServerConfig& c) {
  const auto op = root.child("optimizer");
  c.optimizer.kind = op.one_of("kind", "fedavg", {"fedavg", "fedavgm", "fedadam"});
  c.optimizer.lr = static_cast<float>(op.number("lr", c.optimizer.kind == "fedadam" ? 0.01 : 1.0, 1e-9, 1e3));
  c.optimizer.momentum = static_cast<float>(op.number("momentum", 0.9, 0.0, 0.9999));
  c.optimizer.beta1 = static_cast<float>(op.number("beta1", 0.9, 0.0, 0.9999));
  c.optimizer.beta2 = static_cast<float>(op.number("beta2", 0.99, 0.0, 0.99999));
  c.optimizer.tau = static_cast<float>(op.number("tau", 1e-3, 1e-12, 1.0));
  op.finish();
}

// "aggregation": the robust rule and the server's clipping, checked on their own.
void parse_aggregation(const ConfigNode& ag, AggregationConfig& a) {
  auto& rule = a.rule;
  rule.rule = *robust::parse_rule(ag.one_of("rule", "fedavg", robust::rule_names()));
  rule.f = static_cast<std::size_t>(ag.integer("f", 0, 0, 1 << 20));
  rule.m = static_cast<std::size_t>(ag.integer("m", 0, 0, 1 << 20));
  rule.beta = ag.number("beta", 0.0, 0.0, 0.499);
  // centered_clip's radius: "auto" (the default) measures it on each round's inputs (half the
  // median distance to the centre), so it holds for updates of any scale; a number fixes it.
  if (ag.raw("tau").is_string()) {
    ag.one_of("tau", "auto", {"auto"});
    rule.tau = 0;
  } else {
    rule.tau = ag.number("tau", 0.0, 1e-12, 1e12);
  }
  rule.iterations = static_cast<std::size_t>(ag.integer("iterations", 10, 1, 100));
  // centered_clip's rejection of far inputs, in median distances to the centre (0: off).
  rule.reject = ag.number("reject", robust::kDefaultReject, 0.0, 1e6);
  if (rule.reject > 0 && rule.reject < 1.5) {
    ag.fail("reject", "must be 0 (no rejection) or at least 1.5 median distances: nearer, the rule would reject "
                      "honest updates that are merely on the far side of the median");
  }
  // centered_clip's opposition: inputs pointing against the last committed step, in median
  // alignments on the majority's side (0: off). Only the other side is ever opposed, so a factor
  // cannot take the majority out; above 1 an input must oppose more than the median aligns.
  rule.oppose = ag.number("oppose", robust::kDefaultOppose, 0.0, 100.0);
  // centered_clip's one-sided test: inputs whose balance of coordinates above and below the
  // inputs' median is this many spreads from the median balance (0: off). Below 1 the bound
  // could fall inside the closest half of the inputs.
  rule.one_sided = ag.number("one_sided", robust::kDefaultOneSided, 0.0, 100.0);
  if (rule.one_sided > 0 && rule.one_sided < 1) {
    ag.fail("one_sided", "must be 0 (off) or at least 1 spread: below 1 the bound could leave out inputs of the "
                         "closest half, which the test never does");
  }
  // centered_clip's lag test: inputs whose alignment with the last step is this many spreads
  // behind the median alignment (0: off). Below 1 the bound could fall inside the closest half.
  rule.lag = ag.number("lag", robust::kDefaultLag, 0.0, 100.0);
  if (rule.lag > 0 && rule.lag < 1) {
    ag.fail("lag", "must be 0 (off) or at least 1 spread: below 1 the bound could leave out inputs of the closest "
                   "half, which the test never does");
  }
  rule.nnm = ag.boolean("nnm", false);
  rule.bucket = static_cast<std::size_t>(ag.integer("bucket", 0, 0, 1 << 20));
  a.clip_norm = ag.number("clip_norm", 0.0, 0.0, 1e12);
  if (ag.has("adaptive_clip")) {
    const auto ac = ag.child("adaptive_clip");
    a.adaptive_clip.quantile = ac.number("quantile", 0.5, 0.01, 0.99);
    a.adaptive_clip.lr = ac.number("lr", 0.2, 1e-6, 10.0);
    a.adaptive_clip.initial = ac.number("initial", 1.0, 1e-9, 1e12);
    a.adaptive_clip.min = ac.number("min", a.adaptive_clip.initial / 1000, 1e-12, 1e12);
    if (a.adaptive_clip.min > a.adaptive_clip.initial) ac.fail("min", "is above initial");
    ac.finish();
    if (a.clip_norm > 0) ag.fail("clip_norm", "and adaptive_clip both set the clip norm: keep one");
  }
  a.fallback = *robust::parse_fallback(ag.one_of("fallback", "median", robust::fallback_names()));
  ag.finish();
  const std::string rule_name(robust::name(rule.rule));
  if (robust::needs_f(rule.rule) && rule.f == 0) {
    ag.fail("f", "must be >= 1 for " + rule_name + " (the number of Byzantine silos to tolerate)");
  }
  if (rule.nnm && rule.f == 0) {
    ag.fail("nnm", "mixes each input with its n - f nearest: set f >= 1 (with f = 0 every input becomes the mean)");
  }
}

// Without secure aggregation the rule runs on the silos' own updates: on as few as min_updates,
// and never on an edge's partial sum.
void check_plain_rule(const ConfigNode& ag, ServerConfig& c) {
  const auto& a = c.aggregation;
  const auto& rule = a.rule;
  const std::size_t n = c.selection.min_updates;
  if (const auto st = robust::check(rule, n); !st) {
    ag.fail("rule", st.error().message() + " but a round may commit with selection.min_updates = " + std::to_string(n) +
                        " updates; raise min_updates or lower f");
  }
  if (const auto st = robust::check_tolerance(rule, n); !st) {
    ag.fail("f", st.error().message() + ": a round may commit with selection.min_updates = " + std::to_string(n) +
                     " updates; raise min_updates or lower f");
  }
  if (const auto st = robust::check_protects(rule, n); !st) {
    c.warnings.push_back(ag.key_path("rule") + ": " + st.error().message() + " when a round commits with selection.min_updates = " +
                         std::to_string(n) + " updates");
  }
  if (a.needs_all_updates() && c.allow.allows_role(wire::EDGE)) {
    ag.fail(a.clip_norm > 0 && rule.rule == robust::Rule::FedAvg ? "clip_norm" : "rule",
            "needs every silo's own update, but edges send one partial sum per region; "
            "remove allow.edge, or run the rule across secure groups");
  }
}

// "aggregation" and "secure", and whether the rule can run on what a round may commit with.
void parse_rounds_aggregation(const ConfigNode& root, ServerConfig& c) {
  const auto ag = root.child("aggregation");
  parse_aggregation(ag, c.aggregation);
  const auto se = root.child("secure");
  parse_secure(se, c.secure);
  // The rule must be able to run on the fewest inputs a round may commit with: the silos'
  // updates, or with secure groups the groups that min_updates silos make.
  if (!c.secure.on()) {
    check_plain_rule(ag, c);
  } else {
    check_secure_rule(ag, se, c);
  }
}

// A key of another codec's block than `codec`'s is refused, naming the schemes it belongs to.
void refuse_other_schemes_keys(const ConfigNode& cn, const protocol::Codec& codec) {
  const auto own = codec.keys();
  std::set<std::string> keys;
  for (const auto* other : protocol::codecs()) {
    if (other) for (const auto& k : other->keys()) keys.insert(k);
  }
  for (const auto& key : keys) {
    if (!cn.has(key) || std::count(own.begin(), own.end(), key)) continue;
    std::vector<std::string> whose;
    for (const auto* other : protocol::codecs()) {
      if (!other) continue;
      const auto ks = other->keys();
      if (std::count(ks.begin(), ks.end(), key)) whose.emplace_back(other->name());
    }
    std::string names;
    for (std::size_t i = 0; i < whose.size(); ++i) {
      names += (i == 0 ? "" : i + 1 == whose.size() ? " and " : ", ") + whose[i];
    }
    cn.fail(key, "applies to scheme" + std::string(whose.size() > 1 ? "s " : " ") + names + " only");
  }
}

// "compression": which scheme the silos use on their uploads, and whether it can be made
// secure (only linear schemes survive masking: random-k with a shared coordinate set).
void parse_compression(const ConfigNode& root, ServerConfig& c) {
  if (!root.has("compression")) return;
  const auto cn = root.child("compression");
  auto& z = c.compression;
  const auto scheme = cn.one_of("scheme", "none", protocol::scheme_names());
  using C = wire::Compression;
  z.set_scheme(protocol::scheme_of_name(scheme));
  const protocol::Codec& codec = *protocol::find_codec(z.scheme());  // scheme_names() has only codecs' names
  codec.configure(cn, z);
  refuse_other_schemes_keys(cn, codec);
  // Error feedback is what makes biased compressors converge (sign, top-k); on by default.
  z.set_error_feedback(cn.boolean("error_feedback", z.scheme() != C::NONE));
  // Tensors that travel dense (fnmatch patterns of names): normalisation statistics by default,
  // which local training sets rather than moves, so a residual of them only grows.
  if (z.scheme() != C::NONE) {
    const auto dense = cn.has("dense") ? cn.str_list("dense") : protocol::default_dense_patterns();
    for (const auto& p : dense) z.add_dense(p);
    if (const auto st = protocol::check_compression(z); !st) cn.fail("dense", st.error().message());
  } else if (cn.has("dense")) {
    cn.fail("dense", "applies when a scheme is set");
  }
  cn.finish();
  if (const auto st = codec.secure(z); c.secure.on() && !st) {
    cn.fail("scheme", scheme + " cannot be combined with secure aggregation: the server sums masked vectors, so "
                               "every silo must send the same coordinates as ring words; " +
                               st.error().message() +
                               ". Use random_k (the coordinate set drawn from the round's seed), or secure.mode off");
  }
  if (c.secure.on() && z.scheme() == C::RANDOM_K && !z.error_feedback()) {
    cn.fail("error_feedback", "must be true for random_k with secure aggregation: without it each kept coordinate "
                              "is scaled by d / k, and the fixed-point codec's clip to secure.clip_norm would undo that");
  }
}

// "broadcast": the model goes to silos that hold the previous round's model as a quantized
// delta against it (the rest get it whole). Independent of the upload's compression and of
// secure aggregation: the model is no secret from the silos.
void parse_broadcast(const ConfigNode& root, ServerConfig& c) {
  if (!root.has("broadcast")) return;
  const auto bn = root.child("broadcast");
  auto& b = c.broadcast;
  const auto scheme = bn.one_of("scheme", "none", {"none", "quantize"});
  if (scheme == "none") {
    for (const char* key : {"bits", "block", "dense"}) {
      if (bn.has(key)) bn.fail(key, "applies to scheme quantize only");
    }
    bn.finish();
    return;
  }
  b.set_scheme(wire::Compression::QUANTIZE);
  protocol::find_codec(b.scheme())->configure(bn, b);
  // Normalisation statistics go as their values: a rounded delta could take a small variance
  // below zero.
  const auto dense = bn.has("dense") ? bn.str_list("dense") : protocol::default_dense_patterns();
  for (const auto& p : dense) b.add_dense(p);
  if (const auto st = protocol::check_broadcast(b); !st) bn.fail("dense", st.error().message());
  bn.finish();
}

// "schedule": synchronous rounds (absent, or mode "synchronous"), or buffered asynchronous
// rounds (server/schedule.h). Checked against what a buffered round can combine: a plain sum of
// updates from silos that each trained on their own version, so no secure mode (pairwise masks
// cancel only within a fixed cohort), no robust rule (its screens compare updates of one model)
// and no silo-level DP (its accounting assumes one release per fixed cohort).
void parse_schedule(const ConfigNode& root, ServerConfig& c) {
  if (!root.has("schedule")) return;
  const auto sc = root.child("schedule");
  auto& s = c.schedule;
  s.mode = sc.one_of("mode", "synchronous", {"synchronous", "buffered"}) == "buffered" ? ScheduleMode::Buffered
                                                                                         : ScheduleMode::Synchronous;
  if (!s.buffered()) {
    for (const char* key : {"k", "max_staleness", "staleness"}) {
      if (sc.has(key)) sc.fail(key, "applies to mode \"buffered\" only");
    }
    sc.finish();
    return;
  }
  if (!sc.has("k")) sc.fail("k", "is required with mode \"buffered\" (the updates each commit waits for)");
  s.k = static_cast<std::size_t>(sc.integer("k", 2, 1, 1 << 20));
  // Buffered rounds have no robust rule (below): with k = 1 one silo, the fastest, would decide
  // every commit alone, and every silo could read its update from two consecutive versions.
  if (s.k < 2) {
    sc.fail("k", "must be >= 2, got " + std::to_string(s.k) + ": with k = 1 each commit is one silo's update alone "
                 "(it decides the step, and every silo reads it from two consecutive versions; docs/buffered.md)");
  }
  s.max_staleness = static_cast<std::uint64_t>(sc.integer("max_staleness", 4, 0, 1 << 20));
  if (sc.has("staleness")) {
    const auto st = sc.child("staleness");
    const auto kind = st.one_of("kind", "polynomial", {"polynomial", "constant", "hinge"});
    s.staleness = kind == "constant" ? Staleness::Constant : kind == "hinge" ? Staleness::Hinge : Staleness::Polynomial;
    if (s.staleness == Staleness::Constant) {
      if (st.has("a") || st.has("b")) st.fail(st.has("a") ? "a" : "b", "has no meaning for kind \"constant\"");
    } else {
      s.a = st.number("a", s.staleness == Staleness::Hinge ? 10.0 : 0.5, 0.0, 100.0);
    }
    if (s.staleness == Staleness::Hinge) {
      s.b = static_cast<std::uint64_t>(st.integer("b", 4, 0, 1 << 20));
    } else if (st.has("b")) {
      st.fail("b", "applies to kind \"hinge\" only");
    }
    st.finish();
  }
  sc.finish();
  if (!c.expected_silos.empty() && s.k > c.expected_silos.size()) {
    sc.fail("k", "is " + std::to_string(s.k) + " but allow.silo names only " + std::to_string(c.expected_silos.size()) +
                     " silos: no commit could ever gather k updates");
  }
  if (c.secure.on()) {
    sc.fail("mode", "buffered rounds run in plain mode only: secure aggregation's pairwise masks cancel only within a "
                    "cohort fixed for the round, and a buffer mixes updates of several versions (set secure.mode "
                    "\"off\" or drop schedule)");
  }
  if (c.aggregation.rule.rule != robust::Rule::FedAvg || c.aggregation.clip_norm > 0 || c.aggregation.adaptive_clip.on()) {
    sc.fail("mode", "buffered rounds combine by the staleness-weighted mean only: a robust rule or clipping compares "
                    "updates as if trained on one model (set aggregation.rule \"fedavg\" without clip_norm)");
  }
  if (c.central_dp || c.distributed_dp) {
    sc.fail("mode", "buffered rounds do not account silo-level privacy (its ledger counts one release per round of "
                    "a fixed cohort): drop the privacy block or the schedule");
  }
  if (c.selection.min_updates < 2) {
    sc.fail("mode", "buffered rounds need selection.min_updates >= 2, got " + std::to_string(c.selection.min_updates) +
                        ": a commit at the training deadline would otherwise hold one silo's update alone (it decides "
                        "the step, and every silo reads it from two consecutive versions; docs/buffered.md)");
  }
  if (c.compression.scheme() == wire::Compression::POWER_SGD) {
    sc.fail("mode", "buffered rounds do not take compression \"powersgd\": its shared projection is seeded per round, "
                    "and a silo carried across commits encodes with its start's round, not the commit's (use "
                    "another scheme or synchronous rounds)");
  }
  if (c.selection.silos_per_round || c.selection.over_selection > 0) {
    sc.fail("mode", "buffered rounds take any connected silo: selection.silos_per_round and over_selection apply to "
                    "synchronous rounds");
  }
}

}  // namespace

ServerConfig load_server_config(const std::filesystem::path& file) {
  const auto j = ConfigNode::load_file(file);
  ConfigNode root(j, file.string());
  ServerConfig c;
  c.file = file;
  c.config_sha256 = crypto::sha256_hex(read_file(file));
  c.federation = root.str_required("federation");
  c.listen = transport::parse_endpoint_key(root, "listen", "0.0.0.0:7443");
  c.port_file = root.path("port_file", "");
  c.tls = transport::parse_tls(root.child("tls"));
  c.allow = transport::parse_allow(root.child("allow"));
  if (!c.allow.allows_role(wire::SILO) && !c.allow.allows_role(wire::EDGE)) {
    root.fail("allow", "must admit at least one silo or edge (\"silo\": [names] or [\"*\"])");
  }
  for (const auto& s : root.child("allow").str_list("silo")) {
    if (s != "*") c.expected_silos.insert(s);
  }
  c.channel = transport::parse_channel_options(root.child("transport"));
  c.secure.max_message_bytes = c.channel.max_frame_bytes;  // LightSecAgg's share messages must fit
  c.chunk_bytes = static_cast<std::size_t>(
      root.integer("chunk_bytes", 1 << 20, 1024, std::int64_t{1} << 30));
  if (c.chunk_bytes + 4096 > c.channel.max_frame_bytes) {
    root.fail("chunk_bytes", std::to_string(c.chunk_bytes) +
                                 " leaves no room for the envelope in transport.max_frame_bytes " +
                                 std::to_string(c.channel.max_frame_bytes) + " (need 4096 spare)");
  }
  c.state_dir = root.path("state_dir", "state");
  c.state_mirror = root.path("state_mirror", "");
  if (!c.state_mirror.empty() && std::filesystem::weakly_canonical(c.state_mirror) == std::filesystem::weakly_canonical(c.state_dir)) {
    root.fail("state_mirror", "must be another folder than state_dir (ideally on another disk)");
  }
  c.keep_checkpoints = static_cast<std::size_t>(root.integer("keep_checkpoints", 5, 0, 1 << 20));
  c.staging.over_bytes = static_cast<std::uint64_t>(root.integer("stage_uploads_over_mib", 1024, 0, 1 << 30)) << 20;
  c.staging.dir = c.state_dir;
  c.broadcasts_at_once = static_cast<std::size_t>(root.integer("broadcasts_at_once", kDefaultBroadcastsAtOnce, 0, 1 << 20));
  c.uploads_at_once = static_cast<std::size_t>(root.integer("uploads_at_once", kDefaultUploadsAtOnce, 1, kMaxUploadsAtOnce));
  c.network_threads = transport::parse_network_threads(root);
  c.model = parse_model(root.child("model"));
  c.rounds = static_cast<std::uint64_t>(root.integer("rounds", 10, 1, 1 << 30));
  c.seed = static_cast<std::uint64_t>(root.integer("seed", 1, 0));

  parse_selection(root, c);
  parse_deadlines(root, c);
  parse_training(root, c);
  parse_optimizer(root, c);
  parse_rounds_aggregation(root, c);
  c.optimizer.keep_last_step = c.aggregation.rule.rule == robust::Rule::CenteredClip;
  parse_compression(root, c);
  parse_broadcast(root, c);
  parse_privacy(root, c);
  parse_schedule(root, c);

  c.log_level = root.one_of("log_level", "info", {"trace", "debug", "info", "warn", "error"});
  c.log_format = root.one_of("log_format", "text", {"text", "json"});
  c.metrics = transport::parse_metrics(root);
  root.finish();
  return c;
}

namespace {
std::string abs_path(const std::filesystem::path& p) { return std::filesystem::absolute(p).lexically_normal().string(); }
}  // namespace

namespace {

nlohmann::json model_json(const ModelSpec& m) {
  nlohmann::json model = {{"kind", m.kind}, {"init_seed", m.seed}};
  if (m.kind == "file") {
    model = {{"kind", "file"}, {"path", abs_path(m.file)}};
  } else if (m.kind == "synthetic") {
    model["parameters"] = m.parameters;
  } else {
    model["inputs"] = m.inputs;
    model["classes"] = m.classes;
    if (!m.hidden.empty()) model["hidden"] = m.hidden;
  }
  return model;
}

// The training block as given (user keys for external trainers included), known keys as parsed.
nlohmann::json training_json(const wire::TrainingPlan& plan) {
  nlohmann::json training =
      plan.config_json().empty() ? nlohmann::json::object() : nlohmann::json::parse(plan.config_json());
  training["local_epochs"] = plan.local_epochs();
  training["batch_size"] = plan.batch_size();
  training["learning_rate"] = plan.learning_rate();
  training["weight_decay"] = plan.weight_decay();
  training["silo_momentum"] = plan.silo_momentum();
  training["max_weight"] = plan.max_weight();
  return training;
}

nlohmann::json aggregation_json(const AggregationConfig& a) {
  const auto& r = a.rule;
  nlohmann::json j = {{"rule", robust::name(r.rule)},
                      {"f", r.f},
                      {"m", r.m},
                      {"beta", r.beta},
                      {"tau", r.tau > 0 ? nlohmann::json(r.tau) : nlohmann::json("auto")},
                      {"iterations", r.iterations},
                      {"reject", r.reject},
                      {"oppose", r.oppose},
                      {"one_sided", r.one_sided},
                      {"lag", r.lag},
                      {"nnm", r.nnm},
                      {"bucket", r.bucket},
                      {"clip_norm", a.clip_norm},
                      {"fallback", robust::name(a.fallback)}};
  if (const auto& ac = a.adaptive_clip; ac.on()) {
    j["adaptive_clip"] = {{"quantile", ac.quantile}, {"lr", ac.lr}, {"initial", ac.initial}, {"min", ac.min}};
  }
  return j;
}

// Compression of the uploads and of the broadcast, the metrics listener, the port file: only
// when configured.
void add_optional_blocks(const ServerConfig& c, nlohmann::json& j) {
  if (!c.port_file.empty()) j["port_file"] = abs_path(c.port_file);
  if (c.central_dp) j["privacy"] = privacy_json(*c.central_dp);
  if (c.distributed_dp) j["privacy"] = privacy_json(*c.distributed_dp);
  if (c.metrics.listen) j["metrics"] = transport::to_json(c.metrics);
  if (protocol::compressed(c.compression)) j["compression"] = protocol::to_json(c.compression);
  if (c.schedule.buffered()) j["schedule"] = to_json(c.schedule);
  if (protocol::compressed(c.broadcast)) {
    auto b = protocol::to_json(c.broadcast);
    b.erase("error_feedback");  // never part of a broadcast
    j["broadcast"] = b;
  }
}

}  // namespace

nlohmann::json to_json(const ServerConfig& c) {
  nlohmann::json j = {{"federation", c.federation},
                      {"listen", c.listen.str()},
                      {"tls", transport::to_json(c.tls)},
                      {"allow", transport::to_json(c.allow)},
                      {"transport", transport::to_json(c.channel)},
                      {"chunk_bytes", c.chunk_bytes},
                      {"state_dir", abs_path(c.state_dir)},
                      {"state_mirror", c.state_mirror.empty() ? std::string() : abs_path(c.state_mirror)},
                      {"keep_checkpoints", c.keep_checkpoints},
                      {"stage_uploads_over_mib", c.staging.over_bytes >> 20},
                      {"uploads_at_once", c.uploads_at_once},
                      {"broadcasts_at_once", c.broadcasts_at_once},
                      {"network_threads", c.network_threads},
                      {"model", model_json(c.model)},
                      {"rounds", c.rounds},
                      {"seed", c.seed},
                      {"selection",
                       {{"min_silos", c.selection.min_silos},
                        {"min_updates", c.selection.min_updates},
                        {"silos_per_round", c.selection.silos_per_round},
                        {"over_selection", c.selection.over_selection}}},
                      {"deadlines",
                       {{"join_s", secs_of(c.deadlines.join)},
                        {"train_s", secs_of(c.deadlines.train)},
                        {"upload_s", secs_of(c.deadlines.upload)}}},
                      {"training", training_json(c.plan)},
                      {"optimizer",
                       {{"kind", c.optimizer.kind},
                        {"lr", c.optimizer.lr},
                        {"momentum", c.optimizer.momentum},
                        {"beta1", c.optimizer.beta1},
                        {"beta2", c.optimizer.beta2},
                        {"tau", c.optimizer.tau}}},
                      {"aggregation", aggregation_json(c.aggregation)},
                      {"secure", secure_json(c.secure)},
                      {"log_level", c.log_level},
                      {"log_format", c.log_format}};
  add_optional_blocks(c, j);
  return j;
}

}  // namespace xsilo::server
