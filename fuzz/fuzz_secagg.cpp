// Secure aggregation's message handlers under messages altered or made up at every step. A
// group of four silos (the complete graph, or SecAgg+ on a ring of degree 2) runs in process
// with real certificates, keys and boxes, every step as in a real round. The input decides,
// step by step, what silo-0 is sent (the key list, the share delivery, the settled list, the
// survivors, the unmask request) and what the server is sent by silo-3 (keys, shares, receipt,
// confirmation, unmask answer): the honest message, the honest message with bytes of its wire
// form altered, or a message parsed from the input; and, as a server that deviates would, two
// survivor sets the server signed (a split view), of which silo-0 must confirm only one. Silo-3 is Byzantine: it may sign what it
// altered with its own key (so that keys, boxes and receipts reach the checks behind the
// signatures and the blame), seal made-up unmask answers to the server, vanish after settling,
// or speak under another name. The honest members go on whatever happens, so every later
// handler is reached with the state a real round has. Every refusal must be a reason, never a
// crash or a leak; and in a round whose messages were all honest, every step must succeed and
// the sum must be exact.
#include <cstdlib>
#include <optional>

#include "crypto/keys.h"
#include "fuzz/fuzz_input.h"
#include "protocol/secagg_wire.h"

namespace {

using namespace xsilo;
namespace secagg = crypto::secagg;

constexpr std::size_t kMembers = 4, kLength = 5;

const std::vector<crypto::CertSigner>& silo_signers() {
  static const auto signers = [] {
    std::vector<crypto::CertSigner> s;
    for (std::size_t i = 0; i < kMembers; ++i) {
      const auto kit = fuzz::pki().dir / "kits" / ("silo-" + std::to_string(i));
      s.push_back(crypto::CertSigner::from_pem(read_file(kit / "cert.pem"), read_file(kit / "key.pem")));
    }
    return s;
  }();
  return signers;
}

// What one party is sent at one step: the honest message (`honest` stays true), the honest one
// with up to four of its bytes altered, or one parsed from the input.
class Adversary {
 public:
  explicit Adversary(fuzz::Input& in) : in_(in) {}
  bool honest() const { return honest_; }

  std::string bytes(const std::string& real) {
    switch (in_.u8() % 4) {
      case 2: {
        honest_ = false;
        std::string b = real;
        for (int k = 1 + in_.u8() % 4; k > 0 && !b.empty(); --k) b[in_.u16() % b.size()] ^= static_cast<char>(in_.u8() | 1);
        return b;
      }
      case 3: honest_ = false; return in_.bytes(in_.u16() % 2048);
      default: return real;
    }
  }
  template <class Msg>
  Msg message(const Msg& real) {
    const std::string b = bytes(real.SerializeAsString());
    Msg m;
    (void)m.ParseFromString(b);  // what does not parse arrives empty
    return m;
  }
  // Who the server hears it from: silo-3 mostly, now and then another name (a relay's mislabel).
  std::string sender() {
    const std::uint8_t v = in_.u8();
    std::string name = v < 200 ? "silo-3" : v < 250 ? "silo-" + std::to_string(v % 6) : in_.bytes(8);
    if (name != "silo-3") honest_ = false;
    return name;
  }
  // Whether silo-3 signs (or seals) what it sends afresh: of honest content, a signature as good
  // as the first; of altered content, a Byzantine member's message that its signature covers.
  bool signs() { return in_.u8() & 1; }
  void forge() { honest_ = false; }
  // In a round that was honest so far, a step that failed is a bug.
  bool failed(bool failure) const {
    if (failure && honest_) std::abort();
    return failure;
  }
  fuzz::Input& in() { return in_; }

