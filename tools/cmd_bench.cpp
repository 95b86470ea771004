// xsilo bench round | secagg | robust | allreduce | compression | ...
#include <iostream>

#include "common/build_info.h"
#include "common/config.h"
#include "silo_agent/collective/communicator.h"
#include "tools/bench.h"
#include "tools/commands.h"

namespace xsilo::tools {

namespace {

// `bench round`: a real server and agents on loopback.
void add_bench_round(CLI::App& bench, int& exit_code) {
  auto round = std::make_shared<RoundBenchOptions>();
  auto* r = bench.add_subcommand("round", "server + K agents on loopback, synthetic model, no training");
  r->add_option("--silos", round->silos, "agents (several values: one run each)")->capture_default_str();
  r->add_option("--params", round->params, "float32 parameters of the model")->capture_default_str();
  r->add_option("--rounds", round->rounds, "rounds per run (the first is not timed)")->capture_default_str();
  r->add_option("--edges", round->edges, "edge aggregators between silos and server (several values)")
      ->capture_default_str();
  // A block of the server config, as a JSON object (`round` keeps `into` alive).
  auto config_block = [&](const std::string& flag, nlohmann::json& into, const std::string& help) {
    r->add_option_function<std::string>(
        flag,
        [round, &into, flag](const std::string& s) {
          into = nlohmann::json::parse(s, nullptr, false);
          if (!into.is_object()) throw CLI::ValidationError(flag, "not a JSON object: " + s);
        },
        help);
  };
  config_block("--compression", round->compression,
               "the server config's compression block, e.g. '{\"scheme\": \"quantize\", \"bits\": 4}'");
  config_block("--broadcast", round->broadcast,
               "the server config's broadcast block, e.g. '{\"scheme\": \"quantize\", \"bits\": 8}'");
  r->add_option("--secure", round->secure, "secure aggregation mode")
      ->check(CLI::IsMember({"off", "global", "grouped"}))
      ->capture_default_str();
  // scripts/wan-bench.sh makes the namespaces and shapes their links; hidden from --help.
  r->add_option("--netns-prefix", round->netns_prefix, "run the server in PREFIX-server, silo I in PREFIX-silo-I")
      ->group("");
  r->add_option("--uploads-at-once", round->uploads_at_once,
                "the server's uploads_at_once (default: the server's default)");
  r->add_option("--broadcasts-at-once", round->broadcasts_at_once,
                "the server's broadcasts_at_once, 0: every silo at once (default: the server's default)");
  r->add_option("--network-threads", round->network_threads,
                "the server's network_threads (default: the server's default)");
  r->add_option("--server-address", round->server_address, "the address the server listens on, silos dial")
      ->group("");
  r->add_flag("--json", round->json, "one JSON object per measurement");
  r->callback([round, &exit_code] { exit_code = bench_round(*round); });
}

// `bench attacks`: robust rules against simulated attackers.
void add_bench_attacks(CLI::App& bench, int& exit_code) {
  auto at = std::make_shared<AttackBenchOptions>();
  auto* a = bench.add_subcommand("attacks", "robust rules and steps against simulated attacks (10 silos by default, non-IID)");
  a->add_option("--datasets", at->datasets, "digits (MLP), breast_cancer, digits_logistic (logistic regressions; several values)")->capture_default_str();
  a->add_option("--alpha", at->alpha, "Dirichlet label skew (several values: one table each)")->capture_default_str();
  a->add_option("--attackers", at->attackers, "Byzantine silos (several values: one table each)")->capture_default_str();
  a->add_option("--seeds", at->seeds, "seeds: each cell is their mean and spread")->capture_default_str();
  a->add_option("--rounds", at->rounds, "rounds per run")->capture_default_str();
  a->add_option("--tau", at->tau, "centered clipping radius (0: auto, from each round's inputs)")->capture_default_str();
  a->add_option("--silos", at->silos, "silos in each federation (every one takes part in every round)")
      ->check(CLI::Range(3, 1000))
      ->capture_default_str();
  a->add_option("--iterations", at->iterations, "centered clipping's iterations")->capture_default_str();
  a->add_option("--oppose", at->oppose, "centered clipping's opposition, in median alignments with the last step (0: off)")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  // A spread factor below 1 would give up the majority guarantee; the server's config refuses it too.
  const CLI::Validator off_or_spread(
      [](std::string& v) {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        const bool ok = end != v.c_str() && *end == '\0' && (x == 0 || (x >= 1 && x <= 100));
        return ok ? std::string() : "must be 0 (off) or 1..100, got " + v;
      },
      "0 or 1..100");
  a->add_option("--one-sided", at->one_sided,
                "centered clipping's one-sided test, in spreads of the inputs' balances (0: off; else at least 1)")
      ->check(off_or_spread)
      ->capture_default_str();
  a->add_option("--lag", at->lag,
                "centered clipping's lag test, in spreads of the alignments with the last step (0: off; else at least 1)")
      ->check(off_or_spread)
      ->capture_default_str();
  a->add_option("--f", at->f, "the f the rules assume (0: the number of attackers; set it to try more attackers than f)")
      ->capture_default_str();
  a->add_option("--defences", at->defences, "only these rows (default: all)");
  a->add_option("--attacks", at->attacks, "only these columns (default: all)");
  a->add_flag("--processes", at->processes, "every run as real processes over mutual TLS (slow) instead of in process");
  a->add_flag("--json", at->json, "one JSON object per run");
  a->callback([at, &exit_code] { exit_code = bench_attacks(*at); });
}

// `bench compression`: codecs and broadcast deltas.
void add_bench_compression(CLI::App& bench, int& exit_code) {
  auto co = std::make_shared<CompressionBenchOptions>();
  auto* cb = bench.add_subcommand("compression", "upload compressors and broadcast deltas: accuracy, bytes and codec speed");
  cb->add_option("--d", co->d, "parameters for the codec speed table (several values)")->capture_default_str();
  cb->add_option("--rounds", co->rounds, "rounds of each federation (0: codec speed only)")->capture_default_str();
  cb->add_option("--seeds", co->seeds, "seeds: each row is their mean")->capture_default_str();
  cb->add_option("--only", co->only, "only these rows, e.g. \"8-bit\" (default: all)");
  cb->add_option("--sim", co->sim,
                 "a sim config whose model, trainer and data to federate instead of the digits MLP "
                 "(e.g. examples/pytorch/sim.json); silos, split, rounds and selection stay the bench's")
      ->check(CLI::ExistingFile);
  cb->add_flag("--no-codecs", co->skip_codecs, "skip the codec speed table");
  cb->add_flag("--json", co->json, "one JSON object per measurement");
  cb->callback([co, &exit_code] { exit_code = bench_compression(*co); });
}

// `bench robust`: the robust rules beside numpy.
void add_bench_robust(CLI::App& bench, int& exit_code) {
  auto ro = std::make_shared<RobustBenchOptions>();
  auto* rb = bench.add_subcommand("robust", "robust rules on n x d matrices beside a numpy reference");
  rb->add_option("--n", ro->n, "inputs (several values)")->capture_default_str();
  rb->add_option("--d", ro->d, "parameters (several values)")->capture_default_str();
  rb->add_option("--numpy-rules", ro->numpy_rules, "rules the numpy reference times")->capture_default_str();
  rb->add_flag("--json", ro->json, "one JSON object per measurement");
  rb->callback([ro, &exit_code] { exit_code = bench_robust(*ro); });
}

// `bench secagg`: masking and unmasking against the keystream bound.
void add_bench_secagg(CLI::App& bench, int& exit_code) {
  auto so = std::make_shared<SecAggBenchOptions>();
  auto* sb = bench.add_subcommand("secagg", "masking and unmasking time against the AES-CTR keystream bound");
  sb->add_option("--n", so->n, "silos per group (several values)")->capture_default_str();
  sb->add_option("--d", so->d, "parameters (several values)")->capture_default_str();
  sb->add_option("--dropouts", so->dropouts, "fractions of silos that vanish after sharing keys")->capture_default_str();
  sb->add_option("--graph", so->graph, "complete (every pair masks), plus (SecAgg+: k neighbours each) or both")
      ->check(CLI::IsMember({"complete", "plus", "both"}))
      ->capture_default_str();
  sb->add_option("--plan-dropout", so->plan_dropout, "dropout rate SecAgg+'s graph is chosen for")
      ->check(CLI::Range(0.0, 0.9))
      ->capture_default_str();
  sb->add_option("--corrupt", so->corrupt, "fraction of corrupt silos SecAgg+'s graph is chosen for")
      ->check(CLI::Range(0.0, 0.5))
      ->capture_default_str();
  sb->add_flag("--lightsecagg", so->lightsecagg,
               "add LightSecAgg rows: U = n minus the --plan-dropout share, T = --lsa-privacy x n");
  sb->add_option("--lsa-privacy", so->lsa_privacy, "LightSecAgg's privacy T as a fraction of n")
      ->check(CLI::Range(0.01, 0.99))
      ->capture_default_str();
  sb->add_flag("--json", so->json, "one JSON object per measurement");
  sb->callback([so, &exit_code] { exit_code = bench_secagg(*so); });
}

// `bench allreduce`: our all-reduce beside OpenMPI and Gloo.
void add_bench_allreduce(CLI::App& bench, int& exit_code) {
  auto ar = std::make_shared<AllreduceBenchOptions>();
  auto* arc = bench.add_subcommand("allreduce", "all-reduce across local worker processes, beside OpenMPI and Gloo");
  arc->add_option("--backend", ar->backends, "ring, hd, tree, butterfly, hierarchical (hierarchical+hd, +tree, +butterfly: that algorithm among the hosts' leaders instead of the ring), auto, nccl, int8 (the 8-bit all-reduce over the TCP mesh), topk (the sparse all-reduce; several values)")->capture_default_str();
  arc->add_option("--ranks-per-host", ar->ranks_per_host, "hierarchical: ranks r / N share a host")->capture_default_str();
  arc->add_option("--intra-host", ar->intra_host, "hierarchical: inside each host tcp, nccl (a GPU per rank of a host) or auto")
      ->check(CLI::IsMember(collective::intra_host_transports()))
      ->capture_default_str();
  arc->add_option("--topk-fraction", ar->topk_fraction, "topk: the share of coordinates each rank sends")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  arc->add_option("--ranks", ar->ranks, "worker processes (several values: one table each)")->capture_default_str();
  arc->add_option("--bytes", ar->bytes, "message sizes in bytes")->capture_default_str();
  arc->add_option("--chunk-bytes", ar->chunk_bytes, "pipelining unit of our ring")->capture_default_str();
  arc->add_option("--hosts", ar->hosts, "rank k runs on hosts[k % N] (as local.hosts; hierarchical then groups ranks by host)");
  arc->add_option("--launcher", ar->launcher, "with --hosts: the command that starts a rank on its host, {host} replaced (as local.launcher)");
  arc->add_option("--listen-host", ar->listen_host, "with --hosts: the address the ranks reach this machine at")->capture_default_str();
  arc->add_flag("!--no-peers", ar->peers, "skip OpenMPI and Gloo");
  arc->add_flag("--json", ar->json, "one JSON object per measurement");
  arc->callback([ar, &exit_code] { exit_code = bench_allreduce(*ar); });
}

// `bench trainer`: the external trainer hand-off.
void add_bench_trainer(CLI::App& bench, int& exit_code) {
  auto trn = std::make_shared<TrainerBenchOptions>();
  auto* tb = bench.add_subcommand("trainer", "hand-off to an external trainer and back, against /dev/shm");
  tb->add_option("--params", trn->params, "float32 parameters (several values)")->capture_default_str();
  tb->add_option("--repeats", trn->repeats, "timed hand-offs per size (the best counts)")->capture_default_str();
  tb->add_option("--rounds", trn->rounds, "rounds of the default experiment, built-in vs external (0: skip)")
      ->capture_default_str();
  tb->add_option("--python", trn->python, "the interpreter with numpy")->capture_default_str();
  tb->add_flag("--json", trn->json, "one JSON object per measurement");
  tb->callback([trn, &exit_code] { exit_code = bench_trainer(*trn); });
}

// `bench stragglers`: one slow local worker, without and with fractional repetition.
void add_bench_stragglers(CLI::App& bench, int& exit_code) {
  auto st = std::make_shared<StragglerBenchOptions>();
  auto* s = bench.add_subcommand("stragglers", "a training step with one slow local worker, without and with local.stragglers");
  s->add_option("--workers", st->workers, "local workers (threads)")->capture_default_str();
  s->add_option("--stragglers", st->stragglers, "local.stragglers for the mitigated rows (0: none, with --gossip)")->capture_default_str();
  s->add_flag("--gossip", st->gossip, "also rows of push-sum gossip (local.algorithm gossip), which waits for nobody");
  s->add_option("--slow-worker", st->slow_worker, "which worker is slow")->capture_default_str();
  s->add_option("--slow", st->slow, "how many times slower it computes (several values; 1: nobody slow)")->capture_default_str();
  s->add_option("--epochs", st->epochs, "epochs over the digits rows")->capture_default_str();
  s->add_option("--repeats", st->repeats, "runs of each row (the median counts)")->capture_default_str();
  s->add_option("--batch", st->batch, "global batch")->capture_default_str();
  s->add_option("--hidden", st->hidden, "the MLP's hidden layers")->capture_default_str();
  s->add_flag("--json", st->json, "one JSON object per measurement");
  s->callback([st, &exit_code] { exit_code = bench_stragglers(*st); });
}

// `bench transport`: one TLS channel.
void add_bench_transport(CLI::App& bench, int& exit_code) {
  struct TransportOpts {
    std::size_t mib = 256, chunk = 1 << 20;
    bool json = false;
  };
  auto tr = std::make_shared<TransportOpts>();
  auto* t = bench.add_subcommand("transport", "one TLS channel streaming chunks over loopback");
  t->add_option("--mib", tr->mib, "payload")->capture_default_str();
  t->add_option("--chunk-bytes", tr->chunk, "chunk size")->capture_default_str();
  t->add_flag("--json", tr->json, "JSON output");
  t->callback([tr, &exit_code] { exit_code = bench_transport(tr->mib, tr->chunk, tr->json); });
}

}  // namespace

void add_bench(CLI::App& app, int& exit_code) {
  auto* bench = app.add_subcommand("bench", "benchmarks: tables against the physical limits");
  bench->require_subcommand(1);
  // Every figure says which build and which CPU produced it (on stderr: --json stays JSON).
  bench->parse_complete_callback([] { std::cerr << "# " << build_info() << "; CPU " << cpu_info() << "\n"; });

  add_bench_round(*bench, exit_code);
  add_bench_attacks(*bench, exit_code);
  add_bench_compression(*bench, exit_code);
  add_bench_robust(*bench, exit_code);
  add_bench_secagg(*bench, exit_code);
  add_bench_allreduce(*bench, exit_code);
  add_bench_trainer(*bench, exit_code);
  add_bench_stragglers(*bench, exit_code);
  add_bench_transport(*bench, exit_code);
}

}  // namespace xsilo::tools
