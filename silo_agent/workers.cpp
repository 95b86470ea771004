#include "silo_agent/workers.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/fs.h"
#include "common/process.h"
#include "common/safetensors.h"
#include "crypto/hash.h"
#include "silo_agent/collective/gossip_links.h"
#include "silo_agent/gossip.h"

namespace xsilo::agent {

const std::vector<std::string>& local_algorithms() {
  static const std::vector<std::string> names{"data_parallel", "gossip"};
  return names;
}

LocalAlgorithm parse_local_algorithm(const std::string& name) {
  const auto& names = local_algorithms();
  const auto at = std::find(names.begin(), names.end(), name);
  if (at == names.end()) throw std::invalid_argument("local algorithms are data_parallel and gossip, not " + name);
  return static_cast<LocalAlgorithm>(at - names.begin());
}

const std::string& name(LocalAlgorithm a) { return local_algorithms().at(static_cast<std::size_t>(a)); }

void save_job(const std::filesystem::path& path, const WorkerJob& job) {
  nlohmann::json j{{"model", job.model.string()},
                   {"data", job.data.string()},
                   {"out", job.out.string()},
                   {"epochs", job.train.epochs},
                   {"batch_size", job.train.batch_size},
                   {"learning_rate", job.train.learning_rate},
                   {"weight_decay", job.train.weight_decay},
                   {"seed", job.train.seed},
                   {"shards", job.shards},
                   {"algorithm", name(job.algorithm)},
                   {"first_bucket_bytes", job.buckets.first_bytes},
                   {"bucket_bytes", job.buckets.bytes},
                   {"bucket_compression", job.buckets.compression},
                   {"topk_fraction", job.buckets.topk_fraction},
                   {"stragglers", job.buckets.stragglers}};
  if (!job.progress.empty()) {
    j["progress"] = job.progress.string();
    j["checkpoint_ms"] = job.checkpoint_interval.count();
    j["key"] = job.key;
  }
  if (job.start.op > 0) {
    j["start_op"] = job.start.op;
    j["step_loss"] = job.start.step_loss;
  }
  atomic_write_file(path, j.dump(2) + "\n");
}

WorkerJob load_job(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read the job file " + path.string());
  const auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw std::runtime_error(path.string() + ": not a JSON object");
  try {
    WorkerJob job;
    job.model = j.at("model").get<std::string>();
    job.data = j.at("data").get<std::string>();
    job.out = j.at("out").get<std::string>();
    job.train.epochs = j.at("epochs").get<std::uint32_t>();
    job.train.batch_size = j.at("batch_size").get<std::uint32_t>();
    job.train.learning_rate = j.at("learning_rate").get<float>();
    job.train.weight_decay = j.at("weight_decay").get<float>();
    job.train.seed = j.at("seed").get<std::uint64_t>();
    job.shards = j.at("shards").get<int>();
    job.algorithm = parse_local_algorithm(j.value("algorithm", std::string("data_parallel")));
    job.buckets.first_bytes = j.at("first_bucket_bytes").get<std::size_t>();
    job.buckets.bytes = j.at("bucket_bytes").get<std::size_t>();
    job.buckets.compression = j.value("bucket_compression", std::string("none"));
    job.buckets.topk_fraction = j.value("topk_fraction", 0.01);
    job.buckets.stragglers = j.value("stragglers", 0);
    job.progress = j.value("progress", std::string());
    job.checkpoint_interval = std::chrono::milliseconds(j.value("checkpoint_ms", std::int64_t{0}));
    job.key = j.value("key", std::string());
    job.start.op = j.value("start_op", std::uint64_t{0});
    job.start.step_loss = j.value("step_loss", std::vector<float>{});
    if (job.shards < 1) throw std::runtime_error("shards must be at least 1");
    return job;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path.string() + ": " + e.what());
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(path.string() + ": " + e.what());
  }
}

