#include "crypto/lightsecagg.h"

#include <sodium.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "crypto/secagg_graph.h"
#include "crypto/secure_detail.h"

namespace xsilo::crypto::lightsecagg {

static_assert(std::endian::native == std::endian::little, "shares travel as little-endian words: add a byte swap");

namespace {

using field::kPrime;

using detail::as_bytes;
using detail::joined;
using detail::pack;
using detail::sorted;
using detail::unpack;
using detail::wipe;

void wipe(std::vector<std::uint32_t>& v) {
  if (!v.empty()) sodium_memzero(v.data(), v.size() * sizeof(std::uint32_t));
  v.clear();
}

std::string words_bytes(std::span<const std::uint32_t> w) {
  return std::string(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(std::uint32_t));
}

// L field words from their bytes, or nullopt for the wrong length or a word >= p.
std::optional<std::vector<std::uint32_t>> field_words(std::string_view bytes, std::size_t words) {
  if (bytes.size() != words * sizeof(std::uint32_t)) return std::nullopt;
  std::vector<std::uint32_t> w(words);
  if (words) std::memcpy(w.data(), bytes.data(), bytes.size());
  if (!field::in_field(w)) {
    wipe(w);
    return std::nullopt;
  }
  return w;
}

std::uint32_t alpha(const Params& p, std::uint32_t index) { return p.target + index; }

X25519KeyPair fresh_key_pair(const Sources& s) {
  Secret sk;
  s.random_bytes(sk.bytes());
  return X25519KeyPair{sk, X25519KeyPair::public_of(sk)};
}

// What a box from `dealer` to `holder` holds: the dealer-signed share, checked. Success and `out`
// filled, or why the box is bad (the dealer's fault: the box carries its signature).
Status open_box(const Params& p, const CertVerifier& ca, const Advertisement& dealer_keys, const std::string& dealer,
                const std::string& holder, const X25519KeyPair& inbox, std::string_view box,
                std::vector<std::uint32_t>& out) {
  auto plain = open_sealed(inbox, box);
  if (!plain) return Error("its share for " + holder + " does not open");
  auto fields = unpack(*plain, 2);
  wipe(*plain);
  if (!fields) return Error("its share for " + holder + " is malformed");
  auto words = field_words((*fields)[0], p.segment());
  const bool signed_by_dealer =
      ca.verify(dealer_keys.certificate, dealer, kSiloRole, share_statement(p.session, dealer, holder, (*fields)[0]),
                (*fields)[1]).has_value();
  wipe((*fields)[0]);
  if (!words) return Error("its share for " + holder + " is not " + std::to_string(p.segment()) + " field words");
  if (!signed_by_dealer) {
    wipe(*words);
    return Error("its share for " + holder + " is not signed by it");
  }
  out = std::move(*words);
  return {};
}

}  // namespace

std::uint32_t Params::index_of(const std::string& name) const {
  auto it = std::find(members.begin(), members.end(), name);
  return it == members.end() ? 0 : static_cast<std::uint32_t>(it - members.begin()) + 1;
}

std::size_t Params::segment() const {
  const std::size_t k = target > privacy ? target - privacy : 1;
  return (length + k - 1) / k;
}

std::size_t max_box_bytes(const Params& p) { return 4 * p.segment() + kMaxSignatureBytes + 128; }

std::size_t max_shares_message_bytes(const Params& p) {
  const std::size_t n = p.members.size();
  return (n > 0 ? n - 1 : 0) * (max_box_bytes(p) + kMaxSignatureBytes + 256);
}

Status check_params(const Params& p) {
  const std::size_t n = p.members.size();
  if (n == 0) return Error("a secure group needs members");
  if (sorted(p.members).size() != n) return Error("a secure group names a member twice");
  if (!std::is_sorted(p.members.begin(), p.members.end())) {
    return Error("a secure group's members must be listed in order (every member places the others by the list)");
  }
  if (p.privacy < 1) return Error("the privacy T must be at least 1 (T colluding members learn nothing of a mask)");
  if (p.target <= p.privacy) {
    return Error("the target U " + std::to_string(p.target) + " must exceed the privacy T " +
                 std::to_string(p.privacy) + " (the mask takes U - T segments of the code)");
  }
  if (p.target > n) {
    return Error("the target U " + std::to_string(p.target) + " exceeds the group's " + std::to_string(n) +
                 " members: the server could never gather U answers");
  }
  if (2 * std::size_t{p.threshold} <= n) {
    return Error("threshold " + std::to_string(p.threshold) + " is not above half of the group's " + std::to_string(n) +
                 " members: two different survivor sets could each collect it");
  }
  if (p.threshold > n) {
    return Error("threshold " + std::to_string(p.threshold) + " exceeds the group's " + std::to_string(n) + " members");
  }
  const std::uint32_t least = std::max(p.threshold, p.target);
  if (p.min_survivors < least || p.min_survivors > n) {
    return Error("the smallest revealed sum (" + std::to_string(p.min_survivors) +
                 " silos) must lie between max(t, U) = " + std::to_string(least) + " and the group's " +
                 std::to_string(n) + " members");
  }
  if (p.length == 0) return Error("an input needs at least one word");
  if (!usable_public_key(p.server_key)) return Error("the server's key is not a usable X25519 key");
  return {};
}

Status check_floor(const Params& p, const secagg::Floor& f) {
  const std::size_t n = p.members.size();
  const std::uint32_t c = secagg::corrupt_count(n, f.corrupt);
  const std::string assumed = " (this silo assumes up to " + std::to_string(c) + " of the group's " + std::to_string(n) +
                              " may collude with the server: secure_floor.corrupt " + std::to_string(f.corrupt) + ")";
  if (p.privacy < c) {
    return Error("privacy T = " + std::to_string(p.privacy) + " is below the colluders: " + std::to_string(c) +
                 " shares of a member's mask would leave part of it unprotected" + assumed);
  }
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
  if (2 * std::size_t{std::max(p.threshold, p.min_survivors)} <= n + c) {
    return Error("threshold " + std::to_string(p.threshold) + " and sums of " + std::to_string(p.min_survivors) +
                 " of " + std::to_string(n) +
                 ": a split view of the survivors, the colluders confirming both sides, could gather "
                 "confirmations for two survivor sets" +
                 assumed);
  }
  return {};
}

std::string keys_statement(const std::string& session, const std::string& silo, const Advertisement& a) {
  std::string inbox;
  for (const auto& [peer, key] : a.inbox_keys) inbox += pack({peer, as_bytes(key)});
  return statement("lightsecagg-keys", {session, silo, inbox});
}

std::string share_statement(const std::string& session, const std::string& dealer, const std::string& holder,
                            std::string_view share) {
  return statement("lightsecagg-share", {session, dealer, holder, share});
}

std::string box_statement(const std::string& session, const std::string& sender, const std::string& recipient,
                          std::string_view box) {
  return statement("lightsecagg-box", {session, sender, recipient, box});
}

std::string answer_statement(const std::string& session, const std::string& member,
                             const std::vector<std::string>& survivors, std::string_view answer) {
  return statement("lightsecagg-answer", {session, member, joined(sorted(survivors)), answer});
}

std::string encode_answer(const std::string& member, std::string_view words, const std::string& signature) {
  return pack({member, words, signature});
}

// ---- the coding ---------------------------------------------------------------------------

void encode(const Params& p, std::span<const std::uint32_t* const> segments, std::span<const std::uint32_t> holders,
            std::span<std::uint32_t* const> out) {
  std::vector<std::uint32_t> beta(p.target), at(holders.size());
  for (std::uint32_t k = 0; k < p.target; ++k) beta[k] = k + 1;
  for (std::size_t j = 0; j < holders.size(); ++j) at[j] = alpha(p, holders[j]);
  field::combine(field::lagrange(beta, at), segments, p.segment(), out);
}

void decode(const Params& p, std::span<const std::uint32_t> responders, std::span<const std::uint32_t* const> answers,
            std::span<std::uint32_t> out) {
  if (responders.size() != p.target || answers.size() != p.target || out.size() != p.length) {
    throw std::invalid_argument("decode: U answers of U responders into d words");
  }
  const std::size_t L = p.segment(), segments = p.target - p.privacy;
  std::vector<std::uint32_t> at(responders.size()), beta(segments);
  for (std::size_t j = 0; j < responders.size(); ++j) at[j] = alpha(p, responders[j]);
  for (std::size_t k = 0; k < segments; ++k) beta[k] = static_cast<std::uint32_t>(k + 1);
  // Segments that lie within d go straight into `out`; those the padding cuts short (the last,
  // or for tiny d the last few) into a scratch buffer, of which the part below d is copied.
  const std::size_t whole = p.length / L;
  std::vector<std::uint32_t> tail((segments - whole) * L);
  std::vector<std::uint32_t*> rows(segments);
  for (std::size_t k = 0; k < segments; ++k) rows[k] = k < whole ? out.data() + k * L : tail.data() + (k - whole) * L;
  field::combine(field::lagrange(at, beta), answers, L, rows);
  std::copy_n(tail.begin(), p.length - whole * L, out.begin() + static_cast<std::ptrdiff_t>(whole * L));
  wipe(tail);
}

// ---- client -------------------------------------------------------------------------------

Client::Client(Params p, std::string me, CertSigner signer, CertVerifier ca, std::string server_certificate,
               std::string server_name, secagg::Floor floor, Sources sources)
    : p_(std::move(p)), me_(std::move(me)), signer_(std::move(signer)), ca_(std::move(ca)),
      server_certificate_(std::move(server_certificate)), server_name_(std::move(server_name)), floor_(floor),
      sources_(std::move(sources)), mine_(p_.index_of(me_)) {}

Client::~Client() {
  wipe(z_);
  for (auto& [dealer, share] : held_) wipe(share);
}

Result<Advertisement> Client::advertise() {
  if (step_ != Step::Advertise) return Error("keys advertised twice");
  if (auto why = check_params(p_); !why) return why.error();
  if (auto why = check_floor(p_, floor_); !why) return Error("below this silo's floor: " + why.error().message());
  if (!mine_) return Error("this silo is not a member of the group");
  Advertisement a;
  for (const auto& m : p_.members) {
    if (m == me_) continue;
    inbox_[m] = fresh_key_pair(sources_);
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
  if (mine == a.inbox_keys.end()) return Error(name + " advertised no key for this silo's share");
  if (!usable_public_key(mine->second)) return Error(name + " advertised an unusable key");
  return {};
}

Result<Outbox> Client::share(const KeyList& u1) {
  if (step_ != Step::Share) return Error("sharing out of order");
  auto self = u1.find(me_);
  if (self == u1.end()) return Error("the key list does not include this silo");
  for (const auto& [m, kp] : inbox_) {
    auto it = self->second.inbox_keys.find(m);
    if (it == self->second.inbox_keys.end() || it->second != kp.public_key) {
      return Error("the key list altered this silo's own keys");
    }
  }
  if (u1.size() < p_.min_survivors) {
    return Error("only " + std::to_string(u1.size()) + " members advertised keys; a sum needs " +
                 std::to_string(p_.min_survivors));
  }
  u1_.clear();
  for (const auto& [name, keys] : u1) {
    if (name == me_) continue;
    if (auto why = check_peer(name, keys); !why) return why.error();
  }
  u1_ = u1;
  // The mask and the noise: U segments of L uniform field words from one fresh seed; the mask's
  // padding past d is zero (the server ignores it).
  const std::size_t L = p_.segment(), segments = p_.target - p_.privacy;
  std::vector<std::uint32_t> coded(std::size_t{p_.target} * L);
  {
    Secret seed;
    sources_.random_bytes(seed.bytes());
    field::uniform(seed, coded);
  }
  std::fill(coded.begin() + static_cast<std::ptrdiff_t>(p_.length),
            coded.begin() + static_cast<std::ptrdiff_t>(segments * L), 0u);
  std::vector<const std::uint32_t*> in(p_.target);
  for (std::size_t k = 0; k < p_.target; ++k) in[k] = coded.data() + k * L;
  std::vector<std::uint32_t> holders;
  for (const auto& [name, keys] : u1_) holders.push_back(p_.index_of(name));
  std::vector<std::vector<std::uint32_t>> shares(holders.size(), std::vector<std::uint32_t>(L));
  std::vector<std::uint32_t*> out;
  for (auto& s : shares) out.push_back(s.data());
  encode(p_, in, holders, out);
  z_.assign(coded.begin(), coded.begin() + static_cast<std::ptrdiff_t>(p_.length));
  wipe(coded);  // the noise goes now; the mask stays in z_ until mask()

  Outbox outbox;
  std::size_t i = 0;
  for (const auto& [name, keys] : u1_) {
    auto& words = shares[i++];
    if (name == me_) {
      held_[me_] = std::move(words);
      continue;
    }
    std::string bytes = words_bytes(words);
    wipe(words);
    const std::string sig = signer_.sign(share_statement(p_.session, me_, name, bytes));
    std::string plain = pack({bytes, sig});
    wipe(bytes);
    std::string box = seal_to(keys.inbox_keys.at(me_), plain);
    wipe(plain);
    std::string box_sig = signer_.sign(box_statement(p_.session, me_, name, box));
    outbox[name] = {std::move(box), std::move(box_sig)};
  }
  step_ = Step::Receive;
  return outbox;
}

Result<Receipt> Client::receive(const Inbox& from) {
  if (step_ != Step::Receive) return Error("share delivery out of order");
  using Held = std::vector<std::uint32_t>;
  auto r = detail::receive(
      from,
      detail::Delivery<KeyList, Held>{.session = p_.session, .me = me_, .ca = ca_, .signer = signer_, .u1 = u1_,
                                      .inbox = inbox_, .held = held_, .accused = accused_},
      {"a share from ", "the share from ", " does not carry"}, box_statement,
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
    if (!held_.count(m)) return Error("the settled list names " + m + ", whose share this silo does not hold");
  }
  u2_ = members;
  step_ = Step::Mask;
  return {};
}

Status Client::mask(std::span<std::uint32_t> input) {
  if (step_ != Step::Mask) return Error("masked input out of order");
  if (input.size() != p_.length || z_.size() != p_.length) return Error("input has the wrong length");
  std::uint32_t bad = 0;
  std::uint32_t* __restrict x = input.data();
  const std::uint32_t* __restrict z = z_.data();
  for (std::size_t i = 0; i < input.size(); ++i) {
    bad |= x[i] >= kPrime;
    const std::uint64_t s = std::uint64_t{x[i]} + z[i];
    x[i] = static_cast<std::uint32_t>(s >= kPrime ? s - kPrime : s);
  }
  if (bad) {
    std::fill(input.begin(), input.end(), 0u);
    return Error("input words must be field words below p = 2^32 - 5 (map the codec's words with field::to_field)");
  }
  wipe(z_);
  step_ = Step::Confirm;
  return {};
}

Result<Confirmation> Client::confirm(const std::vector<std::string>& survivors, const std::string& server_signature) {
  const auto u3 = sorted(survivors);
  if (confirmed_ && *confirmed_ != u3) return Error("asked to confirm a second, different survivor set; refusing");
  if (!confirmed_ && step_ != Step::Confirm) return Error("survivor confirmation out of order");
  if (auto why = checks().survivors(u3, server_signature, false); !why) return why.error();
  for (const auto& v : u3) {
    if (!held_.count(v)) return Error("survivor " + v + " dealt this silo no share: its mask could not be removed");
    if (!std::binary_search(u2_.begin(), u2_.end(), v)) return Error("survivor " + v + " is not in the settled group");
  }
  confirmed_ = u3;
  if (step_ == Step::Confirm) step_ = Step::Unmask;
  return Confirmation{signer_.sign(secagg::survivors_statement(p_.session, u3))};
}

Result<SealedReply> Client::unmask(const UnmaskRequest& r) {
  if (step_ != Step::Unmask) return Error("unmasking out of order (or asked twice)");
  const auto survivors = sorted(r.survivors);
  if (survivors != *confirmed_) return Error("the request names other survivors than this silo confirmed");
  for (const auto& v : survivors) {
    if (!held_.count(v)) return Error("the request names " + v + ", who dealt this silo no share; refusing");
  }
  const std::size_t valid = detail::confirmations(ca_, p_.session, u1_, survivors, r.signatures,
                                                   [](const std::string&) { return true; });
  const std::size_t needed = std::max(p_.threshold, p_.min_survivors);
  if (valid < needed) {
    return Error("only " + std::to_string(valid) + " survivors signed the survivor set; " + std::to_string(needed) +
                 " must");
  }
  // The aggregate share: sum over U3 of what each dealt this silo.
  std::vector<std::uint32_t> answer(p_.segment(), 0);
  for (const auto& v : survivors) field::field_add(answer, held_.at(v));
  std::string bytes = words_bytes(answer);
  wipe(answer);
  const std::string sig = signer_.sign(answer_statement(p_.session, me_, survivors, bytes));
  std::string plain = encode_answer(me_, bytes, sig);
  wipe(bytes);
  std::string sealed = seal_to(p_.server_key, plain);
  wipe(plain);
  for (auto& [dealer, share] : held_) wipe(share);
  held_.clear();
  step_ = Step::Done;
  return SealedReply{std::move(sealed)};
}

// ---- server -------------------------------------------------------------------------------

Server::Server(Params p, CertVerifier ca, CertSigner signer, X25519KeyPair box, Sources sources)
    : Dealing({p.session, p.min_survivors, std::max(p.threshold, p.min_survivors), " sent a receipt without having shared"},
              {" shares without having advertised keys", " shared twice", " addressed a share to ",
               " did not share with every member in the key list", " silos shared; a sum needs "},
              p.members, std::move(ca), std::move(signer)),
      p_(std::move(p)), box_(std::move(box)), sources_(std::move(sources)) {
  p_.server_key = box_.public_key;
}

Server::~Server() {
  for (auto& [who, a] : answers_) wipe(a);
}

Status Server::check_box(const std::string& from, const std::string& recipient, const SealedShares& c) const {
  if (c.box.size() > max_box_bytes(p_) || c.signature.size() > kMaxSignatureBytes) {
    return Error(from + "'s box for " + recipient + " is larger than a share of this group can be");
  }
  return {};
}

void Server::judge(const std::string& accuser, const secagg::Accusation& a) {
  const std::string& accused = a.accused;
  if (!u2_.count(accused) || accused == accuser) return blame(accuser, "accused " + accused + ", who dealt it nothing");
  auto inbox =
      detail::accusation_key(ca_, keys_, accuser, a, box_statement(p_.session, accused, accuser, a.evidence.box));
  if (!inbox) return blame(accuser, inbox.error().message());
  std::vector<std::uint32_t> got;
  if (auto why = open_box(p_, ca_, keys_.at(accused), accused, accuser, *inbox, a.evidence.box, got); !why) {
    return blame(accused, why.error().message() + " (shown by " + accuser + " with the box " + accused + " signed)");
  }
  wipe(got);
  blame(accuser, "accused " + accused + " falsely: the box " + accused + " dealt it opens to a share " + accused +
                     " signed");
}

Status Server::on_unmask(const std::string& from, const std::string& sealed) {
  if (step_ != Step::Unmask || !request_) return Error("an unmask answer arrived out of order");
  if (!u3_.count(from)) return Error(from + " is not a survivor");
  if (answers_.count(from)) return Error(from + " answered twice");
  auto plain = open_sealed(box_, sealed);
  if (!plain) return Error("the unmask answer from " + from + " does not open with the server's key");
  auto fields = unpack(*plain, 3);
  wipe(*plain);
  if (!fields || (*fields)[0] != from)
    return Error("the unmask answer from " + from + " is malformed or names another member");
  if (auto verdict = ca_.verify(keys_.at(from).certificate, from, kSiloRole,
                                answer_statement(p_.session, from, request_->survivors, (*fields)[1]), (*fields)[2]);
      !verdict) {
    return Error("the unmask answer from " + from + " is not signed by it for this survivor set (" +
                 verdict.error().message() + ")");
  }
  auto words = field_words((*fields)[1], p_.segment());
  wipe((*fields)[1]);
  if (!words)
    return Error("the unmask answer from " + from + " is not " + std::to_string(p_.segment()) + " field words");
  answers_[from] = std::move(*words);
  return {};
}

Status Server::finish(std::span<std::uint32_t> sum) {
  if (step_ != Step::Unmask || !request_) return Error("unmasking out of order");
  if (answers_.size() < p_.target) {
    return Error("only " + std::to_string(answers_.size()) +
                 " survivors answered; decoding the aggregate mask needs U = " + std::to_string(p_.target));
  }
  if (sum.size() != p_.length) return Error("sum has the wrong length");
  if (!field::in_field(sum))
    return Error("the sum has words outside the field (add masked inputs with field::field_add)");
  const std::size_t L = p_.segment();
  // The first U answers (in member order) decode; the rest check them.
  std::vector<std::uint32_t> responders, extras;
  std::vector<const std::uint32_t*> used, checks;
  for (const auto& [who, a] : answers_) {
    const bool decoding = responders.size() < p_.target;
    (decoding ? responders : extras).push_back(index_.at(who));
    (decoding ? used : checks).push_back(a.data());
  }
  if (!extras.empty()) {
    // Every extra answer must equal F(alpha_e) for the F the first U define. Interpolation is
    // linear, so it is checked on random projections r . a, r uniform and drawn after every
    // answer was fixed: a nonzero discrepancy d survives one projection with probability 1 / p
    // (r . d = 0), two independent ones with p^-2 (about 2^-64). The full check would cost
    // |extras| U L multiply-adds; this costs 2 L per answer.
    std::vector<std::uint32_t> r(2 * L);
    {
      Secret seed;
      sources_.random_bytes(seed.bytes());
      field::uniform(seed, r);
    }
    auto project = [&](const std::uint32_t* a, std::size_t which) {
      std::uint64_t acc = 0;
      const std::uint32_t* rr = r.data() + which * L;
      for (std::size_t i = 0; i < L; ++i) {
        const std::uint64_t v = std::uint64_t{rr[i]} * a[i];
        acc += (v >> 32) * 5 + (v & 0xffffffffu);
        if ((i & 0x3ff) == 0x3ff) acc = field::reduce(acc);  // bounded: 1024 terms of < 6 2^32 fit
      }
      return field::reduce(acc);
    };
    std::vector<std::uint32_t> at(responders.size()), extra_at(extras.size());
    for (std::size_t j = 0; j < responders.size(); ++j) at[j] = alpha(p_, responders[j]);
    for (std::size_t e = 0; e < extras.size(); ++e) extra_at[e] = alpha(p_, extras[e]);
    const auto m = field::lagrange(at, extra_at);
    for (std::size_t which = 0; which < 2; ++which) {
      std::vector<std::uint32_t> s(used.size());
      for (std::size_t j = 0; j < used.size(); ++j) s[j] = project(used[j], which);
      for (std::size_t e = 0; e < extras.size(); ++e) {
        std::uint32_t expected = 0;
        for (std::size_t j = 0; j < used.size(); ++j) expected = field::add(expected, field::mul(m.at(e, j), s[j]));
        if (expected != project(checks[e], which)) {
          return Error("the " + std::to_string(answers_.size()) +
                       " unmask answers do not lie on one polynomial of degree < U "
                       "= " +
                       std::to_string(p_.target) +
                       ": a member answered wrongly or a dealer encoded inconsistently "
                       "(which one cannot be told); the sum is left masked");
        }
      }
    }
  }
  std::vector<std::uint32_t> mask(p_.length);
  decode(p_, responders, used, mask);
  field::field_sub(sum, mask);
  wipe(mask);
  for (auto& [who, a] : answers_) wipe(a);
  step_ = Step::Done;
  return {};
}

}  // namespace xsilo::crypto::lightsecagg
