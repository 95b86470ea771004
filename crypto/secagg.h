// Secure aggregation against active adversaries (Bonawitz et al., CCS 2017, the malicious
// variant), one instance per secure group, as two sans-I/O state machines. No sockets, no wire
// types: the server and the agent translate these plain structs to and from protobuf messages.
//
// Every member signs what it says with its federation certificate (crypto/certs.h), and every
// member checks what others said against the federation CA, so a party that relays messages (an
// edge, or the network) can drop them but not forge, swap or replay them.
//
//   0 AdvertiseKeys  each member: a mask key pair (X25519), one inbox key pair per other member
//                    (the shares that member deals it are sealed to it), and a commitment
//                    SHA-256(b) to its self-mask seed b; signed with its certificate.      -> U1
//   1 ShareKeys      each member: t-of-n Shamir shares of its mask secret key and of b, each
//                    share signed by it (the dealer), sealed to the recipient's inbox key for it,
//                    and the sealed box signed by it.                                      -> U2
//   1b Receipt       each member opens what it was dealt and signs a receipt; a box that does
//                    not open to two dealer-signed shares is an accusation, with the evidence:
//                    the signed box and the inbox secret that opens it. Anyone can judge it: the
//                    dealer is excluded, or, when the box is fine, the accuser is.
//      Settled       the server signs the final U2 (without the excluded and the silent).
//   2 MaskedInput    y_u = x_u + PRG(b_u) + sum_{v in U2, v != u} +-PRG(s_uv), s_uv from
//                    X25519(mask keys), + when index(u) < index(v).                      -> U3
//   2b Consistency   the server names U3; each survivor signs it once (and never another set).
//   3 Unmasking      the request carries at least max(t, min_group) survivors' signatures on
//                    U3; each survivor answers, sealed to the server's key (relays see only
//                    ciphertext), with dealer-signed shares: for v in U2 \ U3 of v's mask key,
//                    for v in U3 of b_v, never both for one v. The server keeps only shares
//                    their dealer signed, rebuilds the secrets (checking each against the
//                    public key or the commitment) and removes the masks: sum_{u in U3} x_u.
//
// Thresholds: t > n / 2 (checked by every member, not only configured), so two different U3
// sets can never both collect t signatures unless a member signs twice; no sum over fewer than
// max(t, min_group) survivors is ever revealed. Blame is provable: an accusation, a share its
// dealer did not sign, or shares that rebuild to something their dealer's commitment refutes.
//
// SecAgg+ (Bell et al., CCS 2020; Params::degree > 0, crypto/secagg_graph.h): every step above
// runs between neighbours in a k-regular graph drawn from the session and the graph seed. A
// member advertises inbox keys for, deals to, holds shares of and masks with its k neighbours
// only; t counts shares among a secret's k + 1 holders (its owner and its neighbours). A member
// answers the unmask request only when t of those holders signed the same U3 and the survivors
// form one connected piece of the graph (otherwise the sum of one piece could be told apart from
// the rest); the server refuses such a U3 too.
//
// A server that deviates (DESIGN.md §2: split views, weak signed setups, chosen seeds) meets
// the member's own Floor: with c colluders assumed, a member joins only setups where two
// survivor sets shown to two sides of any member, the colluders answering both, cannot each
// gather t shares of one of its secrets (2t > k + 1 + c; the complete graph, 2 max(t,
// min_survivors) > n + c). Then also t > c + 1: a survivor whose honest neighbours the server
// claims dropped keeps its self mask, since only it and at most c colluders of its holders
// survive to answer, and it answers only with t of its own holders' signatures. Both hold for
// every graph, so a chosen or ground seed gains the server nothing. plan_graph() chooses k, t.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "crypto/certs.h"
#include "crypto/fixed_point.h"
#include "crypto/mask.h"
#include "crypto/hash.h"
#include "crypto/keys.h"
#include "crypto/secagg_graph.h"
#include "crypto/shamir.h"

