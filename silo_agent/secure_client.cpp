#include "silo_agent/secure_client.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "crypto/secagg_graph.h"
#include "crypto/skellam.h"
#include "proto/frame.h"
#include "protocol/secagg_wire.h"

namespace xsilo::agent {

void SecureClient::reset() {
  member_.reset();
  setup_.reset();
  settled_ = masking_ = false;
  words_.reset();
}

void SecureClient::disconnected() {
  if (!masking_) return;
  // The masking job's result will be dropped: this silo's input never reaches the sum, and it
  // takes no further part in its group. The job keeps its own reference to the member, which no
  // later message can reach.
  member_.reset();
  setup_.reset();
  settled_ = masking_ = false;
}

Result<std::string> SecureClient::setup_signer(const wire::SecAggSetup& setup, std::uint64_t round) const {
  if (!cfg_.signer || !cfg_.ca) return Error("this agent has no certificate key to take part in secure aggregation");
  auto server = cfg_.ca->certified(setup.server_certificate(), "server");
  if (!server) return Error("the secure setup carries no valid server certificate: " + server.error().message());
  if (!cfg_.servers.empty() && !cfg_.servers.count(server->name)) {
    return Error("the secure setup is signed by server " + server->name + ", which is not one this agent trusts");
  }
  auto verdict = cfg_.ca->verify(setup.server_certificate(), server->name, "server",
                                 protocol::setup_statement(setup, cfg_.federation, round), setup.server_signature());
  if (!verdict) return Error("the secure setup is not signed by the server (" + verdict.error().message() + ")");
  return server->name;
}

namespace {

// Distributed DP's part of this silo's floor: success when the signed setup carries at least the
// noise the silo's own config asks for (its noise multiplier: the sum's noise over its
// sensitivity, whatever the server's config says), else the refusal.
Status check_noise_floor(const wire::SecAggSetup& setup, const crypto::secagg::Floor& floor) {
  char why[700];
  // Whatever the floor: a share of noise too large to draw exactly would come out in coarse
  // steps, or as nothing (crypto::kMaxPoissonMean), so a huge signed variance is no guarantee.
  if (setup.has_skellam() && setup.min_survivors() > 0) {
    const double mean = setup.skellam().variance() / (2.0 * setup.min_survivors());
    if (!(mean <= crypto::kMaxPoissonMean)) {
      std::snprintf(why, sizeof why,
                    "the secure setup's distributed-DP noise (variance %.6g over %u survivors) is larger than this silo "
                    "can draw exactly (a Poisson mean of %.6g, above 2^52)",
                    setup.skellam().variance(), setup.min_survivors(), mean);
      return Error(why);
    }
  }
  if (floor.min_noise_multiplier <= 0) return {};
  if (!setup.has_skellam()) {
    std::snprintf(why, sizeof why,
                  "below this silo's floor: the secure setup adds no distributed-DP noise, and this silo joins only "
                  "with a noise multiplier of at least %.6g (secure_floor.min_noise_multiplier)",
                  floor.min_noise_multiplier);
    return Error(why);
  }
  const auto& k = setup.skellam();
  const std::size_t padded = protocol::skellam_padded(setup);
  // The round's multiplier: the count word's sensitivity h counts against the same noise.
  const double z =
      crypto::skellam_noise_multiplier(k.variance(), k.gamma(), k.clip_norm(), padded, k.beta(), k.count_scale());
  // Colluders know their own shares of the noise: c of the group's members (as the floor counts
  // them for the masks, crypto::secagg::check_floor) among the n_min survivors of the least sum
  // the setup reveals leave (n_min - c) / n_min of its variance unknown, so the noise multiplier
  // that holds against them is z sqrt((n_min - c) / n_min).
  const std::uint32_t n_min = setup.min_survivors();
  const std::uint32_t c = crypto::secagg::corrupt_count(static_cast<std::size_t>(setup.members_size()), floor.corrupt);
  const double z_held = c == 0 ? z : n_min > c ? z * std::sqrt(static_cast<double>(n_min - c) / n_min) : 0.0;
  if (z_held >= floor.min_noise_multiplier) return {};
  const int head = std::snprintf(why, sizeof why,
                                 "below this silo's floor: the secure setup's distributed-DP noise (variance %.6g, "
                                 "gamma %.6g, clip_norm %.6g, %zu rotated coordinates, count word scale %llu) has "
                                 "noise multiplier %.6g",
                                 k.variance(), k.gamma(), k.clip_norm(), padded,
                                 static_cast<unsigned long long>(k.count_scale()), z);
  const std::size_t at = std::min(static_cast<std::size_t>(std::max(head, 0)), sizeof why - 1);
  if (c > 0) {
    std::snprintf(why + at, sizeof why - at,
                  ", %.6g against the %u of its %d members this silo assumes may collude with the server "
                  "(secure_floor.corrupt %.6g: they know their shares, %u of the %u in the least sum it reveals), "
                  "below this silo's %.6g (secure_floor.min_noise_multiplier)",
                  z_held, c, setup.members_size(), floor.corrupt, c, n_min, floor.min_noise_multiplier);
  } else {
    std::snprintf(why + at, sizeof why - at, ", below this silo's %.6g (secure_floor.min_noise_multiplier)",
                  floor.min_noise_multiplier);
  }
  return Error(why);
}

}  // namespace

proto::Result<wire::SecureAggregation> SecureClient::start(const wire::SecAggSetup& setup, std::uint64_t round,
                                                           const std::string& me) {
  const auto signer = setup_signer(setup, round);
  if (!signer || signer->empty()) {  // a certificate that names no one signs nothing
    return proto::error(wire::NOT_ALLOWED, signer ? "" : signer.error().message());
  }
  if (auto floor = check_noise_floor(setup, cfg_.floor); !floor) {
    return proto::error(wire::NOT_ALLOWED, floor.error().message());
  }
  std::shared_ptr<secure::Member> member = secure::make_member(
      setup, secure::MemberContext{.federation = cfg_.federation,
                                   .round = round,
                                   .me = me,
                                   .signer = *cfg_.signer,
                                   .ca = *cfg_.ca,
                                   .server_name = *signer,
                                   .floor = cfg_.floor,
                                   .sources = cfg_.sources,
                                   .max_message_bytes = cfg_.max_message_bytes});
  if (!member) {
    return proto::error(wire::NOT_ALLOWED, "the secure setup names protocol " + std::to_string(setup.protocol()) +
                                               ", which this agent does not speak");
  }
  // A setup below this silo's floor, or unusable: refused with the member's own code and words.
  auto keys = member->start();
  if (!keys) return keys;
  round_ = round;
  setup_ = setup;
  session_ = protocol::secure_session(setup, cfg_.federation, round);
  member_ = std::move(member);
  return keys;
}

Result<SecureReply, secure::Refusal> SecureClient::receive(const wire::Envelope& e) {
  const std::string step = proto::body_name(e);
  if (masking_) return secure::Refusal{step, "the " + step + " arrived while this silo masks its update"};
  auto r = member_->receive(e.secure());
  if (auto* no = std::get_if<secure::Refusal>(&r)) return std::move(*no);
  SecureReply reply{.answer = std::move(std::get<secure::Answer>(r))};
  if (member_->ready() && !settled_) settled_ = reply.settled = true;
  return reply;
}

std::optional<MaskingJob> SecureClient::masking_job(const std::optional<RoundOutput>& pending, FaultHook& hook) {
  if (!member_ || !settled_ || !pending || !pending->update || words_ || masking_) return std::nullopt;
  masking_ = true;
  std::uint64_t seed = 0;  // the encoding's rounding
  cfg_.sources.random_bytes({reinterpret_cast<std::uint8_t*>(&seed), sizeof seed});
  MaskingJob m{.member = member_,
               .setup = *setup_,
               .update = pending->update,
               .weight = pending->weight,
               .kept = pending->kept,
               .hook = &hook,
               .seed = seed};
  if (setup_->has_skellam()) cfg_.sources.random_bytes(m.noise_key);  // distributed DP's noise
  return m;
}

Result<std::string> SecureClient::masked(MaskDone r) {
  masking_ = false;
  if (!r.error.empty()) return Error(std::move(r.error));
  words_ = std::move(r.words);
  return std::move(r.sha256);
}

std::string SecureClient::skellam_sha256() const {
  return setup_ && setup_->has_skellam() && setup_->vector_length() > 0
             ? protocol::skellam_sha256(setup_->skellam(), protocol::skellam_padded(*setup_))
             : std::string();
}

std::string SecureClient::session_string() const {
  return member_ && setup_ ? session_ : std::string();
}

}  // namespace xsilo::agent
