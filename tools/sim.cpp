// xsilo sim: runs a whole federation on this machine and follows it round by round.
#include "tools/sim.h"
#include "tools/sim_agent.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <thread>

#include "common/fs.h"
#include "common/mlp.h"
#include "common/safetensors.h"
#include "common/tensorboard.h"
#include "server/metrics.h"
#include "protocol/privacy.h"
#include "silo_agent/external_trainer.h"
#include "silo_agent/privacy_budget.h"
#include "silo_agent/sgd.h"
#include "tools/report.h"
#include "tools/sim_edge.h"
#include "tools/sim_server.h"
#include "tools/sim_stall.h"

namespace xsilo::tools {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_interrupt(int) { g_interrupted = 1; }

}  // namespace

namespace {

// The training plan the sim's training block makes (what the server sends each silo).
wire::TrainingPlan sim_plan(const SimConfig& cfg, std::uint64_t epochs_factor = 1) {
  json tr = cfg.training;
  const auto epochs = tr.value("local_epochs", 1u) * epochs_factor;
  tr["local_epochs"] = epochs;
  wire::TrainingPlan plan;
  plan.set_train(true);
  plan.set_local_epochs(static_cast<std::uint32_t>(epochs));
  plan.set_batch_size(tr.value("batch_size", 32u));
  plan.set_learning_rate(tr.value("learning_rate", 0.1f));
  plan.set_weight_decay(tr.value("weight_decay", 0.0f));
  plan.set_seed(cfg.seed);
  plan.set_config_json(tr.dump());
  return plan;
}

// Evaluates models on the pooled test rows: the built-in networks in this process, a user's own
// model through its own training script (one more copy of it, run here on the pooled data).
class CentralEvaluator {
 public:
  CentralEvaluator(const SimConfig& cfg, const FederationFiles& f) : cfg_(cfg), f_(f) {
    if (!cfg.trainer) return;
    external_ = std::make_unique<agent::ExternalTrainer>(central_trainer_config(cfg, f, f.out / "central" / "state"));
  }
  // Accuracy and loss of `m` on the pooled test rows (NaN when it cannot be evaluated).
  std::pair<double, double> evaluate(const Model& m, std::uint64_t round) {
    if (!external_) {
      const auto ev = Network(m).evaluate(m.flat(), f_.central_test);
      return {ev.accuracy, ev.loss};
    }
    try {
      agent::TrainTask task{round, "central", sim_plan(cfg_)};
      const auto ev = external_->evaluate(m, task);
      if (ev.eval_samples() == 0) return {NAN, NAN};  // the script does not evaluate: not measured, not 0
      // A script that reports its accuracy but no loss: a cross-entropy is never exactly 0.
      return {ev.eval_accuracy(), ev.eval_loss() > 0 ? ev.eval_loss() : NAN};
    } catch (const std::exception& e) {
      std::cerr << "sim: evaluating round " << round << " failed: " << e.what() << "\n";
      return {NAN, NAN};
    }
  }
  // The same model trained centrally on the pooled training rows, for as many epochs as a silo
  // saw in total; its test accuracy.
  double baseline() {
    if (!external_) {
      ModelSpec spec;
      spec.kind = cfg_.model_kind;
      spec.inputs = f_.all.features;
      spec.classes = static_cast<std::size_t>(f_.all.classes);
      spec.hidden = cfg_.hidden;
      spec.seed = model_init_seed(cfg_);  // the federation's initial model (sim_files.cpp)
      Model m = init_model(spec);
      const auto plan = sim_plan(cfg_, cfg_.rounds);
      agent::TrainOptions opts;
      opts.epochs = plan.local_epochs();
      opts.batch_size = plan.batch_size();
      opts.learning_rate = plan.learning_rate();
      opts.weight_decay = plan.weight_decay();
      opts.seed = sim_seed(cfg_, "baseline-row-order");
      if (cfg_.privacy) {
        // The same DP-SGD on the pooled rows, at the same epsilon over all its steps: what the
        // federation is compared against under record-level privacy.
        const auto& p = *cfg_.privacy;
        opts.dp.clip_norm = p.clip_norm;
        opts.dp.sample_rate = std::min(1.0, static_cast<double>(opts.batch_size) / static_cast<double>(f_.central_train.rows));
        const auto steps = agent::dp_steps_per_epoch(opts.dp.sample_rate) * opts.epochs;
        opts.dp.noise_multiplier = protocol::dp_sgd_noise_for({}, opts.dp.sample_rate, steps, 1, p.max_epsilon, p.delta);
        if (opts.dp.noise_multiplier == 0) return -1;
      }
      const Network net(m);
      agent::train_sgd(net, m.flat(), f_.central_train, opts);
      return net.evaluate(m.flat(), f_.central_test).accuracy;
    }
    try {
      const Model init = load_safetensors(f_.initial_model);
      Model trained = init.zeros_like();
      agent::TrainTask task{1, "central", sim_plan(cfg_, cfg_.rounds)};
      external_->train(init, task, trained);
      const auto ev = external_->evaluate(trained, task);
      if (ev.eval_samples() == 0) {
        std::cerr << "sim: the script does not evaluate (no evaluate task answered): no central accuracy to compare\n";
        return -1;
      }
      return ev.eval_accuracy();
    } catch (const std::exception& e) {
      std::cerr << "sim: central training failed: " << e.what() << "\n";
      return -1;
    }
  }

