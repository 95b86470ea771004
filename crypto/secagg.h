// Secure aggregation (Bonawitz et al., CCS 2017), one instance per secure group, as two
// sans-I/O state machines. No sockets, no wire types: the server and the agent translate
// these plain structs to and from protobuf messages.
//
//   round 0  AdvertiseKeys  each client: two X25519 key pairs (share encryption, masks) and a
//                           commitment SHA-256(b) to its self-mask seed b.   -> U1
//   round 1  ShareKeys      each client: t-of-n Shamir shares of its mask secret key and of b,
//                           one AEAD ciphertext per other member of U1 (associated data binds
//                           session, sender and recipient).                   -> U2
//   round 2  MaskedInput    y_u = x_u + PRG(b_u) + sum_{v in U2, v != u} +-PRG(s_uv), where
//                           s_uv comes from X25519(mask keys) and the sign is + when
//                           index(u) < index(v).                              -> U3
//   round 3  Unmasking      each survivor sends, for every v in U2 \ U3, its share of v's mask
//                           key, and for every v in U3 its share of b_v, never both for one v.
//                           The server rebuilds them (checking each against the public key or
//                           the commitment), removes the dropped silos' pairwise masks from
//                           the survivors' sum and every survivor's self mask: sum_{u in U3} x_u.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "crypto/fixed_point.h"
#include "crypto/hash.h"
#include "crypto/keys.h"
#include "crypto/shamir.h"

namespace xsilo::crypto::secagg {

// A value or the sentence that explains why there is none.
template <class T>
using Expected = std::variant<T, std::string>;
template <class T>
bool ok(const Expected<T>& e) { return e.index() == 0; }
template <class T>
T& value(Expected<T>& e) { return std::get<0>(e); }
template <class T>
T value(Expected<T>&& e) { return std::get<0>(std::move(e)); }
template <class T>
const std::string& error(const Expected<T>& e) { return std::get<1>(e); }

struct Params {
  std::string session;               // binds federation, round and group
  std::vector<std::string> members;  // index of a member = position + 1
  std::uint32_t threshold = 2;       // t
  std::uint32_t bits = 32;           // ring Z_{2^bits}
  std::size_t length = 0;            // words in each input
  std::uint32_t index_of(const std::string& name) const;  // 0 if not a member
};

// "" or why the parameters cannot work (t > n, t < 2, bits not 32/64, no members).
std::string check_params(const Params& p);

struct PublicKeys {
  Key32 cipher_pk{};
  Key32 mask_pk{};
  Digest self_mask_commitment{};
};
using KeyList = std::map<std::string, PublicKeys>;   // U1
using Ciphertexts = std::map<std::string, std::string>;  // peer -> ciphertext

struct UnmaskRequest {
  std::vector<std::string> dropped;    // U2 \ U3: mask-key shares wanted
  std::vector<std::string> survivors;  // U3: self-mask shares wanted
};
struct UnmaskReply {
  std::map<std::string, std::string> mask_key_shares;   // owner -> encoded Share
  std::map<std::string, std::string> self_mask_shares;  // owner -> encoded Share
};

class Client {
 public:
  Client(Params p, std::string me);

  PublicKeys advertise();
  // Shares for every other member of U1, encrypted to it.
  Expected<Ciphertexts> share(const KeyList& u1);
  // The ciphertexts addressed to this client, by sender (U2 without itself).
  std::string receive(const Ciphertexts& from);
  // Adds the masks to an encoded input in place (length words).
  std::string mask(std::span<std::uint32_t> input);
  std::string mask(std::span<std::uint64_t> input);
  // Answers once; refuses any request that would reveal both shares of one member.
  Expected<UnmaskReply> unmask(const UnmaskRequest& request);

  const std::vector<std::string>& masked_with() const { return u2_; }

 private:
  template <class T>
  std::string mask_impl(std::span<T> input);

  Params p_;
  std::string me_;
  X25519KeyPair cipher_, mask_;
  Secret self_seed_;
  KeyList u1_;
  std::vector<std::string> u2_;  // members whose shares this client holds (itself included)
  std::map<std::string, std::pair<Share, Share>> held_;  // owner -> (mask-key share, self-mask share)
  enum class Step { Advertise, Share, Receive, Mask, Unmask, Done } step_ = Step::Advertise;
};

class Server {
 public:
  explicit Server(Params p);

  std::string on_keys(const std::string& from, const PublicKeys& keys);
  Expected<KeyList> close_keys();  // U1; fails below the threshold
  std::string on_shares(const std::string& from, const Ciphertexts& to);
  // Per member of U2: the ciphertexts addressed to it by the other members of U2.
  Expected<std::map<std::string, Ciphertexts>> close_shares();
  // The caller received a complete masked input from `from` and added it to its sum.
  std::string on_masked_input(const std::string& from);
  Expected<UnmaskRequest> close_masked();  // U3; fails below the threshold
  std::string on_unmask(const std::string& from, const UnmaskReply& reply);
  std::size_t unmask_replies() const { return replies_.size(); }
  // Removes the masks from the sum of the U3 members' masked inputs; fails below the
  // threshold or when a rebuilt secret does not match its public key or commitment.
  std::string finish(std::span<std::uint32_t> sum);
  std::string finish(std::span<std::uint64_t> sum);

  const std::set<std::string>& u1() const { return u1_; }
  const std::set<std::string>& u2() const { return u2_; }
  const std::set<std::string>& u3() const { return u3_; }
  // Mask expansions the last finish() needed (for benchmarks).
  std::size_t expansions() const { return expansions_; }

 private:
  template <class T>
  std::string finish_impl(std::span<T> sum);

  Params p_;
  KeyList keys_;
  std::set<std::string> u1_, u2_, u3_;
  std::map<std::string, Ciphertexts> shares_;  // sender -> recipient -> ciphertext
  std::map<std::string, UnmaskReply> replies_;
  std::optional<UnmaskRequest> request_;
  enum class Step { Keys, Shares, Masked, Unmask, Done } step_ = Step::Keys;
  std::size_t expansions_ = 0;
};

}  // namespace xsilo::crypto::secagg
