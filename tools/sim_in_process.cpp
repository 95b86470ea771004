// `xsilo sim --in-process`: the federation's arithmetic without its processes. Every silo's
// trainer, momentum and simulated attack are the agent's own code (make_sim_hooks, run_round,
// apply_momentum, the FaultHook's tamper); every update goes through the server's own
// aggregator (make_aggregator: the upload checks, clipping, the pre-aggregation steps, the
// rule and its fallback, adaptive clipping) and the server optimizer. What is left out is the
// network and the protocol around it: no TLS, no deadlines, no dropouts, no audit log, so the
// modes that live in the protocol (edges, faults, hostile processes, an external trainer) are
// refused with the reason. Secure aggregation runs as its arithmetic: every silo encodes its
// update with the round's codec (clipping, weight cap, fixed point, the unclipped bit) as its
// session does, the encoded words of each group (drawn as the server draws them) are summed in
// the ring, where the pairwise masks would cancel, and the server's own checks and combination
// run on the decoded sums. It is what large sweeps (xsilo bench attacks) run on; tests check
// that it commits the same models as the real processes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>

#include <spdlog/spdlog.h>

#include "common/config.h"
#include "common/fs.h"
#include "common/mlp.h"
#include "common/safetensors.h"
#include "crypto/hash.h"
#include "crypto/skellam.h"
#include "crypto/sources.h"
#include "protocol/privacy.h"
#include "server/aggregator.h"
#include "server/config_privacy.h"
#include "server/config.h"
#include "server/optimizer.h"
#include "server/commit.h"
#include "server/schedule.h"
#include "server/secure_groups.h"
#include "server/selection.h"
#include "silo_agent/config.h"
#include "silo_agent/silo_state.h"
#include "silo_agent/update.h"
#include "tools/sim.h"
#include "tools/sim_agent.h"

namespace xsilo::tools {

namespace {

// The modes whose behaviour lives in the protocol, not in the arithmetic: refused before any
// file is written or command run.
void refuse_protocol_modes(const SimConfig& cfg) {
  auto refuse = [&](const std::string& what) {
    throw ConfigError("sim --in-process: " + what + " needs the real processes (run xsilo sim without --in-process)");
  };
  if (cfg.edges) refuse("edges");
  if (!cfg.faults.empty()) refuse("faults");
  if (!cfg.hostile.empty()) refuse("hostile processes");
  if (cfg.trainer) refuse("an external trainer");
  // The codecs and their error feedback live in the agents' and the server's sessions.
  auto set = [](const nlohmann::json& block) {
    return block.is_object() && block.value("scheme", std::string("none")) != "none";
  };
  if (set(cfg.compression)) refuse("compressed uploads (compression)");
  if (set(cfg.broadcast)) refuse("a compressed broadcast (broadcast)");
  // Sampling silos (selection.silos_per_round) runs here as the server's select() draws it, the
  // round closing at its target with the first silos done on the simulated clock.
}

// A round of secure aggregation without its protocol: the members' encoded words summed per
// group, decoded, checked and combined as SecureGroups does after unmasking.
class GroupedSums {
 public:
  GroupedSums(const server::ServerConfig& cfg, std::uint64_t round, const std::vector<std::string>& silos,
              std::size_t d, std::optional<double> clip_norm, const crypto::secagg::Floor& floor)
      : cfg_(cfg), secure_(cfg.secure), round_(round), d_(d), clip_norm_(clip_norm),
        counts_(server::counts_unclipped(cfg, clip_norm)) {
    // As the server's round: the round's adaptive clip norm, never above secure.clip_norm.
    if (clip_norm) secure_.clip_norm = std::min(*clip_norm, secure_.clip_norm);
    codec_ = secure_.codec();
    codec_.unclipped_bit = counts_;
    // The signed setup carries both as float32: the silos clip and cap with those values.
    codec_.clip_norm = static_cast<float>(codec_.clip_norm);
    codec_.max_weight = static_cast<float>(codec_.max_weight);
    const auto groups = server::make_groups(silos, cfg.secure, server::group_permutation_seed(cfg.seed, round));
    for (const auto& g : groups) {
      // The silos' own floor (the agent's secure_floor): sums smaller than it are refused there.
      const auto least = server::group_min_survivors(cfg.secure, g.size());
      if (least < floor.min_sum) {
        throw ConfigError("sim --in-process: the silos would refuse this secure setup: it reveals sums of " +
                          std::to_string(least) + " silos, below a silo's floor of " + std::to_string(floor.min_sum) +
                          " (secure_floor.min_sum); raise secure.min_group");
      }
    }
    // Distributed DP: as the server's setups say, at the round's adaptive C.
    if (cfg.distributed_dp) {
      dp_ = clip_norm ? server::at_clip_norm(*cfg.distributed_dp, secure_.clip_norm) : *cfg.distributed_dp;
    }
    skellam_ = server::skellam_setup(cfg, round, clip_norm ? std::optional<double>(secure_.clip_norm) : std::nullopt);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      for (const auto& m : groups[g]) group_of_[m] = g;
      sums_.emplace_back(codec_.bits, skellam_ ? crypto::skellam_words(params(1), d) : codec_.words(d));
      members_.push_back(groups[g]);
    }
  }

