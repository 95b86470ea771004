// xsilo bench secagg: a silo's masking time and the server's unmasking time against the
// AES-128-CTR keystream bound, with the rate measured in the same run (openssl speed, and our
// own PRG for comparison).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <unistd.h>
#include <cstdio>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "crypto/mask.h"
#include "crypto/secagg.h"
#include "transport/pki.h"
#include "transport/tls.h"
#include "tools/bench.h"

namespace xsilo::tools {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", v);
  return buf;
}

// A silo's masking: at most this many times its keystream bound (issue 17, part 5).
constexpr double kMaskTarget = 1.25;

// `openssl speed -evp aes-128-ctr` at 16 KiB blocks, in bytes per second (0 if unavailable).
double openssl_ctr_rate() {
  FILE* p = ::popen("openssl speed -evp aes-128-ctr -bytes 16384 -seconds 2 2>/dev/null", "r");
  if (!p) return 0;
  char line[512];
  double rate = 0;
  while (std::fgets(line, sizeof line, p)) {
    double k = 0;
    char name[64];
    if (std::sscanf(line, "%63s %lfk", name, &k) == 2 && std::string(name).find("AES-128-CTR") != std::string::npos) {
      rate = k * 1000.0;
    }
  }
  ::pclose(p);
  return rate;
}

double our_ctr_rate() {
  std::vector<std::uint8_t> buf(std::size_t{256} << 20);
  const auto seed = crypto::Secret::random();
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    crypto::keystream(seed, buf);
    best = std::max(best, static_cast<double>(buf.size()) / seconds_since(t0));
  }
  return best;
}