 private:
  fuzz::Input& in_;
  bool honest_ = true;
};

// Silo i's input before masking.
template <class T>
std::vector<T> masked_input(std::size_t i) {
  std::vector<T> x(kLength);
  for (std::size_t k = 0; k < kLength; ++k) x[k] = static_cast<T>(1000 * (i + 1) + k);
  return x;
}

// The wire form of the messages that have one to_wire overload.
constexpr auto wire_of = [](const auto& m) { return protocol::to_wire(m); };

// What member i is sent: silo-0 gets what the adversary makes of the message on the wire
// (nothing, when that does not parse), the others the message.
template <class T, class ToWire>
std::optional<T> to_member(std::size_t i, const T& real, Adversary& adv, ToWire to_wire) {
  if (i != 0) return real;
  auto got = protocol::from_wire(adv.message(to_wire(real)));
  if (!got) return std::nullopt;
  return T(*got);
}

// What member i answers, to the server (`take(from, answer)`): silo-3's through the adversary,
// signed afresh by silo-3 (`sign`) when it chooses, under the name it picks.
template <class T, class ToWire, class Sign, class Take>
void to_server(std::size_t i, const std::string& name, const T& answer, Adversary& adv, ToWire to_wire, Sign sign,
               Take take) {
  if (i + 1 < kMembers) return take(name, answer);
  auto got = protocol::from_wire(adv.message(to_wire(answer)));
  if (!got) return;
  T msg = *got;
  if (adv.signs()) sign(msg);
  const std::string from = adv.sender();
  take(from, msg);
}

// The same for an answer that is bytes (a signature, a sealed box); `forge` makes silo-3's own
// version of it from bytes of the input.
template <class Forge, class Take>
void bytes_to_server(std::size_t i, const std::string& name, const std::string& answer, Adversary& adv, Forge forge,
                     Take take) {
  if (i + 1 < kMembers) return take(name, answer);
  std::string got = adv.bytes(answer);
  if (adv.signs()) {
    adv.forge();
    got = forge(adv.in().bytes(adv.in().u16() % 512));
  }
  const std::string from = adv.sender();
  take(from, got);
}

// The round from the keys to the sum, for words of type T.
template <class T>
void run(secagg::Params p, Adversary& adv) {
  const auto& box = fuzz::server_box();
  const auto& pki = fuzz::pki();
  const auto& byzantine = silo_signers()[kMembers - 1];
  p.bits = 8 * sizeof(T);
  p.server_key = box.public_key;
  secagg::Server server(p, pki.ca, pki.server, box);
  std::vector<secagg::Client> c;
  for (std::size_t i = 0; i < kMembers; ++i) {
    // Floor {2, 0}: the ring of degree 2 with t = 2 stays reachable (the default floor refuses it:
    // its own tests are in secagg_test), so that the handlers behind advertise() are fuzzed.
    c.emplace_back(p, p.members[i], silo_signers()[i], pki.ca, pki.server.certificate(), "server",
                   secagg::Floor{2, 0.0});
  }
  const std::string& me3 = p.members[kMembers - 1];
  // Keys: silo-3's pass through the adversary to the server.
  for (std::size_t i = 0; i < kMembers; ++i) {
    auto keys = c[i].advertise();
    if (!keys) std::abort();  // valid parameters: advertising cannot fail
    to_server(
        i, p.members[i], *keys, adv, wire_of,
        [&](secagg::Advertisement& a) { a.signature = byzantine.sign(secagg::keys_statement(p.session, me3, a)); },
        [&](const std::string& from, const auto& a) { adv.failed(!server.on_keys(from, a).has_value()); });
  }
  if (adv.failed(!server.close_keys().has_value())) return;
  // Shares: silo-0's key list and silo-3's shares through the adversary.
  for (std::size_t i = 0; i < kMembers; ++i) {
    const auto list = to_member(i, server.keys_for(p.members[i]), adv, wire_of);
    if (adv.failed(!list)) continue;
    auto out = c[i].share(*list);
    if (adv.failed(!out)) continue;
    to_server(
        i, p.members[i], *out, adv, [](const auto& o) { return protocol::outbox_to_wire(o); },
        [&](secagg::Outbox& o) {
          for (auto& [to, b] : o) b.signature = byzantine.sign(secagg::box_statement(p.session, me3, to, b.box));
        },
        [&](const std::string& from, const auto& o) { adv.failed(!server.on_shares(from, o).has_value()); });
  }
  auto inboxes = server.close_shares();
  if (adv.failed(!inboxes)) return;
  // Receipts: silo-0's delivery and silo-3's receipt through the adversary.
  for (std::size_t i = 0; i < kMembers; ++i) {
    const auto inbox =
        to_member(i, (*inboxes)[p.members[i]], adv, [](const auto& in) { return protocol::delivery_to_wire(in); });
    if (adv.failed(!inbox)) continue;
    auto receipt = c[i].receive(*inbox);
    if (adv.failed(!receipt)) continue;
    to_server(
        i, p.members[i], *receipt, adv, wire_of,
        [&](secagg::Receipt& r) { r.signature = byzantine.sign(secagg::receipt_statement(p.session, me3, r)); },
        [&](const std::string& from, const auto& r) { adv.failed(!server.on_receipt(from, r).has_value()); });
  }
  auto settled = server.settle();
  if (adv.failed(!settled)) return;
  // Masking: silo-0 is sent the adversary's settled list; silo-3 masks, or vanishes.
  const bool third_masks = adv.in().u8() % 4 != 0;
  const std::size_t members = third_masks ? kMembers : kMembers - 1;  // those still here
  std::vector<T> sum(kLength, 0), expected(kLength, 0);
  for (std::size_t i = 0; i < members; ++i) {
    const auto s = i == 0 ? protocol::from_wire(adv.message(protocol::to_wire(*settled))) : *settled;
    if (adv.failed(!c[i].settle(s).has_value())) continue;
    const auto plain = masked_input<T>(i);
    auto x = plain;
    if (adv.failed(!c[i].mask(std::span<T>(x)).has_value())) continue;
    for (std::size_t k = 0; k < kLength; ++k) {
      sum[k] = static_cast<T>(sum[k] + x[k]);
      expected[k] = static_cast<T>(expected[k] + plain[k]);
    }
    adv.failed(!server.on_masked_input(p.members[i]).has_value());
  }
  auto u3 = server.close_masked();
  if (adv.failed(!u3)) return;
  // Confirmations: silo-0 is sent the adversary's survivors; silo-3's signature goes through it
  // (or silo-3 signs a survivor set of its own making).
  for (std::size_t i = 0; i < members; ++i) {
    std::vector<std::string> survivors = *u3;
    std::string signature = server.survivors_signature();
    // A deviating server (review N1) signs survivor sets of its choosing: one for silo-0 here,
    // then a second one; silo-0 confirms the second only if it is the same set.
    auto signed_set = [&](std::uint8_t pick) {
      std::vector<std::string> set;
      for (std::size_t m = 0; m < kMembers; ++m) {
        if (pick & (1u << m)) set.push_back(p.members[m]);
      }
      return set;
    };
    if (i == 0) {
      wire::SecAggSurvivors real;
      for (const auto& v : survivors) real.add_survivors(v);
      real.set_server_signature(signature);
      if (adv.in().u8() % 4 == 0) {
        adv.forge();
        survivors = signed_set(adv.in().u8());
        signature = pki.server.sign(secagg::survivors_statement(p.session, survivors));
      } else {
        const auto got = adv.message(real);
        survivors.assign(got.survivors().begin(), got.survivors().end());
        signature = got.server_signature();
      }
    }
    auto confirmation = c[i].confirm(survivors, signature);
    if (adv.failed(!confirmation)) continue;
    if (i == 0 && adv.in().u8() % 4 == 0) {
      adv.forge();
      auto other = signed_set(adv.in().u8());
      const auto again = c[0].confirm(other, pki.server.sign(secagg::survivors_statement(p.session, other)));
      std::sort(other.begin(), other.end());
      auto first = survivors;
      std::sort(first.begin(), first.end());
      first.erase(std::unique(first.begin(), first.end()), first.end());
      other.erase(std::unique(other.begin(), other.end()), other.end());
      if (again.has_value() && other != first) std::abort();  // two survivor sets confirmed: a split view
    }
    bytes_to_server(
        i, p.members[i], confirmation->signature, adv,
        [&](const std::string& names) {
          std::vector<std::string> set;
          for (const char n : names) set.push_back("silo-" + std::to_string(static_cast<unsigned char>(n) % 5));
          return byzantine.sign(secagg::survivors_statement(p.session, set));
        },
        [&](const std::string& from, const std::string& sig) {
          adv.failed(!server.on_confirmation(from, sig).has_value());
        });
  }
  auto request = server.close_confirmations();
  if (adv.failed(!request)) return;
  // Unmasking: silo-0 is sent the adversary's request; silo-3's sealed answer goes through it
  // (or silo-3 seals bytes of its own making to the server).
  for (std::size_t i = 0; i < members; ++i) {
    const auto r = to_member(i, *request, adv, wire_of);
    if (adv.failed(!r)) continue;
    auto reply = c[i].unmask(*r);
    if (adv.failed(!reply)) continue;
    bytes_to_server(
        i, p.members[i], reply->box, adv,
        [&](const std::string& plain) { return crypto::seal_to(p.server_key, plain); },
        [&](const std::string& from, const std::string& sealed) {
          adv.failed(!server.on_unmask(from, sealed).has_value());
        });
  }
  const auto unmasked = server.finish(std::span<T>(sum));
  // An honest round (silo-3 masking or gone) ends in exactly the sum of the masked inputs.
  if (adv.honest() && (!unmasked || sum != expected)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  Adversary adv(in);
  secagg::Params p;
  p.session = "fed/1/1";
  for (std::size_t i = 0; i < kMembers; ++i) p.members.push_back("silo-" + std::to_string(i));
  p.length = kLength;
  const std::uint8_t shape = in.u8();
  if (shape & 1) {  // SecAgg+: each silo masks with its two ring neighbours
    p.degree = 2;
    p.graph_seed = in.bytes(4);
    p.threshold = p.min_survivors = 2;
  } else {
    p.threshold = p.min_survivors = 3;
  }
  switch ((shape >> 1) % 4) {
    case 0: run<std::uint32_t>(p, adv); break;
    case 1: run<std::uint64_t>(p, adv); break;
    case 2: run<std::uint16_t>(p, adv); break;
    default: run<std::uint8_t>(p, adv); break;
  }
  return 0;
}
