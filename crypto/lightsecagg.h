// LightSecAgg (So et al., "LightSecAgg: a Lightweight and Versatile Design for Secure
// Aggregation in Federated Learning", MLSys 2022), one instance per secure group, as two sans-I/O
// state machines beside crypto::secagg. No sockets, no wire types, no clock: randomness comes in
// through crypto::Sources. Secure aggregation where the server removes the masks of all
// survivors at once by decoding one aggregate, instead of rebuilding secrets member by member.
//
// Arithmetic is in F_p, p = 2^32 - 5 (crypto/prime_field.h); inputs are field words:
// field::to_field() maps the fixed-point codec's words in, field::from_field() maps the sum out.
// Indices: member i (position + 1) is evaluated at alpha_i = U + i, the segments sit at
// beta_k = k (k = 1..U), so no alpha is a beta and none is 0.
//
//   0 Advertise   each member: one inbox key pair (X25519) per other member (what that member
//                 deals it is sealed to it), signed with its federation certificate.      -> U1
//   1 Share       (offline: before the input exists) each member i draws a fresh 32-byte seed
//                 and expands it with the mask PRG into U field segments of L = ceil(d / (U - T))
//                 words (field::uniform: AES-128-CTR, words >= p rejected: exactly uniform):
//                 the first U - T hold its mask z_i (d words, zero-padded to (U - T) L), the last
//                 T are noise. The polynomial f_i of degree < U with f_i(beta_k) = segment k
//                 gives member j the encoded share [z_i]_j = f_i(alpha_j) (L words). Each share
//                 is signed by its dealer, sealed to the recipient's inbox key for the dealer,
//                 and the box signed by the dealer; i keeps its own share.              -> U2
//   1b Receipt    each member opens what it was dealt. A box that does not open to L field
//                 words its dealer signed for it is an accusation with the evidence (the signed
//                 box and the inbox secret that opens it), judged by the server exactly as in
//                 crypto::secagg: the dealer is excluded, or, when the box is fine, the accuser.
//                 A box whose own signature fails was altered on the way: an error, no blame.
//      Settled    the server signs the final U2 (without the excluded and the silent); each
//                 member checks it holds a share from every member of it.
//   2 Mask        y_i = x_i + z_i (mod p), one pass; z_i is then wiped.                   -> U3
//   2b Confirm    the server names U3 (the members whose masked inputs are in its sum) and
//                 signs it; each survivor signs it once and never a second, different set.
//   3 Unmask      the request carries at least max(t, min_survivors) survivors' signatures on
//                 U3. Each survivor j answers once with a_j = sum_{i in U3} [z_i]_j (L words),
//                 signed by it and sealed to the server's key, and refuses a request naming
//                 another set than the one it confirmed, lacking signatures, or naming a member
//                 it holds no share from. a_j = F(alpha_j) for F = sum_{i in U3} f_i, degree
//                 < U: from any U answers the server interpolates F at beta_1..beta_{U-T} (one
//                 (U - T) x U matrix from U inversions, then U d multiply-adds), which is
//                 sum_{i in U3} z_i, and subtracts it from sum_{i in U3} y_i.
//
// Who learns what. Any T members together see T evaluations of each f_i: the T noise segments
// make them uniform and independent of z_i (the T x T matrix from noise to their shares is
// invertible: a polynomial of degree < U vanishing at the U - T mask nodes and at T alphas is
// zero). The server sees the masked inputs and, for the one set U3 that at least max(t,
// min_survivors) members confirmed, U evaluations of F: the aggregate mask of U3 and nothing
// of any single z_i beyond it (T of those evaluations are again uniform noise). So it learns
// sum_{i in U3} x_i and nothing about the masked input of a member outside U3.
//
// Thresholds, and why. T >= 1 (privacy against T colluding members; the floor asks T >= c);
// U > T (the mask must occupy at least one segment); U <= N. The server decodes from any U
// answers, so the round tolerates N - U members that drop after sharing (from the masked input
// on, |U3| - U more). t > N / 2 (checked by every member, not only configured): two different
// U3 sets can never both collect t confirmations unless a member signs twice, so the server
// never gets aggregate answers for two sets (two aggregates would reveal the difference of two
// sums). min_survivors >= max(t, U): no sum over fewer silos is revealed, and a named U3 can
// always be decoded.
//
// Cost per member: the offline phase encodes N shares, N U L ~ N U d / (U - T) multiply-adds,
// and sends N - 1 of them: (N - 1) d / (U - T) words, against a few hundred bytes of keys in
// SecAgg: LightSecAgg trades offline bandwidth for online work. Masking is one pass over d
// words; the answer is |U3| L additions. The server: U d multiply-adds whatever drops out, and
// (answers beyond U) cheap random-projection checks.
//
// What this does NOT protect against, in the malicious model:
// - A dealer whose shares are not evaluations of one polynomial of degree < U (or that masks
//   with another z than it encoded) changes the decoded sum by an amount of its choosing, as a
//   Byzantine input could. With more than U answers the answers no longer lie on one polynomial
//   and finish() fails; who caused it cannot be told without polynomial commitments (or
//   revealing the signed shares, which the dealers' signatures would make attributable).
// - A member whose answer is wrong: detected whenever at least U answers are honest and more
//   than U arrived (finish() fails with the reason), never attributed (every answer is signed by
//   its member, so a relay cannot forge or swap one; but which one is wrong is not identified:
//   that would take U + 2e answers and error correction). With exactly U answers nothing is
//   checked and a wrong answer gives a wrong sum.
// - Inputs themselves are not bounded: a member may put any field words in (a robust rule or a
//   zero-knowledge range proof has to handle that), as in crypto::secagg.
// - The server is trusted for availability (it may abort any round), not for privacy.
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
#include "crypto/keys.h"
#include "crypto/prime_field.h"
#include "crypto/secagg.h"
#include "crypto/sources.h"

