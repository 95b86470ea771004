// `xsilo sim`: a whole federation on one machine. It provisions a throwaway PKI, splits a
// data set across silos, writes each process's config, starts the server and the agents as
// real processes talking mutual TLS over loopback, shows progress per round, and writes the
// metrics, the final model, the audit log and a report.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "crypto/secagg.h"

#include "common/dataset.h"
#include "common/feature_stats.h"
#include "common/model.h"
#include "common/process.h"
#include "common/result.h"
#include "server/metrics.h"
#include "silo_agent/config.h"

namespace xsilo::tools {

struct SimConfig {
  std::filesystem::path file;        // empty: the built-in default experiment
  std::string name = "breast-cancer-logistic";
  std::string federation = "sim";
  std::size_t silos = 5;
  std::uint64_t rounds = 20;
  std::uint64_t seed = 7;
  // data
  std::filesystem::path data_path;   // resolved CSV file
  double test_fraction = 0.2;
  bool standardize = true;
  std::string split = "dirichlet";   // "dirichlet" or "iid"
  double alpha = 0.5;
  // model: built-in, or a user's model file (an external trainer's)
  std::string model_kind = "logistic";   // "logistic", "mlp" or "file"
  std::vector<std::size_t> hidden;
  std::filesystem::path model_file;      // kind "file"; made by trainer.init when it does not exist
  // The silos' trainer: the built-in one, or the users' own script (docs/bring-your-own-model.md).
  struct Trainer {
    std::vector<std::string> command;     // run in every silo (an external trainer)
    std::vector<std::string> init;        // writes the initial model: "{path}" is replaced
    std::filesystem::path cwd;
    std::vector<std::pair<std::string, std::string>> env;
    double startup_s = 120, task_timeout_s = 0;
    int max_failures = 3;
    bool evaluate = true;                 // federated metrics of each round's model
    // Per-silo data files instead of the sim's split of data.dataset: [{"train", "test"}, ...]
    std::vector<std::pair<std::filesystem::path, std::filesystem::path>> silo_data;
  };
  std::optional<Trainer> trainer;
  // passed through to the server config (validated there)
  nlohmann::json training, optimizer, selection, deadlines, transport, aggregation, secure, compression, broadcast;
  nlohmann::json schedule;  // the server's "schedule" (server/schedule.h): buffered rounds run --in-process only
  // Simulated Byzantine silos: the last `attackers` silos run `attack` (its keys as in the
  // agent config's "attack" section, without "honest", which the sim fills in).
  std::size_t attackers = 0;
  nlohmann::json attack;
  // Edge aggregators: silo i is behind edge i % edges (its backup is the next edge, then the
  // server). 0: every silo talks to the server.
  std::size_t edges = 0;
  std::int64_t uploads_at_once = 0;  // the server's (0: its default)
  nlohmann::json local;  // passed to every agent as its "local" block (local.workers: data-parallel workers)
  // "privacy": {"level": "record", "max_epsilon": E, "delta": D, ...}: every silo gets that budget
  // (the agent's "privacy" block; rounds: the sim's, unless a noise_multiplier is given) and
  // DP-SGD in the built-in trainer.
  std::optional<agent::PrivacyConfig> privacy;
  // "privacy": {"level": "silo", "mode": "central", "epsilon": E, "delta": D, ...}: the server's
  // "privacy" block as given, less "level" (server/config_privacy.cpp validates it; rounds: the
  // sim's unless given). Null when off.
  nlohmann::json silo_privacy;
  // Rehearsed failures: kill or restart a process when a round reaches a phase.
  struct Fault {
    std::string process;  // "server", "edge-01", "hospital-03"
    std::string action;   // "kill" or "restart"
    std::uint64_t round = 1;
    // "train" (the round started) or "upload" (the first upload slot); for silos also
    // "after_keys" / "after_shares": the silo dies right after that secure-aggregation step.
    std::string phase;
  };
  std::vector<Fault> faults;
  // A seeded kill storm (the soak of docs/benchmarks.md, "Kill storm"): every `every_rounds`
  // rounds (drawn in [min, max]) one process of a kind drawn from `targets` is SIGKILLed at a
  // drawn phase and restarted. load_sim_config expands it into `faults` (kill_storm_faults), so
  // the storm is the same rehearsed faults, only many of them.
  struct KillStorm {
    std::uint64_t seed = 1;
    std::uint64_t min_every = 3, max_every = 5;
    std::uint64_t first_round = 2;            // no kill before this round
    std::vector<std::string> targets;         // "server", "edges", "silos"
    std::vector<std::string> phases;          // "train", "upload"
  };
  std::optional<KillStorm> kill_storm;
  // Simulated compute: each silo's training takes at least [min, max] ms, drawn per round and
  // silo (tools/sim_agent.h). A kill storm's default is [100, 300]: without it a small model's
  // round lasts a few milliseconds and the faults would land rounds after the ones they name.
  std::uint64_t train_min_ms = 0, train_max_ms = 0;
  // "stragglers": {"silos": N, "factor": F}: the last N silos train F times as long (train_ms x F).
  std::size_t straggler_silos = 0;
  std::uint64_t straggler_factor = 1;
  // Hostile processes, by name: an edge ("edge-01": tools/sim_edge.h), a silo in secure mode
  // ("hospital-03": tools/sim_agent.h) or the server in secure mode ("server":
  // tools/sim_server.h), and what it does.
  std::map<std::string, std::string> hostile;
  bool baseline = true;              // also train centrally on the pooled data
  // "report": {"tensorboard": DIR}: each round's metrics as TensorBoard event files in DIR.
  std::filesystem::path tensorboard;
  std::string log_format = "text";   // every process's log_format ("json": one object per line)
  bool metrics = false;              // every process serves Prometheus metrics on a loopback port
};

// Throws ConfigError with the file and key path on invalid input.
SimConfig load_sim_config(const std::filesystem::path& file);
SimConfig default_sim_config();
// The processes' names in a federation: silo i is "hospital-NN", edge e "edge-NN" (from 1).
// The floor a simulated federation's silos keep (the agent's secure_floor): they assume what its
// server plans for, the colluding fraction of secure.graph.corrupt (the defaults otherwise).
crypto::secagg::Floor sim_secure_floor(const SimConfig& cfg);
std::string silo_name(std::size_t i);
// The sim's seed for one purpose (which rows are test rows, how the rest are dealt, the initial
// model, the baseline's row order): crypto::derive_seed(cfg.seed, 0, purpose), so that no two
// of them draw the same numbers, nor one run's split another seed's.
std::uint64_t sim_seed(const SimConfig& cfg, std::string_view purpose);
// The initial model's, written into the server's config as model.init_seed: its low 53 bits, so
// that every JSON reader (the config loader takes integers below 2^63, Python's json exactly
// below 2^53) holds it exactly.
std::uint64_t model_init_seed(const SimConfig& cfg);
std::string edge_name(std::size_t e);
// The storm's faults for a federation of `silos` silos, `edges` edges and `rounds` rounds: the
// same list for the same seed on every machine (its own arithmetic on a mt19937_64).
std::vector<SimConfig::Fault> kill_storm_faults(const SimConfig::KillStorm& storm, std::size_t silos, std::size_t edges,
                                                std::uint64_t rounds);

// Where the vendored data sets live: $XSILO_DATA_DIR, else the source tree's data/.
std::filesystem::path data_dir();

// The files of a federation on this machine: data splits, a PKI, the server config. Tests
// use it to start and kill the processes themselves.
struct FederationFiles {
  std::filesystem::path out, pki, state, logs, server_config, port_file;
  std::filesystem::path central_train_csv, central_test_csv;  // the pooled rows, as the silos' files are
  std::filesystem::path initial_model;                        // model kind "file"
  std::filesystem::path server_simulate;                      // a hostile server's hooks (tools/sim_server.h)
  std::vector<std::string> silos;
  std::vector<std::string> edges;
  std::uint16_t server_port = 0;
  std::vector<std::uint16_t> edge_ports;
  Dataset all, central_train, central_test;
  Standardizer standardizer;  // pooled (the in-process sim's); the processes use feature_stats
  // The federation's feature statistics, handed to every silo (data.feature_stats): the built-in
  // trainer standardizes with them, an external trainer gets them as task.feature_stats.
  std::filesystem::path feature_stats_file;
  FeatureStats feature_stats;
};

FederationFiles prepare_federation(const SimConfig& cfg, const std::filesystem::path& out);
// The server's selection.min_silos in the federation the sim makes: the config's, else a
// majority, and at least its min_updates (without one, under secure aggregation at least
// secure.min_group where there are that many silos).
std::size_t sim_min_silos(const SimConfig& cfg);
// The user's script as one more trainer of the sim's own, on the pooled rows: it gives the
// initial weights (an init task) and evaluates each round's model on the pooled test rows.
agent::AgentConfig central_trainer_config(const SimConfig& cfg, const FederationFiles& f,
                                         const std::filesystem::path& state_dir);
// Where a process of the federation ("server", an edge's or a silo's name) writes its metrics
// port when the sim config asks for metrics: OUT/metrics/NAME.port.
inline std::filesystem::path metrics_port_file(const FederationFiles& f, const std::string& process) {
  return f.out / "metrics" / (process + ".port");
}
// The federation-wide mean and variance of the features of the silos' training files, from what
// each silo computes over its own rows (its count, sum and sum of squares about a shared
// reference), added up (tools/sim_stats.cpp).
FeatureStats federation_feature_stats(const std::vector<std::filesystem::path>& silo_train_files);
// The same statistics computed by a federation of the silos' agents (trainer.kind
// "feature_stats": silo_agent/stats_trainer.h) under `cfg`'s secure aggregation, before the
// federation's own server starts: the server learns only the totals. `pooled` (the sums'
// result) only sets the public bounds of the ring (clip norm, weight cap). Throws
// std::runtime_error with the statistics server's log when it cannot finish.
FeatureStats secure_feature_stats(const SimConfig& cfg, const FederationFiles& f,
                                  const std::vector<std::filesystem::path>& silo_train_files, const FeatureStats& pooled);
// Success when the config's data split can be made (the split prepare_federation makes), else
// why not.
Status check_split(const SimConfig& cfg);
// Waits for the server to write its port file; throws with the log's tail if it dies. The
// port is then pinned: server_argv() binds it again on a restart, and the edges' upstreams
// name it. The server's config file is not changed (the audit records its hash).
std::uint16_t wait_for_port(Process& server, FederationFiles& f,
                            std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));
