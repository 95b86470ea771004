#include "tools/sim_agent.h"

#include <limits>

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <thread>

#include "crypto/sources.h"

#include <sodium.h>

#include "common/config.h"
#include "protocol/secagg_wire.h"
#include "transport/tls.h"
#include "silo_agent/builtin_trainer.h"
#include "silo_agent/sgd.h"
#include "silo_agent/update.h"

namespace xsilo::tools {

namespace {

// Benchmarks: a deterministic pseudo-random delta and no data: a 64 Ki-element random block
// from splitmix64, tiled over the model and scaled by a per-tile factor. The delta depends on
// the round and the silo only, so it can be made as it is sent (streams()): a silo then holds
// no copy of the model, which is what lets a few silos of a billion parameters share a box.
class SyntheticDelta final : public agent::DeltaStream {
 public:
  static constexpr std::size_t kBlock = 1 << 16;

  SyntheticDelta(std::uint64_t seed, std::size_t elements) : z_(seed), block_(kBlock) {
    const float scale = 2e-3f / 16777216.0f;
    for (auto& v : block_) v = static_cast<float>(static_cast<std::int64_t>(next() >> 40) - (1 << 23)) * scale;
    factors_.resize((elements + kBlock - 1) / kBlock);
    for (auto& f : factors_) f = 0.5f + static_cast<float>(next() >> 40) / 16777216.0f;
  }

  void fill(std::size_t first, std::span<float> out) const override {
    for (std::size_t k = 0; k < out.size(); ++k) {
      const std::size_t i = first + k;
      out[k] = block_[i % kBlock] * factors_[i / kBlock];
    }
  }

 private:
  std::uint64_t next() {
    z_ += 0x9e3779b97f4a7c15ull;
    std::uint64_t x = (z_ ^ (z_ >> 30)) * 0xbf58476d1ce4e5b9ull;
    return x ^ (x >> 27);
  }
  std::uint64_t z_;
  std::vector<float> block_;
  std::vector<float> factors_;
};

class SyntheticTrainer final : public agent::Trainer {
 public:
  explicit SyntheticTrainer(std::uint64_t samples) : samples_(samples) {}
  wire::TrainMetrics evaluate(const Model&, const agent::TrainTask&) override { return {}; }
  agent::TrainResult train(const Model& global, const agent::TrainTask& task, Model& local) override {
    const auto g = global.flat();
    auto l = local.flat();
    SyntheticDelta(crypto::derive_seed(task.plan.seed(), task.round, "sim-synthetic-delta", task.silo), l.size()).fill(0, l);
    for (std::size_t i = 0; i < l.size(); ++i) l[i] += g[i];
    agent::TrainResult r;
    r.num_samples = samples_;
    return r;
  }
  bool streams() const override { return true; }
  agent::StreamedTraining train_streamed(const agent::TrainTask& task, std::size_t elements) override {
    agent::StreamedTraining t;
    t.delta = std::make_shared<SyntheticDelta>(crypto::derive_seed(task.plan.seed(), task.round, "sim-synthetic-delta", task.silo),
                                             elements);
    t.result.num_samples = samples_;
    return t;
  }

 private:
  std::uint64_t samples_;
};

// Simulated compute around a real trainer: a round's training takes at least its drawn time.
class PacedTrainer final : public agent::Trainer {
 public:
  PacedTrainer(std::unique_ptr<agent::Trainer> inner, std::uint64_t min_ms, std::uint64_t max_ms)
      : inner_(std::move(inner)), min_ms_(min_ms), max_ms_(max_ms) {}
  wire::TrainMetrics evaluate(const Model& model, const agent::TrainTask& task) override {
    return inner_->evaluate(model, task);
  }
  agent::TrainResult train(const Model& global, const agent::TrainTask& task, Model& local) override {
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(sim_training_ms(task.plan.seed(), task.round, task.silo, min_ms_, max_ms_));
    auto r = inner_->train(global, task, local);
    std::this_thread::sleep_until(until);
    return r;
  }
  void cancel() override { inner_->cancel(); }