// Certificate keys for the bench's silos and server: a throwaway federation PKI, as `xsilo
// pki` makes it (P-256), so the bench pays for the same signatures a federation does.
struct BenchPki {
  std::filesystem::path dir;
  std::optional<crypto::CertVerifier> ca;
  std::map<std::string, crypto::CertSigner> signers;
  explicit BenchPki(std::size_t silos) {
    dir = std::filesystem::temp_directory_path() / ("xsilo-bench-pki-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    transport::pki_init(dir, "bench");
    ca = transport::load_verifier(transport::TlsFiles::from_kit(issue(wire::SERVER, "server")));
    signers.emplace("server", transport::load_signer(transport::TlsFiles::from_kit(dir / "kits" / "server")));
    for (std::size_t i = 0; i < silos; ++i) {
      const std::string name = "silo-" + std::to_string(i);
      signers.emplace(name, transport::load_signer(transport::TlsFiles::from_kit(issue(wire::SILO, name))));
    }
  }
  ~BenchPki() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::filesystem::path issue(wire::Role role, const std::string& name) {
    transport::IssueRequest req;
    req.role = role;
    req.name = name;
    return transport::pki_issue(dir, req);
  }
};

struct Row {
  std::size_t n, d;
  double drop;
  std::uint32_t degree, threshold;  // degree n - 1: the complete graph
  double setup_s;  // one silo's share of the authenticated key phases (sign, verify, seal, open, agree)
  double mask_s, mask_bound_s, unmask_s, unmask_bound_s;
  std::size_t expansions;
  bool exact;
};

// plan.degree 0: the complete graph, t = max(n / 2 + 1, 2n / 3); otherwise SecAgg+ with the
// plan's k and t, and sums over at least half the group.
Row run(std::size_t n, std::size_t d, double drop, double rate, const BenchPki& pki, const crypto::secagg::GraphPlan& plan) {
  crypto::secagg::Params p;
  p.session = "bench/1/1";
  for (std::size_t i = 0; i < n; ++i) p.members.push_back("silo-" + std::to_string(i));
  if (plan.degree) {
    p.degree = plan.degree;
    p.graph_seed = "bench-round-seed";
    p.threshold = plan.threshold;
    p.min_survivors = std::max<std::uint32_t>(plan.threshold, static_cast<std::uint32_t>(n / 2));
  } else {
    p.threshold = static_cast<std::uint32_t>(std::max(n / 2 + 1, static_cast<std::size_t>(std::ceil(2.0 * static_cast<double>(n) / 3.0))));
    p.min_survivors = p.threshold;
  }
  p.bits = 32;
  p.length = d + 1;
  auto box = crypto::X25519KeyPair::generate();
  p.server_key = box.public_key;
  const auto& server_signer = pki.signers.at("server");
  crypto::secagg::Server server(p, *pki.ca, server_signer, std::move(box));
  std::vector<std::unique_ptr<crypto::secagg::Client>> clients;
  const std::uint32_t degree = plan.degree ? plan.degree : static_cast<std::uint32_t>(n - 1);
  Row r{n, d, drop, degree, p.threshold, 0, 0, 0, 0, 0, 0, false};
  // Every step must succeed: a refusal is a bug in the bench or the protocol, not a slow row.
  auto must = [](const std::string& err, const char* step) {
    if (!err.empty()) throw std::runtime_error(std::string("secagg bench: ") + step + ": " + err);
  };
  auto got = [&](auto&& e, const char* step) {
    if (!crypto::secagg::ok(e)) must(crypto::secagg::error(e), step);
    return crypto::secagg::value(std::move(e));
  };
  auto timed = [&](std::size_t i, auto&& f) {
    const auto t0 = Clock::now();
    auto out = f();
    if (i == 0) r.setup_s += seconds_since(t0);
    return out;
  };
  for (std::size_t i = 0; i < n; ++i) {
    const auto& m = p.members[i];
    clients.push_back(std::make_unique<crypto::secagg::Client>(p, m, pki.signers.at(m), *pki.ca,
                                                               server_signer.certificate(), "server"));
    must(server.on_keys(m, got(timed(i, [&] { return clients.back()->advertise(); }), "advertise")), "keys");
  }
  (void)got(server.close_keys(), "close keys");
  for (std::size_t i = 0; i < n; ++i) {
    const auto mine = server.keys_for(p.members[i]);  // as the server sends it: the member's neighbours' part
    must(server.on_shares(p.members[i], got(timed(i, [&] { return clients[i]->share(mine); }), "share")),
         "shares");
  }
  auto boxes = got(server.close_shares(), "close shares");
  for (std::size_t i = 0; i < n; ++i) {
    must(server.on_receipt(p.members[i],
                           got(timed(i, [&] { return clients[i]->receive(boxes[p.members[i]]); }), "receive")),
         "receipt");
  }
  auto settled = got(server.settle(), "settle list");
  for (std::size_t i = 0; i < n; ++i) must(timed(i, [&] { return clients[i]->settle(settled); }), "settle");  // agrees the seeds
  // The last `dropped` silos vanish after settling: the server must rebuild their mask keys.
  const auto dropped = static_cast<std::size_t>(std::round(drop * static_cast<double>(n)));
  std::vector<std::uint32_t> y(d + 1), sum(d + 1, 0), expected(d + 1, 0);
  for (std::size_t i = 0; i + dropped < n; ++i) {
    for (std::size_t k = 0; k <= d; ++k) y[k] = static_cast<std::uint32_t>(i * 2654435761u + k);
    for (std::size_t k = 0; k <= d; ++k) expected[k] += y[k];
    const auto t0 = Clock::now();
    must(clients[i]->mask(y), "mask");
    const double s = seconds_since(t0);
    if (i < 3) r.mask_s = i == 0 ? s : std::min(r.mask_s, s);  // best of the first three silos
    for (std::size_t k = 0; k <= d; ++k) sum[k] += y[k];
    must(server.on_masked_input(p.members[i]), "masked input");
  }
  auto u3 = got(server.close_masked(), "close masked");
  for (std::size_t i = 0; i + dropped < n; ++i) {
    must(server.on_confirmation(p.members[i],
                                got(clients[i]->confirm(u3, server.survivors_signature()), "confirm").signature),
         "confirmation");
  }
  auto request = got(server.close_confirmations(), "close confirmations");
  for (std::size_t i = 0; i + dropped < n; ++i) {
    must(server.on_unmask(p.members[i], got(clients[i]->unmask(request), "unmask request").box), "unmask");
  }
  const auto t0 = Clock::now();
  const auto err = server.finish(std::span<std::uint32_t>(sum));
  r.unmask_s = seconds_since(t0);
  r.exact = err.empty() && sum == expected;
  r.expansions = server.expansions();
  // A silo expands one mask per neighbour that shared keys (every other member in the complete
  // graph), plus its self mask.
  const double word_bytes = 4.0 * static_cast<double>(d + 1);
  r.mask_bound_s = static_cast<double>(degree + 1) * word_bytes / rate;
  r.unmask_bound_s = static_cast<double>(r.expansions) * word_bytes / rate;
  return r;
}

}  // namespace