std::string job_key(const Model& global, const WorkerJob& job, const std::string& topology) {
  nlohmann::json options{{"epochs", job.train.epochs},
                         {"batch_size", job.train.batch_size},
                         {"learning_rate", job.train.learning_rate},
                         {"weight_decay", job.train.weight_decay},
                         {"seed", job.train.seed},
                         {"shards", job.shards},
                         {"algorithm", name(job.algorithm)},
                         {"data", job.data.string()},
                         {"data_bytes", std::filesystem::file_size(job.data)},
                         {"data_written", std::filesystem::last_write_time(job.data).time_since_epoch().count()},
                         {"first_bucket_bytes", job.buckets.first_bytes},
                         {"bucket_bytes", job.buckets.bytes},
                         {"bucket_compression", job.buckets.compression},
                         {"topk_fraction", job.buckets.topk_fraction},
                         {"stragglers", job.buckets.stragglers},
                         {"topology", topology}};
  return crypto::sha256_hex(crypto::sha256_hex(global.flat()) + options.dump());
}

void save_progress(const std::filesystem::path& dir, const std::string& key, std::uint64_t op, const Model& params,
                   const std::vector<float>& step_loss) {
  std::filesystem::create_directories(dir);
  const std::string name = "params-" + std::to_string(op) + ".safetensors";
  save_safetensors(dir / name, params);
  const nlohmann::json j{{"key", key},
                         {"op", op},
                         {"params", name},
                         {"params_sha256", crypto::sha256_hex(params.flat())},
                         {"step_loss", std::vector<float>(step_loss.begin(), step_loss.begin() + static_cast<long>(op))}};
  atomic_write_file(dir / "progress.json", j.dump() + "\n");
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const auto file = e.path().filename().string();
    if (file != name && file.rfind("params-", 0) == 0) std::filesystem::remove(e.path());
  }
}

Result<std::optional<Progress>> load_progress(const std::filesystem::path& dir, const std::string& key) {
  const auto file = dir / "progress.json";
  if (!std::filesystem::exists(file)) return std::optional<Progress>{};
  try {
    const auto j = nlohmann::json::parse(read_file(file));
    if (j.at("key").get<std::string>() != key) return Error("it was saved for another round's model or options");
    Progress p;
    p.op = j.at("op").get<std::uint64_t>();
    p.params = dir / j.at("params").get<std::string>();
    p.step_loss = j.at("step_loss").get<std::vector<float>>();
    if (p.op == 0 || p.step_loss.size() != p.op) {
      return Error("it has " + std::to_string(p.step_loss.size()) + " losses for " + std::to_string(p.op) + " steps");
    }
    const Model params = load_safetensors(p.params);
    if (crypto::sha256_hex(params.flat()) != j.at("params_sha256").get<std::string>()) {
      return Error("its parameters (" + p.params.filename().string() + ") do not match the hash it names");
    }
    return std::optional<Progress>(std::move(p));
  } catch (const std::exception& e) {
    return Error(std::string("it cannot be read: ") + e.what());
  }
}