namespace xsilo::crypto::secagg {

// A value, or the Error whose sentence explains why there is none (common/result.h).
using xsilo::Error;
using xsilo::Result;
using xsilo::Status;

inline constexpr const char* kSiloRole = "silo";

struct Params {
  std::string session;               // binds federation, round and group
  std::vector<std::string> members;  // index of a member = position + 1
  std::uint32_t threshold = 2;       // t (of the n members, or of each secret's k + 1 holders)
  std::uint32_t min_survivors = 2;   // the fewest silos a revealed sum may cover: max(t, min_group)
  std::uint32_t bits = 32;           // ring Z_{2^bits}: 8, 16, 32 or 64
  std::size_t length = 0;            // words in each input
  Key32 server_key{};                // unmask answers are sealed to it
  std::uint32_t degree = 0;          // SecAgg+: k, even, below n - 1 (0: the complete graph)
  std::string graph_seed;            // draws the graph, with the session (the round's seed)
  bool graph() const { return degree != 0 && std::size_t{degree} + 1 < members.size(); }
  std::uint32_t index_of(const std::string& name) const;  // 0 if not a member
};

// Success, or why the parameters cannot be used safely: no members, t < 2, t <= n / 2, t > n,
// min_survivors < t or above n, bits not 8/16/32/64, an unusable server key; with a graph, an
// odd degree, t above k + 1, or 2t <= k + 1 (two survivor sets shown to two halves of a
// secret's holders could each gather t shares of it; t <= n / 2 is then allowed).
Status check_params(const Params& p);

// The weakest setup a member joins, whatever the server's signed setup states: the member's own
// configuration (the agent's `secure_floor`). A server that may deviate could otherwise sign a
// ring with t = 2 or sums of two silos.
struct Floor {
  std::uint32_t min_sum = 3;  // the fewest silos a revealed sum may cover (min_survivors)
  double corrupt = 0.05;      // the fraction of its group it assumes may collude with the server
  // Distributed DP (crypto/skellam.h): the least noise multiplier a signed setup's Skellam part
  // may give (skellam_noise_multiplier), discounted for the shares the corrupt_count(n, corrupt)
  // colluders know: z sqrt((min_survivors - c) / min_survivors); 0: no floor. Above 0 a setup
  // without one is refused too. Checked by the agent (silo_agent/secure_client.cpp), not by
  // check_floor.
  double min_noise_multiplier = 0;
};
// Success, or why a member with floor `f` refuses `p`; with c = corrupt_count(n, f.corrupt) colluders:
// min_survivors below f.min_sum or below c + 2 (a sum of the member and the colluders alone);
// the complete graph with 2 max(t, min_survivors) <= n + c, a graph with k <= c or 2t <= k + 1 + c
// (a split view of the survivors, the colluders answering both sides, could gather both of a
// member's secrets).
Status check_floor(const Params& p, const Floor& f);

struct Advertisement {
  Key32 mask_pk{};
  Digest self_mask_commitment{};
  std::map<std::string, Key32> inbox_keys;  // other member -> the key its shares to this one are sealed to
  std::string certificate;                  // DER
  std::string signature;                    // over keys_statement()
};
using KeyList = std::map<std::string, Advertisement>;  // U1

struct SealedShares {
  std::string box;        // sealed to the recipient's inbox key for the sender
  std::string signature;  // the sender's, over the session, sender, recipient and box
};
using Outbox = std::map<std::string, SealedShares>;  // recipient -> what this member deals it
using Inbox = std::map<std::string, SealedShares>;   // sender -> what it dealt this member

struct Accusation {
  std::string accused;
  SealedShares evidence;  // as the accused signed it
  Secret inbox_secret;    // the accuser's inbox secret for the accused: opens the box for a judge
};
struct Receipt {
  std::vector<Accusation> accusations;  // empty: every box opened to shares signed by their dealer
  std::string signature;                // the member's, over the session and the accused names
};

struct Settled {
  std::vector<std::string> members;  // the final U2
  std::string signature;             // the server's
};

struct UnmaskRequest {
  std::vector<std::string> dropped;    // U2 \ U3: mask-key shares wanted
  std::vector<std::string> survivors;  // U3: self-mask shares wanted
  std::map<std::string, std::string> signatures;  // survivor -> its signature on U3
};
struct SignedShare {
  std::string share;      // an encoded Share
  std::string signature;  // its dealer's
};
struct UnmaskReply {
  std::map<std::string, SignedShare> mask_key_shares;   // owner -> share
  std::map<std::string, SignedShare> self_mask_shares;  // owner -> share
};
std::string encode(const UnmaskReply& reply);
struct Confirmation {
  std::string signature;  // the member's, over survivors_statement()
};
struct SealedReply {
  std::string box;  // encode(UnmaskReply) sealed to the server's key
};
std::optional<UnmaskReply> decode_reply(std::string_view bytes);

// Who is excluded from a group for the round, and the proof.
struct Blame {
  std::string silo;
  std::string why;
};

// The statements parties sign (crypto::statement: tagged, length-prefixed).
std::string keys_statement(const std::string& session, const std::string& silo, const Advertisement& a);
std::string share_statement(const std::string& session, const std::string& dealer, const std::string& holder,
                            bool mask_key, std::string_view share);
std::string box_statement(const std::string& session, const std::string& sender, const std::string& recipient,
                          std::string_view box);
std::string receipt_statement(const std::string& session, const std::string& member, const Receipt& r);
std::string settled_statement(const std::string& session, const std::vector<std::string>& members);
std::string survivors_statement(const std::string& session, const std::vector<std::string>& survivors);

// ---- what SecAgg, SecAgg+ and LightSecAgg (crypto/lightsecagg.h) do alike ----------------
//
// Written once (crypto/secure_settlement.cpp) so that the protocols cannot drift: the server's
// bookkeeping from the receipts to the unmask request, and a member's checks on the settled list
// and on U3.
//
//   1b Receipt      signed by a member of U2, once; each accusation in it is judged by the
//                   protocol (its boxes differ): the dealer or the accuser is excluded.
//      Settled      U2 without the excluded and the silent, signed by the server.
//   2 MaskedInput   one per settled member: U3.
//   2b Consistency  the server names U3 (after the protocol's own check of it) and signs it; each
//                   survivor's signature on U3 is checked; the unmask request carries them.
//
// A protocol's server derives from Settlement and tells it a member's certificate and how to
// judge an accusation; its own steps (keys, shares, unmasking) stay its own.

// What distinguishes one protocol's settlement from another's.
struct SettlementRules {
  std::string session;                 // the protocol's Params::session
  std::uint32_t min_survivors = 2;     // the fewest members a sum may cover
  std::size_t confirmations = 2;       // the fewest signatures on U3 close_confirmations() accepts
  std::string receipt_before_sharing;  // the error for a receipt from outside U2, after the member's name
};

class Settlement {
 public:
  // A member's receipt; its accusations are judged at once: the verdicts are in blamed(). An
  // error only for a receipt that is not the member's (unsigned) or not expected.
  Status on_receipt(const std::string& from, const Receipt& receipt);
  // The final U2: members that sent a receipt and were not excluded. Fails below min_survivors.
  Result<Settled> settle();
  bool settled_member(const std::string& silo) const { return settled_.count(silo) > 0; }
  // The caller received a complete masked input from `from` and added it to its sum.
  Status on_masked_input(const std::string& from);
  Result<std::vector<std::string>> close_masked();  // U3, signed; fails below min_survivors
  const std::string& survivors_signature() const { return u3_signature_; }  // the server's, on U3
  Status on_confirmation(const std::string& from, const std::string& signature);
  Result<UnmaskRequest> close_confirmations();  // fails below SettlementRules::confirmations signatures