 private:
  const SimConfig& cfg_;
  const FederationFiles& f_;
  std::unique_ptr<agent::ExternalTrainer> external_;
};

}  // namespace

namespace {

// The federation's processes by name: started, killed and restarted by faults, and stopped
// together at the end.
class Processes {
 public:
  explicit Processes(std::filesystem::path logs) : logs_(std::move(logs)) {}
  void start(const std::string& name, std::vector<std::string> argv) {
    argv_[name] = std::move(argv);
    launch(name);
  }
  Process& operator[](const std::string& name) { return *procs_.at(name); }
  bool running(const std::string& name) const { return procs_.count(name) && procs_.at(name)->running(); }
  void set_argv(const std::string& name, std::vector<std::string> argv) { argv_[name] = std::move(argv); }
  bool has(const std::string& name) const { return argv_.count(name) > 0; }
  // SIGKILL, and wait until it is gone.
  void kill(const std::string& name) {
    procs_[name]->signal(SIGKILL);
    procs_[name]->wait(std::chrono::milliseconds(5000));
  }
  void relaunch(const std::string& name) { launch(name); }
  // The others got Finished from the server (or their edge): one grace period for all of them,
  // then whatever is left (an edge restarted after the end, its silos) is stopped together.
  void finish(std::chrono::milliseconds grace) {
    const auto end = Clock::now() + grace;
    for (auto& [name, p] : procs_) {
      if (name != "server") {
        p->wait(std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now())));
      }
    }
    for (auto& [name, p] : procs_) {
      if (p->running()) p->signal(SIGTERM);
    }
    // A stopped agent still shuts its trainer down (up to 10 s) before it exits.
    for (auto& [name, p] : procs_) {
      if (!p->wait(std::chrono::milliseconds(12000))) p->stop(std::chrono::milliseconds(0));
    }
  }

 private:
  void launch(const std::string& name) { procs_[name] = std::make_unique<Process>(argv_[name], logs_ / (name + ".log")); }
  std::filesystem::path logs_;
  std::map<std::string, std::vector<std::string>> argv_;
  std::map<std::string, std::unique_ptr<Process>> procs_;
};

// Fires the rehearsed faults on the server's progress events (events.jsonl): a round starting
// ("train"), its first upload grant ("upload"). A silo's "after_*" faults are its own hook; the
// player counts them when the silo dies of them (its exit code kCrashExit, in the round they name).
class FaultPlayer {
 public:
  // Each fault fired is a line of `log` (OUT/faults.jsonl): round, phase, process, action.
  FaultPlayer(const SimConfig& cfg, std::filesystem::path events, const std::filesystem::path& log)
      : cfg_(cfg), events_(std::move(events)), done_(cfg.faults.size()), log_(log) {}
  // A fault fires only while its round is still the latest round the events show, read again
  // right before the kill: one read behind would land it in a later round than it names. Such a
  // fault is missed, said so, and not counted as fired. Faults on one event are killed together
  // and restarted together after one pause, so a second one does not wait out the first's.
  template <class Say>
  void poll(Processes& procs, Say&& say) {
    if (cfg_.faults.empty()) return;
    const auto events = read_events();
    for (const auto& [name, round] : events) {
      std::vector<std::size_t> due;
      for (std::size_t k = 0; k < cfg_.faults.size(); ++k) {
        const auto& fault = cfg_.faults[k];
        if (done_[k] || fault.phase.rfind("after_", 0) == 0 || fault.round != round) continue;
        if (name != (fault.phase == "train" ? "round_started" : "upload_granted")) continue;
        done_[k] = true;
        due.push_back(k);
      }
      if (due.empty()) continue;
      for (auto&& later : read_events()) pending_.push_back(std::move(later));  // the newest round, now
      std::vector<std::size_t> restart;
      for (const auto k : due) {
        const auto& fault = cfg_.faults[k];
        const std::string what = fault.action + " " + fault.process + " in round " + std::to_string(round) + " (" + fault.phase + ")";
        if (round < latest_) {
          ++missed_;
          const bool hint = cfg_.train_max_ms == 0 && missed_ == 1;  // said once
          say("  fault missed: " + what + ": round " + std::to_string(latest_) + " had started when it was seen" +
              (hint ? "; rounds this short outrun the faults: give the sim \"train_ms\": [100, 300]" : ""));
          continue;
        }
        procs.kill(fault.process);
        fired(fault, say, what);
        if (fault.action == "restart") restart.push_back(k);
      }
      if (!restart.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        for (const auto k : restart) procs.relaunch(cfg_.faults[k].process);
      }
    }
    // A silo's own crash after a secure step: it exits with kCrashExit in the round the fault names
    // (tools/sim_agent.cpp); counted once it has.
    for (std::size_t k = 0; k < cfg_.faults.size(); ++k) {
      const auto& fault = cfg_.faults[k];
      if (done_[k] || fault.phase.rfind("after_", 0) != 0 || !procs.has(fault.process)) continue;
      const auto code = procs[fault.process].wait(std::chrono::milliseconds(0));
      if (!code) continue;
      done_[k] = true;
      if (*code != kCrashExit) continue;  // it ended otherwise (killed by a fault, or the federation finished first)
      const std::string what = fault.action + " " + fault.process + " in round " + std::to_string(fault.round) + " (" +
                               fault.phase + ", its own hook)";
      fired(fault, say, what);
      if (fault.action == "restart") {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        procs.relaunch(fault.process);
      }
    }
  }

