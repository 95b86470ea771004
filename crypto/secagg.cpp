#include "crypto/secagg.h"

#include <sodium.h>

#include <algorithm>
#include <cstring>

#include "crypto/mask.h"
#include "crypto/secure_detail.h"

namespace xsilo::crypto::secagg {

namespace {

using namespace detail;  // as_bytes, pack and unpack, joined, sorted, wipe

std::string pair_context(const std::string& purpose, const Params& p, const std::string& a, const std::string& b) {
  const bool ab = a < b;
  return purpose + "/" + p.session + "/" + (ab ? a : b) + "/" + (ab ? b : a);
}

// The seed two members share for their pairwise mask, from one's secret and the other's key.
std::optional<Secret> pair_seed(const Params& p, const Secret& my_secret, const Key32& their_public,
                                const std::string& me, const std::string& them) {
  auto shared = x25519(my_secret, their_public);
  if (!shared) return std::nullopt;
  return derive(*shared, pair_context("pair-mask", p, me, them));
}

// What a box from `dealer` to `holder` holds: the two dealer-signed shares, checked. Success and
// `out` filled, or why the box is bad (then the dealer is at fault: the box carries its
// signature).
Status open_box(const Params& p, const CertVerifier& ca, const Advertisement& dealer_keys, const std::string& dealer,
                const std::string& holder, const X25519KeyPair& inbox, std::string_view box,
                std::pair<SignedShare, SignedShare>& out) {
  auto plain = open_sealed(inbox, box);
  if (!plain) return Error("its shares for " + holder + " do not open");
  auto fields = unpack(*plain, 4);
  wipe(*plain);
  if (!fields) return Error("its shares for " + holder + " are malformed");
  const std::uint32_t x = p.index_of(holder);
  for (int k = 0; k < 2; ++k) {
    const std::string& share = (*fields)[2 * k];
    const std::string& sig = (*fields)[2 * k + 1];
    auto decoded = Share::decode(share);
    if (!decoded || decoded->x != x) return Error("its shares for " + holder + " are malformed");
    if (!ca.verify(dealer_keys.certificate, dealer, kSiloRole, share_statement(p.session, dealer, holder, k == 0, share),
                   sig)) {
      return Error("its shares for " + holder + " are not signed by it");
    }
  }
  out = {{(*fields)[0], (*fields)[1]}, {(*fields)[2], (*fields)[3]}};
  for (auto& f : *fields) wipe(f);
  return {};
}

}  // namespace

std::uint32_t Params::index_of(const std::string& name) const {
  auto it = std::find(members.begin(), members.end(), name);
  return it == members.end() ? 0 : static_cast<std::uint32_t>(it - members.begin()) + 1;
}

Status check_params(const Params& p) {
  const auto n = p.members.size();
  if (n == 0) return Error("a secure group needs members");
  if (sorted(p.members).size() != n) return Error("a secure group names a member twice");
  if (p.threshold < 2) return Error("the threshold must be at least 2");
  if (p.graph()) {
    if (p.degree % 2) return Error("the neighbour graph's degree " + std::to_string(p.degree) + " must be even");
    if (p.threshold > p.degree + 1) {
      return Error("threshold " + std::to_string(p.threshold) + " exceeds the " + std::to_string(p.degree + 1) +
                   " holders of each secret (degree " + std::to_string(p.degree) + " and the owner)");
    }
    if (2 * std::size_t{p.threshold} <= std::size_t{p.degree} + 1) {
      return Error("threshold " + std::to_string(p.threshold) + " is not above half of each secret's " +
                   std::to_string(p.degree + 1) +
                   " holders: two survivor sets shown to two halves of them could each "
                   "collect it");
    }
  } else if (2 * std::size_t{p.threshold} <= n) {
    return Error("threshold " + std::to_string(p.threshold) + " is not above half of the group's " + std::to_string(n) +
                 " members: two different survivor sets could each collect it");
  }
  if (p.threshold > n) {
    return Error("threshold " + std::to_string(p.threshold) + " exceeds the group's " + std::to_string(n) + " members");
  }
  if (p.min_survivors < p.threshold || p.min_survivors > n) {
    return Error("the smallest revealed sum (" + std::to_string(p.min_survivors) +
                 " silos) must lie between the threshold " + std::to_string(p.threshold) + " and the group's " +
                 std::to_string(n) + " members");
  }
  if (!ring_bits_supported(p.bits)) return Error(std::string("modulus bits must be ") + kRingBits);
  if (!usable_public_key(p.server_key)) return Error("the server's key is not a usable X25519 key");
  return {};
}

Status check_floor(const Params& p, const Floor& f) {
  const std::size_t n = p.members.size();
  const std::uint32_t c = corrupt_count(n, f.corrupt);
  const std::string assumed = " (this silo assumes up to " + std::to_string(c) + " of the group's " + std::to_string(n) +
                              " may collude with the server: secure_floor.corrupt " + std::to_string(f.corrupt) + ")";
  if (p.min_survivors < f.min_sum) {
    return Error("the setup reveals sums of " + std::to_string(p.min_survivors) + " silos; this silo's floor is " +
                 std::to_string(f.min_sum) + " (secure_floor.min_sum)");
  }
  if (p.min_survivors < c + 2) {
    return Error("the setup reveals sums of " + std::to_string(p.min_survivors) +
                 " silos, which this silo and the colluders "
                 "alone could make" +
                 assumed);
  }
  if (p.threshold <= c) {
    // The colluders each hold a share of every member's mask key and self-mask seed: t of them
    // rebuild both without asking anyone, and unmask the member's input alone.
    return Error("threshold " + std::to_string(p.threshold) + ": the colluders alone hold that many shares of each " +
                 "member's secrets" + assumed);
  }
  if (p.graph()) {
    if (p.degree <= c) {
      return Error("each member has " + std::to_string(p.degree) + " neighbours, which the colluders could all be" +
                   assumed);
    }
    if (2 * std::size_t{p.threshold} <= std::size_t{p.degree} + 1 + c) {
      return Error(
          "threshold " + std::to_string(p.threshold) + " of " + std::to_string(p.degree + 1) +
          " holders: a split view of the survivors, the colluders answering both sides, could gather both of a "
          "member's secrets; it must exceed " +
          std::to_string((p.degree + 1 + c) / 2) + assumed);
    }
  } else if (2 * std::size_t{std::max(p.threshold, p.min_survivors)} <= n + c) {
    return Error("threshold " + std::to_string(p.threshold) + " and sums of " + std::to_string(p.min_survivors) +
                 " of " + std::to_string(n) +
                 ": a split view of the survivors, the colluders answering both sides, could gather "
                 "both of a member's secrets" +
                 assumed);
  }
  return {};
}

std::string keys_statement(const std::string& session, const std::string& silo, const Advertisement& a) {
  std::string inbox;
  for (const auto& [peer, key] : a.inbox_keys) inbox += pack({peer, as_bytes(key)});
  return statement("secagg-keys", {session, silo, as_bytes(a.mask_pk), as_bytes(a.self_mask_commitment), inbox});
}

std::string share_statement(const std::string& session, const std::string& dealer, const std::string& holder,
                            bool mask_key, std::string_view share) {
  return statement("secagg-share", {session, dealer, holder, mask_key ? "mask-key" : "self-mask", share});
}

std::string box_statement(const std::string& session, const std::string& sender, const std::string& recipient,
                          std::string_view box) {
  return statement("secagg-box", {session, sender, recipient, box});
}

std::string receipt_statement(const std::string& session, const std::string& member, const Receipt& r) {
  std::vector<std::string> accused;
  for (const auto& a : r.accusations) accused.push_back(a.accused);
  return statement("secagg-receipt", {session, member, joined(sorted(accused))});
}

std::string settled_statement(const std::string& session, const std::vector<std::string>& members) {
  return statement("secagg-settled", {session, joined(sorted(members))});
}

std::string survivors_statement(const std::string& session, const std::vector<std::string>& survivors) {
  return statement("secagg-survivors", {session, joined(sorted(survivors))});
}

std::string encode(const UnmaskReply& r) {
  std::string out;
  for (const auto* m : {&r.mask_key_shares, &r.self_mask_shares}) {
    std::string part;
    for (const auto& [owner, s] : *m) part += pack({owner, s.share, s.signature});
    out += pack({part});
  }
  return out;
}

std::optional<UnmaskReply> decode_reply(std::string_view bytes) {
  auto parts = unpack(bytes, 2);
  if (!parts) return std::nullopt;
  UnmaskReply r;
  for (int k = 0; k < 2; ++k) {
    auto& into = k == 0 ? r.mask_key_shares : r.self_mask_shares;
    auto f = unpack((*parts)[k], 0);
    if (!f || f->size() % 3 != 0) return std::nullopt;
    for (std::size_t i = 0; i < f->size(); i += 3) {  // owner, share, signature
      if ((*f)[i].empty() || !into.emplace((*f)[i], SignedShare{(*f)[i + 1], (*f)[i + 2]}).second) return std::nullopt;
    }
  }
  return r;
}

// ---- client ---------------------------------------------------------------------------------

Client::Client(Params p, std::string me, CertSigner signer, CertVerifier ca, std::string server_certificate,
               std::string server_name, Floor floor)
    : p_(std::move(p)), me_(std::move(me)), signer_(std::move(signer)), ca_(std::move(ca)),
      server_certificate_(std::move(server_certificate)), server_name_(std::move(server_name)), floor_(floor),
      graph_(p_.members.size(), p_.graph() ? p_.degree : 0, p_.session + "/" + p_.graph_seed), mine_(p_.index_of(me_)) {
  for (auto v : graph_.neighbours(mine_)) near_[p_.members[v - 1]] = v;
  if (p_.graph()) {
    for (std::size_t i = 0; i < p_.members.size(); ++i) index_[p_.members[i]] = static_cast<std::uint32_t>(i + 1);
  }
}

Client::~Client() {
  for (auto& [owner, shares] : held_) {
    wipe(shares.first.share);
    wipe(shares.second.share);
  }
}

Result<Advertisement> Client::advertise() {
  if (step_ != Step::Advertise) return Error("keys advertised twice");
  if (auto why = check_params(p_); !why) return why.error();
  if (auto why = check_floor(p_, floor_); !why) return Error("below this silo's floor: " + why.error().message());
  if (!mine_) return Error("this silo is not a member of the group");
  mask_ = X25519KeyPair::generate();
  self_seed_ = Secret::random();
  Advertisement a;
  a.mask_pk = mask_.public_key;
  a.self_mask_commitment = sha256(std::span<const std::uint8_t>(self_seed_.bytes()));
  for (const auto& [m, index] : near_) {
    inbox_[m] = X25519KeyPair::generate();
    a.inbox_keys[m] = inbox_[m].public_key;
  }
  a.certificate = signer_.certificate();
  a.signature = signer_.sign(keys_statement(p_.session, me_, a));
  step_ = Step::Share;
  return a;
}

Status Client::check_peer(const std::string& name, const Advertisement& a) const {
  if (!p_.index_of(name)) return Error("the key list names " + name + ", who is not in the group");
  if (auto verdict = ca_.verify(a.certificate, name, kSiloRole, keys_statement(p_.session, name, a), a.signature);
      !verdict) {
    return Error("the keys of " + name + " are not signed by " + name + " (" + verdict.error().message() + ")");
  }
  auto mine = a.inbox_keys.find(me_);
  if (mine == a.inbox_keys.end()) return Error(name + " advertised no key for this silo's shares");
  if (!usable_public_key(mine->second) || !usable_public_key(a.mask_pk))
    return Error(name + " advertised an unusable key");
  return {};
}

Result<Outbox> Client::share(const KeyList& u1) {
  if (step_ != Step::Share) return Error("ShareKeys out of order");
  auto self = u1.find(me_);
  if (self == u1.end()) return Error("the key list does not include this silo");
  if (self->second.mask_pk != mask_.public_key || self->second.self_mask_commitment !=
                                                      sha256(std::span<const std::uint8_t>(self_seed_.bytes()))) {
    return Error("the key list altered this silo's own keys");
  }
  // On a graph the list holds this member's neighbours only (Server::keys_for): what counts
  // here is its holders (below), and the survivor count is checked at confirmation, on the set
  // the server signs.
  if (!p_.graph() && u1.size() < p_.min_survivors) {
    return Error("only " + std::to_string(u1.size()) + " members advertised keys; a sum needs " +
                 std::to_string(p_.min_survivors));
  }
  const std::set<std::string> group(p_.members.begin(), p_.members.end());
  for (const auto& [name, keys] : u1) {
    if (!group.count(name)) return Error("the key list names " + name + ", who is not in the group");
  }
  // This member's neighbours that advertised keys (every other member: complete graph), and it.
  u1_.clear();
  std::vector<std::uint32_t> xs;
  for (const auto& [name, index] : near_) {
    auto it = u1.find(name);
    if (it == u1.end()) continue;
    if (auto why = check_peer(name, it->second); !why) return why.error();
    u1_.insert(*it);
  }
  u1_.insert(*self);
  for (const auto& [name, keys] : u1_) xs.push_back(name == me_ ? mine_ : near_.at(name));
  if (xs.size() < p_.threshold) {
    return Error("only " + std::to_string(xs.size()) + " of this silo's " + std::to_string(near_.size() + 1) +
                 " holders advertised keys; its secrets need " + std::to_string(p_.threshold));
  }
  const auto key_shares = shamir_split(mask_.secret, p_.threshold, xs);
  const auto seed_shares = shamir_split(self_seed_, p_.threshold, xs);
  Outbox out;
  std::size_t i = 0;
  for (const auto& [name, keys] : u1_) {
    std::string a = key_shares[i].encode(), b = seed_shares[i].encode();
    ++i;
    SignedShare sa{a, signer_.sign(share_statement(p_.session, me_, name, true, a))};
    SignedShare sb{b, signer_.sign(share_statement(p_.session, me_, name, false, b))};
    if (name == me_) {
      held_[me_] = {std::move(sa), std::move(sb)};
    } else {
      std::string plain = pack({sa.share, sa.signature, sb.share, sb.signature});
      std::string box = seal_to(keys.inbox_keys.at(me_), plain);
      wipe(plain);
      wipe(sa.share);
      wipe(sb.share);
      std::string sig = signer_.sign(box_statement(p_.session, me_, name, box));
      out[name] = {std::move(box), std::move(sig)};
    }
    wipe(a);
    wipe(b);
  }
  step_ = Step::Receive;
  return out;
}

Result<Receipt> Client::receive(const Inbox& from) {
  if (step_ != Step::Receive) return Error("share delivery out of order");
  using Held = std::pair<SignedShare, SignedShare>;
  auto r = detail::receive(
      from,
      detail::Delivery<KeyList, Held>{.session = p_.session, .me = me_, .ca = ca_, .signer = signer_, .u1 = u1_,
                                      .inbox = inbox_, .held = held_, .accused = accused_},
      {"shares from ", "the shares from ", " do not carry"}, box_statement,
      [&](const Advertisement& keys, const std::string& sender, const std::string& box, Held& got) {
        return open_box(p_, ca_, keys, sender, me_, inbox_.at(sender), box, got);
      });
  if (r) step_ = Step::Settle;
  return r;
}

Status Client::settle(const Settled& s) {
  if (step_ != Step::Settle) return Error("the settled member list arrived out of order");
  auto checked = checks().settled(s);
  if (!checked) return checked.error();
  const auto members = std::move(*checked);
  for (const auto& m : members) {
    if (holds(m) && !held_.count(m))
      return Error("the settled list names " + m + ", whose shares this silo does not hold");
  }
  // The masks are agreed now, one X25519 per settled neighbour, while the update is usually still
  // being trained: mask() is then the keystreams alone.
  std::vector<MaskTerm> masks;
  for (const auto& [v, index] : near_) {
    if (!std::binary_search(members.begin(), members.end(), v)) continue;
    auto seed = pair_seed(p_, mask_.secret, u1_.at(v).mask_pk, me_, v);
    if (!seed) return Error("member " + v + " advertised an invalid mask key");
    masks.push_back({*seed, mine_ < index ? +1 : -1});
  }
  masks.push_back({self_seed_, +1});
  masks_ = std::move(masks);
  u2_ = members;
  step_ = Step::Mask;
  return {};
}

template <class T>
Status Client::mask_impl(std::span<T> input) {
  if (step_ != Step::Mask) return Error("masked input out of order");
  if (input.size() != p_.length) return Error("input has the wrong length");
  if (sizeof(T) * 8 != p_.bits) return Error("input words do not match the ring");
  if (masks_.empty()) return Error("no masks were agreed when U2 was settled");  // never sent unmasked
  add_masks(masks_, input);  // one pass over the input for all of them
  masks_.clear();            // the seeds are zeroed as they go
  step_ = Step::Confirm;
  return {};
}

Status Client::mask(std::span<std::uint8_t> input) { return mask_impl(input); }
Status Client::mask(std::span<std::uint16_t> input) { return mask_impl(input); }
Status Client::mask(std::span<std::uint32_t> input) { return mask_impl(input); }
Status Client::mask(std::span<std::uint64_t> input) { return mask_impl(input); }

Result<Confirmation> Client::confirm(const std::vector<std::string>& survivors, const std::string& server_signature) {
  const auto u3 = sorted(survivors);
  if (confirmed_ && *confirmed_ != u3) return Error("asked to confirm a second, different survivor set; refusing");
  if (!confirmed_ && step_ != Step::Confirm) return Error("survivor confirmation out of order");
  if (auto why = checks().survivors(u3, server_signature, p_.graph()); !why) return why.error();
  for (const auto& v : u3) {
    if (!std::binary_search(u2_.begin(), u2_.end(), v)) return Error("survivor " + v + " is not in the settled group");
  }
  confirmed_ = u3;
  if (step_ == Step::Confirm) step_ = Step::Unmask;
  return Confirmation{signer_.sign(survivors_statement(p_.session, u3))};
}

Result<SealedReply> Client::unmask(const UnmaskRequest& r) {
  if (step_ != Step::Unmask) return Error("unmasking out of order (or asked twice)");
  const auto survivors = sorted(r.survivors);
  const auto dropped = sorted(r.dropped);
  if (survivors != *confirmed_) return Error("the request names other survivors than this silo confirmed");
  for (const auto& v : dropped) {
    if (std::binary_search(survivors.begin(), survivors.end(), v))
      return Error("asked for both shares of " + v + "; refusing");
  }
  std::vector<std::string> all = survivors;
  all.insert(all.end(), dropped.begin(), dropped.end());
  // Everyone this silo masked with is either a survivor or dropped, and nobody else: otherwise
  // the sum could never be unmasked, and a partial answer would only leak.
  if (sorted(all) != u2_) return Error("the request does not account for exactly the members this silo masked with");
  // Signatures on U3: from at least max(t, min_group) survivors; with a graph, from t of this
  // member's own holders (its neighbours and itself), the only ones it can check without work
  // that grows with n.
  const std::size_t valid = detail::confirmations(ca_, p_.session, u1_, survivors, r.signatures,
                                                   [&](const std::string& who) { return holds(who); });
  const std::size_t needed = p_.graph() ? p_.threshold : p_.min_survivors;
  if (valid < needed) {
    return Error("only " + std::to_string(valid) + (p_.graph() ? " of this silo's holders" : " survivors") +
                 " signed the survivor set; " + std::to_string(needed) + " must");
  }
  if (p_.graph()) {
    std::vector<std::uint32_t> alive;
    for (const auto& v : survivors) alive.push_back(index_.at(v));
    if (!graph_.connected(alive)) {
      return Error(
          "the survivors fall apart into pieces of the neighbour graph; unmasking would reveal "
          "the sum of each piece");
    }
  }
  UnmaskReply reply;
  for (const auto& v : dropped) {
    if (holds(v)) reply.mask_key_shares[v] = held_.at(v).first;
  }
  for (const auto& v : survivors) {
    if (holds(v)) reply.self_mask_shares[v] = held_.at(v).second;
  }
  std::string plain = encode(reply);
  std::string sealed = seal_to(p_.server_key, plain);
  wipe(plain);
  for (auto* m : {&reply.mask_key_shares, &reply.self_mask_shares}) {
    for (auto& [owner, s] : *m) wipe(s.share);
  }
  for (auto& [owner, pair] : held_) {
    wipe(pair.first.share);
    wipe(pair.second.share);
  }
  step_ = Step::Done;
  return SealedReply{std::move(sealed)};
}

// ---- server ---------------------------------------------------------------------------------

Server::Server(Params p, CertVerifier ca, CertSigner signer, X25519KeyPair box)
    : Dealing({p.session, p.min_survivors, p.min_survivors, " sent a receipt without having shared keys"},
              {" shares keys without having advertised any", " shared keys twice", " addressed shares to ",
               " did not share with every neighbour in the key list", " silos shared keys; a sum needs "},
              p.members, std::move(ca), std::move(signer)),
      p_(std::move(p)), graph_(p_.members.size(), p_.graph() ? p_.degree : 0, p_.session + "/" + p_.graph_seed),
      box_(std::move(box)) {
  p_.server_key = box_.public_key;
}

bool Server::near(const std::string& a, const std::string& b) const {
  auto ia = index_.find(a), ib = index_.find(b);
  return ia != index_.end() && ib != index_.end() && graph_.adjacent(ia->second, ib->second);
}

std::vector<std::string> Server::neighbours(const std::string& silo) const {
  std::vector<std::string> out;
  auto it = index_.find(silo);
  if (it == index_.end()) return out;
  for (auto v : graph_.neighbours(it->second)) out.push_back(p_.members[v - 1]);
  return out;
}

Server::~Server() {
  for (auto& [holder, reply] : replies_) {
    for (auto& [owner, s] : reply.mask_key_shares) wipe(s.share);
    for (auto& [owner, s] : reply.self_mask_shares) wipe(s.share);
  }
}

bool Server::usable_keys(const Advertisement& a) const { return usable_public_key(a.mask_pk); }

KeyList Server::keys_for(const std::string& member) const {
  if (step_ == Step::Keys) return {};  // U1 is not settled yet
  if (!p_.graph()) return keys_;
  KeyList out;
  if (auto it = keys_.find(member); it != keys_.end()) out.insert(*it);
  for (const auto& v : neighbours(member)) {
    if (auto it = keys_.find(v); it != keys_.end()) out.insert(*it);
  }
  return out;
}

void Server::judge(const std::string& accuser, const Accusation& a) {
  const std::string& accused = a.accused;
  if (!u2_.count(accused) || !near(accused, accuser)) {
    return blame(accuser, "accused " + accused + ", who dealt it nothing");
  }
  auto inbox =
      detail::accusation_key(ca_, keys_, accuser, a, box_statement(p_.session, accused, accuser, a.evidence.box));
  if (!inbox) return blame(accuser, inbox.error().message());
  std::pair<SignedShare, SignedShare> got;
  if (auto why = open_box(p_, ca_, keys_.at(accused), accused, accuser, *inbox, a.evidence.box, got); !why) {
    return blame(accused, why.error().message() + " (shown by " + accuser + " with the box " + accused + " signed)");
  }
  blame(accuser, "accused " + accused + " falsely: the box " + accused + " dealt it opens to shares " + accused +
                     " signed");
}

Status Server::check_survivors(const std::set<std::string>& u3) const {
  std::vector<std::uint32_t> alive;
  for (const auto& v : u3) alive.push_back(index_.at(v));
  if (!graph_.connected(alive)) {
    return Error("the " + std::to_string(u3.size()) +
                 " survivors fall apart into pieces of the neighbour graph; their members refuse to unmask");
  }
  return {};
}

Status Server::on_unmask(const std::string& from, const std::string& sealed) {
  if (step_ != Step::Unmask || !request_) return Error("unmask shares arrived out of order");
  if (!u3_.count(from)) return Error(from + " is not a survivor");
  if (replies_.count(from)) return Error(from + " answered twice");
  auto plain = open_sealed(box_, sealed);
  if (!plain) return Error("the unmask answer from " + from + " does not open with the server's key");
  auto reply = decode_reply(*plain);
  wipe(*plain);
  if (!reply) return Error("the unmask answer from " + from + " is malformed");
  // The shares it holds: of its neighbours (and its own self mask), as the request names them
  // (both lists sorted: they come from a set).
  auto named = [](const std::vector<std::string>& list, const std::string& v) {
    return std::binary_search(list.begin(), list.end(), v);
  };
  auto holds = neighbours(from);
  holds.push_back(from);
  std::size_t dropped = 0, survivors = 0;
  for (const auto& v : holds) {
    if (v != from && named(request_->dropped, v)) {
      ++dropped;
      if (!reply->mask_key_shares.count(v)) return Error(from + " left out the share of " + v + "'s mask key");
    }
    if (named(request_->survivors, v)) {
      ++survivors;
      if (!reply->self_mask_shares.count(v)) return Error(from + " left out the share of " + v + "'s self mask");
    }
  }
  if (reply->mask_key_shares.size() != dropped || reply->self_mask_shares.size() != survivors) {
    return Error(from + " answered with shares nobody asked for");
  }
  replies_[from] = std::move(*reply);
  return {};
}

Result<Secret> Server::rebuild(const std::string& owner, bool mask_key) {
  std::vector<Share> shares;
  const auto& dealer = keys_.at(owner);
  for (const auto& [holder, reply] : replies_) {
    if (excluded_.count(holder) || (holder != owner && !near(holder, owner))) continue;
    const auto& s = (mask_key ? reply.mask_key_shares : reply.self_mask_shares).at(owner);
    if (!ca_.verify(dealer.certificate, owner, kSiloRole, share_statement(p_.session, owner, holder, mask_key, s.share),
                    s.signature)) {
      blame(holder, "answered with a share of " + owner + " that " + owner + " never signed");
      continue;
    }
    auto share = Share::decode(s.share);
    if (!share || share->x != index_.at(holder)) {
      blame(owner, "signed a malformed share for " + holder);
      return Error(owner + " dealt a malformed share");
    }
    shares.push_back(*share);
    if (shares.size() == p_.threshold) break;
  }
  if (shares.size() < p_.threshold) {
    return Error("only " + std::to_string(shares.size()) + " valid shares of " + owner + "'s " +
                 (mask_key ? "mask key" : "self mask") + "; the threshold is " + std::to_string(p_.threshold));
  }
  auto secret = shamir_combine(shares);
  if (!secret) return Error("the shares of " + owner + "'s " + (mask_key ? "mask key" : "self mask") + " do not combine");
  return *secret;
}

template <class T>
Status Server::finish_impl(std::span<T> sum) {
  if (step_ != Step::Unmask || !request_) return Error("unmasking out of order");
  if (replies_.size() < p_.threshold) {
    return Error("only " + std::to_string(replies_.size()) + " survivors answered; the threshold is " +
                 std::to_string(p_.threshold));
  }
  if (sum.size() != p_.length) return Error("sum has the wrong length");
  if (sizeof(T) * 8 != p_.bits) return Error("sum words do not match the ring");
  expansions_ = 0;
  // Every secret is rebuilt and checked before the sum is touched; then one pass removes all
  // the masks.
  std::vector<MaskTerm> masks;
  // Dropped after settling: rebuild the mask key; remove its pairwise masks from each survivor.
  for (const auto& v : request_->dropped) {
    auto sk = rebuild(v, true);
    if (!sk) return sk.error();
    if (X25519KeyPair::public_of(*sk) != keys_.at(v).mask_pk) {
      blame(v, "dealt shares (signed by it) that rebuild to a mask key other than the one it advertised");
      return Error("the mask key of " + v + " rebuilt from its signed shares does not match its public key");
    }
    for (const auto& w : neighbours(v)) {
      if (!u3_.count(w)) continue;  // only survivors masked with v and are in the sum
      auto seed = pair_seed(p_, *sk, keys_.at(w).mask_pk, v, w);
      if (!seed) return Error("member " + w + " advertised an invalid mask key");
      // w added +PRG when index(w) < index(v), -PRG otherwise: take it out.
      masks.push_back({*seed, index_.at(w) < index_.at(v) ? -1 : +1});
    }
  }
  // Every survivor's self mask.
  for (const auto& u : request_->survivors) {
    auto b = rebuild(u, false);
    if (!b) return b.error();
    if (sha256(std::span<const std::uint8_t>(b->bytes())) != keys_.at(u).self_mask_commitment) {
      blame(u, "dealt shares (signed by it) that rebuild to a self-mask seed its commitment refutes");
      return Error("the self-mask seed of " + u + " rebuilt from its signed shares does not match its commitment");
    }
    masks.push_back({*b, -1});
  }
  add_masks(masks, sum);
  expansions_ = masks.size();
  step_ = Step::Done;
  return {};
}

Status Server::finish(std::span<std::uint8_t> sum) { return finish_impl(sum); }
Status Server::finish(std::span<std::uint16_t> sum) { return finish_impl(sum); }
Status Server::finish(std::span<std::uint32_t> sum) { return finish_impl(sum); }
Status Server::finish(std::span<std::uint64_t> sum) { return finish_impl(sum); }

}  // namespace xsilo::crypto::secagg
