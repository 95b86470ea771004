#include "server/secure_round.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <stdexcept>

#include "crypto/hash.h"
#include "crypto/keys.h"
#include "crypto/skellam.h"
#include "crypto/sources.h"
#include "protocol/round_start.h"
#include "protocol/secagg_wire.h"
#include "server/distributed_dp.h"

namespace xsilo::server {

namespace secagg = crypto::secagg;

std::uint64_t group_permutation_seed(std::uint64_t seed, std::uint64_t round) {
  return crypto::derive_seed(seed, round, "secure-groups");
}

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
                         std::vector<std::uint64_t> kept, std::optional<wire::SkellamSetup> skellam)
    : cfg_(cfg), skellam_(std::move(skellam)), federation_(federation), round_(round),
      permutation_seed_(group_permutation_seed(seed, round)), d_(d),
      kept_(kept.empty() ? nullptr : std::make_shared<const std::vector<std::uint64_t>>(std::move(kept))) {
  if (!signer || !ca) throw std::invalid_argument("secure aggregation needs the server's certificate key and CA");
  const auto groups = make_groups(std::move(selected), cfg_, permutation_seed_);
  for (std::size_t k = 0; k < groups.size(); ++k) {
    const auto id = static_cast<std::uint32_t>(k + 1);
    // What every protocol's setup states; the protocol plans, keys and signs the rest.
    wire::SecAggSetup s;
    s.set_group(id);
    for (const auto& m : groups[k]) {
      s.add_members(m);
      group_of_[m] = id;
    }
    s.set_modulus_bits(cfg_.bits);
    s.set_fraction_bits(cfg_.fraction_bits);
    s.set_vector_length((kept_ ? kept_->size() : d_) + 1 + (count_unclipped ? 1 : 0));
    if (skellam_) {  // distributed DP: the rotated length, then the count (crypto/skellam.h)
      s.set_vector_length(crypto::padded_length(kept_ ? kept_->size() : d_) + 1 +
                          (skellam_->count_scale() > 0 ? 1 : 0));  // adaptive clipping's count word
      *s.mutable_skellam() = *skellam_;
      // The packed wire wherever the silos' rule (protocol::check_wire_bits) takes it: not
      // LightSecAgg's field, nor an adaptive count word read in the whole ring, nor bits equal
      // to the ring's (whole words then).
      if (cfg_.packed_wire) {
        s.set_protocol(cfg_.protocol == SecureProtocol::LightSecAgg ? wire::LIGHTSECAGG : wire::SECAGG);
        s.set_wire_bits(skellam_->bits());
        if (!protocol::check_wire_bits(s)) s.set_wire_bits(0);
      }
    }
    s.set_count_unclipped(count_unclipped);
    s.set_clip_norm(static_cast<float>(cfg_.clip_norm));
    s.set_max_weight(static_cast<float>(cfg_.max_weight));
    auto g = secure::make_group(cfg_, std::move(s), secure::GroupContext{.signer = *signer, .ca = *ca, .federation = federation_, .round = round_});
    drain(*g);
    groups_.emplace(id, std::move(g));
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

secure::Group* SecureRound::group_for(const std::string& silo) {
  const auto id = group_of(silo);
  return id ? groups_.at(id).get() : nullptr;
}

wire::Envelope SecureRound::env() const {
  wire::Envelope e;
  e.set_federation(federation_);
  e.set_round(round_);
  return e;
}

void SecureRound::drain(secure::Group& g) {
  for (auto& [silo, step] : g.take_out()) {
    auto e = env();
    *e.mutable_secure() = std::move(step);
    out_.emplace_back(silo, std::move(e));
  }
  for (auto& d : g.take_dropped()) dropped_.push_back({std::move(d.silo), std::move(d.why), d.reason});
}

void SecureRound::on_message(const std::string& silo, const wire::SecureAggregation& step) {
  secure::Group* g = group_for(silo);
  if (!g || !g->failed().empty()) return;
  // Setup steps while collecting, the survivors' answers once the unmasking began: a group left
  // behind in Setup when collection closed takes no more steps.
  const bool answers = g->stage() == secure::Stage::Confirm || g->stage() == secure::Stage::Unmask;
  if (answers != unmasking_) return;
  g->receive(silo, step, away_);
  drain(*g);
}

void SecureRound::keys_deadline() {
  for (auto& [id, g] : groups_) {
    if (g->stage() != secure::Stage::Setup) continue;
    g->close_step(away_);
    drain(*g);
  }
}

void SecureRound::silo_gone(const std::string& silo) {
  secure::Group* g = group_for(silo);
  if (!g) return;
  g->gone(silo, away_);
  drain(*g);
}

void SecureRound::silo_away(const std::string& silo) {
  secure::Group* g = group_for(silo);
  if (!g || !g->failed().empty() || (g->stage() != secure::Stage::Confirm && g->stage() != secure::Stage::Unmask)) return;
  away_.insert(silo);
  if (g->stage() == secure::Stage::Confirm) {
    g->proceed(away_);
    drain(*g);
  }
}

bool SecureRound::settled() const {
  return std::all_of(groups_.begin(), groups_.end(),
                     [](const auto& kv) { return kv.second->stage() != secure::Stage::Setup; });
}

bool SecureRound::may_upload(const std::string& silo) const {
  const auto id = group_of(silo);
  return id && groups_.at(id)->may_upload(silo);
}

void SecureRound::masked_from(const std::string& silo) {
  if (secure::Group* g = group_for(silo)) g->masked_from(silo);
}

void SecureRound::begin_unmask() {
  unmasking_ = true;
  for (auto& [id, g] : groups_) {
    g->begin_unmask();
    drain(*g);
  }
}

bool SecureRound::unmask_deadline() {
  bool asked = false;
  for (auto& [id, g] : groups_) {
    if (g->stage() != secure::Stage::Confirm || !g->failed().empty()) continue;
    g->close_step(away_);
    drain(*g);
    asked = asked || g->stage() == secure::Stage::Unmask;
  }
  return asked;
}

bool SecureRound::unmask_requested() const {
  return std::any_of(groups_.begin(), groups_.end(),
                     [](const auto& kv) { return kv.second->stage() >= secure::Stage::Confirm; });
}

std::optional<wire::Envelope> SecureRound::unmask_request(const std::string& silo) const {
  const auto id = group_of(silo);
  if (!id) return std::nullopt;
  auto step = groups_.at(id)->pending(silo);
  if (!step) return std::nullopt;
  auto e = env();
  *e.mutable_secure() = std::move(*step);
  return e;
}

bool SecureRound::unmask_complete() const {
  // Asked on every message of the unmasking: a scan of all groups each time would make a round
  // cost messages x groups. Groups complete one after another and stay so, so the search resumes
  // at the group the last call found open; only "complete" takes a full pass to confirm.
  auto open = [this](const auto& kv) {
    const secure::Group& g = *kv.second;
    const auto stage = g.stage();
    return g.failed().empty() && (stage == secure::Stage::Confirm || stage == secure::Stage::Unmask) &&
           !(stage == secure::Stage::Unmask && only_away(g));
  };
  auto it = std::find_if(groups_.lower_bound(open_from_), groups_.end(), open);
  if (it == groups_.end()) it = std::find_if(groups_.begin(), groups_.end(), open);
  if (it == groups_.end()) return true;
  open_from_ = it->first;
  return false;
}

std::vector<GroupResult> SecureRound::finish(std::map<std::uint32_t, protocol::MaskedVector>& sums) {
  std::vector<GroupResult> out;
  for (auto& [id, group] : groups_) {
    secure::Group& g = *group;
    GroupResult r;
    r.group = id;
    r.members.assign(g.setup().members().begin(), g.setup().members().end());
    r.threshold = g.setup().threshold();
    r.min_survivors = g.setup().min_survivors();
    r.survivors = g.survivors();
    auto& sum = sums.at(id);
    if (!g.failed().empty()) {
      r.sum = Error(g.failed());
    } else if (g.stage() != secure::Stage::Unmask) {
      r.sum = Error("collection closed before the survivors confirmed their set");
    } else if (auto unmasked = g.finish(sum); !unmasked) {
      r.sum = unmasked.error();
    } else {
      ++revealed_;
      if (skellam_) {
        crypto::SkellamParams p;
        p.bits = skellam_->bits();
        p.gamma = skellam_->gamma();
        p.rotation_seed = skellam_->rotation_seed();
        p.ring = cfg_.bits;
        p.count_scale = skellam_->count_scale();
        // Under RANDOM_K the words hold the kept coordinates, spread back over the model's.
        auto decoded = sum.visit([&](auto w) { return crypto::decode_skellam(p, w, kept_ ? kept_->size() : d_); });
        r.sum = GroupSum(kept_ ? spread_kept(std::move(decoded), *kept_, d_) : std::move(decoded), d_);
      } else {
        r.sum = GroupSum(std::move(sum), cfg_.codec(), d_, kept_);
      }
    }
    r.excluded = g.excluded();
    sum = protocol::MaskedVector();  // moved into the result, or not needed again
    out.push_back(std::move(r));
  }
  return out;
}

nlohmann::json SecureRound::describe() const {
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& [id, g] : groups_) groups.push_back(g->describe());
  nlohmann::json out = {{"mode", name(cfg_.mode)},
                        {"permutation_seed", permutation_seed_},
                        {"modulus_bits", cfg_.bits},
                        {"fraction_bits", cfg_.fraction_bits},
                        {"clip_norm", cfg_.clip_norm},
                        {"max_weight", cfg_.max_weight},
                        {"groups", groups}};
  if (cfg_.graph) out["graph"] = {{"dropout", cfg_.graph_dropout}, {"corrupt", cfg_.graph_corrupt}};
  if (cfg_.protocol != SecureProtocol::SecAgg) out["protocol"] = name(cfg_.protocol);
  // The packed wire the setups signed (one width for the round): the bits a masked word travelled in.
  if (!groups_.empty()) {
    if (const auto w = setup(groups_.begin()->first).wire_bits()) out["wire_bits"] = w;
  }
  return out;
}

}  // namespace xsilo::server