 private:
  std::unique_ptr<agent::Trainer> inner_;
  std::uint64_t min_ms_, max_ms_;
};

// A Byzantine silo: replaces its honest delta with the attack's, after the agent's checks; a
// crash right after a secure-aggregation step.
class SimHook final : public agent::FaultHook {
 public:
  SimHook(const agent::AgentConfig& cfg, SimAgentConfig sim) : sim_(std::move(sim)) {
    if (!sim_.hostile.empty()) signer_ = transport::load_signer(cfg.tls);
    for (const auto& h : sim_.attack.honest) {
      agent::AgentConfig hc = cfg;  // the colluders' view of an honest silo: its data, standardized alike
      hc.train_data = h.train;
      hc.test_data.clear();
      hc.local.workers = 1;
      honest_.emplace_back(h.silo, std::make_unique<agent::BuiltinTrainer>(hc, agent::load_local_data(hc)));
    }
  }

  bool after_sent(agent::SecureStep step, std::uint64_t round) override {
    const bool keys = step == agent::SecureStep::KeysSent;
    if (sim_.crash_after != (keys ? "keys" : "shares") || sim_.crash_round != round) return false;
    spdlog::warn("round {}: simulated crash after sending {}", round, sim_.crash_after);
    // Let the message leave, then die as a crash would: from here on the silo does nothing.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::_Exit(kCrashExit);
    }).detach();
    return true;
  }

  // A hostile member, as the protocol sees one: what it sends is signed by itself, so the
  // others can prove what it did (and exclude it) rather than blame the relay.
  void outgoing(wire::Envelope& e, const std::string& session) override {
    if (!signer_ || session.empty()) return;
    const std::string me = signer_->who().name;
    if (sim_.hostile == "bad_keys" && e.secure().has_secagg_keys()) {
      auto a = protocol::from_wire(e.secure().secagg_keys());
      if (!a) return;
      a->mask_pk.fill(0);  // the identity point: every pair key with it is known to all
      a->signature = signer_->sign(crypto::secagg::keys_statement(session, me, *a));
      *e.mutable_secure()->mutable_secagg_keys() = protocol::to_wire(*a);
      spdlog::warn("round {}: hostile: advertised an unusable mask key, signed", e.round());
    } else if (sim_.hostile == "garbage_shares" && e.secure().has_secagg_shares()) {
      for (auto& entry : *e.mutable_secure()->mutable_secagg_shares()->mutable_entries()) {
        std::string box(entry.box().size(), '\0');
        randombytes_buf(box.data(), box.size());
        entry.set_signature(signer_->sign(crypto::secagg::box_statement(session, me, entry.recipient(), box)));
        entry.set_box(std::move(box));
      }
      spdlog::warn("round {}: hostile: dealt boxes of random bytes, signed", e.round());
    }
  }

  // An attack replaces the delta after the agent's checks, on a model in memory.
  bool tampers() const override { return sim_.attack.active(); }

  // Under secure aggregation: an attacker that skips its clipping encodes with no norm bound (the
  // ring's largest code still bounds each coordinate); one that lies in its unclipped count
  // adds 7 where an honest member adds 0 or 1. What the server does about each: docs/security.md.
  void encoding(crypto::FixedPointParams& codec) override {
    if (sim_.attack.kind == "skip_clipping") codec.clip_norm = std::numeric_limits<double>::max();
  }
  void encoded(protocol::MaskedVector& words, const crypto::FixedPointParams& codec) override {
    if (sim_.attack.kind != "unclipped_lie" || !codec.unclipped_bit) return;
    words.visit([&](auto w) {
      using T = typename decltype(w)::element_type;
      w[w.size() - 1] = static_cast<T>(T{7} << codec.fraction_bits);
    });
  }

  void tamper(const agent::TrainTask& task, const Model& global, std::span<float> update, double weight) override {
    const auto& a = sim_.attack;
    if (!a.active() || a.kind == "label_flip") return;
    std::vector<float> delta(update.begin(), update.end());
    for (auto& v : delta) v = static_cast<float>(v / weight);
    apply_attack(a, delta, crypto::derive_seed(task.plan.seed(), task.round, "sim-attack", task.silo), [&] {
      std::vector<std::vector<float>> deltas;
      for (const auto& [silo, trainer] : honest_) {
        agent::TrainTask t = task;
        t.silo = silo;
        Model local = global.zeros_like();
        trainer->train(global, t, local);
        for (std::size_t k = 0; k < local.size(); ++k) local.flat()[k] -= global.flat()[k];
        // With silo momentum the honest silos upload their momentum: so do the colluders' copies.
        if (const double beta = task.plan.silo_momentum(); beta > 0) {
          Model& m = honest_momentum_[silo];
          if (!m.same_layout(local)) m = local.zeros_like();
          agent::apply_momentum(local, 1.0, m, beta);
        }
        deltas.emplace_back(local.flat().begin(), local.flat().end());
      }
      return deltas;
    });
    for (std::size_t k = 0; k < update.size(); ++k) update[k] = static_cast<float>(delta[k] * weight);
  }