  // The silo's upload (weight x delta) as its session encodes it, its hook included.
  void add(const std::string& silo, std::span<const float> update, double weight, agent::FaultHook& hook) {
    std::vector<float> delta(update.begin(), update.end());
    for (auto& v : delta) v = static_cast<float>(v / weight);
    if (skellam_) {  // distributed DP: the silo's encoding (silo_agent/masking_job.cpp), fresh noise
      const auto g = group_of_.at(silo);
      const auto p = params(server::group_min_survivors(cfg_.secure, members_[g].size()));
      protocol::MaskedVector words(codec_.bits, crypto::skellam_words(p, d_));
      crypto::NoiseSource noise;
      words.visit([&](auto w) { crypto::encode_skellam(p, delta, noise, w); });
      sums_[g].add(words);
      survivors_[g].push_back(silo);
      return;
    }
    auto applied = codec_;
    hook.encoding(applied);
    protocol::MaskedVector words(codec_.bits, codec_.words(d_));
    // Stochastic rounding, from the federation's seed, the round and the silo (its session draws
    // it at random).
    const std::uint64_t seed = crypto::derive_seed(cfg_.seed, round_, "sim-encoding-rounding", silo);
    words.visit([&](auto w) { crypto::encode(applied, delta, weight, seed, w); });
    hook.encoded(words, codec_);
    const auto g = group_of_.at(silo);
    sums_[g].add(words);
    survivors_[g].push_back(silo);
  }

  server::CombineResult combine(std::span<float> out, const server::CombineContext& ctx) {
    std::vector<server::GroupResult> results;
    for (std::size_t g = 0; g < sums_.size(); ++g) {
      server::GroupResult r;
      r.group = static_cast<std::uint32_t>(g + 1);
      r.members = members_[g];
      r.survivors = survivors_[g];
      r.min_survivors = server::group_min_survivors(cfg_.secure, r.members.size());
      if (r.survivors.size() < r.min_survivors) {
        r.sum = Error("too few members uploaded");
      } else if (skellam_) {
        ++revealed_;  // unmasked: a noisy release, charged even if the round then aborts
        const auto p = params(static_cast<std::uint32_t>(r.min_survivors));
        r.sum = server::GroupSum(sums_[g].visit([&](auto w) { return crypto::decode_skellam(p, w, d_); }), d_);
        if (auto st = server::check_plausible_skellam_sum(*r.sum, r.survivors.size(), r.min_survivors, *dp_);
            !st) {
          r.sum = st.error();
        }
      } else {
        r.sum = server::GroupSum(std::move(sums_[g]), codec_, d_);
        if (auto st = server::check_plausible_sum(*r.sum, r.survivors.size(), secure_, counts_); !st) {
          r.sum = st.error();
        }
      }
      results.push_back(std::move(r));
    }
    if (skellam_) {
      return server::combine_distributed_groups(cfg_.aggregation, results, d_, *dp_, ctx, out, cfg_.secure.clip_norm);
    }
    const server::GroupClipping clipping{
        .counted = counts_,
        .adaptive = clip_norm_ ? std::optional<double>(secure_.clip_norm) : std::nullopt,
        .ceiling = cfg_.secure.clip_norm,
        .warn = false};  // the run's closing line says it, once
    return server::combine_groups(cfg_.aggregation, results, d_, clipping, ctx, out);
  }