// The command that starts the federation's server: `--listen` the pinned port once it has one,
// `--simulate` a hostile server's hooks.
std::vector<std::string> server_argv(const FederationFiles& f, const std::string& xsilo);
// Silo i's files: its agent config, and its simulation hooks when it has any (an attack, a
// crash); argv() is the command that starts it.
struct AgentFiles {
  std::filesystem::path config, simulate;
  std::vector<std::string> argv(const std::string& xsilo) const;
};
// Writes silo i's agent config pointing at `upstreams`.
AgentFiles write_agent_config(const SimConfig& cfg, const FederationFiles& f, std::size_t i,
                              const std::vector<std::string>& upstreams);
// Silo i's upstreams in failover order: its edge, the next edge, the server.
std::vector<std::string> agent_upstreams(const SimConfig& cfg, const FederationFiles& f, std::size_t i);
std::filesystem::path edge_config_path(const FederationFiles& f, std::size_t e);
// Waits until edge e listens (its port file names its port); throws with its log if it dies.
// The port is then pinned in the edge's config, and agent_upstreams names it.
void wait_for_edge(Process& edge, FederationFiles& f, std::size_t e,
                   std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));

struct SimResult {
  int exit_code = 1;
  std::uint64_t rounds_committed = 0, rounds_aborted = 0;
  double final_accuracy = 0, final_loss = 0, baseline_accuracy = -1;  // NaN: the script does not evaluate
  double final_train_loss = 0;  // what the silos reported for the last committed round; NaN: none report
  double epsilon_spent = -1;    // record level: the largest epsilon a silo spent; silo level: the federation's (-1: off)
  // --in-process with train_ms: the simulated clock when the last round committed (each silo's
  // training takes its drawn train_ms, silos train in parallel, nothing else takes time).
  std::int64_t sim_ms = 0;
  // Secure mode without adaptive clipping: the updates secure.clip_norm scaled down, of those
  // counted, over the committed rounds (the round records' secure.clipped).
  std::uint64_t secure_clipped = 0, secure_counted = 0, secure_clipped_rounds = 0, secure_counted_rounds = 0;
  double secure_clip_norm = 0;
};

