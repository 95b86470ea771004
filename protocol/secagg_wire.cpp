#include "protocol/secagg_wire.h"

#include "crypto/hash.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <set>

namespace xsilo::protocol {

namespace {

template <class Array>
bool copy_exact(const std::string& bytes, Array& out) {
  if (bytes.size() != out.size()) return false;
  std::memcpy(out.data(), bytes.data(), out.size());
  return true;
}

template <class Array>
std::string as_bytes(const Array& a) {
  return std::string(reinterpret_cast<const char*>(a.data()), a.size());
}

proto::Error bad(std::string why) { return proto::error(wire::BAD_UPDATE, std::move(why)); }

// name -> bytes, refusing empty names and a name given twice.
template <class Entries, class Name, class Value>
proto::Result<std::map<std::string, secagg::SealedShares>> to_map(const Entries& entries, Name name, Value value,
                                                                  const char* what) {
  std::map<std::string, secagg::SealedShares> out;
  for (const auto& e : entries) {
    const std::string& n = name(e);
    if (n.empty()) return bad(std::string(what) + " entry without a silo name");
    if (!out.emplace(n, value(e)).second) return bad(std::string(what) + " names " + n + " twice");
  }
  return out;
}

// The part of a key advertisement both protocols have: the inbox keys, the certificate and the
// signature (W: wire::SecAggKeys or wire::LsaKeys).
template <class W, class Advertisement>
void signed_inbox_keys_to_wire(const Advertisement& a, W& w) {
  for (const auto& [peer, key] : a.inbox_keys) {
    auto* k = w.add_inbox_keys();
    k->set_peer(peer);
    k->set_key(as_bytes(key));
  }
  w.set_certificate(a.certificate);
  w.set_signature(a.signature);
}
template <class W, class Advertisement>
proto::Status signed_inbox_keys_from_wire(const W& w, Advertisement& a) {
  for (const auto& k : w.inbox_keys()) {
    crypto::Key32 key{};
    if (k.peer().empty() || !copy_exact(k.key(), key)) return bad("malformed keys: an inbox key without a peer or of the wrong size");
    if (!a.inbox_keys.emplace(k.peer(), key).second) return bad("malformed keys: two inbox keys for " + k.peer());
  }
  if (w.certificate().empty() || w.signature().empty()) return bad("keys without a certificate or signature");
  a.certificate = w.certificate();
  a.signature = w.signature();
  return {};
}

// A key list (silo -> advertisement) either way, for either protocol.
template <class WireList, class KeyList>
WireList key_list_to_wire(const KeyList& list) {
  WireList w;
  for (const auto& [silo, k] : list) {
    auto* e = w.add_entries();
    e->set_silo(silo);
    *e->mutable_keys() = to_wire(k);
  }
  return w;
}
template <class KeyList, class WireList>
proto::Result<KeyList> key_list_from_wire(const WireList& w) {
  KeyList list;
  for (const auto& e : w.entries()) {
    if (e.silo().empty()) return bad("key list entry without a silo name");
    auto k = from_wire(e.keys());
    if (!k) return bad("the key list entry of " + e.silo() + ": " + k.error().message());
    if (!list.emplace(e.silo(), std::move(*k)).second) return bad("the key list names " + e.silo() + " twice");
  }
  return list;
}

}  // namespace

std::string secure_session(const wire::SecAggSetup& s, const std::string& federation, std::uint64_t round) {
  return federation + "/" + std::to_string(round) + "/" + std::to_string(s.group()) + "/" +
         crypto::sha256_hex(setup_statement(s, federation, round));
}

secagg::Params secagg_params(const wire::SecAggSetup& s, const std::string& federation, std::uint64_t round) {
  secagg::Params p;
  p.session = secure_session(s, federation, round);
  p.members.assign(s.members().begin(), s.members().end());
  p.threshold = s.threshold();
  p.min_survivors = s.min_survivors();
  p.bits = s.modulus_bits();
  p.length = s.vector_length();
  p.degree = s.degree();
  p.graph_seed = s.graph_seed();
  if (!copy_exact(s.server_key(), p.server_key)) p.server_key = {};  // check_params refuses it
  return p;
}

std::uint32_t secagg_degree(const wire::SecAggSetup& setup) {
  if (setup.degree()) return setup.degree();
  return setup.members_size() > 0 ? static_cast<std::uint32_t>(setup.members_size() - 1) : 0;
}

std::string skellam_statement(const wire::SkellamSetup& k) {
  auto exact = [](double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%a", v);
    return std::string(b);
  };
  std::string out;
  crypto::append_field(out, "skellam");
  crypto::append_field(out, std::to_string(k.bits()));
  crypto::append_field(out, exact(k.gamma()));
  crypto::append_field(out, exact(k.variance()));
  crypto::append_field(out, exact(k.clip_norm()));
  crypto::append_field(out, exact(k.beta()));
  crypto::append_field(out, std::to_string(k.rotation_seed()));
  if (k.count_scale() > 0) {  // adaptive clipping's count word (without it, the statement is as before)
    crypto::append_field(out, "count_scale");
    crypto::append_field(out, std::to_string(k.count_scale()));
  }
  return out;
}

std::string skellam_sha256(const wire::SkellamSetup& k, std::size_t padded) {
  std::string statement = skellam_statement(k);
  crypto::append_field(statement, std::to_string(padded));
  return crypto::sha256_hex(statement);
}

std::size_t skellam_padded(const wire::SecAggSetup& s) {
  const std::size_t words = s.skellam().count_scale() > 0 ? 2 : 1;
  return s.vector_length() > words ? s.vector_length() - words : 0;
}

std::string setup_statement(const wire::SecAggSetup& s, const std::string& federation, std::uint64_t round) {
  std::string members;
  for (const auto& m : s.members()) crypto::append_field(members, m);
  auto num = [](auto v) { return std::to_string(v); };
  std::string out = crypto::statement("secagg-setup", {federation, num(round), num(s.group()), members,
                                                      num(s.threshold()), num(s.min_survivors()), num(s.modulus_bits()),
                                                      num(s.fraction_bits()), num(s.vector_length()), num(s.clip_norm()),
                                                      num(s.max_weight()), s.server_key(), s.server_certificate()});
  if (s.count_unclipped()) {
    // The count word (adaptive clipping, or a secure round without silo-level DP): the flag, and
    // the clip norm to the bit (under adaptive clipping it changes every round and can be small;
    // six decimals would let a relay swap it for another that prints alike). Without the flag
    // the statement is as before.
    char exact[64];
    std::snprintf(exact, sizeof exact, "%a", static_cast<double>(s.clip_norm()));
    crypto::append_field(out, "count_unclipped");
    crypto::append_field(out, exact);
  }
  if (s.degree()) {  // SecAgg+: the graph (without it, the statement is as before)
    crypto::append_field(out, "graph");
    crypto::append_field(out, num(s.degree()));
    crypto::append_field(out, s.graph_seed());
  }
  if (s.has_skellam()) out += skellam_statement(s.skellam());  // distributed DP (without it, as before)
  if (s.wire_bits() != 0) {  // the packed wire (without it, as before)
    crypto::append_field(out, "wire_bits");
    crypto::append_field(out, num(s.wire_bits()));
  }
  if (s.protocol() != wire::SECAGG) {  // another protocol and its parameters (SecAgg's is as before)
    crypto::append_field(out, "protocol");
    crypto::append_field(out, num(static_cast<int>(s.protocol())));
    crypto::append_field(out, num(s.privacy()));
    crypto::append_field(out, num(s.target()));
  }
  return out;
}

wire::SecAggKeys to_wire(const secagg::Advertisement& a) {
  wire::SecAggKeys w;
  w.set_mask_pk(as_bytes(a.mask_pk));
  w.set_self_mask_commitment(as_bytes(a.self_mask_commitment));
  signed_inbox_keys_to_wire(a, w);
  return w;
}

proto::Result<secagg::Advertisement> from_wire(const wire::SecAggKeys& w) {
  secagg::Advertisement a;
  if (!copy_exact(w.mask_pk(), a.mask_pk) || !copy_exact(w.self_mask_commitment(), a.self_mask_commitment)) {
    return bad("malformed keys: public keys and the commitment are 32 bytes each");
  }
  if (auto keys = signed_inbox_keys_from_wire(w, a); !keys) return keys.error();
  return a;
}

lightsecagg::Params lightsecagg_params(const wire::SecAggSetup& s, const std::string& federation, std::uint64_t round) {
  lightsecagg::Params p;
  p.session = secure_session(s, federation, round);
  p.members.assign(s.members().begin(), s.members().end());
  p.privacy = s.privacy();
  p.target = s.target();
  p.threshold = s.threshold();
  p.min_survivors = s.min_survivors();
  p.length = s.vector_length();
  if (!copy_exact(s.server_key(), p.server_key)) p.server_key = {};  // check_params refuses it
  return p;
}

wire::LsaKeys to_wire(const lightsecagg::Advertisement& a) {
  wire::LsaKeys w;
  signed_inbox_keys_to_wire(a, w);
  return w;
}

proto::Result<lightsecagg::Advertisement> from_wire(const wire::LsaKeys& w) {
  lightsecagg::Advertisement a;
  if (auto keys = signed_inbox_keys_from_wire(w, a); !keys) return keys.error();
  return a;
}

wire::LsaKeyList to_wire(const lightsecagg::KeyList& list) { return key_list_to_wire<wire::LsaKeyList>(list); }

proto::Result<lightsecagg::KeyList> from_wire(const wire::LsaKeyList& w) { return key_list_from_wire<lightsecagg::KeyList>(w); }

wire::SecAggKeyList to_wire(const secagg::KeyList& list) { return key_list_to_wire<wire::SecAggKeyList>(list); }

proto::Result<secagg::KeyList> from_wire(const wire::SecAggKeyList& w) { return key_list_from_wire<secagg::KeyList>(w); }

wire::SecAggShares outbox_to_wire(const secagg::Outbox& to) {
  wire::SecAggShares w;
  for (const auto& [recipient, s] : to) {
    auto* e = w.add_entries();
    e->set_recipient(recipient);
    e->set_box(s.box);
    e->set_signature(s.signature);
  }
  return w;
}

proto::Result<secagg::Outbox> from_wire(const wire::SecAggShares& w) {
  return to_map(
      w.entries(), [](const auto& e) -> const std::string& { return e.recipient(); },
      [](const auto& e) { return secagg::SealedShares{e.box(), e.signature()}; }, "shares");
}

wire::SecAggShareDelivery delivery_to_wire(const secagg::Inbox& from) {
  wire::SecAggShareDelivery w;
  for (const auto& [sender, s] : from) {
    auto* e = w.add_entries();
    e->set_sender(sender);
    e->set_box(s.box);
    e->set_signature(s.signature);
  }
  return w;
}

proto::Result<secagg::Inbox> from_wire(const wire::SecAggShareDelivery& w) {
  return to_map(
      w.entries(), [](const auto& e) -> const std::string& { return e.sender(); },
      [](const auto& e) { return secagg::SealedShares{e.box(), e.signature()}; }, "share delivery");
}

wire::SecAggReceipt to_wire(const secagg::Receipt& r) {
  wire::SecAggReceipt w;
  for (const auto& a : r.accusations) {
    auto* e = w.add_accusations();
    e->set_accused(a.accused);
    e->set_box(a.evidence.box);
    e->set_box_signature(a.evidence.signature);
    e->set_inbox_secret(as_bytes(a.inbox_secret.bytes()));
  }
  w.set_signature(r.signature);
  return w;
}

proto::Result<secagg::Receipt> from_wire(const wire::SecAggReceipt& w) {
  secagg::Receipt r;
  std::set<std::string> seen;
  for (const auto& e : w.accusations()) {
    secagg::Accusation a;
    a.accused = e.accused();
    a.evidence = {e.box(), e.box_signature()};
    if (a.accused.empty() || !copy_exact(e.inbox_secret(), a.inbox_secret.bytes())) {
      return bad("malformed receipt: an accusation without a name or with a secret of the wrong size");
    }
    if (!seen.insert(a.accused).second) return bad("malformed receipt: " + a.accused + " accused twice");
    r.accusations.push_back(std::move(a));
  }
  r.signature = w.signature();
  return r;
}

wire::SecAggSettled to_wire(const secagg::Settled& s) {
  wire::SecAggSettled w;
  for (const auto& m : s.members) w.add_members(m);
  w.set_server_signature(s.signature);
  return w;
}

secagg::Settled from_wire(const wire::SecAggSettled& w) {
  return {{w.members().begin(), w.members().end()}, w.server_signature()};
}

wire::SecAggUnmaskRequest to_wire(const secagg::UnmaskRequest& r) {
  wire::SecAggUnmaskRequest w;
  for (const auto& v : r.dropped) w.add_dropped(v);
  for (const auto& v : r.survivors) w.add_survivors(v);
  for (const auto& [silo, sig] : r.signatures) {
    auto* s = w.add_signatures();
    s->set_silo(silo);
    s->set_signature(sig);
  }
  return w;
}

proto::Result<secagg::UnmaskRequest> from_wire(const wire::SecAggUnmaskRequest& w) {
  secagg::UnmaskRequest r;
  r.dropped.assign(w.dropped().begin(), w.dropped().end());
  r.survivors.assign(w.survivors().begin(), w.survivors().end());
  for (const auto& s : w.signatures()) {
    if (!r.signatures.emplace(s.silo(), s.signature()).second) return bad("the unmask request has two signatures of " + s.silo());
  }
  return r;
}

std::vector<std::pair<std::string, std::string>> advertised_keys(const wire::SecureAggregation& step) {
  std::vector<std::pair<std::string, std::string>> out;
  const auto hashed = [](const std::string& signature) { return crypto::sha256_hex(signature); };
  if (step.has_secagg_key_list()) {
    for (const auto& e : step.secagg_key_list().entries()) out.emplace_back(e.silo(), hashed(e.keys().signature()));
  } else if (step.has_lsa_key_list()) {
    for (const auto& e : step.lsa_key_list().entries()) out.emplace_back(e.silo(), hashed(e.keys().signature()));
  }
  return out;
}

std::string advertised_own_keys(const wire::SecureAggregation& step) {
  if (step.has_secagg_keys()) return crypto::sha256_hex(step.secagg_keys().signature());
  if (step.has_lsa_keys()) return crypto::sha256_hex(step.lsa_keys().signature());
  return "";
}

Result<std::map<std::string, std::string>> record_keys(const nlohmann::json& unmask_begun) {
  const auto keys = unmask_begun.find("keys");
  if (keys == unmask_begun.end() || !keys->is_array()) return Error("it lists no members' keys");
  std::map<std::string, std::string> named;
  for (const auto& k : *keys) {
    const auto silo = k.find("silo"), sha = k.find("keys_sha256");
    if (!k.is_object() || silo == k.end() || !silo->is_string() || sha == k.end() || !sha->is_string()) {
      return Error("an entry of its keys is not a silo and its keys_sha256");
    }
    if (!named.emplace(silo->get<std::string>(), sha->get<std::string>()).second) {
      return Error("it names member " + silo->get<std::string>() + " twice (the keys of two runs under one charge)");
    }
  }
  return named;
}

bool asks_unmask_shares(const wire::SecureAggregation& step) {
  return step.has_secagg_unmask_request() || step.has_lsa_unmask_request();
}

}  // namespace xsilo::protocol
