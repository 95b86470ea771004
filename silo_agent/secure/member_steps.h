// A member's steps that every protocol on crypto::secagg's settlement takes alike (SecAgg,
// SecAgg+, LightSecAgg): the messages have SecAgg's form, only the oneof case of
// wire::SecureAggregation is the protocol's own, so each step is written once here and a
// protocol's receive() names its cases (silo_agent/secure/secagg_member.cpp,
// lightsecagg_member.cpp). `put(m)` gives the protocol's field of the answer `m` to fill.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

#include <spdlog/spdlog.h>

#include "protocol/secagg_wire.h"
#include "silo_agent/secure/member.h"

namespace xsilo::agent::secure::steps {

// The key list: the client deals its shares.
template <class Client, class KeyList, class Put>
std::variant<Answer, Refusal> deal(Client& client, const KeyList& l, Put put) {
  auto list = protocol::from_wire(l);
  if (!list) return Refusal{"key list", list.error().message()};
  auto shares = client.share(*list);
  if (!shares) return Refusal{"key list", shares.error().message()};
  wire::SecureAggregation m;
  *put(m) = protocol::outbox_to_wire(*shares);
  return Answer{std::move(m), Sent::Shares};
}

// What the others dealt: the receipt, each bad box accused (logged as "the `box` <dealer> dealt
// this silo `is` bad").
template <class Client, class Put>
std::variant<Answer, Refusal> take_delivery(Client& client, const wire::SecAggShareDelivery& d, std::uint64_t round,
                                            const char* box, const char* is, Put put) {
  auto from = protocol::from_wire(d);
  if (!from) return Refusal{"share delivery", from.error().message()};
  auto receipt = client.receive(*from);
  if (!receipt) return Refusal{"share delivery", receipt.error().message()};
  for (const auto& a : receipt->accusations) {
    spdlog::warn("round {}: the {} {} dealt this silo {} bad; accusing it with the evidence", round, box, a.accused, is);
  }
  wire::SecureAggregation m;
  *put(m) = protocol::to_wire(*receipt);
  return Answer{std::move(m), Sent::Other};
}

// The settled list: the client settles (SecAgg agrees its pairwise mask seeds here, on the
// network thread: the worker is usually still training then, and a job would queue behind the
// training and put the agreements back between it and the masking).
template <class Client>
std::variant<Answer, Refusal> settle(Client& client, const wire::SecAggSettled& s, bool& settled) {
  if (auto agreed = client.settle(protocol::from_wire(s)); !agreed) {
    return Refusal{"settled members", agreed.error().message()};
  }
  settled = true;
  return Answer{};
}

// The survivor set: the client's confirmation.
template <class Client, class Put>
std::variant<Answer, Refusal> confirm(Client& client, const wire::SecAggSurvivors& s, Put put) {
  auto c = client.confirm({s.survivors().begin(), s.survivors().end()}, s.server_signature());
  if (!c) return Refusal{"survivors", c.error().message()};
  wire::SecureAggregation m;
  put(m)->set_signature(c->signature);
  return Answer{std::move(m), Sent::Other};
}

// The unmask request: the client's sealed answer (logged as "<what> sent").
template <class Client, class Put>
std::variant<Answer, Refusal> unmask(Client& client, const wire::SecAggUnmaskRequest& r, std::uint64_t round,
                                     const char* what, Put put) {
  auto request = protocol::from_wire(r);
  if (!request) return Refusal{"unmask request", request.error().message()};
  auto reply = client.unmask(*request);
  if (!reply) return Refusal{"unmask request", reply.error().message()};
  wire::SecureAggregation m;
  put(m)->set_sealed(reply->box);
  spdlog::info("round {}: {} sent, sealed to the server", round, what);
  return Answer{std::move(m), Sent::UnmaskShares};
}

}  // namespace xsilo::agent::secure::steps