SimResult run_sim(const SimConfig& cfg, const std::filesystem::path& out, bool quiet = false);

// A committed round's record (its secure.clipped, where the masked sums counted) added to
// `result`'s secure_* counts; a round under adaptive clipping, where clipping is the point, is
// not counted.
void count_secure_clipping(const nlohmann::json& record, SimResult& result);
// What the run's closing lines say of secure.clip_norm when it scaled updates down (none else).
std::vector<std::string> secure_clipping_lines(const SimResult& result);

// After each round of an in-process run: the round, whether it committed, the model after it
// and its accuracy and loss on the pooled test rows.
using RoundCallback = std::function<void(std::uint64_t round, bool committed, const Model& model, double accuracy,
                                         double loss)>;
// The same federation in this process (tools/sim_in_process.cpp): the agents' trainers, the
// simulated attacks and the server's aggregator and optimizer, without processes or network
// (secure aggregation as its arithmetic, as said above). Refuses, with the reason, what lives in
// the protocol: edges, faults, hostile processes, external trainers, sampling silos under secure
// aggregation, compressed uploads, and a secure setup whose sums are smaller than the silos' floor
// (secure_floor.min_sum; the floor's other conditions, on colluders and SecAgg+ graphs, are
// checked only by real silos). Time is a simulated clock (train_ms, nothing slept); buffered
// rounds (schedule.mode buffered) run on it (docs/buffered.md). Writes out/model.safetensors and
// out/rounds.jsonl (a line a round: its sim_ms, accuracy and updates).
SimResult run_sim_in_process(const SimConfig& cfg, const std::filesystem::path& out,
                             const RoundCallback& on_round = nullptr);

// A round's metrics as TensorBoard scalars (tag, value): the server's row, and the test accuracy
// and loss on the pooled test rows where measured (NaN: not). tools/report.cpp.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const server::MetricsRow& row, double test_accuracy,
                                                                 double test_loss);

}  // namespace xsilo::tools