  // Distributed DP: the group sums combine() unmasked (as server::SecureRound::revealed).
  std::size_t revealed() const { return revealed_; }

 private:
  crypto::SkellamParams params(std::uint32_t min_survivors) const {
    crypto::SkellamParams p;
    p.ring = codec_.bits;
    p.bits = skellam_->bits();
    p.gamma = skellam_->gamma();
    p.clip_norm = skellam_->clip_norm();
    p.silo_variance = skellam_->variance() / static_cast<double>(std::max<std::uint32_t>(1, min_survivors));
    p.beta = skellam_->beta();
    p.rotation_seed = skellam_->rotation_seed();
    p.count_scale = skellam_->count_scale();
    return p;
  }

  const server::ServerConfig& cfg_;
  std::optional<wire::SkellamSetup> skellam_;
  std::optional<server::DistributedDpConfig> dp_;  // distributed DP at the round's C
  std::size_t revealed_ = 0;
  server::SecureConfig secure_;  // the round's: clip_norm lowered to the adaptive one
  std::uint64_t round_;
  std::size_t d_;
  std::optional<double> clip_norm_;
  bool counts_ = false;  // the sums end with the unclipped count (server::counts_unclipped)
  crypto::FixedPointParams codec_;
  std::map<std::string, std::size_t> group_of_;
  std::vector<protocol::MaskedVector> sums_;
  std::vector<std::vector<std::string>> members_;
  std::map<std::size_t, std::vector<std::string>> survivors_;
};

struct Silo {
  std::string name;
  std::unique_ptr<agent::Trainer> trainer;
  std::unique_ptr<agent::FaultHook> hook;  // the simulated attack, if any
  Model momentum;
  std::filesystem::path sent_log;  // record-level privacy: its spends, as an agent logs its uploads
  std::uint64_t train_min_ms = 0, train_max_ms = 0;  // simulated compute (train_ms, stragglers)
  std::uint64_t trainings = 0;                        // how many times it trained (its draws' round)
  // Its next training's simulated time, and the task it trains under (its round: the count).
  agent::TrainTask next_task(const wire::TrainingPlan& plan) { return {++trainings, name, plan}; }
  std::int64_t train_ms(const wire::TrainingPlan& plan) const {
    if (train_max_ms == 0) return 0;
    return static_cast<std::int64_t>(sim_training_ms(plan.seed(), trainings, name, train_min_ms, train_max_ms));
  }
};

// The federation's silos, each with its agent's own config, trainer and simulated attack.
std::vector<Silo> make_silos(const SimConfig& cfg, const FederationFiles& f) {
  std::vector<Silo> silos;
  for (std::size_t i = 0; i < cfg.silos; ++i) {
    const auto files = write_agent_config(cfg, f, i, {"127.0.0.1:1"});
    auto a = agent::load_agent_config(files.config);
    a.local.workers = 1;  // local workers' all-reduce gives the same sum, up to float rounding
    SimAgentConfig sim = files.simulate.empty() ? SimAgentConfig{} : load_sim_agent_config(files.simulate);
    Silo s;
    // In-process the training time is simulated, not slept: the silos train one after another.
    s.train_min_ms = std::exchange(sim.train_min_ms, 0);
    s.train_max_ms = std::exchange(sim.train_max_ms, 0);
    auto hooks = make_sim_hooks(a, sim);
    s.name = f.silos[i];
    s.trainer = hooks.trainer ? std::move(hooks.trainer) : agent::make_trainer(a);
    s.hook = std::move(hooks.faults);
    s.sent_log = a.state_dir / "sent.jsonl";
    std::filesystem::create_directories(a.state_dir);
    std::filesystem::remove(s.sent_log);  // a new federation: nothing spent yet
    silos.push_back(std::move(s));
  }
  return silos;
}

// A silo's round as its agent runs it: training (a failure leaves the round to the others), the
// privacy spend on record, momentum, the simulated attack. Nothing when it has no update to send.
std::optional<agent::RoundOutput> silo_round(Silo& s, const agent::TrainTask& task, const Model& global,
                                             const server::ServerConfig& scfg, SimResult& result) {
  const auto round = task.round;
  agent::RoundOutput o;
  try {
    o = agent::run_round(*s.trainer, global, task);
  } catch (const agent::TrainerError& e) {
    // As an agent does: the silo reports the failure and the round goes on without it.
    spdlog::warn("round {}: {}: training failed: {}", round, s.name, e.what());
    return std::nullopt;
  }
  if (!o.update || !(o.weight > 0) || !std::isfinite(o.weight)) return std::nullopt;  // the server refuses such a weight
  if (!o.privacy.mechanism().empty()) {
    // As an agent's upload: its spend is on record before the update leaves.
    agent::commit_record(s.sent_log, {{"round", round},
                                      {"update_sha256", crypto::sha256_hex(o.update->flat())},
                                      {"privacy", protocol::privacy_json(o.privacy)}});
    result.epsilon_spent = std::max(result.epsilon_spent, o.privacy.epsilon());
  }
  if (scfg.plan.silo_momentum() > 0) {
    if (!s.momentum.same_layout(*o.update)) s.momentum = o.update->zeros_like();
    agent::apply_momentum(*o.update, o.weight, s.momentum, scfg.plan.silo_momentum());
  }
  s.hook->tamper(task, global, o.update->flat(), o.weight);
  return o;
}

// The upload, as the server's slot receives it: into the aggregator's buffer, checked, folded.
// `scale`: a buffered update's s(staleness), applied by the fold as the daemon's is.
bool fold_upload(server::Aggregator& agg, const std::string& silo, const agent::RoundOutput& o,
                 server::CombineContext& ctx, double scale = 1) {
  auto buf = agg.buffer();
  const auto bytes = std::as_bytes(o.update->flat());
  std::memcpy(buf.bytes.data(), bytes.data(), bytes.size());
  auto check = std::make_shared<protocol::UploadCheck>();
  protocol::check_work(check, buf.bytes.data(), o.update->size(), wire::F32, /*hash=*/true)();
  const server::Contribution c{.silos = {silo}, .weight = o.weight, .group = 0,
                                .declared_sha256 = crypto::sha256_hex(o.update->flat()), .partial_sum = false,
                                .scale = scale};
  const auto r = agg.fold(c, *check);
  if (!r && r.error().cause == server::FoldFailure::Cause::NonFinite) ++ctx.nonfinite;
  return r.has_value();
}

// Every taking part silo's round into the round's sums (the secure groups or the aggregator):
// how many were folded. The round lasts as long as its slowest silo counted: with
// selection.silos_per_round the silos drawn by the server's select() train and the first
// `target` done on the simulated clock are folded (the others are the round's stragglers, left
// out as the server closes at its target); otherwise every silo. `round_ms` gets the round's time.
std::size_t fold_round(std::vector<Silo>& silos, std::uint64_t round, const Model& global,
                       const server::ServerConfig& scfg, std::optional<GroupedSums>& groups,
                       server::Aggregator* agg, server::CombineContext& ctx, SimResult& result,
                       std::int64_t& round_ms) {
  std::vector<std::size_t> taking_part(silos.size());
  for (std::size_t i = 0; i < silos.size(); ++i) taking_part[i] = i;
  std::size_t target = silos.size();
  if (scfg.selection.silos_per_round) {
    std::vector<server::Candidate> candidates;
    for (std::size_t i = 0; i < silos.size(); ++i) candidates.push_back({.silo = silos[i].name, .route = i});
    const auto sel = server::select(candidates, round, scfg.selection, scfg.seed);
    taking_part.clear();
    for (const auto& c : sel.chosen) taking_part.push_back(static_cast<std::size_t>(c.second));
    target = sel.target;
  }
  // Each silo's training time this round; the first `target` done are counted, in silo order.
  std::vector<std::pair<std::int64_t, std::size_t>> done;
  for (auto i : taking_part) {
    silos[i].trainings = round;  // a synchronous silo trains once a round: its draw is the round's
    done.emplace_back(silos[i].train_ms(scfg.plan), i);
  }
  std::stable_sort(done.begin(), done.end());
  if (done.size() > target) done.resize(target);
  round_ms = done.empty() ? 0 : done.back().first;
  std::sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  std::size_t folded = 0;
  for (const auto& [ms, i] : done) {
    auto& s = silos[i];
    const agent::TrainTask task{round, s.name, scfg.plan};
    const auto o = silo_round(s, task, global, scfg, result);
    if (!o) continue;
    if (groups) {
      // A silo refuses to encode an update with NaN or infinite values (its session's check).
      const auto u = o->update->flat();
      if (!std::all_of(u.begin(), u.end(), [&](float v) { return std::isfinite(v / o->weight); })) continue;
      groups->add(s.name, u, o->weight, *s.hook);
      ++folded;
      continue;
    }
    if (fold_upload(*agg, s.name, *o, ctx)) ++folded;
  }
  return folded;
}

// One line of out/rounds.jsonl: what a commit (or an aborted round) took in, on the simulated clock.
void log_round(std::ofstream& log, const nlohmann::json& line) {
  log << line.dump() << "\n";
  log.flush();
}

// Buffered asynchronous rounds (server/schedule.h) on the simulated clock. Every silo trains
// on the newest model version there is when it starts and uploads when its drawn train_ms has
// passed; the upload is admitted if its base is at most max_staleness versions old, folded
// scaled by s(staleness) into the buffer (the server's aggregator), and the silo starts again
// at once on the newest version. When K updates are in, the buffer commits through the server's
// commit_round as a synchronous round does, and the next version begins. Each commit is a line
// of rounds.jsonl naming every update's silo, base version and staleness, and the refused.
void run_buffered(const server::ServerConfig& scfg, std::vector<Silo>& silos, const FederationFiles& f, Model& global,
                  server::ServerOptimizer& optimizer, std::ofstream& log, SimResult& result,
                  const RoundCallback& on_round) {
  const auto& sched = scfg.schedule;
  std::vector<std::string> names;
  for (const auto& s : silos) names.push_back(s.name);
  struct Training {
    std::int64_t done_ms;
    std::size_t silo;
    std::uint64_t base;
    std::optional<agent::RoundOutput> out;
  };
  auto later = [](const Training& a, const Training& b) {
    return a.done_ms != b.done_ms ? a.done_ms > b.done_ms : a.silo > b.silo;
  };
  std::vector<Training> queue;  // a heap, earliest first
  std::uint64_t version = 0;    // the newest committed model version
  auto start = [&](std::size_t i, std::int64_t now) {
    auto& s = silos[i];
    const auto task = s.next_task(scfg.plan);
    Training t{now + s.train_ms(scfg.plan), i, version, silo_round(s, task, global, scfg, result)};
    queue.push_back(std::move(t));
    std::push_heap(queue.begin(), queue.end(), later);
  };
  for (std::size_t i = 0; i < silos.size(); ++i) start(i, 0);
  auto agg = server::make_aggregator(scfg, global, 1, names, std::nullopt);
  server::CombineContext ctx{1, scfg.seed, 0, optimizer.last_step()};
  std::size_t in_buffer = 0;
  // Trainings in a row that brought nothing into the buffer: when every silo has had two tries
  // (their trainers fail, their budgets are spent, every update is refused), nothing could ever
  // commit again, and the run stops rather than spin.
  std::size_t fruitless = 0;
  nlohmann::json updates = nlohmann::json::array(), refused = nlohmann::json::array();
  while (version < scfg.rounds) {
    if (fruitless >= 2 * silos.size()) {
      spdlog::warn("round {}: no update reached the buffer in {} trainings in a row; the federation stops", version + 1,
                   fruitless);
      ++result.rounds_aborted;
      break;
    }
    std::pop_heap(queue.begin(), queue.end(), later);
    Training t = std::move(queue.back());
    queue.pop_back();
    const std::int64_t now = t.done_ms;
    auto& s = silos[t.silo];
    ++fruitless;  // until its update is folded
    if (t.out) {
      const auto adm = server::admit(sched, t.base, version);
      if (!adm.admitted) {
        refused.push_back({{"silo", s.name}, {"base_version", t.base}, {"staleness", adm.staleness},
                           {"reason", adm.reason}});
      } else {
        const double w = server::staleness_weight(sched, adm.staleness);
        if (fold_upload(*agg, s.name, *t.out, ctx, w)) {
          ++in_buffer;
          fruitless = 0;
          updates.push_back({{"silo", s.name}, {"base_version", t.base}, {"staleness", adm.staleness},
                             {"staleness_weight", w}, {"weight", t.out->weight}, {"arrived_ms", now}});
        } else {
          refused.push_back({{"silo", s.name}, {"base_version", t.base}, {"staleness", adm.staleness},
                             {"reason", "the server's upload checks refused it (not finite)"}});
        }
      }
    }
    if (in_buffer == sched.k) {
      const std::uint64_t round = version + 1;
      (void)agg->prepare();  // a plain sum rejects nothing here
      Model next = global.zeros_like();
      const auto c = server::commit_round([&](std::span<float> step) { return agg->combine(step, ctx); }, next.flat(),
                                          optimizer, global.flat());
      const bool committed = c.has_value();
      if (committed) {
        global = std::move(next);
        version = round;
        ++result.rounds_committed;
        result.sim_ms = now;
      }
      const auto ev = Network(global).evaluate(global.flat(), f.central_test);
      result.final_accuracy = ev.accuracy;
      result.final_loss = ev.loss;
      log_round(log, {{"round", round}, {"status", committed ? "committed" : "aborted"}, {"sim_ms", now},
                      {"accuracy", ev.accuracy}, {"loss", ev.loss}, {"schedule", server::to_json(sched)},
                      {"updates", updates}, {"refused", refused}});
      if (on_round) on_round(round, committed, global, ev.accuracy, ev.loss);
      if (!committed) {
        ++result.rounds_aborted;
        spdlog::warn("round {}: the buffer's step was not finite; the federation stops", round);
        break;
      }
      updates = nlohmann::json::array();
      refused = nlohmann::json::array();
      in_buffer = 0;
      agg = server::make_aggregator(scfg, global, version + 1, names, std::nullopt);
      ctx = server::CombineContext{version + 1, scfg.seed, 0, optimizer.last_step()};
    }
    start(t.silo, now);  // on the newest version, the commit its own upload made included
  }
}

}  // namespace

