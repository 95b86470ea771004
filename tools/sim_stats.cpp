// The federation's feature statistics before round 1 (docs/bring-your-own-model.md, "Feature
// statistics"): added up from each silo's own sums, or, in a secure federation, by a federation
// of their own under the same secure aggregation (silo_agent/stats_trainer.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "common/config.h"
#include "common/fs.h"
#include "common/process.h"
#include "common/safetensors.h"
#include "server/audit.h"
#include "server/config.h"
#include "silo_agent/config.h"
#include "silo_agent/stats_trainer.h"
#include "tools/sim.h"
#include "transport/tls.h"

namespace xsilo::tools {

FeatureStats federation_feature_stats(const std::vector<std::filesystem::path>& silo_train_files) {
  // Each silo's sufficient statistics: its row count, the sum of its rows and the sum of their
  // squares, each about the first silo's first row (a shift keeps the squares small, so that
  // the variance's subtraction loses nothing). Their totals give the mean and the variance.
  std::vector<double> shift, sum, sq;
  double n = 0;
  for (const auto& file : silo_train_files) {
    const Dataset d = load_csv(file);
    if (shift.empty()) {
      shift.assign(d.row(0), d.row(0) + d.features);
      sum.assign(d.features, 0);
      sq.assign(d.features, 0);
    }
    if (d.features != shift.size()) {
      throw std::runtime_error(file.string() + " has " + std::to_string(d.features) + " features, " +
                               silo_train_files[0].string() + " has " + std::to_string(shift.size()));
    }
    for (std::size_t i = 0; i < d.rows; ++i) {
      for (std::size_t j = 0; j < d.features; ++j) {
        const double c = d.row(i)[j] - shift[j];
        sum[j] += c;
        sq[j] += c * c;
      }
    }
    n += static_cast<double>(d.rows);
  }
  FeatureStats s;
  s.count = static_cast<std::uint64_t>(n);
  for (std::size_t j = 0; j < shift.size(); ++j) {
    const double m = sum[j] / n;
    s.mean.push_back(shift[j] + m);
    s.var.push_back(std::max(0.0, sq[j] / n - m * m));
  }
  return s;
}

}  // namespace xsilo::tools

namespace xsilo::tools {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// The secure block of the statistics federation: the federation's own mode and group rules, with
// a ring (SecAgg's 64 bits, whatever protocol the training uses), clip norm and weight cap that
// fit statistics. The clip norm and weight cap are public
// bounds (here from the data the sim holds: twice the largest norm a silo's contribution can
// have, and the largest silo's rows); a real federation's operators state them.
json stats_secure(const SimConfig& cfg, const std::vector<std::filesystem::path>& files, const FeatureStats& pooled) {
  json s = cfg.secure;
  // Every silo must take part in both rounds, so a key or unmask deadline too short for a large
  // group's exchange on a loaded machine loses the statistics (100 silos on two busy cores missed
  // the default 30 s): the bounds grow by a second a silo. Only a failing round waits that long.
  const double wait_s = 30.0 + static_cast<double>(files.size());
  s["keys_s"] = std::max(s.value("keys_s", 30.0), wait_s);
  s["unmask_s"] = std::max(s.value("unmask_s", 30.0), wait_s);
  double bound = 1, rows = 1;
  for (const auto& file : files) {
    const Dataset d = load_csv(file);
    std::vector<double> mean(d.features, 0), var(d.features, 0);
    for (std::size_t i = 0; i < d.rows; ++i) {
      for (std::size_t j = 0; j < d.features; ++j) mean[j] += d.row(i)[j] / static_cast<double>(d.rows);
    }
    for (std::size_t i = 0; i < d.rows; ++i) {
      for (std::size_t j = 0; j < d.features; ++j) {
        const double c = d.row(i)[j] - pooled.mean[j];
        var[j] += c * c / static_cast<double>(d.rows);
      }
    }
    bound = std::max({bound, norm(mean), norm(var)});
    rows = std::max(rows, static_cast<double>(d.rows));
  }
  const double clip = 2 * bound;
  // Every member's weighted, clipped values summed must fit the 64-bit ring with room to spare.
  const double headroom = std::log2(static_cast<double>(files.size()) * rows * clip) + 3;
  s["modulus_bits"] = 64;
  s["fraction_bits"] = static_cast<int>(std::clamp(62.0 - headroom, 8.0, 32.0));
  s["clip_norm"] = clip;
  s["max_weight"] = rows;
  s.erase("count_unclipped");
  // The 64-bit ring is SecAgg's: a federation that trains under LightSecAgg (32-bit field words)
  // computes its statistics under SecAgg, with the same mode, groups and floor.
  s.erase("protocol");
  s.erase("lightsecagg");
  return s;
}

// The statistics' server: two rounds of secure aggregation over every silo, its config checked.
std::filesystem::path write_stats_server(const SimConfig& cfg, const FederationFiles& f, const std::filesystem::path& dir,
                                         const std::filesystem::path& model_file,
                                         const std::vector<std::filesystem::path>& silo_train_files,
                                         const FeatureStats& pooled) {
  json server = {{"federation", cfg.federation},
                 {"listen", "127.0.0.1:0"},
                 {"port_file", (dir / "server.port").string()},
                 {"tls", {{"kit", (f.pki / "kits" / "server").string()}}},
                 {"allow", {{"silo", f.silos}}},
                 {"state_dir", (dir / "server").string()},
                 {"rounds", 2},
                 {"seed", cfg.seed},
                 {"model", {{"kind", "file"}, {"path", model_file.string()}}},
                 {"training", {{"local_epochs", 1}}},
                 {"optimizer", {{"kind", "fedavg"}, {"lr", 1.0}}},
                 {"selection", {{"min_silos", f.silos.size()}, {"min_updates", f.silos.size()}}},
                 {"deadlines", {{"join_s", 30}, {"train_s", 60}, {"upload_s", 30}}},
                 {"secure", stats_secure(cfg, silo_train_files, pooled)},
                 {"log_format", cfg.log_format}};
  const auto server_config = dir / "server.json";
  atomic_write_file(server_config, server.dump(2) + "\n");
  try {
    atomic_write_file(server_config, server::to_json(server::load_server_config(server_config)).dump(2) + "\n");
  } catch (const ConfigError& e) {
    throw ConfigError(std::string("the feature statistics' federation: ") + e.what() + " (generated from sim config " +
                      (cfg.file.empty() ? std::string("defaults") : cfg.file.string()) + ")");
  }
  return server_config;
}

// A silo's agent for the statistics: it reports its data's statistics as its update.
std::filesystem::path write_stats_agent(const SimConfig& cfg, const FederationFiles& f, const std::filesystem::path& dir,
                                        const std::string& silo, std::uint16_t port,
                                        const std::filesystem::path& train_file) {
  agent::AgentConfig a;
  a.federation = cfg.federation;
  a.upstreams = {{"127.0.0.1", port}};
  a.tls = transport::TlsFiles::from_kit(f.pki / "kits" / silo);
  a.reconnect = {std::chrono::milliseconds(100), std::chrono::milliseconds(1000), 0};
  a.log_format = cfg.log_format;
  a.trainer = agent::TrainerKind::FeatureStats;
  a.secure_floor = sim_secure_floor(cfg);
  a.train_data = train_file;
  a.state_dir = dir / "silos" / silo;
  const auto file = dir / (silo + ".json");
  atomic_write_file(file, agent::to_json(a).dump(2) + "\n");
  return file;
}

// The rounds the statistics' server committed (into `committed`), and the count: the first
// round's summed weight.
std::uint64_t stats_count(const std::filesystem::path& audit, std::size_t& committed) {
  std::uint64_t count = 0;
  for (const auto& r : server::read_audit_log(audit)) {
    if (r.value("event", "") != "round" || r.value("status", "") != "committed") continue;
    ++committed;
    if (r.value("round", 0) != 1 || !r.contains("secure")) continue;
    double weight = 0;  // the groups' unmasked weights: the rows of the silos each group summed
    for (const auto& g : r["secure"].value("groups_outcome", json::array())) weight += g.value("weight", 0.0);
    count = static_cast<std::uint64_t>(std::llround(weight));
  }
  return count;
}

}  // namespace