 private:
  // The events written since the last read (and those read ahead of a kill).
  std::vector<std::pair<std::string, std::uint64_t>> read_events() {
    std::vector<std::pair<std::string, std::uint64_t>> events = std::exchange(pending_, {});
    std::ifstream in(events_, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(read_));
    for (std::string line; std::getline(in, line);) {
      if (in.eof()) break;  // a line still being written
      read_ += line.size() + 1;
      try {
        const json ev = json::parse(line);
        events.emplace_back(ev.value("event", ""), ev.value("round", std::uint64_t{0}));
      } catch (const json::exception&) {
        continue;
      }
      if (events.back().first == "round_started") latest_ = std::max(latest_, events.back().second);
    }
    return events;
  }
  template <class Say>
  void fired(const SimConfig::Fault& fault, Say&& say, const std::string& what) {
    ++fired_;
    say("  fault: " + what);
    log_ << json{{"round", fault.round}, {"phase", fault.phase}, {"process", fault.process}, {"action", fault.action}}.dump()
         << std::endl;
  }

  const SimConfig& cfg_;
  std::filesystem::path events_;
  std::vector<bool> done_;
  std::vector<std::pair<std::string, std::uint64_t>> pending_;
  std::size_t read_ = 0, fired_ = 0, missed_ = 0;
  std::uint64_t latest_ = 0;
  std::ofstream log_;

 public:
  std::size_t fired() const { return fired_; }
  std::size_t missed() const { return missed_; }
};

// Each record of an audit log that parses, in order, one line in memory at a time (only the lines
// `containing` a string, where given: the others are not parsed); a damaged line, or one being
// written, is passed over (the verify command the run prints says which).
template <class Fn>
void each_audit_record(const std::filesystem::path& audit, Fn&& fn, const char* containing = nullptr) {
  std::ifstream in(audit);
  for (std::string line; std::getline(in, line);) {
    if (containing && line.find(containing) == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      continue;
    }
    fn(j);
  }
}

// Follows the server's metrics.csv: evaluates each committed model on the held-out rows,
// writes the sim's own metrics.csv and prints one line per round.
class Progress {
 public:
  Progress(const SimConfig& cfg, const FederationFiles& f, CentralEvaluator& central, SimResult& result)
      : cfg_(cfg), f_(f), central_(central), result_(result), out_(f.out / "metrics.csv"),
        resources_(f.out / "server_resources.csv") {
    if (!cfg.tensorboard.empty()) tensorboard_ = std::make_unique<TensorBoardWriter>(cfg.tensorboard);
    out_ << "round,committed,accuracy,loss,fed_eval_accuracy,fed_eval_loss,train_loss,silos_reporting,dropped,seconds\n";
    resources_ << "round,pid,rss_kb,fds\n";
  }
  // `server` is the server process now (a restarted server has another pid): its memory and
  // descriptors are sampled as each round's row appears, so every sample is taken at the same
  // point of a round (just after it ended).
  template <class Say>
  void poll(Say&& say, pid_t server) {
    server_ = server;
    std::vector<server::MetricsRow> rows;
    try {
      rows = server::read_metrics(f_.state / "metrics.csv");
    } catch (const std::exception& e) {
      say(std::string("  cannot read the server's metrics: ") + e.what());
      return;
    }
    for (; seen_ < rows.size(); ++seen_) report(rows[seen_], say);
  }
  std::vector<double> rounds;  // committed rounds