 private:
  SimAgentConfig sim_;
  std::optional<crypto::CertSigner> signer_;
  std::vector<std::pair<std::string, std::unique_ptr<agent::BuiltinTrainer>>> honest_;
  std::map<std::string, Model> honest_momentum_;  // the honest silos' momentum, as they keep it
};

}  // namespace

std::uint64_t sim_training_ms(std::uint64_t seed, std::uint64_t round, const std::string& silo, std::uint64_t min_ms,
                              std::uint64_t max_ms) {
  return min_ms + crypto::derive_seed(seed, round, "sim-training-time", silo) % (max_ms - min_ms + 1);
}

SimAgentConfig load_sim_agent_config(const std::filesystem::path& file) {
  const auto j = ConfigNode::load_file(file);
  ConfigNode root(j, file.string());
  SimAgentConfig c;
  if (root.has("attack")) c.attack = parse_attack(root.child("attack"));
  if (root.has("crash")) {
    const auto cr = root.child("crash");
    c.crash_after = cr.one_of("after", "keys", {"keys", "shares"});
    c.crash_round = static_cast<std::uint64_t>(cr.integer("round", 1, 1));
    cr.finish();
  }
  if (root.has("hostile")) c.hostile = root.one_of("hostile", "", {"bad_keys", "garbage_shares"});
  if (root.has("train_ms")) {
    const auto [lo, hi] = root.int_range("train_ms", 0, 3600 * 1000, "milliseconds");
    c.train_min_ms = static_cast<std::uint64_t>(lo);
    c.train_max_ms = static_cast<std::uint64_t>(hi);
  }
  if (root.has("synthetic")) {
    const auto sy = root.child("synthetic");
    c.synthetic_samples = static_cast<std::uint64_t>(sy.integer("samples", 100, 1));
    sy.finish();
  }
  root.finish();
  return c;
}

nlohmann::json to_json(const SimAgentConfig& c) {
  nlohmann::json j = nlohmann::json::object();
  if (c.attack.active()) {
    const auto& a = c.attack;
    nlohmann::json honest = nlohmann::json::array();
    for (const auto& h : a.honest) honest.push_back({{"silo", h.silo}, {"train", h.train.string()}});
    j["attack"] = {{"kind", a.kind}, {"scale", a.scale},     {"sigma", a.sigma}, {"factor", a.factor},
                   {"z", a.z},       {"epsilon", a.epsilon}, {"boost", a.boost}, {"honest", honest}};
  }
  if (!c.crash_after.empty()) j["crash"] = {{"after", c.crash_after}, {"round", c.crash_round}};
  if (c.synthetic_samples) j["synthetic"] = {{"samples", *c.synthetic_samples}};
  if (!c.hostile.empty()) j["hostile"] = c.hostile;
  if (c.train_max_ms > 0) j["train_ms"] = {c.train_min_ms, c.train_max_ms};
  return j;
}

agent::AgentHooks make_sim_hooks(const agent::AgentConfig& cfg, const SimAgentConfig& sim) {
  agent::AgentHooks hooks;
  if (sim.synthetic_samples) {
    hooks.trainer = std::make_unique<SyntheticTrainer>(*sim.synthetic_samples);
  } else if (sim.attack.kind == "label_flip") {
    auto data = agent::load_local_data(cfg);
    for (auto& y : data.train.y) y = data.train.classes - 1 - y;
    hooks.trainer = std::make_unique<agent::BuiltinTrainer>(cfg, std::move(data));
  }
  if (sim.train_max_ms > 0) {
    hooks.trainer = std::make_unique<PacedTrainer>(hooks.trainer ? std::move(hooks.trainer) : agent::make_trainer(cfg),
                                                   sim.train_min_ms, sim.train_max_ms);
  }
  hooks.faults = std::make_unique<SimHook>(cfg, sim);
  return hooks;
}

}  // namespace xsilo::tools