  const std::set<std::string>& u2() const { return u2_; }
  const std::set<std::string>& settled() const { return settled_; }
  const std::set<std::string>& u3() const { return u3_; }
  const std::set<std::string>& confirmed() const { return confirmed_; }
  const std::vector<Blame>& blamed() const { return blamed_; }

 protected:
  // The server's steps, the protocol's own included.
  enum class Step { Keys, Shares, Receipts, Masked, Confirm, Unmask, Done };

  // `signer` is the server's certificate key: it signs the settled U2 and U3.
  Settlement(SettlementRules rules, CertVerifier ca, CertSigner signer);
  Settlement(const Settlement&) = default;
  Settlement& operator=(const Settlement&) = default;
  Settlement(Settlement&&) = default;
  Settlement& operator=(Settlement&&) = default;
  virtual ~Settlement() = default;

  // The certificate `member` advertised its keys with (a member of U1).
  virtual const std::string& certificate_of(const std::string& member) const = 0;
  // Judges one accusation of a receipt: blames the dealer or the accuser.
  virtual void judge(const std::string& accuser, const Accusation& a) = 0;
  // Success, or why the members of `u3` would refuse to unmask it (the protocol's own rule).
  virtual Status check_survivors(const std::set<std::string>& u3) const;

  // Excludes `silo` for the round, with the reason; only its first blame is kept.
  void blame(const std::string& silo, const std::string& why);