namespace xsilo::crypto::lightsecagg {

using secagg::Error;
using secagg::kSiloRole;
using secagg::Result;
using secagg::Status;

// The plain structs are secagg's where they are the same.
using secagg::Blame;
using secagg::Confirmation;
using secagg::Inbox;       // sender -> what it dealt this member
using secagg::Outbox;      // recipient -> what this member deals it
using secagg::Receipt;
using secagg::SealedReply; // the answer: field words and the member's signature, sealed to the server
using secagg::SealedShares;
using secagg::Settled;
using secagg::UnmaskRequest;  // survivors (U3) and their signatures; `dropped` is U2 \ U3, for the record

struct Params {
  std::string session;               // binds federation, round and group
  std::vector<std::string> members;  // index of a member = position + 1
  std::uint32_t privacy = 1;         // T: colluding members that learn nothing of a single mask
  std::uint32_t target = 2;          // U: the server decodes from any U answers
  std::uint32_t threshold = 2;       // t: confirmations of U3, more than half of the members
  std::uint32_t min_survivors = 2;   // the fewest silos a revealed sum may cover, >= max(t, U)
  std::size_t length = 0;            // d: field words in each input
  Key32 server_key{};                // answers are sealed to it
  std::uint32_t index_of(const std::string& name) const;  // 0 if not a member
  // L = ceil(d / (U - T)): the words of one segment, of one encoded share and of one answer.
  std::size_t segment() const;
};

// Success, or why the parameters cannot be used: no members or a name twice, T < 1, U <= T, U > N,
// t <= N / 2 or t > N, min_survivors below max(t, U) or above N, no input words, an unusable
// server key.
Status check_params(const Params& p);

// Success, or why a member with floor `f` (crypto::secagg's: the member's own configuration) refuses
// `p`; with c = corrupt_count(N, f.corrupt) colluders: T < c (c shares of a mask would leave
// part of it unprotected), min_survivors below f.min_sum or below c + 2, or 2 max(t,
// min_survivors) <= N + c (a split view of the survivors, the colluders confirming both sides,
// could gather confirmations for two sets).
Status check_floor(const Params& p, const secagg::Floor& f);

struct Advertisement {
  std::map<std::string, Key32> inbox_keys;  // other member -> the key its share to this one is sealed to
  std::string certificate;                  // DER
  std::string signature;                    // over keys_statement()
};
using KeyList = std::map<std::string, Advertisement>;  // U1

// The statements parties sign (crypto::statement: tagged, length-prefixed). Receipts, the
// settled list and the survivor set are signed as in crypto::secagg (secagg::receipt_statement,
// settled_statement, survivors_statement).
std::string keys_statement(const std::string& session, const std::string& silo, const Advertisement& a);
std::string share_statement(const std::string& session, const std::string& dealer, const std::string& holder,
                            std::string_view share);
std::string box_statement(const std::string& session, const std::string& sender, const std::string& recipient,
                          std::string_view box);
std::string answer_statement(const std::string& session, const std::string& member,
                             const std::vector<std::string>& survivors, std::string_view answer);

// One party's plaintext answer, as the server opens it (for tests and tools that play a member).
std::string encode_answer(const std::string& member, std::string_view words, const std::string& signature);

class Client {
 public:
  // `signer` is this member's certificate key; `ca` checks the other members' and the server's.
  Client(Params p, std::string me, CertSigner signer, CertVerifier ca, std::string server_certificate,
         std::string server_name, secagg::Floor floor = {}, Sources sources = {});
  Client(Client&&) = default;
  Client& operator=(Client&&) = default;
  ~Client();  // zeroes its mask and the shares it still holds

  // Checks the parameters and the floor before anything is generated; inbox keys per member.
  Result<Advertisement> advertise();
  // The signed key list: checks every entry, draws the mask and the noise, encodes them and
  // deals a signed, sealed share to every other member of U1 (keeps its own).
  Result<Outbox> share(const KeyList& u1);
  // Opens what the others dealt; a box that fails becomes an accusation in the receipt. An error
  // means the delivery itself was tampered with (a box signature that does not verify).
  Result<Receipt> receive(const Inbox& from);
  // The server's final U2; refused when it names a member this silo holds no share from.
  Status settle(const Settled& settled);
  // input[i] = input[i] + z[i] (mod p) in one pass, for `length` field words. A word >= p is
  // refused and the input zeroed (never half-masked); the mask is wiped once it is used.
  Status mask(std::span<std::uint32_t> input);
  // Signs U3, once: a second, different set is refused, as is a set naming a member that dealt
  // this silo nothing or that is not settled. `server_signature` is checked when given.
  Result<Confirmation> confirm(const std::vector<std::string>& survivors, const std::string& server_signature = "");
  // Answers once with its aggregate share over U3, signed and sealed to the server.
  Result<SealedReply> unmask(const UnmaskRequest& request);