namespace {

// A gossip worker's heartbeat (Group::alive every quarter step timeout) while it lives: no
// collective tells the agent that a gossip worker is stuck (nobody waits for it), so the agent
// kills one that is silent for three step timeouts (run_workers_once).
class Heartbeat {
 public:
  explicit Heartbeat(collective::Group& group)
      : thread_([this, &group] {
          const auto every = std::max(std::chrono::milliseconds(10), group.options().step_timeout / 4);
          std::unique_lock<std::mutex> lock(mu_);
          while (!cv_.wait_for(lock, every, [this] { return stopped_; })) group.alive();
        }) {}
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  std::thread thread_;  // last: started once the members above exist
};

// A gossip job: push-sum over links of its own (the group gave the table only); whichever
// worker collects writes the combined model and its stats.
void run_gossip_job(collective::Group& group, const WorkerJob& job, Model& model, const Dataset& data,
                    const Network& net) {
  collective::GossipLinks links(group.rank(), group.peers(), group.listen_fd(), model.size(), group.options().step_timeout);
  RunHooks hooks{.log = {}, .on_epoch = [&](std::uint32_t epoch) {
    spdlog::info("worker {}: epoch {} of {} done", group.id(), epoch, job.train.epochs);
  }};
  // This worker's own files (gossip_output): the agent chooses among the collectors' outputs.
  const auto write = [&](std::span<const float> combined, const GossipResult& r) {
    Model out = model;
    std::copy(combined.begin(), combined.end(), out.flat().begin());
    const auto path = gossip_output(job.out, group.id());
    save_safetensors(path, out);
    const nlohmann::json j{{"mean_loss", r.stats.mean_loss}, {"steps", r.stats.steps},   {"algorithm", "gossip"},
                           {"combined", r.combined},         {"weight", r.weight},       {"members", group.members()},
                           {"epoch", group.epoch()},         {"resumed_at", 0},          {"events", r.events},
                           {"rank", group.id()},             {"model_sha256", crypto::sha256_hex(out.flat())}};
    atomic_write_file(path.string() + ".json", j.dump(2) + "\n");
  };
  const auto r = train_gossip(links, job.shards, net, model.flat(), data, job.train, write, hooks);
  for (const auto& e : r.events) spdlog::warn("worker {}: {}", group.id(), e);
  spdlog::info("worker {}: {} gossip steps, weight {:.6g}, mean loss {:.9g}{}", group.id(), r.own_steps, r.own_weight,
               r.stats.mean_loss,
               r.collected ? ", collected " + std::to_string(r.combined) + " workers (weight " + std::to_string(r.weight) + ")"
                           : "");
}

}  // namespace

std::filesystem::path gossip_output(const std::filesystem::path& out, int rank) {
  return out.string() + ".rank-" + std::to_string(rank);
}

bool choose_gossip_output(const std::filesystem::path& out, int workers, std::vector<std::string>& events) {
  int best = -1;
  double best_weight = 0;
  for (int k = 0; k < workers; ++k) {
    const auto path = gossip_output(out, k);
    if (!std::filesystem::exists(path.string() + ".json")) continue;
    try {
      const auto j = nlohmann::json::parse(read_file(path.string() + ".json"));
      const Model m = load_safetensors(path);
      if (crypto::sha256_hex(m.flat()) != j.at("model_sha256").get<std::string>()) {
        events.push_back("the model worker " + std::to_string(k) + " collected does not match its stats; not used");
        continue;
      }
      const double w = j.at("weight").get<double>();
      if (!(w > 0) || !std::isfinite(w)) {
        events.push_back("worker " + std::to_string(k) + " collected a push-sum weight of " + std::to_string(w) +
                         ", which no combination of workers' mass gives; not used");
        continue;
      }
      if (best >= 0) {
        events.push_back("workers " + std::to_string(best) + " and " + std::to_string(k) +
                         " both collected; the one holding more mass is used");
      }
      if (best < 0 || w > best_weight) {  // ascending ranks: a tie keeps the lower
        best = k;
        best_weight = w;
      }
    } catch (const std::exception& e) {
      events.push_back("the output of worker " + std::to_string(k) + " cannot be read: " + e.what());
    }
  }
  if (best >= 0) {
    std::filesystem::rename(gossip_output(out, best), out);
    std::filesystem::rename(gossip_output(out, best).string() + ".json", out.string() + ".json");
  }
  for (int k = 0; k < workers; ++k) {
    std::filesystem::remove(gossip_output(out, k));
    std::filesystem::remove(gossip_output(out, k).string() + ".json");
  }
  return best >= 0;
}

