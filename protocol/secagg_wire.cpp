#include "protocol/secagg_wire.h"

#include <cstring>

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

proto::Status bad(std::string why) { return proto::error(wire::BAD_UPDATE, std::move(why)); }

// name -> bytes, refusing empty names and a name given twice.
template <class Entries, class Name, class Value>
proto::Result<secagg::Ciphertexts> to_map(const Entries& entries, Name name, Value value, const char* what) {
  secagg::Ciphertexts out;
  for (const auto& e : entries) {
    const std::string& n = name(e);
    if (n.empty()) return bad(std::string(what) + " entry without a silo name");
    if (!out.emplace(n, value(e)).second) return bad(std::string(what) + " names " + n + " twice");
  }
  return out;
}

}  // namespace

std::string secagg_session(const std::string& federation, std::uint64_t round, std::uint32_t group) {
  return federation + "/" + std::to_string(round) + "/" + std::to_string(group);
}

secagg::Params secagg_params(const wire::SecAggSetup& s, const std::string& federation, std::uint64_t round) {
  secagg::Params p;
  p.session = secagg_session(federation, round, s.group());
  p.members.assign(s.members().begin(), s.members().end());
  p.threshold = s.threshold();
  p.bits = s.modulus_bits();
  p.length = s.vector_length();
  return p;
}

wire::SecAggKeys to_wire(const secagg::PublicKeys& k) {
  wire::SecAggKeys w;
  w.set_cipher_pk(as_bytes(k.cipher_pk));
  w.set_mask_pk(as_bytes(k.mask_pk));
  w.set_self_mask_commitment(as_bytes(k.self_mask_commitment));
  return w;
}

proto::Result<secagg::PublicKeys> from_wire(const wire::SecAggKeys& w) {
  secagg::PublicKeys k;
  if (!copy_exact(w.cipher_pk(), k.cipher_pk) || !copy_exact(w.mask_pk(), k.mask_pk) ||
      !copy_exact(w.self_mask_commitment(), k.self_mask_commitment)) {
    return bad("malformed keys: public keys and the commitment are 32 bytes each");
  }
  return k;
}

wire::SecAggKeyList to_wire(const secagg::KeyList& list) {
  wire::SecAggKeyList w;
  for (const auto& [silo, k] : list) {
    auto* e = w.add_entries();
    e->set_silo(silo);
    e->set_cipher_pk(as_bytes(k.cipher_pk));
    e->set_mask_pk(as_bytes(k.mask_pk));
    e->set_self_mask_commitment(as_bytes(k.self_mask_commitment));
  }
  return w;
}

proto::Result<secagg::KeyList> from_wire(const wire::SecAggKeyList& w) {
  secagg::KeyList list;
  for (const auto& e : w.entries()) {
    secagg::PublicKeys k;
    if (e.silo().empty()) return bad("key list entry without a silo name");
    if (!copy_exact(e.cipher_pk(), k.cipher_pk) || !copy_exact(e.mask_pk(), k.mask_pk) ||
        !copy_exact(e.self_mask_commitment(), k.self_mask_commitment)) {
      return bad("the key list has malformed keys for " + e.silo());
    }
    if (!list.emplace(e.silo(), k).second) return bad("the key list names " + e.silo() + " twice");
  }
  return list;
}

wire::SecAggShares shares_to_wire(const secagg::Ciphertexts& to) {
  wire::SecAggShares w;
  for (const auto& [recipient, c] : to) {
    auto* e = w.add_entries();
    e->set_recipient(recipient);
    e->set_ciphertext(c);
  }
  return w;
}

proto::Result<secagg::Ciphertexts> from_wire(const wire::SecAggShares& w) {
  return to_map(
      w.entries(), [](const auto& e) -> const std::string& { return e.recipient(); },
      [](const auto& e) { return e.ciphertext(); }, "shares");
}

wire::SecAggShareDelivery delivery_to_wire(const secagg::Ciphertexts& from) {
  wire::SecAggShareDelivery w;
  for (const auto& [sender, c] : from) {
    auto* e = w.add_entries();
    e->set_sender(sender);
    e->set_ciphertext(c);
  }
  return w;
}

proto::Result<secagg::Ciphertexts> from_wire(const wire::SecAggShareDelivery& w) {
  return to_map(
      w.entries(), [](const auto& e) -> const std::string& { return e.sender(); },
      [](const auto& e) { return e.ciphertext(); }, "share delivery");
}

wire::SecAggUnmaskRequest to_wire(const secagg::UnmaskRequest& r) {
  wire::SecAggUnmaskRequest w;
  for (const auto& v : r.dropped) w.add_dropped(v);
  for (const auto& v : r.survivors) w.add_survivors(v);
  return w;
}

secagg::UnmaskRequest from_wire(const wire::SecAggUnmaskRequest& w) {
  secagg::UnmaskRequest r;
  r.dropped.assign(w.dropped().begin(), w.dropped().end());
  r.survivors.assign(w.survivors().begin(), w.survivors().end());
  return r;
}

wire::SecAggUnmaskShares to_wire(const secagg::UnmaskReply& r) {
  wire::SecAggUnmaskShares w;
  for (const auto& [owner, share] : r.mask_key_shares) {
    auto* e = w.add_entries();
    e->set_owner(owner);
    e->set_is_mask_key(true);
    e->set_share(share);
  }
  for (const auto& [owner, share] : r.self_mask_shares) {
    auto* e = w.add_entries();
    e->set_owner(owner);
    e->set_is_mask_key(false);
    e->set_share(share);
  }
  return w;
}

proto::Result<secagg::UnmaskReply> from_wire(const wire::SecAggUnmaskShares& w) {
  secagg::UnmaskReply r;
  for (const auto& e : w.entries()) {
    auto& into = e.is_mask_key() ? r.mask_key_shares : r.self_mask_shares;
    if (e.owner().empty()) return bad("unmask share without an owner");
    if (!into.emplace(e.owner(), e.share()).second) {
      return bad("two " + std::string(e.is_mask_key() ? "mask-key" : "self-mask") + " shares of " + e.owner());
    }
  }
  return r;
}

}  // namespace xsilo::protocol
