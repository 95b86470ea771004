// xsilo bench secagg: a silo's masking time and the server's unmasking time against the
// AES-128-CTR keystream bound, with the rate measured in the same run (openssl speed, and our
// own PRG for comparison); with --lightsecagg, LightSecAgg's encoding, masking and decoding
// beside them.
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

#include "crypto/lightsecagg.h"
#include "crypto/mask.h"
#include "crypto/prime_field.h"
#include "crypto/secagg.h"
#include "transport/pki.h"
#include "transport/tls.h"
#include "tools/bench.h"

namespace xsilo::tools {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", v);
  return buf;
}

// A silo's masking: at most this many times its keystream bound (issue 17, part 5).
constexpr double kMaskTarget = 1.25;

// `openssl speed -evp aes-128-ctr` at 16 KiB blocks, in bytes per second (0 if unavailable).
double openssl_ctr_rate() { return openssl_speed("aes-128-ctr", "AES-128-CTR"); }

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

struct SecaggRow {
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
crypto::secagg::Params secagg_params(std::size_t n, std::size_t d, const crypto::secagg::GraphPlan& plan) {
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
  return p;
}

// One group's whole protocol in process (silo 0's key phases and the best of three silos' masking
// timed, then the server's unmasking), beside the keystream bounds at `rate`.
SecaggRow run(std::size_t n, std::size_t d, double drop, double rate, const BenchPki& pki, const crypto::secagg::GraphPlan& plan) {
  auto p = secagg_params(n, d, plan);
  auto box = crypto::X25519KeyPair::generate();
  p.server_key = box.public_key;
  const auto& server_signer = pki.signers.at("server");
  crypto::secagg::Server server(p, *pki.ca, server_signer, std::move(box));
  std::vector<std::unique_ptr<crypto::secagg::Client>> clients;
  const std::uint32_t degree = plan.degree ? plan.degree : static_cast<std::uint32_t>(n - 1);
  SecaggRow r{n, d, drop, degree, p.threshold, 0, 0, 0, 0, 0, 0, false};
  // Every step must succeed: a refusal is a bug in the bench or the protocol, not a slow row.
  auto must = [](const Status& done, const char* step) {
    if (!done) throw std::runtime_error(std::string("secagg bench: ") + step + ": " + done.error().message());
  };
  auto got = [&](auto&& e, const char* step) {
    if (!e) must(e.error(), step);
    return *(std::move(e));
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
  const auto unmasked = server.finish(std::span<std::uint32_t>(sum));
  r.unmask_s = seconds_since(t0);
  r.exact = unmasked && sum == expected;
  r.expansions = server.expansions();
  // A silo expands one mask per neighbour that shared keys (every other member in the complete
  // graph), plus its self mask.
  const double word_bytes = 4.0 * static_cast<double>(d + 1);
  r.mask_bound_s = static_cast<double>(degree + 1) * word_bytes / rate;
  r.unmask_bound_s = static_cast<double>(r.expansions) * word_bytes / rate;
  return r;
}


// ---- LightSecAgg ---------------------------------------------------------------------------

struct LsaRow {
  std::size_t n, d;
  double drop;
  std::uint32_t T, U, t;
  bool full;           // the whole protocol in process; otherwise one silo's share and the decode alone
  double share_s;      // one silo's offline phase: draw, encode N shares, sign and seal them
  double mask_s;       // one silo's masking pass
  double unmask_s;     // the server's finish(): checks beyond U, decode, subtract
  std::size_t offline_bytes;  // what one silo sends in the offline phase (boxes and signatures)
  bool exact;
};

// LightSecAgg's parameters for a group of n: U = n minus the planned dropouts, T = privacy x n
// (below U), t and min_survivors as the complete graph's rows.
crypto::lightsecagg::Params lsa_params(std::size_t n, std::size_t d, const SecAggBenchOptions& opts) {
  crypto::lightsecagg::Params p;
  p.session = "bench/1/2";
  for (std::size_t i = 0; i < n; ++i) p.members.push_back("silo-" + std::to_string(i));
  const double nn = static_cast<double>(n);
  p.target = static_cast<std::uint32_t>(std::max<double>(2, nn - std::ceil(opts.plan_dropout * nn - 1e-9)));
  p.privacy = std::clamp<std::uint32_t>(static_cast<std::uint32_t>(std::floor(opts.lsa_privacy * nn)), 1, p.target - 1);
  p.threshold = static_cast<std::uint32_t>(std::max(n / 2 + 1, static_cast<std::size_t>(std::ceil(2.0 * nn / 3.0))));
  p.min_survivors = std::max(p.threshold, p.target);
  p.length = d + 1;
  return p;
}

std::size_t outbox_bytes(const crypto::lightsecagg::Outbox& out) {
  std::size_t b = 0;
  for (const auto& [to, sealed] : out) b += sealed.box.size() + sealed.signature.size() + to.size();
  return b;
}

// The whole protocol, every silo in process: only where every box fits in memory at once.
LsaRow lsa_full(const crypto::lightsecagg::Params& params, double drop, const BenchPki& pki) {
  namespace lsa = crypto::lightsecagg;
  auto p = params;
  const std::size_t n = p.members.size(), d = p.length - 1;
  auto box = crypto::X25519KeyPair::generate();
  p.server_key = box.public_key;
  lsa::Server server(p, *pki.ca, pki.signers.at("server"), std::move(box));
  std::vector<std::unique_ptr<lsa::Client>> clients;
  LsaRow r{n, d, drop, p.privacy, p.target, p.threshold, true, 0, 0, 0, 0, false};
  auto must = [](const Status& done, const char* step) {
    if (!done) throw std::runtime_error(std::string("lightsecagg bench: ") + step + ": " + done.error().message());
  };
  auto got = [&](auto&& e, const char* step) {
    if (!e) must(e.error(), step);
    return *(std::move(e));
  };
  const crypto::secagg::Floor floor{2, 0.0};
  for (const auto& m : p.members) {
    clients.push_back(std::make_unique<lsa::Client>(p, m, pki.signers.at(m), *pki.ca,
                                                    pki.signers.at("server").certificate(), "server", floor));
    must(server.on_keys(m, got(clients.back()->advertise(), "advertise")), "keys");
  }
  const auto keys = got(server.close_keys(), "close keys");
  for (std::size_t i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    auto out = got(clients[i]->share(keys), "share");
    if (i == 0) {
      r.share_s = seconds_since(t0);
      r.offline_bytes = outbox_bytes(out);
    }
    must(server.on_shares(p.members[i], out), "shares");
  }
  auto inboxes = got(server.close_shares(), "close shares");
  for (std::size_t i = 0; i < n; ++i) {
    must(server.on_receipt(p.members[i], got(clients[i]->receive(inboxes[p.members[i]]), "receive")), "receipt");
    inboxes.erase(p.members[i]);
  }
  const auto settled = got(server.settle(), "settle");
  for (auto& c : clients) must(c->settle(settled), "settle");
  const auto dropped = static_cast<std::size_t>(std::round(drop * static_cast<double>(n)));
  std::vector<std::uint32_t> x(d + 1), sum(d + 1, 0), expected(d + 1, 0);
  for (std::size_t i = 0; i + dropped < n; ++i) {
    for (std::size_t k = 0; k <= d; ++k) x[k] = static_cast<std::uint32_t>(i * 2654435761u + k) % crypto::field::kPrime;
    crypto::field::field_add(expected, x);
    const auto t0 = Clock::now();
    must(clients[i]->mask(x), "mask");
    const double s = seconds_since(t0);
    if (i < 3) r.mask_s = i == 0 ? s : std::min(r.mask_s, s);
    crypto::field::field_add(sum, x);
    must(server.on_masked_input(p.members[i]), "masked input");
  }
  const auto u3 = got(server.close_masked(), "close masked");
  for (std::size_t i = 0; i + dropped < n; ++i) {
    must(server.on_confirmation(p.members[i], got(clients[i]->confirm(u3, server.survivors_signature()), "confirm").signature),
         "confirmation");
  }
  const auto request = got(server.close_confirmations(), "close confirmations");
  for (std::size_t i = 0; i + dropped < n; ++i) {
    must(server.on_unmask(p.members[i], got(clients[i]->unmask(request), "unmask request").box), "unmask");
  }
  const auto t0 = Clock::now();
  const auto unmasked = server.finish(sum);
  r.unmask_s = seconds_since(t0);
  r.exact = unmasked && sum == expected;
  return r;
}

// Too large to hold every box (n^2 d / (U - T) words): the silos advertise, one silo runs its
// offline phase for real (draw, encode, sign, seal: its time and bytes), its masking pass is
// the field addition mask() runs, and the server's decode runs for real on U answers of L words
// (uniform words: any U of them are the evaluations of one polynomial of degree < U), checked
// against a plain Lagrange interpolation at a few coordinates.
LsaRow lsa_partial(const crypto::lightsecagg::Params& params, double drop, const BenchPki& pki) {
  namespace lsa = crypto::lightsecagg;
  namespace field = crypto::field;
  auto p = params;
  const std::size_t n = p.members.size(), d = p.length - 1, L = p.segment();
  p.server_key = crypto::X25519KeyPair::generate().public_key;
  LsaRow r{n, d, drop, p.privacy, p.target, p.threshold, false, 0, 0, 0, 0, false};
  std::vector<std::unique_ptr<lsa::Client>> clients;
  lsa::KeyList keys;
  for (const auto& m : p.members) {
    clients.push_back(std::make_unique<lsa::Client>(p, m, pki.signers.at(m), *pki.ca,
                                                    pki.signers.at("server").certificate(), "server",
                                                    crypto::secagg::Floor{2, 0.0}));
    auto a = clients.back()->advertise();
    if (!a) throw std::runtime_error("lightsecagg bench: advertise: " + a.error().message());
    keys[m] = *(std::move(a));
  }
  {
    const auto t0 = Clock::now();
    auto out = clients[0]->share(keys);
    r.share_s = seconds_since(t0);
    if (!out) throw std::runtime_error("lightsecagg bench: share: " + out.error().message());
    r.offline_bytes = outbox_bytes(*out);
  }
  clients.clear();
  std::vector<std::uint32_t> x(d + 1), z(d + 1);
  for (std::size_t k = 0; k <= d; ++k) x[k] = static_cast<std::uint32_t>(k * 2654435761u) % field::kPrime;
  field::uniform(crypto::Secret::random(), z);
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    field::field_add(x, z);
    const double s = seconds_since(t0);
    r.mask_s = i == 0 ? s : std::min(r.mask_s, s);
  }
  // The server: U answers, decoded and subtracted from a sum of d + 1 words.
  std::vector<std::vector<std::uint32_t>> answers(p.target, std::vector<std::uint32_t>(L));
  std::vector<const std::uint32_t*> in;
  std::vector<std::uint32_t> responders;
  for (std::uint32_t j = 0; j < p.target; ++j) {
    field::uniform(crypto::Secret::random(), answers[j]);
    in.push_back(answers[j].data());
    responders.push_back(j + 1);
  }
  std::vector<std::uint32_t> sum = x, mask(d + 1);
  const auto t0 = Clock::now();
  lsa::decode(p, responders, in, mask);
  field::field_sub(sum, mask);
  r.unmask_s = seconds_since(t0);
  // Check: F(beta_k) at a few coordinates by the textbook formula.
  bool ok = true;
  for (std::size_t probe = 0; probe < 8; ++probe) {
    const std::size_t i = (probe * 7919 * 1000003) % (d + 1), k = i / L, off = i % L;
    const std::uint32_t beta = static_cast<std::uint32_t>(k + 1);
    std::uint32_t v = 0;
    for (std::uint32_t j = 0; j < p.target; ++j) {
      std::uint32_t num = 1, den = 1;
      for (std::uint32_t m = 0; m < p.target; ++m) {
        if (m == j) continue;
        num = field::mul(num, field::sub(beta, p.target + responders[m]));
        den = field::mul(den, field::sub(p.target + responders[j], p.target + responders[m]));
      }
      v = field::add(v, field::mul(answers[j][off], field::mul(num, field::inv(den))));
    }
    ok = ok && v == mask[i] && sum[i] == field::sub(x[i], v);
  }
  r.exact = ok;
  return r;
}
// What the runs gather for the tables printed at the end; ok turns false on a miss of a target
// or an inexact sum.
struct SecAggTables {
  std::vector<std::vector<std::string>> rows, lsa_rows;
  std::vector<std::string> speedups, lsa_lines;
  bool ok = true;
};

// The graph SecAgg+ chose for a group of n, and why.
void say_plan(std::size_t n, const crypto::secagg::GraphPlan& plan, const SecAggBenchOptions& opts) {
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
}

// One SecAgg or SecAgg+ run: its row, its JSON line, and against the complete graph's run before it
// (complete_unmask, set by that run) SecAgg+'s speedup.
void graph_case(std::size_t n, std::size_t d, double drop, double rate, const BenchPki& pki,
                const crypto::secagg::GraphPlan& graph, const SecAggBenchOptions& opts, double& complete_unmask,
                SecAggTables& t) {
  if (!opts.json) {
    std::cerr << "n = " << n << ", d = " << d << ", dropouts " << drop * 100 << "%, "
              << (graph.degree ? "k = " + std::to_string(graph.degree) : std::string("complete graph"))
              << " ..." << std::endl;
  }
  const SecaggRow r = run(n, d, drop, rate, pki, graph);
  if (!graph.degree) complete_unmask = r.unmask_s;
  if (graph.degree && complete_unmask > 0 && r.unmask_s > 0) {
    t.speedups.push_back("n = " + std::to_string(n) + ", d = " + std::to_string(d) + ", dropouts " +
                         fmt(drop * 100, 0) + "%: unmasking " + fmt(complete_unmask / r.unmask_s, 1) +
                         "x faster with k = " + std::to_string(graph.degree));
  }
  const double mask_ratio = r.mask_s / r.mask_bound_s, unmask_ratio = r.unmask_s / r.unmask_bound_s;
  const bool mask_ok = mask_ratio <= kMaskTarget;
  const bool unmask_ok = drop < 0.3 - 1e-9 || unmask_ratio <= 2.0;
  t.ok = t.ok && mask_ok && unmask_ok && r.exact;
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
  t.rows.push_back({std::to_string(n), std::to_string(d), fmt(drop * 100, 0) + "%",
                    graph.degree ? std::to_string(r.degree) : "all", std::to_string(r.threshold),
                    fmt(r.setup_s, 3), fmt(r.mask_s, 3), fmt(mask_ratio, 2) + "x" + (mask_ok ? "" : " (>1.25)"),
                    fmt(r.unmask_s, 3), std::to_string(r.expansions),
                    fmt(unmask_ratio, 2) + "x" + (unmask_ok ? "" : " (>2)"), r.exact ? "yes" : "NO"});
}

// LightSecAgg beside them: its row and its ratio to the complete graph's unmasking keystream
// (complete_unmask: the complete graph's measured unmasking in this run, 0 if none ran).
void lightsecagg_case(std::size_t n, std::size_t d, double drop, double rate, const BenchPki& pki,
                      const SecAggBenchOptions& opts, double complete_unmask, SecAggTables& t) {
  const auto lp = lsa_params(n, d, opts);
  const auto dropped = static_cast<std::size_t>(std::round(drop * static_cast<double>(n)));
  if (n - dropped < lp.min_survivors) {
    t.lsa_lines.push_back("n = " + std::to_string(n) + ", dropouts " + fmt(drop * 100, 0) + "%: LightSecAgg with U = " +
                          std::to_string(lp.target) + " cannot decode from " + std::to_string(n - dropped) +
                          " survivors (raise --plan-dropout)");
    return;
  }
  // Every box at once on the server: n (n - 1) L words. Beyond 2 GiB, one silo and the decode alone.
  const double all_boxes = static_cast<double>(n) * static_cast<double>(n - 1) * 4.0 *
                           static_cast<double>(lp.segment());
  if (!opts.json) {
    std::cerr << "n = " << n << ", d = " << d << ", dropouts " << drop * 100 << "%, LightSecAgg T = "
              << lp.privacy << ", U = " << lp.target << " ..." << std::endl;
  }
  const LsaRow l = all_boxes <= 2.0 * (1u << 30) ? lsa_full(lp, drop, pki) : lsa_partial(lp, drop, pki);
  // The complete graph's unmasking keystream: every survivor's self mask and every
  // dropped member's pairwise mask with every survivor, 4(d + 1) bytes each.
  const std::size_t survivors = n - dropped;
  const double complete_expansions = static_cast<double>(survivors + dropped * survivors);
  const double complete_ks = complete_expansions * 4.0 * static_cast<double>(d + 1) / rate;
  const double ratio = l.unmask_s / complete_ks;
  t.ok = t.ok && l.exact;
  if (opts.json) {
    std::cout << json{{"bench", "secagg"}, {"protocol", "lightsecagg"}, {"n", n}, {"d", d}, {"dropouts", drop},
                      {"privacy", l.T}, {"target", l.U}, {"threshold", l.t}, {"in_process", l.full},
                      {"share_seconds", l.share_s}, {"mask_seconds", l.mask_s}, {"unmask_seconds", l.unmask_s},
                      {"offline_bytes_per_silo", l.offline_bytes},
                      {"complete_graph_keystream_seconds", complete_ks}, {"unmask_of_complete_keystream", ratio},
                      {"keystream_GBps", rate / 1e9}, {"exact_sum", l.exact}}
                     .dump()
              << std::endl;
  }
  t.lsa_rows.push_back({std::to_string(n), std::to_string(d), fmt(drop * 100, 0) + "%", std::to_string(l.T),
                        std::to_string(l.U), std::to_string(l.t), l.full ? "all" : "one silo + decode",
                        fmt(l.share_s, 3), fmt(l.mask_s, 4), fmt(l.unmask_s, 3),
                        fmt(static_cast<double>(l.offline_bytes) / 1e6, 1), fmt(ratio, 3) + "x",
                        l.exact ? (l.full ? "yes" : "yes (8 probes)") : "NO"});
  t.lsa_lines.push_back("n = " + std::to_string(n) + ", d = " + std::to_string(d) + ", dropouts " +
                        fmt(drop * 100, 0) + "%: LightSecAgg unmasks in " + fmt(l.unmask_s, 3) + " s = " +
                        fmt(ratio, 3) + "x the complete graph's keystream time (" +
                        std::to_string(static_cast<std::size_t>(complete_expansions)) + " expansions x " +
                        fmt(4.0 * static_cast<double>(d + 1) / 1e6, 1) + " MB at " + fmt(rate / 1e9, 2) +
                        " GB/s = " + fmt(complete_ks, 3) + " s: measured rate x expansions)" +
                        (complete_unmask > 0 ? "; the complete graph's measured unmasking in this run: " +
                                                   fmt(complete_unmask, 3) + " s (" +
                                                   fmt(l.unmask_s / complete_unmask, 3) + "x)"
                                             : ""));
}

void print_tables(const SecAggTables& t, const SecAggBenchOptions& opts) {
  if (opts.json) return;
print_table({"n", "d", "dropouts", "k", "t", "key phases s", "mask s",
             "of bound", "unmask s", "expansions", "of bound", "exact sum"},
            t.rows);
std::cout << "bounds: masking = (k + 1) x 4(d+1) bytes of keystream; "
             "unmasking = expansions x 4(d+1) bytes\n"
          << "key phases: one silo's advertise, share, receive and settle "
             "(certificate signatures and checks, sealing, agreeing its mask seeds)\n"
          << "k: neighbours each silo masks with (all: the complete "
             "graph); t: shares that rebuild a secret\n";
for (const auto& line : t.speedups) std::cout << "SecAgg+ " << line << "\n";
if (opts.lightsecagg) {
  std::cout << "\nLightSecAgg (crypto/lightsecagg.h), field 2^32 - 5:\n";
  print_table({"n", "d", "dropouts", "T", "U", "t", "in process", "share s", "mask s", "unmask s",
               "offline MB/silo", "of complete ks", "exact sum"},
              t.lsa_rows);
  std::cout << "share: one silo's offline phase (draw the mask and noise, encode n shares, sign and seal "
               "them); mask: one silo's pass y = x + z mod p; unmask: the server's decode of the aggregate "
               "mask from U answers and its subtraction (with the check of answers beyond U)\n"
            << "in process \"one silo + decode\": every box at once would not fit (n(n-1) d / (U - T) words); "
               "the silos advertise, one silo shares for real, mask is the field addition pass mask() runs, "
               "and the decode runs on U answers of L words, checked at 8 coordinates against plain Lagrange "
               "interpolation\n"
            << "of complete ks: unmask s over the complete graph's unmasking keystream, (survivors + dropped x "
               "survivors) x 4(d+1) bytes at the measured rate\n";
  for (const auto& line : t.lsa_lines) std::cout << line << "\n";
}
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
  SecAggTables t;
  const BenchPki pki(*std::max_element(opts.n.begin(), opts.n.end()));
  for (auto n : opts.n) {
    // SecAgg+'s graph for this group size, the planned dropout rate and corruption.
    const auto plan = crypto::secagg::plan_graph(n, opts.plan_dropout, opts.corrupt);
    say_plan(n, plan, opts);
    std::vector<crypto::secagg::GraphPlan> graphs;
    if (opts.graph != "plus") graphs.push_back({});
    if (opts.graph != "complete" && plan.degree) graphs.push_back(plan);
    for (auto d : opts.d) {
      for (auto drop : opts.dropouts) {
        double complete_unmask = 0;
        for (const auto& graph : graphs) graph_case(n, d, drop, rate, pki, graph, opts, complete_unmask, t);
        if (opts.lightsecagg) lightsecagg_case(n, d, drop, rate, pki, opts, complete_unmask, t);
      }
    }
  }
  print_tables(t, opts);
  return t.ok ? 0 : 1;
}

}  // namespace xsilo::tools