void run_worker_job(collective::Group& group, const WorkerJob& job) {
  // Beating from before the model and the data load (a large data set takes a while), until
  // the gossip ends (the destructor, before the Group's says DONE on the same connection).
  std::optional<Heartbeat> beat;
  if (job.algorithm == LocalAlgorithm::gossip) beat.emplace(group);
  Model model = load_safetensors(job.model);
  const Dataset data = load_csv(job.data);
  const Network net(model);
  if (job.algorithm == LocalAlgorithm::gossip) return run_gossip_job(group, job, model, data, net);
  std::vector<std::string> events;
  if (job.start.op > 0) spdlog::info("worker {}: resuming at step {} from a checkpoint", group.id(), job.start.op);
  auto last_saved = std::chrono::steady_clock::now();
  RunHooks hooks{.log = [&](const std::string& line) {
                   spdlog::warn("worker {}: {}", group.id(), line);
                   events.push_back(line);
                 },
                 .on_epoch = [&](std::uint32_t epoch) {
                   spdlog::info("worker {}: epoch {} of {} done", group.id(), epoch, job.train.epochs);
                 }};
  // The first member saves for everyone (every replica holds the same parameters), from a copy
  // on a thread of its own: the others wait on it in the next step, and a save of a large model
  // must not look like a stalled worker. A save still under way when the next is due is skipped.
  std::future<void> saving;
  const auto settle = [&](bool wait) {
    if (!saving.valid() || (!wait && saving.wait_for(std::chrono::seconds(0)) != std::future_status::ready)) return;
    try {
      saving.get();
    } catch (const std::exception& e) {
      spdlog::warn("worker {}: a checkpoint was not saved: {}", group.id(), e.what());
    }
  };
  if (!job.progress.empty() && job.checkpoint_interval.count() > 0) {
    hooks.on_step = [&](std::uint64_t op, std::span<const float>, const std::vector<float>& step_loss) {
      const auto now = std::chrono::steady_clock::now();
      if (group.members().front() != group.id() || now - last_saved < job.checkpoint_interval) return;
      settle(false);
      if (saving.valid()) return;
      saving = std::async(std::launch::async, [dir = job.progress, key = job.key, op, params = model,
                                               losses = std::vector<float>(step_loss.begin(), step_loss.begin() + static_cast<long>(op))] {
        save_progress(dir, key, op, params, losses);
      });
      last_saved = now;
    };
  }
  const auto stats = train_data_parallel(group, job.shards, net, model.flat(), data, job.train, job.buckets, hooks, job.start);
  settle(true);
  spdlog::info("worker {}: {} steps, mean loss {:.9g}", group.id(), stats.steps, stats.mean_loss);
  if (group.members().front() != group.id()) return;
  // The first member writes for everyone: every replica holds the same parameters.
  save_safetensors(job.out, model);
  const nlohmann::json j{{"mean_loss", stats.mean_loss},
                         {"steps", stats.steps},
                         {"members", group.members()},
                         {"epoch", group.epoch()},
                         {"resumed_at", job.start.op},
                         {"events", events}};
  atomic_write_file(job.out.string() + ".json", j.dump(2) + "\n");
}

std::vector<std::string> default_launcher() { return {"ssh", "-o", "BatchMode=yes", "{host}"}; }

std::vector<std::string> launch_prefix(const std::vector<std::string>& launcher, const std::string& host) {
  std::vector<std::string> out;
  for (auto word : launcher) {
    for (std::size_t at; (at = word.find("{host}")) != std::string::npos;) word.replace(at, 6, host);
    out.push_back(std::move(word));
  }
  return out;
}