  SettlementRules rules_;
  CertVerifier ca_;
  CertSigner signer_;
  Step step_ = Step::Keys;
  std::set<std::string> u2_, receipted_, settled_, u3_, confirmed_, excluded_;
  std::map<std::string, std::string> confirmations_;  // survivor -> its signature on U3
  std::optional<UnmaskRequest> request_;
  std::string u3_signature_;
  std::vector<Blame> blamed_;
};

// Rounds 0 and 1 at the server, the same in SecAgg, SecAgg+ and LightSecAgg but for what a key
// list entry holds, who deals to whom and a few words, so written once
// (crypto/secure_settlement.cpp):
//
//   0 AdvertiseKeys  from a member of the group, once, signed by it; keys it signed but that
//                    cannot be used (an inbox key per neighbour, and the protocol's own) get it
//                    blamed.                                                         -> U1
//   1 ShareKeys      from a member of U1, once, to exactly its neighbours in U1 (every other
//                    member on the complete graph); delivered to the members of U2 (those that
//                    shared) from their neighbours in U2, and then forgotten.       -> U2
//
// A protocol's server derives from Dealing<its KeyList>.
struct DealingWords {  // after the member's name
  std::string shares_without_keys;  // " shares keys without having advertised any"
  std::string shared_twice;         // " shared keys twice"
  std::string addressed;            // " addressed shares to " (then the recipient)
  std::string not_every;            // " did not share with every neighbour in the key list"
  std::string few_shared;           // after the count: " silos shared keys; a sum needs "
};

template <class KeyList>
class Dealing : public Settlement {
 public:
  using Advertisement = typename KeyList::mapped_type;

  Status on_keys(const std::string& from, const Advertisement& keys);
  Result<KeyList> close_keys();  // U1; fails below min_survivors
  Status on_shares(const std::string& from, const Outbox& to);
  // Per member of U2: what its neighbours in U2 dealt it.
  Result<std::map<std::string, Inbox>> close_shares();

  const std::set<std::string>& u1() const { return u1_; }

 protected:
  Dealing(SettlementRules rules, DealingWords words, std::vector<std::string> members, CertVerifier ca,
          CertSigner signer);

  // Neighbours: who deals to whom (any two members: the complete graph), and a member's in
  // member order.
  virtual bool near(const std::string& a, const std::string& b) const;
  virtual std::vector<std::string> neighbours(const std::string& silo) const;
  // The protocol's own checks of signed keys, beyond an inbox key per neighbour.
  virtual bool usable_keys(const Advertisement&) const { return true; }
  // Success, or why a box `from` deals `recipient` is refused before delivery.
  virtual Status check_box(const std::string& from, const std::string& recipient, const SealedShares& box) const;
  const std::string& certificate_of(const std::string& member) const override { return keys_.at(member).certificate; }

  DealingWords words_;
  std::vector<std::string> members_;
  std::map<std::string, std::uint32_t> index_;  // member -> index
  KeyList keys_;
  std::set<std::string> u1_;
  std::map<std::string, Outbox> shares_;  // sender -> recipient -> sealed, until delivered
};

// A member's checks on what the server says of its group, the same in both protocols: a view of
// the member's own state (references: use it at once).
struct MemberChecks {
  const std::string& session;
  const std::string& me;
  std::uint32_t min_survivors;
  const CertVerifier& ca;
  const std::string& server_certificate;  // DER
  const std::string& server_name;

  // The settled list: signed by the server, naming this member, leaving at least min_survivors
  // members. The members, sorted, or why the list is refused.
  Result<std::vector<std::string>> settled(const Settled& s) const;
  // U3 (sorted): the server's signature on it checked when given or `signature_required`; this
  // member among the survivors, and at least min_survivors of them.
  Status survivors(const std::vector<std::string>& u3, const std::string& server_signature,
                   bool signature_required) const;
};

class Client {
 public:
  // `signer` is this member's certificate key; `ca` checks the other members' and the server's.
  Client(Params p, std::string me, CertSigner signer, CertVerifier ca, std::string server_certificate,
         std::string server_name, Floor floor = {});
  Client(Client&&) = default;
  Client& operator=(Client&&) = default;
  ~Client();  // zeroes the shares it still holds (a group that ended before unmasking)

  // Checks the parameters (threshold above half, and so on) before anything is generated.
  Result<Advertisement> advertise();
  // The signed key list: checks every entry, then deals shares to every other member of U1.
  Result<Outbox> share(const KeyList& u1);
  // Opens what the others dealt; a box that fails becomes an accusation in the receipt. An
  // error means the delivery itself was tampered with (a signature that does not verify).
  Result<Receipt> receive(const Inbox& from);
  // The server's final U2: this member masks with exactly these. Agrees the pairwise mask seeds
  // with its settled neighbours here (one X25519 each), so that mask() is the keystreams alone.
  Status settle(const Settled& settled);
  // Adds the masks to an encoded input in place (length words), in one pass over it.
  Status mask(std::span<std::uint8_t> input);
  Status mask(std::span<std::uint16_t> input);
  Status mask(std::span<std::uint32_t> input);
  Status mask(std::span<std::uint64_t> input);
  // Signs U3, once: a second, different set is refused. `server_signature` is the server's on
  // U3: checked when given, and required with a graph, where a member counts only its own
  // holders' confirmations (a relay showing two sets to two sides of a member could otherwise
  // collect t confirmations for each).
  Result<Confirmation> confirm(const std::vector<std::string>& survivors, const std::string& server_signature = "");
  // Answers once, sealed to the server; refuses any request that would reveal both shares of
  // one member, that names another U3 than the one confirmed, or that lacks enough signatures.
  Result<SealedReply> unmask(const UnmaskRequest& request);