 private:
  template <class Say>
  void report(const server::MetricsRow& r, Say&& say) {
    double acc = NAN, l = NAN;
    if (r.committed) {
      char name[64];
      std::snprintf(name, sizeof name, "round_%06llu.safetensors", static_cast<unsigned long long>(r.round));
      std::tie(acc, l) = central_.evaluate(load_safetensors(f_.state / "checkpoints" / name), r.round);
      ++result_.rounds_committed;
      rounds.push_back(static_cast<double>(r.round));
      result_.final_accuracy = acc;
      result_.final_loss = l;
      // Under a record-level budget no silo reports a loss (docs/privacy.md): not measured, not 0.
      result_.final_train_loss = cfg_.privacy ? NAN : r.train_loss;
    }
    out_ << r.round << "," << (r.committed ? 1 : 0) << "," << acc << "," << l << "," << r.fed_eval_accuracy << ","
         << r.fed_eval_loss << "," << r.train_loss << "," << r.reported << "," << r.dropped << "," << r.seconds << "\n";
    out_.flush();
    if (tensorboard_) tensorboard_->write(static_cast<std::int64_t>(r.round), tensorboard_scalars(r, acc, l));
    char line[256];
    const std::string edges = cfg_.edges ? " | edges " + std::to_string(r.edges) + "/" + std::to_string(cfg_.edges) : "";
    if (r.committed) {
      // The silos' training loss (what they reported), then the model's test loss and accuracy on
      // the pooled test rows where they were measured (a script that does not evaluate has none).
      char test[64] = "";
      if (!std::isnan(acc) && !std::isnan(l)) {
        std::snprintf(test, sizeof test, " | test loss %.4f | acc %6.2f%%", l, 100 * acc);
      } else if (!std::isnan(acc)) {
        std::snprintf(test, sizeof test, " | acc %6.2f%%", 100 * acc);
      }
      std::snprintf(line, sizeof line, "round %3llu/%llu | silos %zu/%zu%s | dropped %zu | train loss %.4f%s | %5.2f s",
                    static_cast<unsigned long long>(r.round), static_cast<unsigned long long>(cfg_.rounds), r.reported,
                    r.selected, edges.c_str(), r.dropped, r.train_loss, test, r.seconds);
    } else {
      ++result_.rounds_aborted;
      std::snprintf(line, sizeof line, "round %3llu/%llu | ABORTED | silos %zu/%zu | dropped %zu | %5.2f s",
                    static_cast<unsigned long long>(r.round), static_cast<unsigned long long>(cfg_.rounds), r.reported,
                    r.selected, r.dropped, r.seconds);
      if (const auto why = aborted_reason(r.round); !why.empty()) {
        say(line);
        std::snprintf(line, sizeof line, "          why: %.200s", why.c_str());
      }
    }
    say(line);
    sample_server(r.round);
  }
  // The reason the server's audit record gives for aborting `round` ("" when none can be read:
  // the record is written before the metrics row that reports the round).
  std::string aborted_reason(std::uint64_t round) const {
    std::string reason;
    each_audit_record(
        f_.state / "audit.jsonl",
        [&](const json& a) {
          if (a.value("event", "") == "round" && a.value("round", std::uint64_t{0}) == round &&
              a.value("status", "") == "aborted") {
            reason = a.value("reason", "");
          }
        },
        "\"aborted\"");
    return reason;
  }
  // server_resources.csv: the server's resident memory (VmRSS of /proc/PID/status) and open
  // descriptors (entries of /proc/PID/fd) after each round; nothing where /proc has no such
  // process (it is being restarted, or this is not Linux).
  void sample_server(std::uint64_t round) {
    if (server_ <= 0) return;
    const auto r = process_resources(server_);
    if (!r) return;
    resources_ << round << "," << server_ << "," << r->rss_bytes / 1024 << "," << r->open_descriptors << "\n";
    resources_.flush();
  }
  const SimConfig& cfg_;
  const FederationFiles& f_;
  CentralEvaluator& central_;
  SimResult& result_;
  std::ofstream out_, resources_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::size_t seen_ = 0;
  pid_t server_ = -1;
};

// The script a trainer command runs ("train.py --epochs 3"), without the interpreter's path.
std::string trainer_command(const SimConfig::Trainer& t) {
  std::string out;
  for (std::size_t i = 0; i < t.command.size(); ++i) {
    const std::string& a = t.command[i];
    if (i == 0 && t.command.size() > 1) continue;  // python3
    out += (out.empty() ? "" : " ") + a;
  }
  return out.size() > 60 ? out.substr(0, 57) + "..." : out;
}