  const std::set<std::string>& accused() const { return accused_; }
  const Params& params() const { return p_; }

 private:
  Status check_peer(const std::string& name, const Advertisement& a) const;
  secagg::MemberChecks checks() const { return {p_.session, me_, p_.min_survivors, ca_, server_certificate_, server_name_}; }

  Params p_;
  std::string me_;
  CertSigner signer_;
  CertVerifier ca_;
  std::string server_certificate_, server_name_;
  secagg::Floor floor_;
  Sources sources_;
  std::uint32_t mine_ = 0;
  std::map<std::string, X25519KeyPair> inbox_;  // per other member
  KeyList u1_;
  std::vector<std::uint32_t> z_;  // the mask, between share() and mask()
  std::map<std::string, std::vector<std::uint32_t>> held_;  // dealer -> its share for this silo (itself included)
  std::set<std::string> accused_;
  std::vector<std::string> u2_;  // settled, sorted
  std::optional<std::vector<std::string>> confirmed_;
  enum class Step { Advertise, Share, Receive, Settle, Mask, Confirm, Unmask, Done } step_ = Step::Advertise;
};

class Server : public secagg::Dealing<KeyList> {
 public:
  // `signer` is the server's certificate key (it signs the settled U2 and U3); `box` the key
  // pair answers are sealed to (its public half becomes Params::server_key). `sources` draws the
  // projections that check answers beyond U.
  Server(Params p, CertVerifier ca, CertSigner signer, X25519KeyPair box, Sources sources = {});
  Server(const Server&) = default;  // a copy decodes from other answers (tests)
  Server& operator=(const Server&) = default;
  Server(Server&&) = default;
  Server& operator=(Server&&) = default;
  ~Server();  // zeroes the answers

  // Keys and shares: secagg::Dealing's, on the complete graph (close_keys() fails below
  // min_survivors; close_shares() gives each member of U2 what the others dealt it).
  // Receipts, the settled U2, U3 and its confirmations: secagg::Settlement's, as in SecAgg
  // (on_masked_input(): the caller added the masked input to its sum with field::field_add;
  // close_confirmations() fails below max(t, min_survivors) signatures).
  // A survivor's sealed answer: opened, its signature and length checked, kept.
  Status on_unmask(const std::string& from, const std::string& sealed_reply);
  std::size_t unmask_replies() const { return answers_.size(); }
  // sum = sum_{i in U3} y_i (mod p), field words, length d: removes the aggregate mask in place.
  // Fails with fewer than U answers, or when answers beyond U do not lie on the polynomial the
  // first U give (a Byzantine answer or dealer, not identified), leaving the sum untouched.
  Status finish(std::span<std::uint32_t> sum);

 private:
  void judge(const std::string& accuser, const secagg::Accusation& a) override;
  // A box no larger than a share of this group can be (max_box_bytes, kMaxSignatureBytes).
  Status check_box(const std::string& from, const std::string& recipient, const SealedShares& box) const override;

  Params p_;
  X25519KeyPair box_;
  Sources sources_;
  std::map<std::string, std::vector<std::uint32_t>> answers_;  // survivor -> a_j
};

// The largest sealed box (and, apart, the largest box signature) a member may deal for a group
// with these parameters: the share's 4 L bytes with the seal, the framing and a signature of up
// to kMaxSignatureBytes. The server refuses larger ones, so that no member can grow another's
// delivery past what the server planned for (review of 421039f).
inline constexpr std::size_t kMaxSignatureBytes = 1024;
std::size_t max_box_bytes(const Params& p);
// The largest message of one member's shares, or of one member's delivery: n - 1 boxes, their
// signatures and names.
std::size_t max_shares_message_bytes(const Params& p);

// ---- the coding itself (what the state machines run; benchmarks time it alone) ------------

// Encodes U segments of L field words (the U - T mask segments, then the T noise) into the
// shares for the members with the given indices (1..N): out[j] = f(alpha_{holders[j]}).
void encode(const Params& p, std::span<const std::uint32_t* const> segments, std::span<const std::uint32_t> holders,
            std::span<std::uint32_t* const> out);
// From exactly U answers (responders' indices, each answer L words) the aggregate mask's first
// d words: out = (F(beta_1) | ... | F(beta_{U-T}))[0, d).
void decode(const Params& p, std::span<const std::uint32_t> responders, std::span<const std::uint32_t* const> answers,
            std::span<std::uint32_t> out);

}  // namespace xsilo::crypto::lightsecagg

namespace xsilo::crypto::secagg {
extern template class Dealing<lightsecagg::KeyList>;
}  // namespace xsilo::crypto::secagg