  const std::vector<std::string>& masked_with() const { return u2_; }
  const std::set<std::string>& accused() const { return accused_; }
  const Params& params() const { return p_; }

 private:
  template <class T>
  Status mask_impl(std::span<T> input);
  Status check_peer(const std::string& name, const Advertisement& a) const;
  MemberChecks checks() const { return {p_.session, me_, p_.min_survivors, ca_, server_certificate_, server_name_}; }
  bool holds(const std::string& owner) const { return owner == me_ || near_.count(owner); }

  Params p_;
  std::string me_;
  CertSigner signer_;
  CertVerifier ca_;
  std::string server_certificate_, server_name_;
  Floor floor_;
  Graph graph_;
  std::uint32_t mine_ = 0;                      // this member's index
  std::map<std::string, std::uint32_t> near_;   // neighbour -> index (every other member: complete graph)
  std::map<std::string, std::uint32_t> index_;  // graph: member -> index (for the survivors' connectivity)
  X25519KeyPair mask_;
  std::map<std::string, X25519KeyPair> inbox_;  // per other member
  Secret self_seed_;
  KeyList u1_;  // this member's and its neighbours' entries of U1
  std::set<std::string> accused_;
  std::vector<std::string> u2_;  // the settled U2 (itself included)
  std::vector<MaskTerm> masks_;  // agreed at settle(): a pairwise seed per settled neighbour, the self seed
  std::map<std::string, std::pair<SignedShare, SignedShare>> held_;  // owner -> (mask-key, self-mask) shares
  std::optional<std::vector<std::string>> confirmed_;
  enum class Step { Advertise, Share, Receive, Settle, Mask, Confirm, Unmask, Done } step_ = Step::Advertise;
};

class Server : public Dealing<KeyList> {
 public:
  // `signer` is the server's certificate key (it signs the settled U2); `box` the key pair the
  // members seal their unmask answers to (its public half is Params::server_key).
  Server(Params p, CertVerifier ca, CertSigner signer, X25519KeyPair box);
  Server(Server&&) = default;
  Server& operator=(Server&&) = default;
  ~Server();  // zeroes the unmask answers it opened

  // Keys and shares: Dealing's (close_keys() fails below min_survivors).
  // After close_keys(): the part of U1 that `member` is sent, its own entry and its neighbours'
  // (all of U1 on the complete graph). On a graph a member's key-list bytes grow with k, not n.
  // Empty before close_keys().
  KeyList keys_for(const std::string& member) const;
  bool graph() const { return p_.graph(); }  // members see only their neighbours (SecAgg+)
  // Receipts, the settled U2, U3 and its confirmations: Settlement's (close_confirmations()
  // fails below min_survivors signatures; close_masked() also when U3 falls apart on a graph).
  Status on_unmask(const std::string& from, const std::string& sealed_reply);
  std::size_t unmask_replies() const { return replies_.size(); }
  // Removes the masks from the sum of the U3 members' masked inputs; fails below the
  // threshold or when a secret cannot be rebuilt (the dealer is blamed with the evidence).
  Status finish(std::span<std::uint8_t> sum);
  Status finish(std::span<std::uint16_t> sum);
  Status finish(std::span<std::uint32_t> sum);
  Status finish(std::span<std::uint64_t> sum);

  // Mask expansions the last finish() needed (for benchmarks).
  std::size_t expansions() const { return expansions_; }

 private:
  template <class T>
  Status finish_impl(std::span<T> sum);
  void judge(const std::string& accuser, const Accusation& a) override;
  Status check_survivors(const std::set<std::string>& u3) const override;  // connected on the graph
  bool near(const std::string& a, const std::string& b) const override;    // on the graph
  std::vector<std::string> neighbours(const std::string& silo) const override;
  bool usable_keys(const Advertisement& a) const override;  // the mask key too
  Result<Secret> rebuild(const std::string& owner, bool mask_key);

  Params p_;
  Graph graph_;
  X25519KeyPair box_;
  std::map<std::string, UnmaskReply> replies_;
  std::size_t expansions_ = 0;
};

extern template class Dealing<KeyList>;

}  // namespace xsilo::crypto::secagg