std::string describe(const SimConfig& cfg, const FederationFiles& f) {
  std::string sizes;
  for (std::size_t i = 0; i < cfg.silos; ++i) {
    sizes += (i ? ", " : "") + std::to_string(load_csv(f.out / "silos" / f.silos[i] / "train.csv").rows);
  }
  return "xsilo sim: " + cfg.name + " | " + std::to_string(cfg.silos) + " silos, " + std::to_string(cfg.rounds) +
         " rounds | " + cfg.data_path.filename().string() + " (" + std::to_string(f.all.rows) + " rows, " +
         std::to_string(f.all.features) + " features, " + std::to_string(f.all.classes) + " classes) | split " +
         cfg.split + (cfg.split == "dirichlet" ? " alpha=" + std::to_string(cfg.alpha).substr(0, 4) : "") +
         (cfg.trainer ? " | trainer: " + trainer_command(*cfg.trainer) : "") + "\n  training rows per silo: " + sizes +
         "; " + std::to_string(f.central_test.rows) + " test rows";
}

// The federation's processes: the server, the edges (listening before their silos dial), the
// agents.
void start_federation(const SimConfig& cfg, FederationFiles& f, Processes& procs) {
  for (const auto& [name, what] : cfg.hostile) {
    if (name != "server" && !std::count(f.edges.begin(), f.edges.end(), name) &&
        !std::count(f.silos.begin(), f.silos.end(), name)) {
      throw ConfigError("sim: hostile names process \"" + name + "\", which this federation does not have");
    }
  }
  if (auto h = cfg.hostile.find("server"); h != cfg.hostile.end()) {
    f.server_simulate = f.out / "configs" / "server.simulate.json";
    atomic_write_file(f.server_simulate, to_json(SimServerConfig{h->second, f.out / "hostile_server.jsonl"}).dump(2) + "\n");
  }
  procs.start("server", server_argv(f, self_exe()));
  wait_for_port(procs["server"], f);
  procs.set_argv("server", server_argv(f, self_exe()));  // a restart binds the same port
  for (std::size_t e = 0; e < f.edges.size(); ++e) {
    std::vector<std::string> argv{self_exe(), "edge", "--config", edge_config_path(f, e).string()};
    if (auto h = cfg.hostile.find(f.edges[e]); h != cfg.hostile.end()) {
      const auto sim = f.out / "configs" / (f.edges[e] + ".simulate.json");
      atomic_write_file(sim, to_json(SimEdgeConfig{h->second, f.silos}).dump(2) + "\n");
      argv.insert(argv.end(), {"--simulate", sim.string()});
    }
    procs.start(f.edges[e], argv);
  }
  for (std::size_t e = 0; e < f.edges.size(); ++e) wait_for_edge(procs[f.edges[e]], f, e);
  for (std::size_t i = 0; i < cfg.silos; ++i) {
    procs.start(f.silos[i], write_agent_config(cfg, f, i, agent_upstreams(cfg, f, i)).argv(self_exe()));
  }
}

// The agents that run now, for StallWatch (tools/sim_stall.h), with the server's
// selection.min_silos as what a round needs.
std::size_t stall_needed(const SimConfig& cfg) { return sim_min_silos(cfg); }

std::size_t agents_running(Processes& procs, const FederationFiles& f) {
  std::size_t alive = 0;
  for (const auto& s : f.silos) alive += procs.running(s) ? 1 : 0;
  return alive;
}

// Each agent that exited: its exit code, its last error when its last lines do not show it, and
// the last lines of its log.
std::string exited_agents(Processes& procs, const FederationFiles& f) {
  std::string out;
  for (const auto& s : f.silos) {
    if (procs.running(s)) continue;
    const auto code = procs[s].exit_code();
    const auto log = f.logs / (s + ".log");
    out += "  " + s + " exited" + (code ? " with code " + std::to_string(*code) : "");
    const auto error = last_error_above_tail(log, 4);
    out += error.empty() ? "; its log ends:\n" : "; its last error:\n    " + error.substr(0, 400) + "\n  and its log ends:\n";
    out += log_tail(log, 4);
  }
  return out;
}