int bench_secagg(const SecAggBenchOptions& opts) {
  const double openssl = openssl_ctr_rate();
  const double ours = our_ctr_rate();
  const double rate = openssl > 0 ? openssl : ours;
  if (!opts.json) {
    std::cout << "AES-128-CTR keystream, one core: openssl speed " << fmt(openssl / 1e9, 2) << " GB/s, xsilo's PRG "
              << fmt(ours / 1e9, 2) << " GB/s; bounds use " << fmt(rate / 1e9, 2) << " GB/s\n";
  }
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> speedups;
  bool ok = true;
  const BenchPki pki(*std::max_element(opts.n.begin(), opts.n.end()));
  for (auto n : opts.n) {
    // SecAgg+'s graph for this group size, the planned dropout rate and corruption.
    const auto plan = crypto::secagg::plan_graph(n, opts.plan_dropout, opts.corrupt);
    if (opts.graph != "complete" && !opts.json) {
      std::cout << "SecAgg+ for n = " << n << ", dropouts " << fmt(opts.plan_dropout * 100, 0) << "%, corrupt "
                << fmt(opts.corrupt * 100, 0) << "%: "
                << (plan.degree ? "k = " + std::to_string(plan.degree) + ", t = " + std::to_string(plan.threshold) +
                                      " of k + 1, safe against a deviating server with " +
                                      std::to_string(plan.corrupt) + " colluders whatever the graph; a round fails "
                                      "with p < " + sci(plan.p_unavailable)
                                : std::string("no graph below the complete one keeps t above half of each secret's "
                                              "holders with these dropouts (2^-20): the complete graph"))
                << "\n";
    }
    std::vector<crypto::secagg::GraphPlan> graphs;
    if (opts.graph != "plus") graphs.push_back({});
    if (opts.graph != "complete" && plan.degree) graphs.push_back(plan);
    for (auto d : opts.d) {
      for (auto drop : opts.dropouts) {
        double complete_unmask = 0;
        for (const auto& graph : graphs) {
          if (!opts.json) {
            std::cerr << "n = " << n << ", d = " << d << ", dropouts " << drop * 100 << "%, "
                      << (graph.degree ? "k = " + std::to_string(graph.degree) : std::string("complete graph"))
                      << " ..." << std::endl;
          }
          const Row r = run(n, d, drop, rate, pki, graph);
          if (!graph.degree) complete_unmask = r.unmask_s;
          if (graph.degree && complete_unmask > 0 && r.unmask_s > 0) {
            speedups.push_back("n = " + std::to_string(n) + ", d = " + std::to_string(d) + ", dropouts " +
                               fmt(drop * 100, 0) + "%: unmasking " + fmt(complete_unmask / r.unmask_s, 1) +
                               "x faster with k = " + std::to_string(graph.degree));
          }
          const double mask_ratio = r.mask_s / r.mask_bound_s, unmask_ratio = r.unmask_s / r.unmask_bound_s;
          const bool mask_ok = mask_ratio <= kMaskTarget;
          const bool unmask_ok = drop < 0.3 - 1e-9 || unmask_ratio <= 2.0;
          ok = ok && mask_ok && unmask_ok && r.exact;
          if (opts.json) {
            std::cout << json{{"bench", "secagg"},
                              {"n", n},
                              {"d", d},
                              {"dropouts", drop},
                              {"degree", r.degree},
                              {"threshold", r.threshold},
                              {"key_phases_seconds", r.setup_s},
                              {"mask_seconds", r.mask_s},
                              {"mask_bound_seconds", r.mask_bound_s},
                              {"unmask_seconds", r.unmask_s},
                              {"unmask_bound_seconds", r.unmask_bound_s},
                              {"expansions", r.expansions},
                              {"keystream_GBps", rate / 1e9},
                              {"exact_sum", r.exact}}
                             .dump()
                      << std::endl;
          }
          rows.push_back({std::to_string(n), std::to_string(d), fmt(drop * 100, 0) + "%",
                          graph.degree ? std::to_string(r.degree) : "all", std::to_string(r.threshold),
                          fmt(r.setup_s, 3), fmt(r.mask_s, 3), fmt(mask_ratio, 2) + "x" + (mask_ok ? "" : " (>1.25)"),
                          fmt(r.unmask_s, 3), std::to_string(r.expansions),
                          fmt(unmask_ratio, 2) + "x" + (unmask_ok ? "" : " (>2)"), r.exact ? "yes" : "NO"});
        }
      }
    }
  }
  if (!opts.json) {
    print_table({"n", "d", "dropouts", "k", "t", "key phases s", "mask s",
                 "of bound", "unmask s", "expansions", "of bound", "exact sum"},
                rows);
    std::cout << "bounds: masking = (k + 1) x 4(d+1) bytes of keystream; "
                 "unmasking = expansions x 4(d+1) bytes\n"
              << "key phases: one silo's advertise, share, receive and settle "
                 "(certificate signatures and checks, sealing, agreeing its mask seeds)\n"
              << "k: neighbours each silo masks with (all: the complete "
                 "graph); t: shares that rebuild a secret\n";
    for (const auto& line : speedups) std::cout << "SecAgg+ " << line << "\n";
  }
  return ok ? 0 : 1;
}

}  // namespace xsilo::tools
