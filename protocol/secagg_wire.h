// Secure aggregation on the wire, written once: the plain structs of crypto/secagg.h and
// crypto/lightsecagg.h to and from their protobuf messages, for the agent (client side), the server (its groups) and tests.
// Everything read from a peer is checked for form: key sizes, duplicate names, empty fields.
// Whether it is signed by whom it claims is crypto/secagg's business.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "crypto/lightsecagg.h"
#include "crypto/secagg.h"
#include <nlohmann/json.hpp>

#include "common/result.h"
#include "proto/status.h"
#include "proto/xsilo.pb.h"

namespace xsilo::protocol {

namespace secagg = crypto::secagg;
namespace lightsecagg = crypto::lightsecagg;

// The session every key, share, box, confirmation and answer of a group is signed under:
// "federation/round/group/" and the SHA-256 of the exact setup signed. Every member places the others by its own
// member list, threshold and parameters, so a server showing members different setups could
// solve for single masks from their answers (LightSecAgg, review of 421039f) or make a group's
// sum fail to add up (SecAgg: another width, length or ring); bound so, a split view stops at
// the first signed message, which fails to verify under the other setup.
std::string secure_session(const wire::SecAggSetup& setup, const std::string& federation, std::uint64_t round);
// The group's parameters as a member reads them from RoundStart.secagg.
secagg::Params secagg_params(const wire::SecAggSetup& setup, const std::string& federation, std::uint64_t round);
// The neighbour graph's degree k: the setup's, or members - 1 for the complete graph (degree 0).
std::uint32_t secagg_degree(const wire::SecAggSetup& setup);
// A LightSecAgg group's parameters as a member reads them from RoundStart.secagg.
lightsecagg::Params lightsecagg_params(const wire::SecAggSetup& setup, const std::string& federation,
                                       std::uint64_t round);
// What the server signs of a setup (every field but the signature, with federation and round).
std::string setup_statement(const wire::SecAggSetup& setup, const std::string& federation, std::uint64_t round);
// Distributed DP's part of the statement (every parameter to the bit), and its SHA-256 in hex:
// what a round's audit record names, so that the recorded parameters are the signed ones.
std::string skellam_statement(const wire::SkellamSetup& k);
// What a round record's setup_sha256 and a silo's sent.jsonl name: the signed Skellam part and
// the rotated length P its sensitivity was computed for (skellam_padded of the setup), so a
// record can restate neither.
std::string skellam_sha256(const wire::SkellamSetup& k, std::size_t padded);
// P, the rotated length a distributed-DP setup's vector holds: its vector_length less the
// contributor word and, with a count_scale (adaptive clipping), the count word.
std::size_t skellam_padded(const wire::SecAggSetup& s);
// The "kind" of a line of a silo's sent.jsonl that says it released its unmask shares in a
// distributed-DP round (with "round", "federation" and "skellam_setup_sha256"): written durably
// before the shares leave, and checked by `xsilo audit verify --sent` against the log's charges.
inline constexpr const char* kUnmaskSharesReleased = "unmask_shares_released";
// The audit record the server writes before it asks for any unmask share under distributed DP
// (server/distributed_dp.h), whose signed head and line the unmask steps carry.
inline constexpr const char* kUnmaskBegun = "unmask_begun";

// The members a key-list step (SecAgg's or LightSecAgg's, server -> silo) names, each with the
// SHA-256 (hex) of its signature over the keys it advertised: keys are fresh each run of a round,
// so the hash names the member's run. Empty for any other step.
std::vector<std::pair<std::string, std::string>> advertised_keys(const wire::SecureAggregation& step);
// The same hash of a silo's own keys step (SecAgg's or LightSecAgg's, silo -> server); "" for any
// other step.
std::string advertised_own_keys(const wire::SecureAggregation& step);
// The members an unmask_begun record names with their keys of its run ("keys": each {"silo",
// "keys_sha256"}), or why they cannot be read: no list, an entry of another form, or a member
// named twice (the keys of two runs under one charge).
Result<std::map<std::string, std::string>> record_keys(const nlohmann::json& unmask_begun);
// Whether a step (server -> silo) asks for the shares that remove masks from a group's sum.
bool asks_unmask_shares(const wire::SecureAggregation& step);

wire::SecAggKeys to_wire(const secagg::Advertisement& keys);
proto::Result<secagg::Advertisement> from_wire(const wire::SecAggKeys& keys);

wire::SecAggKeyList to_wire(const secagg::KeyList& list);
wire::LsaKeys to_wire(const lightsecagg::Advertisement& keys);
proto::Result<lightsecagg::Advertisement> from_wire(const wire::LsaKeys& keys);
wire::LsaKeyList to_wire(const lightsecagg::KeyList& list);
proto::Result<lightsecagg::KeyList> from_wire(const wire::LsaKeyList& list);
proto::Result<secagg::KeyList> from_wire(const wire::SecAggKeyList& list);

// A member's sealed shares: recipient -> box.
wire::SecAggShares outbox_to_wire(const secagg::Outbox& to);
proto::Result<secagg::Outbox> from_wire(const wire::SecAggShares& shares);
// What the server delivers to one member: sender -> box.
wire::SecAggShareDelivery delivery_to_wire(const secagg::Inbox& from);
proto::Result<secagg::Inbox> from_wire(const wire::SecAggShareDelivery& delivery);

wire::SecAggReceipt to_wire(const secagg::Receipt& receipt);
proto::Result<secagg::Receipt> from_wire(const wire::SecAggReceipt& receipt);

wire::SecAggSettled to_wire(const secagg::Settled& settled);
secagg::Settled from_wire(const wire::SecAggSettled& settled);

wire::SecAggUnmaskRequest to_wire(const secagg::UnmaskRequest& request);
proto::Result<secagg::UnmaskRequest> from_wire(const wire::SecAggUnmaskRequest& request);

}  // namespace xsilo::protocol