// Runs until the server exits (a server killed by a "restart" fault comes back: its exit is not
// the end), the user interrupts, or no round can go on (`stalled` says why); returns the server's
// exit code.
template <class Say>
int follow(const SimConfig& cfg, const FederationFiles& f, Processes& procs, FaultPlayer& faults, Progress& progress,
           std::string& stalled, Say&& say) {
  StallWatch watch(stall_needed(cfg));
  auto prev_handler = std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  const bool restarts_server = std::any_of(cfg.faults.begin(), cfg.faults.end(), [](const auto& fl) {
    return fl.process == "server" && fl.action == "restart";
  });
  std::optional<int> exit;
  while (!exit) {
    progress.poll(say, procs["server"].pid());
    faults.poll(procs, say);
    if (g_interrupted) {
      say("interrupted: stopping the federation");
      procs["server"].stop();
      break;
    }
    if (const auto st = watch.check(agents_running(procs, f), f.silos.size(), StallWatch::Clock::now()); !st) {
      stalled = st.error().message();
      say("the federation cannot go on: " + stalled + "; stopping the server\n" + exited_agents(procs, f));
      procs["server"].stop();
      exit = procs["server"].exit_code();
      break;
    }
    exit = procs["server"].wait(std::chrono::milliseconds(cfg.faults.empty() ? 50 : 5));
    if (exit && *exit == 128 + SIGKILL && !g_interrupted && restarts_server) {
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
      if (procs["server"].running()) exit.reset();
    }
  }
  progress.poll(say, -1);
  std::signal(SIGINT, prev_handler);
  std::signal(SIGTERM, SIG_DFL);
  return exit.value_or(-1);
}

// model.safetensors (the last committed round), the audit log and its key, next to metrics.
// Record-level privacy: the largest epsilon a silo spent, from each silo's own log (-1: off).
// Silo level: the epsilon the last committed round's audit record states (0: none committed).
double epsilon_spent(const SimConfig& cfg, const FederationFiles& f) {
  if (cfg.silo_privacy.is_object()) {
    double eps = 0;
    each_audit_record(f.out / "audit.jsonl", [&](const json& j) {
      if (j.value("event", "") == "round" && j.value("status", "") == "committed" && j.contains("privacy")) {
        eps = j["privacy"].value("epsilon", eps);
      }
    });
    return eps;
  }
  if (!cfg.privacy) return -1;
  double most = 0;
  for (const auto& silo : f.silos) {
    const agent::PrivacyBudget budget(*cfg.privacy, f.out / "silos" / silo / "state" / "sent.jsonl");
    most = std::max(most, protocol::dp_sgd_epsilon(budget.spent(), cfg.privacy->delta));
  }
  return most;
}

// The reason of the audit log's federation_end record ("" when there is none).
std::string federation_end_reason(const std::filesystem::path& audit) {
  std::string reason;
  each_audit_record(audit, [&](const json& j) {
    if (j.value("event", "") == "federation_end") reason = j.value("reason", "");
  });
  return reason;
}

// What secure.clip_norm did over the committed rounds (their records' secure.clipped), into
// `result`.
void count_audited_clipping(const std::filesystem::path& audit, SimResult& result) {
  each_audit_record(audit, [&](const json& r) {
    if (r.value("event", "") == "round" && r.value("status", "") == "committed") count_secure_clipping(r, result);
  });
}

void copy_outputs(const FederationFiles& f, const std::vector<double>& rounds) {
  if (!rounds.empty()) {
    char name[64];
    std::snprintf(name, sizeof name, "round_%06llu.safetensors", static_cast<unsigned long long>(rounds.back()));
    std::filesystem::copy_file(f.state / "checkpoints" / name, f.out / "model.safetensors",
                               std::filesystem::copy_options::overwrite_existing);
  }
  for (const char* name : {"audit.jsonl", "audit.pub"}) {
    if (std::filesystem::exists(f.state / name)) {
      std::filesystem::copy_file(f.state / name, f.out / name, std::filesystem::copy_options::overwrite_existing);
    }
  }
}

// The kill storm's faults, counted by kind of process.
std::string kill_storm_line(const SimConfig& cfg) {
  std::map<std::string, std::size_t> kinds;
  for (const auto& fl : cfg.faults) ++kinds[fl.process == "server" ? "server" : fl.process.substr(0, fl.process.find('-'))];
  std::string per;
  for (const auto& [k, n] : kinds) per += (per.empty() ? "" : ", ") + std::to_string(n) + " " + k;
  return "  kill storm: seed " + std::to_string(cfg.kill_storm->seed) + ", " + std::to_string(cfg.faults.size()) +
         " SIGKILLs and restarts (" + per + ")";
}

