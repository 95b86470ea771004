// The session's secure-aggregation client (docs/protocol.md, "A securely aggregated round"): the
// signed setup checked against the silo's own floor, the SecAgg client's messages in and out, and
// masking the encoded update on the worker.
#include "silo_agent/session.h"

#include <spdlog/spdlog.h>

#include <cmath>

#include "crypto/fixed_point.h"
#include "crypto/hash.h"
#include "proto/frame.h"
#include "protocol/failure.h"
#include "protocol/secagg_wire.h"

namespace xsilo::agent {

std::string Session::setup_signer(const wire::SecAggSetup& setup, std::string& why) const {
  if (!cfg_.signer || !cfg_.ca) {
    why = "this agent has no certificate key to take part in secure aggregation";
    return "";
  }
  auto server = cfg_.ca->certified(setup.server_certificate(), "server", why);
  if (!server) {
    why = "the secure setup carries no valid server certificate: " + why;
    return "";
  }
  if (!cfg_.servers.empty() && !cfg_.servers.count(server->name)) {
    why = "the secure setup is signed by server " + server->name + ", which is not one this agent trusts";
    return "";
  }
  why = cfg_.ca->verify(setup.server_certificate(), server->name, "server",
                        protocol::setup_statement(setup, cfg_.federation, round_), setup.server_signature());
  if (!why.empty()) {
    why = "the secure setup is not signed by the server (" + why + ")";
    return "";
  }
  return server->name;
}

// Secure aggregation: the setup is checked, then keys go out at once, overlapping with training.
void Session::start_secure(const wire::SecAggSetup& setup) {
  std::string why;
  const std::string server = setup_signer(setup, why);
  if (server.empty()) {
    spdlog::error("round {}: refusing the secure group: {}", round_, why);
    reply_error(wire::NOT_ALLOWED, why);
    return;
  }
  auto p = protocol::secagg_params(setup, cfg_.federation, round_);
  auto client = std::make_shared<crypto::secagg::Client>(p, name_, *cfg_.signer, *cfg_.ca, setup.server_certificate(),
                                                         server, cfg_.floor);
  auto keys = client->advertise();
  if (!crypto::secagg::ok(keys)) {
    // A setup below this silo's floor, or unusable: said to the server (and so recorded), and
    // in the silo's own log.
    spdlog::error("round {}: refusing the secure group: {}", round_, crypto::secagg::error(keys));
    reply_error(wire::NOT_ALLOWED, "unusable secure group: " + crypto::secagg::error(keys));
    return;
  }
  setup_ = setup;
  secure_ = std::move(client);
  auto out = env();
  *out.mutable_secagg_keys() = protocol::to_wire(crypto::secagg::value(keys));
  send(std::move(out));
  spdlog::info("round {}: secure group {} of {} silos ({} neighbours each, threshold {}, sums of at least {}); keys advertised",
               round_, setup.group(), setup.members_size(),
               protocol::secagg_degree(setup), setup.threshold(),
               setup.min_survivors());
  silent_ = hook_.after_sent(SecureStep::KeysSent, round_);
}

// A secure-aggregation step failed here: say why upstream, and take no further part.
void Session::secure_failed(const std::string& step, const std::string& why) {
  spdlog::error("round {}: secure aggregation ({}): {}", round_, step, why);
  reply_error(wire::UNEXPECTED, why);
}

// Whether a secure-aggregation message is this round's and may be handled now. While the
// masking job runs, the worker holds the client: a message that overtakes the masking (only a
// faulty or malicious upstream sends one; the server asks for nothing before the update is
// announced) is refused here rather than handled beside the worker.
bool Session::secure_message(const wire::Envelope& e, const std::string& step) {
  if (!secure_ || e.round() != round_) return false;
  if (masking_) {
    secure_failed(step, "the " + step + " arrived while this silo masks its update");
    return false;
  }
  return true;
}

void Session::on_key_list(const wire::Envelope& e) {
  if (!secure_message(e, "key list")) return;
  auto list = protocol::from_wire(e.secagg_key_list());
  if (!list) return secure_failed("key list", list.status().message);
  auto shares = secure_->share(*list);
  if (!crypto::secagg::ok(shares)) return secure_failed("key list", crypto::secagg::error(shares));
  auto out = env();
  *out.mutable_secagg_shares() = protocol::outbox_to_wire(crypto::secagg::value(shares));
  send(std::move(out));
  silent_ = hook_.after_sent(SecureStep::SharesSent, round_);
}

void Session::on_share_delivery(const wire::Envelope& e) {
  if (!secure_message(e, "share delivery")) return;
  auto from = protocol::from_wire(e.secagg_share_delivery());
  if (!from) return secure_failed("share delivery", from.status().message);
  auto receipt = secure_->receive(*from);
  if (!crypto::secagg::ok(receipt)) return secure_failed("share delivery", crypto::secagg::error(receipt));
  for (const auto& a : crypto::secagg::value(receipt).accusations) {
    spdlog::warn("round {}: the shares {} dealt this silo are bad; accusing it with the evidence", round_, a.accused);
  }
  auto out = env();
  *out.mutable_secagg_receipt() = protocol::to_wire(crypto::secagg::value(receipt));
  send(std::move(out));
}

// Checks U2 and agrees the pairwise mask seeds here, on the network thread (one X25519 per
// settled neighbour, about 5 ms at 100): the worker is usually still training then, and a job
// would queue behind the training and put the agreements back between it and the masking.
void Session::on_settled(const wire::Envelope& e) {
  if (!secure_message(e, "settled members")) return;
  if (auto err = secure_->settle(protocol::from_wire(e.secagg_settled())); !err.empty()) {
    return secure_failed("settled members", err);
  }
  settled_ = true;
  mask_when_ready();
}

void Session::on_survivors(const wire::Envelope& e) {
  if (!secure_message(e, "survivors")) return;
  const auto& s = e.secagg_survivors().survivors();
  auto c = secure_->confirm({s.begin(), s.end()}, e.secagg_survivors().server_signature());
  if (!crypto::secagg::ok(c)) return secure_failed("survivors", crypto::secagg::error(c));
  auto out = env();
  out.mutable_secagg_confirmation()->set_signature(crypto::secagg::value(c).signature);
  send(std::move(out));
}

void Session::on_unmask_request(const wire::Envelope& e) {
  if (!secure_message(e, "unmask request")) return;
  auto request = protocol::from_wire(e.secagg_unmask_request());
  if (!request) return secure_failed("unmask request", request.status().message);
  auto reply = secure_->unmask(*request);
  if (!crypto::secagg::ok(reply)) return secure_failed("unmask request", crypto::secagg::error(reply));
  auto out = env();
  out.mutable_secagg_unmask_shares()->set_sealed(crypto::secagg::value(reply).box);
  send(std::move(out));
  spdlog::info("round {}: unmasking shares sent, sealed to the server", round_);
}

// Masks the encoded update once both it and the share deliveries are here (on the worker: one
// PRG expansion per group member), then announces it.
void Session::mask_when_ready() {
  if (!secure_ || !settled_ || !pending_ || !pending_->update || masked_ || masking_) return;
  masking_ = true;
  job([client = secure_, setup = *setup_, update = pending_->update, weight = pending_->weight,
       kept = pending_->kept, &hook = hook_, seed = draw_seed()]() -> SessionJobResult {
    MaskDone r;
    const crypto::FixedPointParams codec{setup.modulus_bits(), setup.fraction_bits(), setup.clip_norm(),
                                         setup.max_weight(), setup.count_unclipped()};
    crypto::FixedPointParams applied = codec;
    hook.encoding(applied);  // the production hook changes nothing
    // RANDOM_K: only the round's shared coordinates are masked and sent.
    const std::size_t d = kept ? kept->size() : update->size();
    if (setup.vector_length() != codec.words(d)) {
      r.error = "the secure setup's vector length " + std::to_string(setup.vector_length()) + " does not fit the model (" +
                std::to_string(codec.words(d)) + " words)";
      return r;
    }
    // The upload is weight * delta: the codec wants delta and the weight separately.
    std::vector<float> delta(d);
    const auto u = update->flat();
    for (std::size_t j = 0; j < d; ++j) delta[j] = kept ? u[(*kept)[j]] : u[j];
    for (auto& v : delta) {
      v = static_cast<float>(v / weight);
      if (!std::isfinite(v)) {
        r.error = "the update has NaN or infinite values; it cannot be encoded";
        return r;
      }
    }
    r.words = std::make_shared<protocol::MaskedVector>(codec.bits, codec.words(d));
    r.words->visit([&](auto words) { crypto::encode(applied, delta, weight, seed, words); });
    hook.encoded(*r.words, codec);
    r.error = r.words->visit([&](auto words) { return client->mask(words); });
    const auto b = r.words->bytes();
    r.sha256 = crypto::sha256_hex(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
    return r;
  });
}

void Session::masked(MaskDone r) {
  masking_ = false;
  if (!r.error.empty()) {
    spdlog::error("round {}: masking failed: {}", round_, r.error);
    reply_failure(wire::UPDATE_NOT_ENCODABLE);
    return;
  }
  masked_ = std::move(r.words);
  pending_->sha256 = r.sha256;
  announce_ready();
  spdlog::info("round {}: update encoded and masked", round_);
}

}  // namespace xsilo::agent