namespace {

// Starts the job's workers (and standbys) with a coordinator of their own and waits until every
// one has exited; the group's exclusions go into `events`. Launches after the first log to
// worker-K.launch-N.log, so that the first one's logs stay. Gossip excludes nobody: once a
// collector has written its output (gossip_output of `result`, and its stats), a worker still
// running after three step timeouts more is stalled (the others have given it up) and is killed.
void run_workers_once(const LocalWorkersConfig& cfg, const std::filesystem::path& dir, int launch,
                      const std::filesystem::path& result, std::vector<std::string>& events) {
  // The coordinator last: destroyed first, so its thread's callback never outlives what it uses.
  std::mutex mu;
  std::map<int, std::unique_ptr<Process>> procs;
  // Gossip tolerates failures itself: its table never changes.
  collective::Coordinator coord(cfg.workers, cfg.step_timeout, cfg.listen_host, cfg.backups,
                                cfg.algorithm == LocalAlgorithm::gossip ? collective::Coordinator::Membership::fixed
                                                                        : collective::Coordinator::Membership::reform);
  coord.on_excluded([&](const std::vector<int>& ids) {
    std::lock_guard<std::mutex> lock(mu);
    for (int id : ids) {
      events.push_back("worker " + std::to_string(id) + " died or stalled and was excluded");
      spdlog::warn("local workers: worker {} died or stalled; the others go on without it", id);
      if (procs.count(id)) procs[id]->signal(SIGKILL);
    }
  });
  {
    std::lock_guard<std::mutex> lock(mu);
    for (int k = 0; k < cfg.workers + cfg.backups; ++k) {
      const std::string host = cfg.hosts.empty() ? "127.0.0.1" : cfg.hosts[static_cast<std::size_t>(k) % cfg.hosts.size()];
      std::vector<std::string> argv{self_exe(), "collective", "--coordinator",
                                    cfg.listen_host + ":" + std::to_string(coord.port()), "--id", std::to_string(k),
                                    "--host", host, "--backend", cfg.backend, "--ranks-per-host",
                                    std::to_string(cfg.ranks_per_host), "--across-hosts", cfg.across_hosts, "--intra-host", cfg.intra_host, "--step-timeout-ms",
                                    std::to_string(cfg.step_timeout.count()), "--job", (dir / "job.json").string()};
      // A worker on another host of the silo's cluster starts there through the launcher (ssh
      // by default); the kit, the binary and the data sit at the same paths on every host.
      if (host != "127.0.0.1" && host != "localhost") {
        const auto prefix = launch_prefix(cfg.launcher, host);
        argv.insert(argv.begin(), prefix.begin(), prefix.end());
      }
      const std::string log = "worker-" + std::to_string(k) + (launch > 1 ? ".launch-" + std::to_string(launch) : "") + ".log";
      procs[k] = std::make_unique<Process>(argv, dir / log);
    }
  }
  // Reaped under the lock the coordinator's thread signals under: a Process is not thread-safe,
  // and signal() reads the exit code that reaping writes (ThreadSanitizer caught the two at once;
  // a signal after the reap must not reach a pid the system may have handed on).
  std::optional<std::chrono::steady_clock::time_point> written;
  std::set<int> unheard;  // killed for their silence
  for (int k = 0; k < cfg.workers + cfg.backups; ++k) {
    for (bool killed = false;;) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!procs[k]->running()) break;
        for (int c = 0; cfg.algorithm == LocalAlgorithm::gossip && !written && c < cfg.workers; ++c) {
          if (std::filesystem::exists(gossip_output(result, c).string() + ".json")) written = std::chrono::steady_clock::now();
        }
        if (written && !killed && std::chrono::steady_clock::now() - *written > 3 * cfg.step_timeout) {
          killed = true;
          events.push_back("worker " + std::to_string(k) + " was still running after the model was written and was killed");
          spdlog::warn("local workers: worker {} stalled past the end of gossip; killing it", k);
          procs[k]->signal(SIGKILL);
        }
        // A gossip worker sends a heartbeat every quarter step timeout (run_gossip_job); one
        // silent for three is stalled, whether or not any model was written.
        for (int id : cfg.algorithm == LocalAlgorithm::gossip ? coord.silent(3 * cfg.step_timeout) : std::vector<int>{}) {
          if (!procs.count(id) || !procs[id]->running() || !unheard.insert(id).second) continue;
          events.push_back("worker " + std::to_string(id) + " sent no heartbeat for " +
                           std::to_string(3 * cfg.step_timeout.count()) + " ms and was killed");
          spdlog::warn("local workers: worker {} is stalled (no heartbeat for {} ms); killing it", id,
                       3 * cfg.step_timeout.count());
          procs[id]->signal(SIGKILL);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

// Points `job` at its checkpoint when there is one of this job further on than `after` steps.
bool resume_from_checkpoint(WorkerJob& job, std::uint64_t after, std::vector<std::string>& events) {
  const auto found = load_progress(job.progress, job.key);
  if (!found) {
    spdlog::warn("local workers: not resuming from the checkpoint in {}: {}", job.progress.string(),
                 found.error().message());
    return false;
  }
  const auto& p = *found;
  if (!p || p->op <= after) return false;
  // A copy the job owns: the next checkpoint removes the file it came from, and a standby
  // promoted later still has to load the model the launch started with.
  const auto start = job.progress.parent_path() / "start.safetensors";
  save_safetensors(start, load_safetensors(p->params));
  job.model = start;
  job.start = StartAt{p->op, p->step_loss};
  events.push_back("resumed at step " + std::to_string(p->op) + " from the last checkpoint");
  spdlog::info("local workers: resuming the round's training at step {} from {}", p->op, p->params.string());
  return true;
}

}  // namespace

WorkersResult train_with_workers(const LocalWorkersConfig& cfg, const std::filesystem::path& dir, Model& model,
                                 const std::filesystem::path& data_csv, const TrainOptions& opts) {
  std::filesystem::create_directories(dir);
  WorkerJob job;
  job.model = dir / "global.safetensors";
  job.data = data_csv;
  job.out = dir / "trained.safetensors";
  job.train = opts;
  job.shards = cfg.workers;
  job.algorithm = cfg.algorithm;
  job.buckets = cfg.buckets;
  std::filesystem::remove(job.out);
  std::filesystem::remove(job.out.string() + ".json");
  for (int k = 0; k < cfg.workers; ++k) {
    std::filesystem::remove(gossip_output(job.out, k));
    std::filesystem::remove(gossip_output(job.out, k).string() + ".json");
  }
  save_safetensors(job.model, model);
  WorkersResult result;
  // Gossip keeps no checkpoints: a worker's death costs its mass, not the round.
  if (cfg.checkpoint_interval.count() > 0 && cfg.algorithm == LocalAlgorithm::data_parallel) {
    job.progress = dir / "progress";
    job.checkpoint_interval = cfg.checkpoint_interval;
    job.key = job_key(model, job, cfg.backend + " " + cfg.across_hosts + " " + cfg.intra_host + " " + std::to_string(cfg.ranks_per_host) +
                                      " " + nlohmann::json(cfg.hosts).dump() + " " + std::to_string(cfg.workers));
    // A run of this very job that was cut off and the agent called again (a retry of the same
    // round) goes on from its last checkpoint rather than from the first step.
    resume_from_checkpoint(job, 0, result.events);
  }
  // When every worker died and a checkpoint has moved on since this launch, the workers are
  // started again from it (as long as each launch gets further than the one before).
  for (int launch = 1;; ++launch) {
    save_job(dir / "job.json", job);
    run_workers_once(cfg, dir, launch, job.out, result.events);
    if (cfg.algorithm == LocalAlgorithm::gossip) choose_gossip_output(job.out, cfg.workers, result.events);
    if (std::filesystem::exists(job.out) || job.progress.empty()) break;
    const auto before = job.start.op;
    if (!resume_from_checkpoint(job, before, result.events)) break;
    spdlog::warn("local workers: every worker stopped at or after step {}; starting them again from step {}", before,
                 job.start.op);
  }
  if (!std::filesystem::exists(job.out)) {
    throw std::runtime_error("the local workers did not finish the round; their logs are in " + dir.string());
  }
  Model trained = load_safetensors(job.out);
  if (trained.size() != model.size()) throw std::runtime_error("the local workers returned a model of another size");
  std::copy(trained.flat().begin(), trained.flat().end(), model.flat().begin());
  std::ifstream in(job.out.string() + ".json");
  const auto j = nlohmann::json::parse(in);
  result.stats.mean_loss = j.at("mean_loss").get<double>();
  result.stats.steps = j.at("steps").get<std::uint64_t>();
  if (j.contains("combined")) {
    spdlog::info("local workers: gossip combined {} of {} workers' models (push-sum weight {:.6g} of {})",
                 j.at("combined").get<int>(), cfg.workers, j.at("weight").get<double>(), cfg.workers);
  }
  for (const auto& e : j.at("events")) result.events.push_back(e.get<std::string>());
  return result;
}

}  // namespace xsilo::agent