// OUT/summary.json (and the privacy spent, into `result`).
void write_summary(const SimConfig& cfg, const FederationFiles& f, const std::filesystem::path& out,
                   SimResult& result, const FaultPlayer& faults, int server_code, double secs,
                   const std::string& stalled) {
  json summary = {{"name", cfg.name},
                  {"rounds", cfg.rounds},
                  {"rounds_committed", result.rounds_committed},
                  {"rounds_aborted", result.rounds_aborted},
                  {"faults_fired", faults.fired()},
                  {"faults_missed", faults.missed()},
                  {"server_exit_code", server_code},
                  {"final_accuracy", result.final_accuracy},  // NaN (null): not measured
                  {"final_loss", result.final_loss},
                  {"final_train_loss", result.final_train_loss},
                  {"seconds", secs}};
  if (result.baseline_accuracy >= 0) summary["centralized_accuracy"] = result.baseline_accuracy;
  if (!stalled.empty()) summary["stalled"] = stalled;
  result.epsilon_spent = epsilon_spent(cfg, f);
  if (result.epsilon_spent >= 0) summary["epsilon_spent"] = result.epsilon_spent;
  if (result.secure_counted > 0) {
    summary["secure_clipped"] = {{"updates", result.secure_clipped},
                                 {"of", result.secure_counted},
                                 {"rounds", result.secure_clipped_rounds},
                                 {"of_rounds", result.secure_counted_rounds},
                                 {"clip_norm", result.secure_clip_norm}};
  }
  atomic_write_file(out / "summary.json", summary.dump(2) + "\n");
}

// The closing lines: the outcome, the privacy spent, the centralized baseline, the outputs and how
// to verify the audit log; the server's log when it failed on its own.
template <class Say>
void say_outcome(const SimConfig& cfg, const FederationFiles& f, const std::filesystem::path& out,
                 const SimResult& result, bool ok, bool budgets_spent, const std::string& ended, int server_code,
                 double secs, const std::string& stalled, Say&& say) {
  char line[256];
  char accuracy[96] = "; final test accuracy not measured (the script does not evaluate)";
  if (!std::isnan(result.final_accuracy)) {
    std::snprintf(accuracy, sizeof accuracy, "; final test accuracy %.2f%%", 100 * result.final_accuracy);
  }
  std::snprintf(line, sizeof line, "%s: %llu/%llu rounds committed in %.1f s%s%s", ok ? "done" : "FAILED",
                static_cast<unsigned long long>(result.rounds_committed), static_cast<unsigned long long>(cfg.rounds),
                secs, result.rounds_committed ? accuracy : "", stalled.empty() ? "" : (" (" + stalled + ")").c_str());
  say(line);
  if (result.epsilon_spent >= 0 && cfg.privacy) {
    std::snprintf(line, sizeof line, "  record-level privacy: epsilon %.3f of %g spent (delta %g), the largest over silos",
                  result.epsilon_spent, cfg.privacy->max_epsilon, cfg.privacy->delta);
    say(line);
  } else if (result.epsilon_spent >= 0) {
    std::snprintf(line, sizeof line, "  silo-level %s DP: epsilon %.3f of %g spent (delta %g)",
                  cfg.silo_privacy.value("mode", "central").c_str(), result.epsilon_spent,
                  cfg.silo_privacy.value("epsilon", 0.0), cfg.silo_privacy.value("delta", 1e-5));
    say(line);
  }
  if (budgets_spent) say("  the federation ended before its last round: " + ended);
  for (const auto& l : secure_clipping_lines(result)) say(l);
  if (result.baseline_accuracy >= 0 && !std::isnan(result.final_accuracy)) {
    std::snprintf(line, sizeof line, "  centralized training on the pooled data%s: %.2f%% (difference %+.2f points)",
                  !cfg.privacy ? "" : cfg.trainer ? " (the script's own DP-SGD)" : " (DP-SGD, the same epsilon)",
                  100 * result.baseline_accuracy, 100 * (result.final_accuracy - result.baseline_accuracy));
    say(line);
  }
  say("  outputs: " + (out / "metrics.csv").string() + ", model.safetensors, audit.jsonl + audit.pub, report.html");
  // Against one silo's witnessed heads too: a log cut or rewritten after the fact fails there.
  say("  verify the audit log: xsilo audit verify " + (out / "audit.jsonl").string() + " --key " +
      (out / "audit.pub").string() +
      (f.silos.empty() ? "" : " --witness " + (out / "silos" / f.silos[0] / "state" / "audit_heads.jsonl").string()));
  if (!ok && stalled.empty() && server_code != 0 && server_code != 3) {
    say("  the server exited with code " + std::to_string(server_code) + "; its log ends:\n" + log_tail(f.logs / "server.log"));
  }
}

}  // namespace

