// Local workers: with `local.workers: N` the agent trains each round with N worker processes
// (`xsilo collective --job FILE`), on this host or on the silo's cluster hosts. The agent runs
// the workers' coordinator, writes the round's job (model, data, options), starts the workers,
// kills any the group excluded, and reads back the trained model that the first surviving
// worker writes.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <functional>
#include <string>
#include <vector>

#include "common/model.h"
#include "common/result.h"
#include "silo_agent/collective/group.h"
#include "silo_agent/data_parallel.h"
#include "silo_agent/sgd.h"

namespace xsilo::agent {

std::vector<std::string> default_launcher();
// The launcher's words with every "{host}" replaced by `host`.
std::vector<std::string> launch_prefix(const std::vector<std::string>& launcher, const std::string& host);

// How the local workers train together: "data_parallel" (one SGD step of the global batch,
// gradients summed by the backend's all-reduce: data_parallel.h) or "gossip" (push-sum
// decentralized SGD, no step waits for another worker: gossip.h).
enum class LocalAlgorithm { data_parallel, gossip };
const std::vector<std::string>& local_algorithms();  // their names, in the enum's order
LocalAlgorithm parse_local_algorithm(const std::string& name);  // std::invalid_argument if unknown
const std::string& name(LocalAlgorithm a);

struct LocalWorkersConfig {
  int workers = 1;                       // 1: train in the agent's process
  LocalAlgorithm algorithm = LocalAlgorithm::data_parallel;
  std::vector<std::string> hosts;        // empty: all on this host; else worker k on hosts[k % size]
  std::string listen_host = "127.0.0.1"; // where the coordinator listens (an address the hosts reach)
  // How a worker on another host is started: the command put before the worker's own, each
  // "{host}" replaced by its host (ssh by default; `ip netns exec` in the tests).
  std::vector<std::string> launcher = default_launcher();
  std::string backend = "auto";          // collective::tcp_backends() or nccl
  int ranks_per_host = 0;                // hierarchical on one machine: workers r / n share a "host"
  std::string across_hosts = "ring";     // hierarchical: the leaders' algorithm across hosts
  std::string intra_host = "tcp";        // hierarchical: inside each host tcp, nccl or auto (collective::Options)
  int backups = 0;                       // hot standbys swapped in for a failed worker (ids workers..)
  std::chrono::milliseconds step_timeout{10000};
  BucketOptions buckets;
  // The first worker saves the round's progress (parameters and losses) at most this often, so
  // that when every worker dies the agent starts them again where it was saved instead of from
  // the round's first step (0: never). An agent restart mid-round does not resume: the server
  // has dropped the silo from that round.
  std::chrono::milliseconds checkpoint_interval{30000};
};

// One round's work for the workers, as the JSON file they read.
struct WorkerJob {
  std::filesystem::path model, data, out;  // out: the trained model; out + ".json": the stats
  TrainOptions train;
  int shards = 1;
  LocalAlgorithm algorithm = LocalAlgorithm::data_parallel;
  BucketOptions buckets;
  // Checkpoints: the folder the first worker saves progress in (empty: none), how often, and
  // what names this job (its global model and options: progress resumes only the same job).
  std::filesystem::path progress;
  std::chrono::milliseconds checkpoint_interval{0};
  std::string key;
  // A resumed job starts at start.op with `model` holding that step's parameters.
  StartAt start;
};
void save_job(const std::filesystem::path& path, const WorkerJob& job);
WorkerJob load_job(const std::filesystem::path& path);

// What names a job for its checkpoints: the SHA-256 of the global model's values and of every
// option that changes the steps (a progress saved for another model or options never resumes).
// `topology` names how the workers sum (backend, hosts): another one changes the rounding.
std::string job_key(const Model& global, const WorkerJob& job, const std::string& topology = "");

// The progress folder's checkpoint: `op` steps done, the parameters after them in `params`.
struct Progress {
  std::uint64_t op = 0;
  std::filesystem::path params;
  std::vector<float> step_loss;
};
// Saves progress into `dir` crash-safely: the parameters to a file of their own, then
// progress.json naming it (and its SHA-256), then the older parameter files are removed.
void save_progress(const std::filesystem::path& dir, const std::string& key, std::uint64_t op, const Model& params,
                   const std::vector<float>& step_loss);
// The progress in `dir` when it is this job's (key) and intact; nullopt where there is none; why
// not, where there is one that is not this job's or not intact.
Result<std::optional<Progress>> load_progress(const std::filesystem::path& dir, const std::string& key);

// Worker side: trains on the group and, on the first member, writes the result.
void run_worker_job(collective::Group& group, const WorkerJob& job);

// Where gossip's worker `rank` writes the model it collected (and `.json`, its stats with the
// model's sha256): each collector its own files, so two collectors (one gave up on the other
// as too slow) never mix one's model with the other's stats.
std::filesystem::path gossip_output(const std::filesystem::path& out, int rank);
// After every worker of a gossip job has exited: of the collectors' outputs whose model matches
// the sha256 its stats name, the one holding the most mass (the largest sum w; ties: the lowest
// rank) becomes `out` and `out`.json; the others are removed. False when there is none. Each
// output passed over goes into `events`.
bool choose_gossip_output(const std::filesystem::path& out, int workers, std::vector<std::string>& events);

struct WorkersResult {
  TrainStats stats;
  std::vector<std::string> events;  // re-formations, excluded workers, as the workers logged them
};

// Agent side: trains `model` in place with the configured workers on the rows in `data_csv`.
// `dir` holds the job, the model files and one log per worker. Throws std::runtime_error when
// no worker finished.
WorkersResult train_with_workers(const LocalWorkersConfig& cfg, const std::filesystem::path& dir, Model& model,
                                 const std::filesystem::path& data_csv, const TrainOptions& opts);

}  // namespace xsilo::agent
