// xsilo bench trainer: the hand-off of a round's model to an external trainer and back (agent
// -> safetensors file -> Python SDK -> file -> agent), against writing and reading the same
// bytes once through /dev/shm in the same run; and the per-round overhead of an external
// trainer against the built-in one on the default experiment.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/mlp.h"
#include "common/safetensors.h"
#include "server/metrics.h"
#include "silo_agent/external_trainer.h"
#include "tools/bench.h"
#include "tools/sim.h"

namespace xsilo::tools {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

// Writes `bytes` to a file in `dir` and reads them back through a mapping: the bound.
double shm_round_trip(const std::filesystem::path& dir, const std::vector<float>& data, std::vector<float>& back) {
  const auto path = dir / "bound.bin";
  const auto t0 = Clock::now();
  {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) throw std::runtime_error("cannot write " + path.string());
    const char* p = reinterpret_cast<const char*>(data.data());
    std::size_t left = data.size() * sizeof(float);
    while (left) {
      const ssize_t w = ::write(fd, p, left);
      if (w <= 0) {
        ::close(fd);
        throw std::runtime_error("write failed");
      }
      p += w;
      left -= static_cast<std::size_t>(w);
    }
    ::close(fd);
  }
  {
    const MappedFile f(path);
    std::memcpy(back.data(), f.bytes().data(), f.bytes().size());
  }
  const double s = seconds_since(t0);
  std::filesystem::remove(path);
  return s;
}

double mean_round_seconds(const std::filesystem::path& out) {
  const auto rows = server::read_metrics(out / "server" / "metrics.csv");
  double sum = 0;
  for (const auto& r : rows) sum += r.seconds;
  return rows.empty() ? NAN : sum / static_cast<double>(rows.size());
}

// One model size: the best hand-off to the trainer and back against the same bytes written and
// read once through its folder. False when the model did not come back unchanged.
bool handoff_row(std::size_t d, const agent::AgentConfig& cfg, const TrainerBenchOptions& opts,
                 std::vector<std::vector<std::string>>& rows) {
  std::cerr << "bench trainer: " << d << " parameters (" << d * 4 / (1 << 20) << " MiB), " << opts.repeats
            << " hand-offs..." << std::endl;
  Model global;
  global.add("w", {d});
  for (std::size_t i = 0; i < d; ++i) global.flat()[i] = static_cast<float>(i % 1000) * 1e-3f;
  Model local = global.zeros_like();
  agent::ExternalTrainer trainer(cfg);
  agent::TrainTask task;
  task.silo = "bench";
  task.plan.set_train(true);
  task.round = 0;
  trainer.train(global, task, local);  // start-up and a first hand-off: not timed
  double best = 1e30;
  for (std::size_t k = 0; k < opts.repeats; ++k) {
    task.round = k + 1;
    const auto t0 = Clock::now();
    trainer.train(global, task, local);
    best = std::min(best, seconds_since(t0));
  }
  const bool unchanged = std::memcmp(local.flat().data(), global.flat().data(), global.bytes()) == 0;
  if (!unchanged) std::cerr << "bench trainer: the model did not come back unchanged\n";
  // The bound: the same bytes written and read once through the same folder.
  std::vector<float> data(global.flat().begin(), global.flat().end()), back(d);
  double bound = 1e30;
  for (std::size_t k = 0; k < opts.repeats; ++k) bound = std::min(bound, shm_round_trip(trainer.exchange_dir(), data, back));
  const double gb = static_cast<double>(global.bytes()) / 1e9;
  if (opts.json) {
    std::cout << json{{"bench", "trainer"}, {"params", d}, {"handoff_s", best}, {"shm_once_s", bound},
                      {"ratio", best / bound}}.dump()
              << std::endl;
  }
  rows.push_back({std::to_string(d), fmt(gb * 1000, 0), fmt(best, 3), fmt(2 * gb / best, 2), fmt(bound, 3),
                  fmt(best / bound, 2), best / bound <= 3.0 ? "met" : "MISSED"});
  return unchanged;
}

// The default experiment with the built-in trainer, then with the no-op external trainer.
void default_experiment(const TrainerBenchOptions& opts, const std::filesystem::path& script,
                        const std::filesystem::path& tmp) {
  std::cerr << "bench trainer: the default experiment, built-in and external..." << std::endl;
  SimConfig builtin = default_sim_config();
  builtin.rounds = opts.rounds;
  builtin.baseline = false;
  run_sim(builtin, tmp / "builtin", true);
  SimConfig external = builtin;
  ModelSpec spec;
  spec.inputs = 30;
  save_safetensors(tmp / "init.safetensors", init_model(spec));
  external.model_kind = "file";
  external.model_file = tmp / "init.safetensors";
  external.trainer = SimConfig::Trainer{};
  external.trainer->command = {opts.python, script.string()};
  external.trainer->evaluate = false;
  external.baseline = false;
  run_sim(external, tmp / "external", true);
  const double b = mean_round_seconds(tmp / "builtin"), e = mean_round_seconds(tmp / "external");
  if (opts.json) {
    std::cout << json{{"bench", "trainer_round"}, {"builtin_s", b}, {"external_s", e}, {"overhead_s", e - b}}.dump()
              << std::endl;
  } else {
    std::cout << "\nPer round on the default experiment (5 silos, breast cancer, " << opts.rounds
              << " rounds, mean of the rounds):\n";
    print_table({"trainer", "seconds per round", "overhead"},
                {{"built-in (logistic regression in the agent)", fmt(b, 4), "-"},
                 {"external (no-op Python trainer via the SDK)", fmt(e, 4), fmt(e - b, 4) + " s"}});
  }
}

}  // namespace

int bench_trainer(const TrainerBenchOptions& opts) {
  const auto tmp = std::filesystem::temp_directory_path() / ("xsilo-bench-trainer-" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const std::filesystem::path script = std::filesystem::path(XSILO_SOURCE_DIR) / "bench" / "noop_trainer.py";
  agent::AgentConfig cfg;
  cfg.trainer = agent::TrainerKind::External;
  cfg.external.command = {opts.python, script.string()};
  cfg.external.startup = std::chrono::seconds(120);
  cfg.external.task_timeout = std::chrono::seconds(600);
  cfg.state_dir = tmp / "agent";
  std::vector<std::vector<std::string>> rows;
  int rc = 0;
  for (const auto d : opts.params) {
    if (!handoff_row(d, cfg, opts, rows)) rc = 1;
  }
  if (!opts.json) {
    std::cout << "\nHand-off agent -> trainer -> agent (no-op Python trainer via the SDK), best of " << opts.repeats
              << ", exchange folder in /dev/shm:\n";
    print_table({"parameters", "MB", "hand-off s", "GB/s (both ways)", "shm write+read once s", "ratio", "target <= 3x"},
                rows);
  }

  if (opts.rounds > 0) default_experiment(opts, script, tmp);
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  return rc;
}

}  // namespace xsilo::tools