SimResult run_sim_in_process(const SimConfig& cfg, const std::filesystem::path& out, const RoundCallback& on_round) {
  // The agents' start-up lines would be noise here: warnings and errors still show.
  struct Quieter {
    spdlog::level::level_enum was = spdlog::get_level();
    Quieter() { spdlog::set_level(std::max(was, spdlog::level::warn)); }
    ~Quieter() { spdlog::set_level(was); }
  } quieter;
  refuse_protocol_modes(cfg);
  FederationFiles f = prepare_federation(cfg, out);
  auto scfg = server::load_server_config(f.server_config);
  std::vector<Silo> silos = make_silos(cfg, f);

  Model global = init_model(scfg.model);
  if (scfg.distributed_dp) server::check_distributed_dp(*scfg.distributed_dp, global.size(), f.server_config.string());
  server::ServerOptimizer optimizer(scfg.optimizer, global);
  std::optional<double> clip_norm;
  if (scfg.aggregation.adaptive_clip.on()) clip_norm = scfg.aggregation.adaptive_clip.initial;
  std::vector<std::string> names;
  for (const auto& s : silos) names.push_back(s.name);
  const std::size_t need = scfg.selection.min_updates ? scfg.selection.min_updates : scfg.selection.min_silos;

  SimResult result;
  result.exit_code = 0;
  std::ofstream log(f.out / "rounds.jsonl", std::ios::trunc);
  if (scfg.schedule.buffered()) {
    run_buffered(scfg, silos, f, global, optimizer, log, result, on_round);
    save_safetensors(f.out / "model.safetensors", global);
    result.exit_code = result.rounds_committed == scfg.rounds ? 0 : 1;
    return result;
  }
  const bool secure = scfg.secure.on();
  if (secure && scfg.selection.silos_per_round) {
    throw ConfigError("sim --in-process: sampling silos (selection.silos_per_round) with secure aggregation needs "
                      "the real processes (run xsilo sim without --in-process)");
  }
  // Silo-level central DP: the server's budget, spent by committed rounds as its coordinator does.
  privacy::Ledger central_spent;
  bool budget_ended = false;
  if (scfg.central_dp || scfg.distributed_dp) result.epsilon_spent = 0;
  std::int64_t clock_ms = 0;  // the simulated clock: each round lasts as its slowest silo counted
  for (std::uint64_t round = 1; round <= scfg.rounds; ++round) {
    if ((scfg.central_dp && !server::fits_another_round(*scfg.central_dp, central_spent)) ||
        (scfg.distributed_dp && !server::fits_another_round(*scfg.distributed_dp, central_spent))) {
      spdlog::warn("round {}: the central DP budget is spent (epsilon {:.4g}); the federation ends", round,
                   result.epsilon_spent);
      budget_ended = true;
      break;
    }
    std::unique_ptr<server::Aggregator> agg;
    std::optional<GroupedSums> groups;
    if (secure) {
      groups.emplace(scfg, round, names, global.size(), clip_norm, sim_secure_floor(cfg));
    } else {
      agg = server::make_aggregator(scfg, global, round, names, clip_norm);
    }
    server::CombineContext ctx{round, scfg.seed, 0, optimizer.last_step()};
    std::int64_t round_ms = 0;
    const std::size_t folded = fold_round(silos, round, global, scfg, groups, agg.get(), ctx, result, round_ms);
    clock_ms += round_ms;
    // Only secure groups reject in prepare(), and they are simulated apart (GroupedSums): a plain
    // aggregator's list is always empty.
    if (agg) (void)agg->prepare();
    bool committed = folded >= need;
    const std::optional<double> round_clip = clip_norm;  // adaptive clipping: this round's C, logged
    if (committed) {
      Model next = global.zeros_like();
      // The server's own commit: a step whose sum overflowed float never reaches the optimizer.
      const auto c = server::commit_round(
          [&](std::span<float> step) { return groups ? groups->combine(step, ctx) : agg->combine(step, ctx); },
          next.flat(), optimizer, global.flat());
      committed = c.has_value();
      if (committed) {
        global = std::move(next);
        if (c->next_clip_norm) clip_norm = c->next_clip_norm;
        ++result.rounds_committed;
        count_secure_clipping(c->record, result);
      }
    }
    // As the coordinator: a committed round spends, and under distributed DP so does a round
    // that aborted after unmasking a noisy sum.
    if (committed || (scfg.distributed_dp && groups && groups->revealed() > 0)) {
      if (scfg.central_dp) {
        central_spent.add(server::round_mechanism(*scfg.central_dp), 1);
        result.epsilon_spent = server::epsilon_of(central_spent, scfg.central_dp->delta);
      }
      if (scfg.distributed_dp) {
        central_spent.add(server::round_mechanism(*scfg.distributed_dp), 1);
        result.epsilon_spent = server::epsilon_of(central_spent, scfg.distributed_dp->delta);
      }
    }
    const auto ev = Network(global).evaluate(global.flat(), f.central_test);
    result.final_accuracy = ev.accuracy;
    result.final_loss = ev.loss;
    if (committed) result.sim_ms = clock_ms;
    nlohmann::json line = {{"round", round}, {"status", committed ? "committed" : "aborted"}, {"sim_ms", clock_ms},
                           {"accuracy", ev.accuracy}, {"loss", ev.loss}, {"updates", folded}};
    if (round_clip) line["clip_norm"] = *round_clip;
    log_round(log, line);
    if (on_round) on_round(round, committed, global, ev.accuracy, ev.loss);
  }
  save_safetensors(f.out / "model.safetensors", global);
  // As xsilo sim: every round committed, or the central DP budget ended the federation.
  result.exit_code = result.rounds_committed == scfg.rounds || budget_ended ? 0 : 1;
  return result;
}

}  // namespace xsilo::tools
