// xsilo bench round | secagg | robust | allreduce
#include "common/config.h"
#include "tools/bench.h"
#include "tools/commands.h"

namespace xsilo::tools {

void add_bench(CLI::App& app, int& exit_code) {
  auto* bench = app.add_subcommand("bench", "benchmarks: tables against the physical limits");
  bench->require_subcommand(1);

  auto round = std::make_shared<RoundBenchOptions>();
  auto* r = bench->add_subcommand("round", "server + K agents on loopback, synthetic model, no training");
  r->add_option("--silos", round->silos, "agents (several values: one run each)")->capture_default_str();
  r->add_option("--params", round->params, "float32 parameters of the model")->capture_default_str();
  r->add_option("--rounds", round->rounds, "rounds per run (the first is not timed)")->capture_default_str();
  r->add_flag("--json", round->json, "one JSON object per measurement");
  r->callback([round, &exit_code] { exit_code = bench_round(*round); });

  struct TransportOpts {
    std::size_t mib = 256, chunk = 1 << 20;
    bool json = false;
  };
  auto tr = std::make_shared<TransportOpts>();
  auto* t = bench->add_subcommand("transport", "one TLS channel streaming chunks over loopback");
  t->add_option("--mib", tr->mib, "payload")->capture_default_str();
  t->add_option("--chunk-bytes", tr->chunk, "chunk size")->capture_default_str();
  t->add_flag("--json", tr->json, "JSON output");
  t->callback([tr, &exit_code] { exit_code = bench_transport(tr->mib, tr->chunk, tr->json); });
}

}  // namespace xsilo::tools
