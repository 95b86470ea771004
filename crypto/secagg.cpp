#include "crypto/secagg.h"

#include <algorithm>
#include <cstring>

#include "crypto/mask.h"

namespace xsilo::crypto::secagg {

namespace {

std::string pair_context(const std::string& purpose, const Params& p, const std::string& a,
                         const std::string& b) {
  const bool ab = a < b;
  return purpose + "/" + p.session + "/" + (ab ? a : b) + "/" + (ab ? b : a);
}

// The key two members share for `purpose`, from one's secret and the other's public key.
std::optional<Secret> pair_key(const std::string& purpose, const Params& p, const Secret& my_secret,
                               const Key32& their_public, const std::string& me, const std::string& them) {
  auto shared = x25519(my_secret, their_public);
  if (!shared) return std::nullopt;
  return derive(*shared, pair_context(purpose, p, me, them));
}

std::string share_ad(const Params& p, const std::string& from, const std::string& to) {
  return "xsilo-share|" + p.session + "|" + from + "|" + to;
}

}  // namespace

std::uint32_t Params::index_of(const std::string& name) const {
  auto it = std::find(members.begin(), members.end(), name);
  return it == members.end() ? 0 : static_cast<std::uint32_t>(it - members.begin()) + 1;
}

std::string check_params(const Params& p) {
  if (p.members.empty()) return "a secure group needs members";
  if (p.threshold < 2) return "the threshold must be at least 2";
  if (p.threshold > p.members.size()) {
    return "threshold " + std::to_string(p.threshold) + " exceeds the group's " +
           std::to_string(p.members.size()) + " members";
  }
  if (p.bits != 32 && p.bits != 64) return "modulus bits must be 32 or 64";
  return "";
}

// ---- client ---------------------------------------------------------------------------------

Client::Client(Params p, std::string me) : p_(std::move(p)), me_(std::move(me)) {}

PublicKeys Client::advertise() {
  cipher_ = X25519KeyPair::generate();
  mask_ = X25519KeyPair::generate();
  self_seed_ = Secret::random();
  step_ = Step::Share;
  return {cipher_.public_key, mask_.public_key, sha256(std::span<const std::uint8_t>(self_seed_.bytes()))};
}

Expected<Ciphertexts> Client::share(const KeyList& u1) {
  if (step_ != Step::Share) return std::string("ShareKeys out of order");
  if (!u1.count(me_)) return std::string("the key list does not include this silo");
  if (u1.size() < p_.threshold) {
    return "only " + std::to_string(u1.size()) + " members advertised keys, the threshold is " +
           std::to_string(p_.threshold);
  }
  for (const auto& [name, keys] : u1) {
    if (!p_.index_of(name)) return "the key list names " + name + ", who is not in the group";
  }
  u1_ = u1;
  const auto n = static_cast<std::uint32_t>(p_.members.size());
  const auto key_shares = shamir_split(mask_.secret, p_.threshold, n);
  const auto seed_shares = shamir_split(self_seed_, p_.threshold, n);
  Ciphertexts out;
  for (const auto& [name, keys] : u1) {
    const std::uint32_t i = p_.index_of(name) - 1;
    const std::string plain = key_shares[i].encode() + seed_shares[i].encode();
    if (name == me_) {
      held_[me_] = {key_shares[i], seed_shares[i]};
      continue;
    }
    auto k = pair_key("share-key", p_, cipher_.secret, keys.cipher_pk, me_, name);
    if (!k) return "member " + name + " advertised an invalid encryption key";
    out[name] = seal(*k, plain, share_ad(p_, me_, name));
  }
  step_ = Step::Receive;
  return out;
}

std::string Client::receive(const Ciphertexts& from) {
  if (step_ != Step::Receive) return "share delivery out of order";
  const std::uint32_t mine = p_.index_of(me_);
  for (const auto& [sender, ciphertext] : from) {
    auto keys = u1_.find(sender);
    if (keys == u1_.end() || sender == me_) return "shares from " + sender + ", who advertised no keys";
    auto k = pair_key("share-key", p_, cipher_.secret, keys->second.cipher_pk, me_, sender);
    auto plain = k ? open(*k, ciphertext, share_ad(p_, sender, me_)) : std::nullopt;
    if (!plain || plain->size() != 88) {
      return "the shares from " + sender + " do not decrypt: tampered with, or not for this silo";
    }
    auto a = Share::decode(std::string_view(*plain).substr(0, 44));
    auto b = Share::decode(std::string_view(*plain).substr(44, 44));
    if (!a || !b || a->x != mine || b->x != mine) return "the shares from " + sender + " are malformed";
    held_[sender] = {*a, *b};
  }
  if (from.size() + 1 < p_.threshold) {
    return "only " + std::to_string(from.size() + 1) + " members shared keys, the threshold is " +
           std::to_string(p_.threshold);
  }
  u2_.clear();
  u2_.push_back(me_);
  for (const auto& [sender, c] : from) u2_.push_back(sender);
  step_ = Step::Mask;
  return "";
}

template <class T>
std::string Client::mask_impl(std::span<T> input) {
  if (step_ != Step::Mask) return "masked input out of order";
  if (input.size() != p_.length) return "input has the wrong length";
  if (sizeof(T) * 8 != p_.bits) return "input words do not match the ring";
  const std::uint32_t mine = p_.index_of(me_);
  for (const auto& v : u2_) {
    if (v == me_) continue;
    auto seed = pair_key("pair-mask", p_, mask_.secret, u1_.at(v).mask_pk, me_, v);
    if (!seed) return "member " + v + " advertised an invalid mask key";
    add_mask(*seed, input, mine < p_.index_of(v) ? +1 : -1);
  }
  add_mask(self_seed_, input, +1);
  step_ = Step::Unmask;
  return "";
}

std::string Client::mask(std::span<std::uint32_t> input) { return mask_impl(input); }
std::string Client::mask(std::span<std::uint64_t> input) { return mask_impl(input); }

Expected<UnmaskReply> Client::unmask(const UnmaskRequest& r) {
  if (step_ != Step::Unmask) return std::string("unmasking out of order (or asked twice)");
  std::set<std::string> dropped(r.dropped.begin(), r.dropped.end());
  std::set<std::string> survivors(r.survivors.begin(), r.survivors.end());
  for (const auto& v : dropped) {
    if (survivors.count(v)) return "asked for both shares of " + v + "; refusing";
  }
  if (!survivors.count(me_)) return std::string("this silo is not among the survivors");
  if (survivors.size() < p_.threshold) {
    return "only " + std::to_string(survivors.size()) + " survivors, the threshold is " +
           std::to_string(p_.threshold);
  }
  const std::set<std::string> u2(u2_.begin(), u2_.end());
  for (const auto& v : dropped) {
    if (!u2.count(v)) return "asked for the mask key of " + v + ", who shared no keys with this silo";
  }
  for (const auto& v : survivors) {
    if (!u2.count(v)) return "survivor " + v + " shared no keys with this silo";
  }
  // Everyone this silo masked with is either a survivor or dropped: otherwise the sum could
  // never be unmasked, and a partial answer would only leak.
  if (dropped.size() + survivors.size() != u2.size()) {
    return std::string("the request does not account for every member this silo masked with");
  }
  UnmaskReply reply;
  for (const auto& v : dropped) reply.mask_key_shares[v] = held_.at(v).first.encode();
  for (const auto& v : survivors) reply.self_mask_shares[v] = held_.at(v).second.encode();
  step_ = Step::Done;
  return reply;
}

// ---- server ---------------------------------------------------------------------------------

Server::Server(Params p) : p_(std::move(p)) {}

std::string Server::on_keys(const std::string& from, const PublicKeys& keys) {
  if (step_ != Step::Keys) return "keys arrived after the key list was sent";
  if (!p_.index_of(from)) return from + " is not in this secure group";
  if (keys_.count(from)) return from + " advertised keys twice";
  keys_[from] = keys;
  return "";
}

Expected<KeyList> Server::close_keys() {
  if (step_ != Step::Keys) return std::string("key list already sent");
  if (keys_.size() < p_.threshold) {
    return "only " + std::to_string(keys_.size()) + " of " + std::to_string(p_.members.size()) +
           " silos advertised keys; the threshold is " + std::to_string(p_.threshold);
  }
  for (const auto& [name, k] : keys_) u1_.insert(name);
  step_ = Step::Shares;
  return keys_;
}

std::string Server::on_shares(const std::string& from, const Ciphertexts& to) {
  if (step_ != Step::Shares) return "shares arrived out of order";
  if (!u1_.count(from)) return from + " shares keys without having advertised any";
  if (shares_.count(from)) return from + " shared keys twice";
  for (const auto& [recipient, c] : to) {
    if (!u1_.count(recipient) || recipient == from) return from + " addressed shares to " + recipient;
  }
  if (to.size() + 1 != u1_.size()) return from + " did not share with every member of the key list";
  shares_[from] = to;
  return "";
}

Expected<std::map<std::string, Ciphertexts>> Server::close_shares() {
  if (step_ != Step::Shares) return std::string("shares already delivered");
  if (shares_.size() < p_.threshold) {
    return "only " + std::to_string(shares_.size()) + " silos shared keys; the threshold is " +
           std::to_string(p_.threshold);
  }
  std::map<std::string, Ciphertexts> out;
  for (const auto& [sender, to] : shares_) u2_.insert(sender);
  for (const auto& recipient : u2_) {
    auto& box = out[recipient];
    for (const auto& sender : u2_) {
      if (sender != recipient) box[sender] = shares_.at(sender).at(recipient);
    }
  }
  step_ = Step::Masked;
  return out;
}

std::string Server::on_masked_input(const std::string& from) {
  if (step_ != Step::Masked) return "masked input arrived out of order";
  if (!u2_.count(from)) return from + " sent a masked input without having shared keys";
  if (!u3_.insert(from).second) return from + " sent two masked inputs";
  return "";
}

Expected<UnmaskRequest> Server::close_masked() {
  if (step_ != Step::Masked) return std::string("unmasking already requested");
  if (u3_.size() < p_.threshold) {
    return "only " + std::to_string(u3_.size()) + " masked inputs arrived; the threshold is " +
           std::to_string(p_.threshold);
  }
  UnmaskRequest r;
  for (const auto& v : u2_) (u3_.count(v) ? r.survivors : r.dropped).push_back(v);
  request_ = r;
  step_ = Step::Unmask;
  return r;
}

std::string Server::on_unmask(const std::string& from, const UnmaskReply& reply) {
  if (step_ != Step::Unmask) return "unmask shares arrived out of order";
  if (!u3_.count(from)) return from + " is not a survivor";
  if (replies_.count(from)) return from + " answered twice";
  for (const auto& v : request_->dropped) {
    if (!reply.mask_key_shares.count(v)) return from + " left out the share of " + v + "'s mask key";
  }
  for (const auto& v : request_->survivors) {
    if (!reply.self_mask_shares.count(v)) return from + " left out the share of " + v + "'s self mask";
  }
  replies_[from] = reply;
  return "";
}

template <class T>
std::string Server::finish_impl(std::span<T> sum) {
  if (step_ != Step::Unmask) return "unmasking out of order";
  if (replies_.size() < p_.threshold) {
    return "only " + std::to_string(replies_.size()) + " survivors answered; the threshold is " +
           std::to_string(p_.threshold);
  }
  if (sum.size() != p_.length) return "sum has the wrong length";
  expansions_ = 0;
  // t shares of one secret, from the first t replies.
  auto gather = [&](const std::string& owner, bool mask_key) -> std::optional<Secret> {
    std::vector<Share> shares;
    for (const auto& [who, reply] : replies_) {
      const auto& m = mask_key ? reply.mask_key_shares : reply.self_mask_shares;
      auto s = Share::decode(m.at(owner));
      if (!s || s->x != p_.index_of(who)) return std::nullopt;
      shares.push_back(*s);
      if (shares.size() == p_.threshold) break;
    }
    return shamir_combine(shares);
  };
  // Dropped after sharing: rebuild the mask key; remove its pairwise masks from each survivor.
  for (const auto& v : request_->dropped) {
    auto sk = gather(v, true);
    if (!sk || X25519KeyPair::public_of(*sk) != keys_.at(v).mask_pk) {
      return "the mask key of " + v + " rebuilt from its shares does not match its public key: a share was tampered with";
    }
    for (const auto& w : request_->survivors) {
      auto seed = pair_key("pair-mask", p_, *sk, keys_.at(w).mask_pk, v, w);
      if (!seed) return "member " + w + " advertised an invalid mask key";
      // w added +PRG when index(w) < index(v), -PRG otherwise: take it out.
      add_mask(*seed, sum, p_.index_of(w) < p_.index_of(v) ? -1 : +1);
      ++expansions_;
    }
  }
  // Every survivor's self mask.
  for (const auto& u : request_->survivors) {
    auto b = gather(u, false);
    if (!b || sha256(std::span<const std::uint8_t>(b->bytes())) != keys_.at(u).self_mask_commitment) {
      return "the self-mask seed of " + u + " rebuilt from its shares does not match its commitment: a share was tampered with";
    }
    add_mask(*b, sum, -1);
    ++expansions_;
  }
  step_ = Step::Done;
  return "";
}

std::string Server::finish(std::span<std::uint32_t> sum) { return finish_impl(sum); }
std::string Server::finish(std::span<std::uint64_t> sum) { return finish_impl(sum); }

}  // namespace xsilo::crypto::secagg
