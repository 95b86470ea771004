#include "silo_agent/workers.h"

#include <signal.h>

#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/fs.h"
#include "common/process.h"
#include "common/safetensors.h"

namespace xsilo::agent {

void save_job(const std::filesystem::path& path, const WorkerJob& job) {
  const nlohmann::json j{{"model", job.model.string()},
                         {"data", job.data.string()},
                         {"out", job.out.string()},
                         {"epochs", job.train.epochs},
                         {"batch_size", job.train.batch_size},
                         {"learning_rate", job.train.learning_rate},
                         {"weight_decay", job.train.weight_decay},
                         {"seed", job.train.seed},
                         {"shards", job.shards},
                         {"first_bucket_bytes", job.buckets.first_bytes},
                         {"bucket_bytes", job.buckets.bytes},
                         {"bucket_compression", job.buckets.compression},
                         {"topk_fraction", job.buckets.topk_fraction}};
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
    job.buckets.first_bytes = j.at("first_bucket_bytes").get<std::size_t>();
    job.buckets.bytes = j.at("bucket_bytes").get<std::size_t>();
    job.buckets.compression = j.value("bucket_compression", std::string("none"));
    job.buckets.topk_fraction = j.value("topk_fraction", 0.01);
    if (job.shards < 1) throw std::runtime_error("shards must be at least 1");
    return job;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path.string() + ": " + e.what());
  }
}

void run_worker_job(collective::Group& group, const WorkerJob& job) {
  Model model = load_safetensors(job.model);
  const Dataset data = load_csv(job.data);
  const Network net(model);
  std::vector<std::string> events;
  const auto stats = train_data_parallel(group, job.shards, net, model.flat(), data, job.train, job.buckets,
                                         [&](const std::string& line) {
                                           spdlog::warn("worker {}: {}", group.id(), line);
                                           events.push_back(line);
                                         },
                                         [&](std::uint32_t epoch) {
                                           spdlog::info("worker {}: epoch {} of {} done", group.id(), epoch,
                                                        job.train.epochs);
                                         });
  spdlog::info("worker {}: {} steps, mean loss {:.9g}", group.id(), stats.steps, stats.mean_loss);
  if (group.members().front() != group.id()) return;
  // The first member writes for everyone: every replica holds the same parameters.
  save_safetensors(job.out, model);
  const nlohmann::json j{{"mean_loss", stats.mean_loss},
                         {"steps", stats.steps},
                         {"members", group.members()},
                         {"epoch", group.epoch()},
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

WorkersResult train_with_workers(const LocalWorkersConfig& cfg, const std::filesystem::path& dir, Model& model,
                                 const std::filesystem::path& data_csv, const TrainOptions& opts) {
  std::filesystem::create_directories(dir);
  WorkerJob job;
  job.model = dir / "global.safetensors";
  job.data = data_csv;
  job.out = dir / "trained.safetensors";
  job.train = opts;
  job.shards = cfg.workers;
  job.buckets = cfg.buckets;
  std::filesystem::remove(job.out);
  std::filesystem::remove(job.out.string() + ".json");
  save_safetensors(job.model, model);
  save_job(dir / "job.json", job);

  collective::Coordinator coord(cfg.workers, cfg.step_timeout, cfg.listen_host, cfg.backups);
  std::mutex mu;
  std::map<int, std::unique_ptr<Process>> procs;
  WorkersResult result;
  coord.on_excluded([&](const std::vector<int>& ids) {
    std::lock_guard<std::mutex> lock(mu);
    for (int id : ids) {
      result.events.push_back("worker " + std::to_string(id) + " died or stalled and was excluded");
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
                                    std::to_string(cfg.ranks_per_host), "--step-timeout-ms",
                                    std::to_string(cfg.step_timeout.count()), "--job", (dir / "job.json").string()};
      // A worker on another host of the silo's cluster starts there through the launcher (ssh
      // by default); the kit, the binary and the data sit at the same paths on every host.
      if (host != "127.0.0.1" && host != "localhost") {
        const auto prefix = launch_prefix(cfg.launcher, host);
        argv.insert(argv.begin(), prefix.begin(), prefix.end());
      }
      procs[k] = std::make_unique<Process>(argv, dir / ("worker-" + std::to_string(k) + ".log"));
    }
  }
  for (int k = 0; k < cfg.workers + cfg.backups; ++k) {
    Process* p;
    {
      std::lock_guard<std::mutex> lock(mu);
      p = procs[k].get();
    }
    while (!p->wait(std::chrono::milliseconds(200))) {
    }
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
  for (const auto& e : j.at("events")) result.events.push_back(e.get<std::string>());
  return result;
}

}  // namespace xsilo::agent
