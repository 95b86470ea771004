#include "server/secure_round.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <stdexcept>

#include "crypto/hash.h"
#include "crypto/keys.h"
#include "protocol/secagg_wire.h"

namespace xsilo::server {

namespace secagg = crypto::secagg;

std::vector<std::vector<std::string>> make_groups(std::vector<std::string> silos, const SecureConfig& cfg,
                                                  std::uint64_t permutation_seed) {
  std::sort(silos.begin(), silos.end());
  std::mt19937_64 rng(permutation_seed);
  std::shuffle(silos.begin(), silos.end(), rng);
  std::size_t g = 1;
  if (cfg.mode == SecureMode::Grouped) g = std::max<std::size_t>(1, silos.size() / group_size(cfg));
  std::vector<std::vector<std::string>> out(g);
  for (std::size_t i = 0; i < silos.size(); ++i) out[i % g].push_back(silos[i]);
  for (auto& group : out) std::sort(group.begin(), group.end());
  return out;
}

std::uint32_t group_threshold(const SecureConfig& cfg, std::size_t n) {
  const double t = std::max({2.0, std::floor(static_cast<double>(n) / 2.0) + 1.0,
                             std::ceil(cfg.threshold * static_cast<double>(n) - 1e-9)});
  return static_cast<std::uint32_t>(std::min(t, static_cast<double>(std::max<std::size_t>(n, 2))));
}

// A seed for one group's graph in one round, fresh from libsodium's generator. It is public
// (signed into the setup) but unpredictable before the round: drawn from the round's
// permutation seed, which one setup reveals, every later round's graph could be worked out in
// advance, and a coalition could choose whom to corrupt to surround a silo in a round to come
// (the privacy bound assumes the corrupt silos do not depend on the graph).
namespace {
std::string fresh_graph_seed(const SecureConfig& cfg) {
  std::array<std::uint8_t, 16> r{};
  cfg.random_bytes(r);
  return crypto::to_hex(r);
}
}  // namespace

std::uint32_t group_min_survivors(const SecureConfig& cfg, std::size_t n) {
  return std::max(group_threshold(cfg, n), static_cast<std::uint32_t>(cfg.min_group));
}

std::size_t group_size(const SecureConfig& cfg) {
  std::size_t n = cfg.min_group;
  if (cfg.threshold >= 1.0) return n;  // every member must answer: no size tolerates a dropout
  // Ends: n - t grows without bound with n, as t <= ceil(threshold n) + 1 and threshold < 1.
  while (n - group_min_survivors(cfg, n) < cfg.group_dropouts) ++n;
  return n;
}

SecureRound::SecureRound(const SecureConfig& cfg, const std::optional<crypto::CertSigner>& signer,
                         const std::optional<crypto::CertVerifier>& ca, const std::string& federation, std::uint64_t round,
                         std::uint64_t seed, std::vector<std::string> selected, std::size_t d, bool count_unclipped,
                         std::vector<std::uint64_t> kept)
    : cfg_(cfg), federation_(federation), round_(round),
      permutation_seed_(group_permutation_seed(seed, round)), d_(d), kept_(std::move(kept)) {
  if (!signer || !ca) throw std::invalid_argument("secure aggregation needs the server's certificate key and CA");
  const auto groups = make_groups(std::move(selected), cfg_, permutation_seed_);
  for (std::size_t k = 0; k < groups.size(); ++k) {
    const auto id = static_cast<std::uint32_t>(k + 1);
    Group& g = groups_[id];
    auto& s = g.setup;
    s.set_group(id);
    for (const auto& m : groups[k]) {
      s.add_members(m);
      group_of_[m] = id;
      g.waiting.insert(m);
    }
    const auto n = groups[k].size();
    s.set_threshold(group_threshold(cfg_, n));
    s.set_min_survivors(group_min_survivors(cfg_, n));
    if (cfg_.graph) {
      // SecAgg+ where a graph smaller than the complete one meets the bounds for this group.
      const auto plan = secagg::plan_graph(n, cfg_.graph_dropout, cfg_.graph_corrupt);
      if (plan.degree) {
        s.set_degree(plan.degree);
        s.set_graph_seed(fresh_graph_seed(cfg_));
        s.set_threshold(plan.threshold);
        s.set_min_survivors(std::max(plan.threshold, static_cast<std::uint32_t>(cfg_.min_group)));
      }
    }
    s.set_modulus_bits(cfg_.bits);
    s.set_fraction_bits(cfg_.fraction_bits);
    s.set_vector_length((kept_.empty() ? d_ : kept_.size()) + 1 + (count_unclipped ? 1 : 0));
    s.set_count_unclipped(count_unclipped);
    s.set_clip_norm(static_cast<float>(cfg_.clip_norm));
    s.set_max_weight(static_cast<float>(cfg_.max_weight));
    auto box = crypto::X25519KeyPair::generate();
    s.set_server_key(std::string(reinterpret_cast<const char*>(box.public_key.data()), box.public_key.size()));
    s.set_server_certificate(signer->certificate());
    s.set_server_signature(signer->sign(protocol::setup_statement(s, federation_, round_)));
    auto params = protocol::secagg_params(s, federation_, round_);
    g.server = std::make_unique<secagg::Server>(params, *ca, *signer, std::move(box));
    if (n < cfg_.min_group) {
      fail(g, "a group of " + std::to_string(n) + " silos is smaller than min_group " + std::to_string(cfg_.min_group) +
                  ": its sum would reveal too little about too few");
    } else if (auto why = secagg::check_params(params); !why.empty()) {
      fail(g, why);
    }
  }
}

std::uint32_t SecureRound::group_of(const std::string& silo) const {
  auto it = group_of_.find(silo);
  return it == group_of_.end() ? 0 : it->second;
}

std::vector<std::uint32_t> SecureRound::groups() const {
  std::vector<std::uint32_t> out;
  for (const auto& [id, g] : groups_) out.push_back(id);
  return out;
}

SecureRound::Group* SecureRound::group_for(const std::string& silo) {
  const auto id = group_of(silo);
  return id ? &groups_.at(id) : nullptr;
}

wire::Envelope SecureRound::env() const {
  wire::Envelope e;
  e.set_federation(federation_);
  e.set_round(round_);
  return e;
}

void SecureRound::fail(Group& g, const std::string& why) {
  if (!g.failed.empty()) return;
  g.failed = why;
  g.phase = Phase::Done;
  spdlog::warn("round {}: secure group {} failed: {}", round_, g.setup.group(), why);
  for (const auto& m : g.setup.members()) {
    dropped_.push_back({m, "secure group " + std::to_string(g.setup.group()) + ": " + why, false});
  }
}

// Exclusions the group's crypto server made since the last call: the coordinator drops them.
void SecureRound::report_blame(Group& g) {
  const auto& blamed = g.server->blamed();
  for (; g.blames_reported < blamed.size(); ++g.blames_reported) {
    const auto& b = blamed[g.blames_reported];
    spdlog::warn("round {}: secure group {} excludes {}: {}", round_, g.setup.group(), b.silo, b.why);
    g.waiting.erase(b.silo);
    dropped_.push_back({b.silo, "excluded from secure group " + std::to_string(g.setup.group()) + ": " + b.why, true});
  }
}

void SecureRound::on_message(const std::string& silo, const wire::Envelope& e) {
  Group* g = group_for(silo);
  if (!g || !g->failed.empty()) return;
  receive(*g, silo, e);
  report_blame(*g);
  advance(*g, false);
}

void SecureRound::receive(Group& g, const std::string& silo, const wire::Envelope& e) {
  auto& server = *g.server;
  std::string err;
  using B = wire::Envelope::BodyCase;
  const auto body = e.body_case();
  const bool expected = (body == B::kSecaggKeys && g.phase == Phase::Keys) ||
                        (body == B::kSecaggShares && g.phase == Phase::Shares) ||
                        (body == B::kSecaggReceipt && g.phase == Phase::Receipts) ||
                        (body == B::kSecaggConfirmation && g.phase == Phase::Confirm) ||
                        (body == B::kSecaggUnmaskShares && g.phase == Phase::Unmask);
  if (!expected || !g.waiting.count(silo)) return;  // late, early or twice: nothing to do
  switch (body) {
    case B::kSecaggKeys: {
      auto keys = protocol::from_wire(e.secagg_keys());
      err = keys ? server.on_keys(silo, *keys) : keys.status().message;
      break;
    }
    case B::kSecaggShares: {
      auto to = protocol::from_wire(e.secagg_shares());
      err = to ? server.on_shares(silo, *to) : to.status().message;
      break;
    }
    case B::kSecaggReceipt: {
      auto receipt = protocol::from_wire(e.secagg_receipt());
      err = receipt ? server.on_receipt(silo, *receipt) : receipt.status().message;
      break;
    }
    case B::kSecaggConfirmation: err = server.on_confirmation(silo, e.secagg_confirmation().signature()); break;
    case B::kSecaggUnmaskShares: err = server.on_unmask(silo, e.secagg_unmask_shares().sealed()); break;
    default: return;
  }
  if (!err.empty()) {
    // Unsigned or malformed: perhaps altered on the way. The member may still answer properly.
    spdlog::warn("round {}: secure group {}: {}: {}", round_, g.setup.group(), silo, err);
    return;
  }
  g.waiting.erase(silo);
}

void SecureRound::advance(Group& g, bool force) {
  while (g.failed.empty() && (only_away(g) || force)) {
    const Phase before = g.phase;
    switch (g.phase) {
      case Phase::Keys: close_keys(g); break;
      case Phase::Shares: close_shares(g); break;
      case Phase::Receipts: close_receipts(g); break;
      case Phase::Confirm: close_confirmations(g); break;
      default: return;  // Masking and Unmask end by the coordinator's decision
    }
    report_blame(g);
    force = false;
    if (g.phase == before) return;
  }
}

void SecureRound::close_keys(Group& g) {
  auto keys = g.server->close_keys();
  if (!secagg::ok(keys)) return fail(g, secagg::error(keys));
  // The complete graph: one list for every member. A graph: each member its neighbours' part.
  const bool graph = g.server->graph();
  auto e = env();
  if (!graph) *e.mutable_secagg_key_list() = protocol::to_wire(secagg::value(keys));
  // Members without valid keys in U1 cannot take part from here: dropouts now, not at the
  // training deadline.
  for (const auto& m : g.setup.members()) {
    if (g.waiting.count(m)) {
      dropped_.push_back({m, "secure group " + std::to_string(g.setup.group()) + ": no valid signed keys from it in time",
                          false});
    }
  }
  g.waiting.clear();
  for (const auto& [silo, k] : secagg::value(keys)) {
    g.waiting.insert(silo);
    if (graph) *e.mutable_secagg_key_list() = protocol::to_wire(g.server->keys_for(silo));
    send(silo, e);
  }
  g.phase = Phase::Shares;
}

void SecureRound::close_shares(Group& g) {
  auto boxes = g.server->close_shares();
  if (!secagg::ok(boxes)) return fail(g, secagg::error(boxes));
  for (const auto& m : g.waiting) {
    dropped_.push_back({m, "secure group " + std::to_string(g.setup.group()) + ": no valid signed shares from it in time",
                        false});
  }
  g.waiting.clear();
  for (const auto& [recipient, inbox] : secagg::value(boxes)) {
    auto e = env();
    *e.mutable_secagg_share_delivery() = protocol::delivery_to_wire(inbox);
    g.waiting.insert(recipient);
    send(recipient, std::move(e));
  }
  g.phase = Phase::Receipts;
}

void SecureRound::close_receipts(Group& g) {
  auto settled = g.server->settle();
  report_blame(g);
  if (!secagg::ok(settled)) return fail(g, secagg::error(settled));
  auto e = env();
  *e.mutable_secagg_settled() = protocol::to_wire(secagg::value(settled));
  // Every member that shared learns the outcome; one left out stops there.
  for (const auto& silo : g.server->u2()) send(silo, e);
  // Members that shared but sent no receipt are out of the group now.
  for (const auto& silo : g.server->u2()) {
    if (!g.server->settled_member(silo) && std::none_of(g.server->blamed().begin(), g.server->blamed().end(),
                                                        [&](const auto& b) { return b.silo == silo; })) {
      dropped_.push_back({silo, "secure group " + std::to_string(g.setup.group()) + ": sent no receipt for its shares",
                          false});
    }
  }
  g.waiting.clear();
  g.phase = Phase::Masking;
}

void SecureRound::close_confirmations(Group& g) {
  auto request = g.server->close_confirmations();
  if (!secagg::ok(request)) return fail(g, secagg::error(request));
  auto e = env();
  *e.mutable_secagg_unmask_request() = protocol::to_wire(secagg::value(request));
  g.unmask_request = e;
  g.waiting.clear();
  for (const auto& v : g.server->confirmed()) {
    g.waiting.insert(v);
    send(v, e);
  }
  g.phase = Phase::Unmask;
}

void SecureRound::keys_deadline() {
  for (auto& [id, g] : groups_) {
    if (g.phase == Phase::Keys || g.phase == Phase::Shares || g.phase == Phase::Receipts) advance(g, true);
  }
}

void SecureRound::silo_gone(const std::string& silo) {
  Group* g = group_for(silo);
  if (!g || !g->failed.empty() || g->phase == Phase::Masking) return;
  if (g->waiting.erase(silo)) advance(*g, false);
}

void SecureRound::silo_away(const std::string& silo) {
  Group* g = group_for(silo);
  if (!g || !g->failed.empty() || (g->phase != Phase::Confirm && g->phase != Phase::Unmask)) return;
  away_.insert(silo);
  if (g->phase == Phase::Confirm) advance(*g, false);
}

bool SecureRound::settled() const {
  return std::all_of(groups_.begin(), groups_.end(), [](const auto& kv) {
    return kv.second.phase >= Phase::Masking || !kv.second.failed.empty();
  });
}

bool SecureRound::may_upload(const std::string& silo) const {
  const auto id = group_of(silo);
  if (!id) return false;
  const Group& g = groups_.at(id);
  return g.failed.empty() && g.phase == Phase::Masking && g.server->settled_member(silo);
}

void SecureRound::masked_from(const std::string& silo) {
  Group* g = group_for(silo);
  if (!g || !g->failed.empty()) return;
  if (auto err = g->server->on_masked_input(silo); !err.empty()) spdlog::warn("round {}: {}", round_, err);
}

void SecureRound::begin_unmask() {
  for (auto& [id, g] : groups_) {
    if (!g.failed.empty() || g.phase != Phase::Masking) continue;
    auto u3 = g.server->close_masked();
    if (!secagg::ok(u3)) {
      fail(g, secagg::error(u3));
      continue;
    }
    auto e = env();
    for (const auto& v : secagg::value(u3)) e.mutable_secagg_survivors()->add_survivors(v);
    e.mutable_secagg_survivors()->set_server_signature(g.server->survivors_signature());
    g.survivors = e;
    g.waiting.clear();
    for (const auto& v : secagg::value(u3)) {
      g.waiting.insert(v);
      send(v, e);
    }
    g.phase = Phase::Confirm;
  }
}

bool SecureRound::unmask_deadline() {
  bool asked = false;
  for (auto& [id, g] : groups_) {
    if (g.phase != Phase::Confirm || !g.failed.empty()) continue;
    advance(g, true);
    asked = asked || g.phase == Phase::Unmask;
  }
  return asked;
}

bool SecureRound::unmask_requested() const {
  return std::any_of(groups_.begin(), groups_.end(), [](const auto& kv) { return kv.second.phase >= Phase::Confirm; });
}

std::optional<wire::Envelope> SecureRound::unmask_request(const std::string& silo) const {
  const auto id = group_of(silo);
  if (!id) return std::nullopt;
  const Group& g = groups_.at(id);
  if (!g.failed.empty() || !g.waiting.count(silo)) return std::nullopt;
  if (g.phase == Phase::Confirm) return g.survivors;
  if (g.phase == Phase::Unmask) return g.unmask_request;
  return std::nullopt;
}

bool SecureRound::unmask_complete() const {
  // Asked on every message of the unmasking: a scan of all groups each time would make a round
  // cost messages x groups. Groups complete one after another and stay so, so the search resumes
  // at the group the last call found open; only "complete" takes a full pass to confirm.
  auto open = [this](const auto& kv) {
    const Group& g = kv.second;
    return g.failed.empty() && g.phase >= Phase::Confirm && !(g.phase == Phase::Unmask && only_away(g));
  };
  auto it = std::find_if(groups_.lower_bound(open_from_), groups_.end(), open);
  if (it == groups_.end()) it = std::find_if(groups_.begin(), groups_.end(), open);
  if (it == groups_.end()) return true;
  open_from_ = it->first;
  return false;
}

std::vector<GroupResult> SecureRound::finish(std::map<std::uint32_t, protocol::MaskedVector>& sums) {
  std::vector<GroupResult> out;
  for (auto& [id, g] : groups_) {
    GroupResult r;
    r.group = id;
    r.members.assign(g.setup.members().begin(), g.setup.members().end());
    r.threshold = g.setup.threshold();
    r.survivors.assign(g.server->u3().begin(), g.server->u3().end());
    auto& sum = sums.at(id);
    if (!g.failed.empty()) {
      r.why = g.failed;
    } else if (g.phase != Phase::Unmask) {
      r.why = "collection closed before the survivors confirmed their set";
    } else {
      auto& server = *g.server;  // a lambda may not capture a structured binding (clang 14)
      const std::string err = sum.visit([&](auto words) { return server.finish(words); });
      if (!err.empty()) {
        r.why = err;
      } else {
        r.ok = true;
        const auto codec = cfg_.codec();
        r.sum = sum.visit([&](auto words) {
          return crypto::decode(codec, std::span<const typename decltype(words)::element_type>(words));
        });
        if (!kept_.empty()) {  // the kept coordinates back in place, the others zero, the extras after d
          std::vector<double> full(d_ + (r.sum.size() - kept_.size()), 0.0);
          for (std::size_t j = 0; j < kept_.size(); ++j) full[kept_[j]] = r.sum[j];
          std::copy(r.sum.begin() + static_cast<std::ptrdiff_t>(kept_.size()), r.sum.end(),
                    full.begin() + static_cast<std::ptrdiff_t>(d_));
          r.sum = std::move(full);
        }
      }
    }
    r.excluded = g.server->blamed();
    g.phase = Phase::Done;
    sum = protocol::MaskedVector();  // the masked sum is not needed again
    out.push_back(std::move(r));
  }
  return out;
}

nlohmann::json SecureRound::describe() const {
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& [id, g] : groups_) {
    const auto& s = *g.server;
    groups.push_back({{"group", id},
                      {"members", std::vector<std::string>(g.setup.members().begin(), g.setup.members().end())},
                      {"threshold", g.setup.threshold()},
                      {"min_survivors", g.setup.min_survivors()},
                      {"degree", protocol::secagg_degree(g.setup)},
                      {"graph_seed", g.setup.graph_seed()},
                      {"advertised_keys", s.u1().size()},
                      {"shared_keys", s.u2().size()},
                      {"settled", s.settled().size()},
                      {"masked_inputs", s.u3().size()},
                      {"confirmed", s.confirmed().size()}});
    if (!s.blamed().empty()) {
      nlohmann::json ex = nlohmann::json::array();
      for (const auto& b : s.blamed()) ex.push_back({{"silo", b.silo}, {"evidence", b.why}});
      groups.back()["excluded"] = ex;
    }
    if (!g.failed.empty()) groups.back()["failed"] = g.failed;
  }
  nlohmann::json out = {{"mode", name(cfg_.mode)},
                        {"permutation_seed", permutation_seed_},
                        {"modulus_bits", cfg_.bits},
                        {"fraction_bits", cfg_.fraction_bits},
                        {"clip_norm", cfg_.clip_norm},
                        {"max_weight", cfg_.max_weight},
                        {"groups", groups}};
  if (cfg_.graph) out["graph"] = {{"dropout", cfg_.graph_dropout}, {"corrupt", cfg_.graph_corrupt}};
  return out;
}

}  // namespace xsilo::server
