#include "server/secure_round.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "protocol/secagg_wire.h"

namespace xsilo::server {

std::vector<std::vector<std::string>> make_groups(std::vector<std::string> silos, const SecureConfig& cfg,
                                                  std::uint64_t permutation_seed) {
  std::sort(silos.begin(), silos.end());
  std::mt19937_64 rng(permutation_seed);
  std::shuffle(silos.begin(), silos.end(), rng);
  std::size_t g = 1;
  if (cfg.mode == SecureMode::Grouped) g = std::max<std::size_t>(1, silos.size() / cfg.min_group);
  std::vector<std::vector<std::string>> out(g);
  for (std::size_t i = 0; i < silos.size(); ++i) out[i % g].push_back(silos[i]);
  for (auto& group : out) std::sort(group.begin(), group.end());
  return out;
}

SecureRound::SecureRound(const SecureConfig& cfg, const std::string& federation, std::uint64_t round,
                         std::uint64_t seed, std::vector<std::string> selected, std::size_t d)
    : cfg_(cfg), federation_(federation), round_(round),
      permutation_seed_(seed ^ (round * 0xd1b54a32d192ed03ull)), d_(d) {
  const auto groups = make_groups(std::move(selected), cfg_, permutation_seed_);
  for (std::size_t k = 0; k < groups.size(); ++k) {
    const auto id = static_cast<std::uint32_t>(k + 1);
    Group& g = groups_[id];
    auto& s = g.setup;
    s.set_group(id);
    for (const auto& m : groups[k]) {
      s.add_members(m);
      group_of_[m] = id;
      g.keys_from[m] = false;
    }
    const auto n = groups[k].size();
    s.set_threshold(static_cast<std::uint32_t>(
        std::min<double>(static_cast<double>(n), std::max(2.0, std::ceil(cfg_.threshold * static_cast<double>(n))))));
    s.set_modulus_bits(cfg_.bits);
    s.set_fraction_bits(cfg_.fraction_bits);
    s.set_vector_length(d_ + 1);
    s.set_clip_norm(static_cast<float>(cfg_.clip_norm));
    s.set_max_weight(static_cast<float>(cfg_.max_weight));
    g.server = std::make_unique<crypto::secagg::Server>(protocol::secagg_params(s, federation_, round_));
    if (n < 2 || n < s.threshold()) fail(g, "group of " + std::to_string(n) + " silos is below the threshold");
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
  spdlog::warn("round {}: secure group {} failed: {}", round_, g.setup.group(), why);
  for (const auto& m : g.setup.members()) {
    failed_.emplace_back(m, "secure group " + std::to_string(g.setup.group()) + ": " + why);
  }
}

void SecureRound::on_message(const std::string& silo, const wire::Envelope& e) {
  Group* g = group_for(silo);
  if (!g || !g->failed.empty()) return;
  if (e.has_secagg_keys()) on_keys(*g, silo, e.secagg_keys());
  if (e.has_secagg_shares()) on_shares(*g, silo, e.secagg_shares());
  if (e.has_secagg_unmask_shares()) on_unmask(*g, silo, e.secagg_unmask_shares());
}

void SecureRound::on_keys(Group& g, const std::string& silo, const wire::SecAggKeys& k) {
  if (g.keys_closed) return;
  auto keys = protocol::from_wire(k);
  if (!keys) {
    spdlog::warn("round {}: {}: {}", round_, silo, keys.status().message);
    return;
  }
  if (auto err = g.server->on_keys(silo, *keys); !err.empty()) {
    spdlog::warn("round {}: {}", round_, err);
    return;
  }
  g.keys_from[silo] = true;
  try_close_keys(g, false);
}

void SecureRound::try_close_keys(Group& g, bool force) {
  if (g.keys_closed || !g.failed.empty()) return;
  const bool all = std::all_of(g.keys_from.begin(), g.keys_from.end(), [](const auto& kv) { return kv.second; });
  if (!all && !force) return;
  g.keys_closed = true;
  auto keys = g.server->close_keys();
  if (!crypto::secagg::ok(keys)) return fail(g, crypto::secagg::error(keys));
  auto e = env();
  *e.mutable_secagg_key_list() = protocol::to_wire(crypto::secagg::value(keys));
  for (const auto& [silo, pk] : crypto::secagg::value(keys)) {
    g.shares_from[silo] = false;
    out_.emplace_back(silo, e);
  }
}

void SecureRound::on_shares(Group& g, const std::string& silo, const wire::SecAggShares& s) {
  if (!g.keys_closed || g.shares_closed) return;
  auto to = protocol::from_wire(s);
  if (!to) {
    spdlog::warn("round {}: {}: {}", round_, silo, to.status().message);
    return;
  }
  if (auto err = g.server->on_shares(silo, *to); !err.empty()) {
    spdlog::warn("round {}: {}", round_, err);
    return;
  }
  g.shares_from[silo] = true;
  try_close_shares(g, false);
}

void SecureRound::try_close_shares(Group& g, bool force) {
  if (!g.keys_closed || g.shares_closed || !g.failed.empty()) return;
  const bool all = std::all_of(g.shares_from.begin(), g.shares_from.end(), [](const auto& kv) { return kv.second; });
  if (!all && !force) return;
  g.shares_closed = true;
  auto boxes = g.server->close_shares();
  if (!crypto::secagg::ok(boxes)) return fail(g, crypto::secagg::error(boxes));
  for (const auto& [recipient, box] : crypto::secagg::value(boxes)) {
    auto e = env();
    *e.mutable_secagg_share_delivery() = protocol::delivery_to_wire(box);
    out_.emplace_back(recipient, std::move(e));
  }
}

void SecureRound::keys_deadline() {
  for (auto& [id, g] : groups_) {
    if (!g.keys_closed) try_close_keys(g, true);
    else if (!g.shares_closed) try_close_shares(g, true);
  }
}

void SecureRound::silo_gone(const std::string& silo) {
  Group* g = group_for(silo);
  if (!g) return;
  if (!g->keys_closed && !g->keys_from[silo]) {
    g->keys_from.erase(silo);
    try_close_keys(*g, false);
  } else if (g->keys_closed && !g->shares_closed && g->shares_from.count(silo) && !g->shares_from[silo]) {
    g->shares_from.erase(silo);
    try_close_shares(*g, false);
  }
}

bool SecureRound::shared() const {
  return std::all_of(groups_.begin(), groups_.end(),
                     [](const auto& kv) { return kv.second.shares_closed || !kv.second.failed.empty(); });
}

void SecureRound::masked_from(const std::string& silo) {
  Group* g = group_for(silo);
  if (!g) return;
  if (auto err = g->server->on_masked_input(silo); !err.empty()) spdlog::warn("round {}: {}", round_, err);
}

void SecureRound::begin_unmask() {
  for (auto& [id, g] : groups_) {
    if (!g.failed.empty() || g.unmask_requested) continue;
    g.unmask_requested = true;
    auto req = g.server->close_masked();
    if (!crypto::secagg::ok(req)) {
      fail(g, crypto::secagg::error(req));
      continue;
    }
    auto e = env();
    *e.mutable_secagg_unmask_request() = protocol::to_wire(crypto::secagg::value(req));
    for (const auto& v : crypto::secagg::value(req).survivors) out_.emplace_back(v, e);
    g.unmask_request = e;
  }
}

bool SecureRound::unmask_requested() const {
  return std::any_of(groups_.begin(), groups_.end(), [](const auto& kv) { return kv.second.unmask_requested; });
}

std::optional<wire::Envelope> SecureRound::unmask_request(const std::string& silo) const {
  const auto id = group_of(silo);
  if (!id) return std::nullopt;
  const Group& g = groups_.at(id);
  if (!g.failed.empty() || !g.unmask_requested || !g.server->u3().count(silo) || g.unmask_answered.count(silo)) {
    return std::nullopt;
  }
  return g.unmask_request;
}

void SecureRound::on_unmask(Group& g, const std::string& silo, const wire::SecAggUnmaskShares& s) {
  if (!g.unmask_requested) return;
  auto reply = protocol::from_wire(s);
  if (!reply) {
    spdlog::warn("round {}: {}: {}", round_, silo, reply.status().message);
    return;
  }
  if (auto err = g.server->on_unmask(silo, *reply); !err.empty()) {
    spdlog::warn("round {}: {}", round_, err);
    return;
  }
  g.unmask_answered.insert(silo);
}

bool SecureRound::unmask_complete() const {
  return std::all_of(groups_.begin(), groups_.end(), [](const auto& kv) {
    const Group& g = kv.second;
    return !g.failed.empty() || !g.unmask_requested || g.server->unmask_replies() == g.server->u3().size();
  });
}

std::vector<GroupResult> SecureRound::finish(std::map<std::uint32_t, protocol::MaskedVector>& sums) {
  std::vector<GroupResult> out;
  const auto codec = cfg_.codec();
  for (auto& [id, g] : groups_) {
    GroupResult r;
    r.group = id;
    r.members.assign(g.setup.members().begin(), g.setup.members().end());
    r.threshold = g.setup.threshold();
    r.survivors.assign(g.server->u3().begin(), g.server->u3().end());
    auto& sum = sums.at(id);
    if (!g.failed.empty()) {
      r.why = g.failed;
    } else {
      const std::string err = cfg_.bits == 32 ? g.server->finish(sum.u32()) : g.server->finish(sum.u64());
      if (!err.empty()) {
        r.why = err;
      } else {
        r.ok = true;
        r.sum = cfg_.bits == 32 ? crypto::decode(codec, std::span<const std::uint32_t>(sum.u32()))
                                : crypto::decode(codec, std::span<const std::uint64_t>(sum.u64()));
      }
    }
    sum = protocol::MaskedVector();  // the masked sum is not needed again
    out.push_back(std::move(r));
  }
  return out;
}

nlohmann::json SecureRound::describe() const {
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& [id, g] : groups_) {
    groups.push_back({{"group", id},
                      {"members", std::vector<std::string>(g.setup.members().begin(), g.setup.members().end())},
                      {"threshold", g.setup.threshold()},
                      {"advertised_keys", g.server->u1().size()},
                      {"shared_keys", g.server->u2().size()},
                      {"masked_inputs", g.server->u3().size()}});
    if (!g.failed.empty()) groups.back()["failed"] = g.failed;
  }
  return {{"mode", name(cfg_.mode)},
          {"permutation_seed", permutation_seed_},
          {"modulus_bits", cfg_.bits},
          {"fraction_bits", cfg_.fraction_bits},
          {"clip_norm", cfg_.clip_norm},
          {"max_weight", cfg_.max_weight},
          {"groups", groups}};
}

}  // namespace xsilo::server