void count_secure_clipping(const nlohmann::json& record, SimResult& result) {
  if (!record.is_object() || !record.contains("secure") || !record["secure"].is_object()) return;
  const auto& secure = record["secure"];
  if (!secure.contains("clipped")) return;
  // Under adaptive clipping, clipping is the point: not counted.
  if (record.contains("robust") && record["robust"].is_object() && record["robust"].contains("adaptive_clip")) return;
  const auto& c = secure["clipped"];
  const auto scaled = c.value("updates", std::uint64_t{0});
  result.secure_clipped += scaled;
  result.secure_counted += c.value("of", std::uint64_t{0});
  result.secure_clipped_rounds += scaled > 0 ? 1 : 0;
  ++result.secure_counted_rounds;
  result.secure_clip_norm = c.value("clip_norm", 0.0);
}

std::vector<std::string> secure_clipping_lines(const SimResult& result) {
  if (result.secure_clipped == 0) return {};
  char line[256];
  std::snprintf(line, sizeof line,
                "  secure.clip_norm %g scaled down %llu of %llu updates (in %llu of %llu rounds): each such round's "
                "step was damped and biased against plain mode;",
                result.secure_clip_norm, static_cast<unsigned long long>(result.secure_clipped),
                static_cast<unsigned long long>(result.secure_counted),
                static_cast<unsigned long long>(result.secure_clipped_rounds),
                static_cast<unsigned long long>(result.secure_counted_rounds));
  return {line,
          "    raise it (the config check says when the ring needs more room for it) or let "
          "aggregation.adaptive_clip follow the norms (docs/configs.md, secure.clip_norm)"};
}

SimResult run_sim(const SimConfig& cfg, const std::filesystem::path& out, bool quiet) {
  SimResult result;
  auto say = [&](const std::string& s) {
    if (!quiet) std::cout << s << std::endl;
  };
  const auto t_start = Clock::now();
  FederationFiles f = prepare_federation(cfg, out);
  say(describe(cfg, f));
  if (cfg.kill_storm) say(kill_storm_line(cfg));
  Processes procs(f.logs);
  start_federation(cfg, f, procs);
  say("  server on 127.0.0.1:" + std::to_string(f.server_port) + " (mutual TLS 1.3), " +
      (f.edges.empty() ? std::string() : std::to_string(f.edges.size()) + " edges, ") + std::to_string(cfg.silos) +
      " agents started; logs in " + f.logs.string());
  say("  watch it: xsilo status --server 127.0.0.1:" + std::to_string(f.server_port) + " --kit " +
      (f.pki / "kits" / "operator").string() +
      (cfg.metrics ? "; metrics ports in " + (f.out / "metrics").string() : std::string()));
  CentralEvaluator central(cfg, f);
  FaultPlayer faults(cfg, f.state / "events.jsonl", f.out / "faults.jsonl");
  Progress progress(cfg, f, central, result);
  std::string stalled;
  const int server_code = follow(cfg, f, procs, faults, progress, stalled, say);
  // Each agent sends its trainer the shutdown task and gives it 10 s to exit (the script's code
  // after its loop runs): the agents get longer than that before they are stopped.
  procs.finish(std::chrono::milliseconds(15000));

  copy_outputs(f, progress.rounds);
  if (cfg.baseline && !g_interrupted) result.baseline_accuracy = central.baseline();
  const double secs = std::chrono::duration<double>(Clock::now() - t_start).count();
  count_audited_clipping(out / "audit.jsonl", result);
  write_summary(cfg, f, out, result, faults, server_code, secs, stalled);
  // From the files just written, as `xsilo report OUT` would draw it.
  write_report(run_sources(out), out / "report.html", out / "report.svg");

  // Under a kill storm a round may abort (its silos were killed; the audit record says why,
  // and the server exits 3): the run is whole when every round ended, committed or aborted.
  // Under record-level privacy the server ends the federation, audited, once too few silos have
  // budget left for a round: the run is whole then too, however many rounds it committed.
  const std::string ended = federation_end_reason(out / "audit.jsonl");
  // Silo-level central DP: the server ends it, audited, once another round would pass the budget.
  const bool budgets_spent = (cfg.privacy || cfg.silo_privacy.is_object()) && server_code == 0 &&
                             (ended.rfind("privacy budgets spent", 0) == 0 || ended.rfind("privacy budget spent", 0) == 0);
  const bool ok = budgets_spent ||
                  (cfg.kill_storm ? (server_code == 0 || server_code == 3) &&
                                        result.rounds_committed + result.rounds_aborted == cfg.rounds
                                  : server_code == 0 && result.rounds_committed == cfg.rounds);
  say_outcome(cfg, f, out, result, ok, budgets_spent, ended, server_code, secs, stalled, say);
  result.exit_code = ok ? 0 : 1;
  return result;
}

}  // namespace xsilo::tools