FeatureStats secure_feature_stats(const SimConfig& cfg, const FederationFiles& f,
                                  const std::vector<std::filesystem::path>& silo_train_files, const FeatureStats& pooled) {
  const auto dir = f.out / "feature_stats";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto model_file = dir / "zeros.safetensors";
  save_safetensors(model_file, agent::feature_stats_model(pooled.mean.size()));
  const auto server_config = write_stats_server(cfg, f, dir, model_file, silo_train_files, pooled);
  // The xsilo binary: this process under `xsilo sim`; a test that prepares a federation itself
  // names it in XSILO_BIN, as CTest does.
  const char* bin = std::getenv("XSILO_BIN");
  const std::string xsilo = bin && *bin ? bin : self_exe();
  std::vector<std::unique_ptr<Process>> procs;
  auto fail = [&](const std::string& why) -> std::runtime_error {
    for (auto& p : procs) p->stop(std::chrono::milliseconds(1000));
    return std::runtime_error("sim: the feature statistics could not be computed: " + why + "; the server's log ends:\n" +
                              log_tail(f.logs / "feature-stats-server.log"));
  };
  procs.push_back(std::make_unique<Process>(std::vector<std::string>{xsilo, "server", "--config", server_config.string()},
                                            f.logs / "feature-stats-server.log"));
  Process& srv = *procs.front();
  std::uint16_t port = 0;
  for (const auto until = Clock::now() + std::chrono::seconds(30); !port && Clock::now() < until;) {
    const auto p = dir / "server.port";
    if (std::filesystem::exists(p)) {
      const std::string text = read_file(p);
      if (!text.empty() && text.back() == '\n') port = static_cast<std::uint16_t>(std::stoi(text));
    }
    if (!port && !srv.running()) throw fail("its server exited at start");
    if (!port) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!port) throw fail("its server did not start");
  for (std::size_t i = 0; i < f.silos.size(); ++i) {
    const auto file = write_stats_agent(cfg, f, dir, f.silos[i], port, silo_train_files[i]);
    procs.push_back(std::make_unique<Process>(std::vector<std::string>{xsilo, "agent", "--config", file.string()},
                                              f.logs / ("feature-stats-" + f.silos[i] + ".log")));
  }
  const auto code = srv.wait(std::chrono::minutes(5));
  if (code.value_or(-1) != 0) throw fail(code ? "its server exited with code " + std::to_string(*code) : "it took over 5 minutes");
  for (std::size_t k = 1; k < procs.size(); ++k) {
    if (!procs[k]->wait(std::chrono::milliseconds(5000))) procs[k]->stop(std::chrono::milliseconds(1000));
  }
  // Two committed rounds; the count is the first round's summed weight (inside the masked sum
  // under secure aggregation: the server learns the total only).
  std::size_t committed = 0;
  const std::uint64_t count = stats_count(dir / "server" / "audit.jsonl", committed);
  if (committed != 2) throw fail(std::to_string(committed) + " of its 2 rounds committed");
  return agent::feature_stats_from(load_safetensors(dir / "server" / "checkpoints" / "round_000002.safetensors"), count);
}

}  // namespace xsilo::tools
