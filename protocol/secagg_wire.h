// Secure aggregation on the wire, written once: the plain structs of crypto/secagg.h to and
// from their protobuf messages, for the agent (client side), the server (its groups) and tests.
// Everything read from a peer is checked: key sizes, duplicate names, empty fields.
#pragma once

#include <cstdint>
#include <string>

#include "crypto/secagg.h"
#include "proto/status.h"
#include "proto/xsilo.pb.h"

namespace xsilo::protocol {

namespace secagg = crypto::secagg;

// The session string that binds federation, round and group into every key and ciphertext.
std::string secagg_session(const std::string& federation, std::uint64_t round, std::uint32_t group);
// The group's parameters as a member reads them from RoundStart.secagg.
secagg::Params secagg_params(const wire::SecAggSetup& setup, const std::string& federation, std::uint64_t round);

wire::SecAggKeys to_wire(const secagg::PublicKeys& keys);
proto::Result<secagg::PublicKeys> from_wire(const wire::SecAggKeys& keys);

wire::SecAggKeyList to_wire(const secagg::KeyList& list);
proto::Result<secagg::KeyList> from_wire(const wire::SecAggKeyList& list);

// A member's shares: recipient -> ciphertext.
wire::SecAggShares shares_to_wire(const secagg::Ciphertexts& to);
proto::Result<secagg::Ciphertexts> from_wire(const wire::SecAggShares& shares);
// What the server delivers to one member: sender -> ciphertext.
wire::SecAggShareDelivery delivery_to_wire(const secagg::Ciphertexts& from);
proto::Result<secagg::Ciphertexts> from_wire(const wire::SecAggShareDelivery& delivery);

wire::SecAggUnmaskRequest to_wire(const secagg::UnmaskRequest& request);
secagg::UnmaskRequest from_wire(const wire::SecAggUnmaskRequest& request);
wire::SecAggUnmaskShares to_wire(const secagg::UnmaskReply& reply);
proto::Result<secagg::UnmaskReply> from_wire(const wire::SecAggUnmaskShares& shares);

}  // namespace xsilo::protocol
