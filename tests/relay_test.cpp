// The edge's sans-I/O relay, driven message by message: no sockets, no threads, every timing
// scripted.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>

#include "crypto/hash.h"
#include "edge_aggregator/relay.h"
#include "protocol/compression.h"
#include "protocol/join.h"
#include "protocol/masked.h"
#include "protocol/packed.h"
#include "protocol/round_start.h"
#include "tests/testlib.h"

namespace xsilo::edge {
namespace {

class Harness {
 public:
  Harness() : relay_({"fed", 12}) {}

  // The server connects and gives this connection its join nonce.
  void server_up(const std::string& nonce = "nonce-of-connection-1") {
    relay_.on_server_up();
    wire::Envelope c;
    c.mutable_join_challenge()->set_nonce(nonce);
    from_server(c);
  }
  // A silo connects and signs the challenge it is given, as its agent does.
  void silo_up(const std::string& s, bool sign = true) {
    relay_.on_silo_up(s);
    pump();
    if (!sign) return;
    for (const auto& m : silo_inbox[s]) {
      if (m.has_join_challenge()) sign_join(s, m.join_challenge().nonce());
    }
  }
  void sign_join(const std::string& s, const std::string& nonce) {
    wire::Envelope p;
    *p.mutable_join_proof() = protocol::sign_join(test::signer(wire::SILO, s), "fed", "edge-1", nonce);
    from_silo(s, p);
  }
  void silo_down(const std::string& s) {
    relay_.on_silo_down(s);
    pump();
  }
  void from_server(wire::Envelope e) {
    e.set_federation("fed");
    relay_.on_server_message(e);
    pump();
  }
  void from_silo(const std::string& s, wire::Envelope e) {
    e.set_federation("fed");
    if (views && e.has_tensor_chunk()) {
      // As the edge daemon reads it: the chunk's data left in its frame (proto::decode_message).
      if (auto msg = proto::as_read(e)) {
        viewed += msg->viewed;
        relay_.on_silo_message(s, *msg);
      } else {
        relay_.on_silo_message(s, e);  // a chunk a test made that no frame could carry
      }
    } else {
      relay_.on_silo_message(s, e);
    }
    pump();
  }
  // Silos' chunks delivered as the edge daemon reads them, views of their frames (false: whole
  // Envelopes, as an in-process caller hands them over).
  bool views = true;
  int viewed = 0;  // chunks that reached the relay as views

  // RoundStart for `silo` (layout: a[4], b[2]), optionally in a secure group.
  // The server and silos s1, s2 connected, round 1 started for both.
  void two_silos_in_round_one() {
    server_up();
    for (auto s : {"s1", "s2"}) silo_up(s);
    for (auto s : {"s1", "s2"}) round_start(1, s);
  }
  // `wire_bits` or `dp_bits`: distributed DP at `dp_bits` (or `wire_bits`) bits, its words packed
  // in `wire_bits` (0: whole words); vector: 8 rotated + 1 words.
  void round_start(std::uint64_t round, const std::string& silo, std::uint32_t group = 0, std::uint32_t bits = 64,
                   std::uint32_t wire_bits = 0, std::uint32_t dp_bits = 0) {
    wire::Envelope e;
    e.set_round(round);
    e.set_silo(silo);
    auto* rs = e.mutable_round_start();
    rs->set_round(round);
    for (auto [name, n] : {std::pair{"a", 4}, {"b", 2}}) {
      auto* t = rs->add_tensors();
      t->set_name(name);
      t->set_dtype(wire::F32);
      t->add_shape(n);
    }
    if (group) {
      rs->mutable_secagg()->set_group(group);
      rs->mutable_secagg()->set_modulus_bits(bits);
      rs->mutable_secagg()->set_vector_length(7);
    }
    if (wire_bits || dp_bits) {
      rs->mutable_secagg()->mutable_skellam()->set_bits(dp_bits ? dp_bits : wire_bits);
      rs->mutable_secagg()->set_wire_bits(wire_bits);
      rs->mutable_secagg()->set_vector_length(9);
    }
    from_server(e);
  }
  // The server's settled member list of a secure group, relayed to `silo`.
  void settled(std::uint64_t round, const std::string& silo, const std::vector<std::string>& members) {
    wire::Envelope e;
    e.set_round(round);
    e.set_silo(silo);
    for (const auto& m : members) e.mutable_secure()->mutable_secagg_settled()->add_members(m);
    e.mutable_secure()->set_admits_upload(std::count(members.begin(), members.end(), silo) > 0);
    from_server(e);
  }
  void ready(const std::string& silo, std::uint64_t round, std::uint64_t samples) {
    wire::Envelope e;
    e.set_round(round);
    e.mutable_update_ready()->set_num_samples(samples);
    from_silo(silo, e);
  }
  // Streams 6 floats (plain) in chunks, then UpdateEnd with `weight`.
  void upload(const std::string& silo, std::uint64_t round, std::vector<float> v, double weight, int stop_after = -1,
              std::optional<std::string> declared = std::nullopt) {
    auto m = std::make_shared<Model>();
    m->add("a", {4});
    m->add("b", {2});
    std::copy(v.begin(), v.end(), m->flat().begin());
    protocol::ChunkSource src(m, m->flat(), m->tensors(), "fed", round, 12);
    int sent = 0;
    while (auto e = src.next()) {
      if (stop_after >= 0 && sent++ == stop_after) return;
      from_silo(silo, *e);
    }
    wire::Envelope end;
    end.set_round(round);
    end.mutable_update_end()->set_weight(weight);
    end.mutable_update_end()->set_update_sha256(declared.value_or(crypto::sha256_hex(m->flat())));
    from_silo(silo, end);
  }
  // With `packed_bits`, the words go reduced mod 2^packed_bits and packed, as a silo sends them
  // under the packed wire (protocol/packed.h), and hashed reduced.
  template <class W = std::uint64_t>
  void upload_words(const std::string& silo, std::uint64_t round, std::vector<W> w, std::uint32_t packed_bits = 0) {
    if (packed_bits) {
      for (auto& x : w) x &= static_cast<W>((W{1} << packed_bits) - 1);
    }
    auto bytes = std::make_shared<std::vector<std::uint8_t>>(w.size() * sizeof(W));
    std::memcpy(bytes->data(), w.data(), bytes->size());
    protocol::ChunkSource src(bytes, *bytes, protocol::ring_dtype(8 * sizeof(W)), {{"masked", {w.size()}, 0}}, "fed",
                              round, 16, packed_bits);
    while (auto e = src.next()) from_silo(silo, *e);
    wire::Envelope end;
    end.set_round(round);
    end.mutable_update_end()->set_update_sha256(
        crypto::sha256_hex(std::string_view(reinterpret_cast<const char*>(bytes->data()), bytes->size())));
    from_silo(silo, end);
  }
  // The server grants the region its upload (what was queued for it before is dropped): the
  // messages that follow it.
  std::vector<wire::Envelope> granted(std::uint64_t round) {
    up();
    grant_region(round);
    return up();
  }
  void grant_region(std::uint64_t round) {
    wire::Envelope g;
    g.set_round(round);
    g.mutable_upload_grant();
    from_server(g);
  }

  // The message of the last error among the messages for `silo` (taken from the queue); "" if none.
  std::string refusal(const std::string& silo) {
    std::string why;
    for (const auto& e : to(silo)) {
      if (e.has_error()) why = e.error().message();
    }
    return why;
  }
  // Messages for a silo / for the server, taken from the queue.
  std::vector<wire::Envelope> to(const std::string& silo) { return std::exchange(silo_inbox[silo], {}); }
  std::vector<wire::Envelope> up() { return std::exchange(server_inbox, {}); }
  static bool has(const std::vector<wire::Envelope>& v, wire::Envelope::BodyCase body) {
    return std::any_of(v.begin(), v.end(), [&](const auto& e) { return e.body_case() == body; });
  }
  static bool has(const std::vector<wire::Envelope>& v, wire::SecureAggregation::StepCase step) {
    return std::any_of(v.begin(), v.end(), [&](const auto& e) { return e.has_secure() && e.secure().step_case() == step; });
  }
  // The region's own UpdateReady (not one relayed for a silo).
  static bool region_ready(const std::vector<wire::Envelope>& v) {
    return std::any_of(v.begin(), v.end(), [&](const auto& e) { return e.has_update_ready() && e.silo().empty(); });
  }

  Relay& relay() { return relay_; }
  std::map<std::string, std::vector<wire::Envelope>> silo_inbox;
  std::vector<wire::Envelope> server_inbox;
  std::vector<std::vector<std::uint8_t>> streamed;  // each StreamToServer's bytes, concatenated

 private:
  void pump() {
    for (;;) {
      auto actions = relay_.take_actions();
      if (actions.empty()) return;
      for (auto& a : actions) {
        if (auto* s = std::get_if<action::ToSilo>(&a)) silo_inbox[s->silo].push_back(s->env);
        if (auto* s = std::get_if<action::ToSilos>(&a)) {
          for (const auto& silo : s->silos) silo_inbox[silo].push_back(s->env);
        }
        if (auto* s = std::get_if<action::ToServer>(&a)) server_inbox.push_back(s->env);
        if (auto* s = std::get_if<action::StreamToServer>(&a)) {
          std::vector<std::uint8_t> bytes;
          while (auto e = s->source->next()) {
            const auto& d = e->tensor_chunk().data();
            bytes.insert(bytes.end(), d.begin(), d.end());
          }
          streamed.push_back(std::move(bytes));
        }
        if (auto* b = std::get_if<action::Background>(&a)) b->work();
        if (auto* j = std::get_if<action::Job>(&a)) relay_.on_job_done(j->id, j->work());  // folded, or why refused
      }
    }
  }
  Relay relay_;
};

std::vector<float> floats(const std::vector<std::uint8_t>& b) {
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// Failback: a silo's Leaving goes up named by Envelope.silo, and the server's answer goes to
// that silo only, after the RoundStart the server sent it before.
TEST(Relay, AModelRequestWhileARoundRunsIsAnsweredNoneAndNeverReachesTheSilo) {
  Harness h;
  h.two_silos_in_round_one();
  h.to("s1");
  h.up();
  wire::Envelope ask;
  ask.set_round(1);
  ask.set_silo("s1");
  ask.mutable_model_request()->set_model_sha256("abc");
  h.from_server(ask);
  EXPECT_TRUE(h.to("s1").empty());
  const auto up = h.up();
  ASSERT_EQ(up.size(), 1u);
  ASSERT_TRUE(up[0].has_model_offer());
  EXPECT_FALSE(up[0].model_offer().held());
  EXPECT_EQ(up[0].silo(), "s1");
  // The silo's chunks stay what they are in a round: refused without a grant, never relayed up.
  wire::Envelope chunk;
  chunk.set_round(1);
  chunk.mutable_tensor_chunk()->set_name("a");
  chunk.mutable_tensor_chunk()->set_data(std::string(8, '\0'));
  h.from_silo("s1", chunk);
  for (const auto& e : h.up()) EXPECT_FALSE(e.has_tensor_chunk());
}

TEST(Relay, AnUploadUnderWayWhenTheServerWentIsNeverRelayedAsTheLostModel) {
  Harness h;
  h.two_silos_in_round_one();
  h.ready("s1", 1, 5);
  ASSERT_TRUE(Harness::has(h.to("s1"), wire::Envelope::kUploadGrant));
  h.upload("s1", 1, {1, 2, 3, 4, 5, 6}, 5.0, /*stop_after=*/1);  // one chunk of two, then the server goes
  h.relay().on_server_down();
  h.server_up("nonce-of-connection-2");
  h.up();
  wire::Envelope ask;
  ask.set_round(3);
  ask.set_silo("s1");
  ask.mutable_model_request()->set_model_sha256("abc");
  h.from_server(ask);
  EXPECT_FALSE(Harness::has(h.to("s1"), wire::Envelope::kModelRequest));  // answered for it: none
  auto up = h.up();
  ASSERT_EQ(up.size(), 1u);
  EXPECT_FALSE(up[0].model_offer().held());
  // The rest of its upload arrives: nothing of it goes up.
  wire::Envelope chunk;
  chunk.set_round(1);
  chunk.mutable_tensor_chunk()->set_name("b");
  chunk.mutable_tensor_chunk()->set_data(std::string(8, '\0'));
  h.from_silo("s1", chunk);
  wire::Envelope end;
  end.set_round(1);
  end.mutable_update_end()->set_weight(5.0);
  h.from_silo("s1", end);
  for (const auto& e : h.up()) EXPECT_FALSE(e.has_tensor_chunk()) << e.DebugString();
  // Its upload over, a request reaches it.
  h.from_server(ask);
  EXPECT_TRUE(Harness::has(h.to("s1"), wire::Envelope::kModelRequest));
}

TEST(Relay, CarriesAnAskedSilosCopyOfTheLostModelUpAndNoOneElses) {
  for (const bool views : {false, true}) {
    SCOPED_TRACE(views ? "chunks read as views" : "whole envelopes");
    Harness h;
    h.views = views;
    h.server_up();
    h.silo_up("s1");
    h.silo_up("s2");
    h.up();
    h.to("s1");
    h.to("s2");
    wire::Envelope ask;
    ask.set_round(3);
    ask.set_silo("s1");
    ask.mutable_model_request()->set_model_sha256("abc");
    h.from_server(ask);
    const auto in = h.to("s1");
    ASSERT_EQ(in.size(), 1u);
    EXPECT_TRUE(in[0].has_model_request());
    EXPECT_TRUE(h.to("s2").empty());
    // s1's chunk and offer go up in its name, outside any upload slot.
    wire::Envelope chunk;
    chunk.set_round(3);
    chunk.mutable_tensor_chunk()->set_name("w");
    chunk.mutable_tensor_chunk()->set_data(std::string(8, '\0'));
    wire::Envelope offer;
    offer.set_round(3);
    offer.mutable_model_offer()->set_model_sha256("abc");
    offer.mutable_model_offer()->set_held(true);
    h.from_silo("s1", chunk);
    h.from_silo("s1", offer);
    const auto up = h.up();
    ASSERT_EQ(up.size(), 2u);
    EXPECT_TRUE(up[0].has_tensor_chunk());
    EXPECT_EQ(up[0].tensor_chunk().data(), chunk.tensor_chunk().data());  // a view's data passed up too
    EXPECT_EQ(h.viewed, views ? 1 : 0);
    EXPECT_TRUE(up[1].has_model_offer());
    for (const auto& e : up) EXPECT_EQ(e.silo(), "s1");
    // Its answer is over: a second offer, and s2's unasked ones, are refused at the edge.
    h.from_silo("s1", offer);
    h.from_silo("s2", chunk);
    h.from_silo("s2", offer);
    EXPECT_TRUE(h.up().empty());
    const auto again = h.to("s1");
    ASSERT_EQ(again.size(), 1u);
    EXPECT_TRUE(again[0].has_error());
    const auto errors = h.to("s2");
    ASSERT_EQ(errors.size(), 2u);
    for (const auto& e : errors) EXPECT_TRUE(e.has_error());
  }
}

TEST(Relay, CarriesASilosLeavingUpAndTheAnswerBackInOrder) {
  Harness h;
  h.two_silos_in_round_one();
  h.to("s1");
  h.to("s2");
  h.up();
  wire::Envelope leave;
  leave.set_round(1);
  leave.mutable_leaving();
  h.from_silo("s1", leave);
  const auto up = h.up();
  ASSERT_EQ(up.size(), 1u);
  EXPECT_TRUE(up[0].has_leaving());
  EXPECT_EQ(up[0].silo(), "s1");
  h.round_start(2, "s1");
  leave.set_silo("s1");
  h.from_server(leave);
  const auto in = h.to("s1");
  ASSERT_EQ(in.size(), 2u);
  EXPECT_TRUE(in[0].has_round_start());
  EXPECT_TRUE(in[1].has_leaving());
  EXPECT_TRUE(h.to("s2").empty());
}

// Found by fuzzing (fuzz/corpus/relay): a RoundStart whose layout claims 48 GiB made the edge
// allocate it and die. Layouts are checked first; the edge answers with an error and goes on.
TEST(Relay, ARoundStartWithAnImpossibleLayoutIsRefusedBeforeAnythingIsAllocated) {
  Harness h;
  h.server_up();
  h.silo_up("s1");
  (void)h.up();
  auto start = [&](std::vector<std::uint64_t> shape, std::uint64_t vector_length = 0) {
    wire::Envelope e;
    e.set_round(1);
    e.set_silo("s1");
    auto* rs = e.mutable_round_start();
    rs->set_round(1);
    auto* t = rs->add_tensors();
    t->set_name("w");
    for (auto d : shape) t->add_shape(d);
    if (vector_length) {
      rs->mutable_secagg()->set_modulus_bits(64);
      rs->mutable_secagg()->set_vector_length(vector_length);
    }
    h.from_server(e);
    const auto up = h.up();
    return up.size() == 1 && up[0].has_error() ? up[0].error().message() : std::string("no error");
  };
  EXPECT_NE(start({std::uint64_t{1} << 40, std::uint64_t{1} << 40}).find("overflows"), std::string::npos);
  EXPECT_NE(start({std::uint64_t{1} << 35}).find("too large"), std::string::npos);
  EXPECT_NE(start({6}, std::uint64_t{1} << 62).find("does not fit"), std::string::npos);
  EXPECT_TRUE(h.silo_inbox["s1"].empty() || !h.silo_inbox["s1"].back().has_round_start());  // nothing relayed
  h.round_start(1, "s1");  // a sound one still starts the round
  ASSERT_FALSE(h.silo_inbox["s1"].empty());
  EXPECT_TRUE(h.silo_inbox["s1"].back().has_round_start());
}

// Found by fuzzing (fuzz/corpus/relay): a secure region granted its upload with no silo done
// read the plain sum it does not have.
TEST(Relay, ASecureRegionWithNothingToSendEndsItsUploadEmpty) {
  Harness h;
  h.server_up();
  h.silo_up("s1");
  h.round_start(1, "s1", /*group=*/1);
  (void)h.up();
  wire::Envelope grant;
  grant.set_round(1);
  grant.mutable_upload_grant();
  h.from_server(grant);  // the server's deadline forces the region's upload
  const auto up = h.up();
  ASSERT_FALSE(up.empty());
  EXPECT_TRUE(up.back().has_update_end());
  EXPECT_EQ(up.back().update_end().contributors_size(), 0);
}

TEST(Relay, AnEmptyRegionIsAnnouncedWithARegionStatusBody) {
  Harness h;
  h.server_up();
  auto up = h.up();
  ASSERT_EQ(up.size(), 1u);
  ASSERT_TRUE(up[0].has_region_status());  // a body, even with no silos (the server refuses an empty envelope)
  EXPECT_EQ(up[0].region_status().silos_size(), 0);
  h.silo_up("s1");
  up = h.up();
  ASSERT_EQ(up.size(), 1u);
  EXPECT_EQ(up[0].region_status().silos(0), "s1");
}

// A silo is announced only once it has signed the server's challenge for this connection, its
// proof travels once per connection, and a new server connection needs fresh signatures.
TEST(Relay, AnnouncesASiloOnlyWithItsSignedJoinForTheCurrentConnection) {
  Harness h;
  h.server_up("nonce-of-connection-1");
  h.up();  // the empty region
  h.silo_up("s1", false);
  EXPECT_TRUE(h.up().empty());  // connected, not signed: nothing to announce
  auto to1 = h.to("s1");
  ASSERT_TRUE(Harness::has(to1, wire::Envelope::kJoinChallenge));
  EXPECT_EQ(to1[0].join_challenge().nonce(), "nonce-of-connection-1");
  h.sign_join("s1", "an old nonce");  // not this connection's challenge
  EXPECT_TRUE(h.up().empty());
  EXPECT_TRUE(Harness::has(h.to("s1"), wire::Envelope::kError));
  h.sign_join("s1", "nonce-of-connection-1");
  auto up = h.up();
  ASSERT_EQ(up.size(), 1u);
  ASSERT_EQ(up[0].region_status().silos_size(), 1);
  ASSERT_EQ(up[0].region_status().proofs_size(), 1);
  EXPECT_EQ(up[0].region_status().proofs(0).silo(), "s1");
  h.silo_up("s2");
  up = h.up();
  ASSERT_EQ(up.size(), 1u);
  EXPECT_EQ(up[0].region_status().silos_size(), 2);
  ASSERT_EQ(up[0].region_status().proofs_size(), 1);  // only the new one's
  EXPECT_EQ(up[0].region_status().proofs(0).silo(), "s2");
  // s2 cannot hand in a proof under s1's name
  wire::Envelope forged;
  *forged.mutable_join_proof() = up[0].region_status().proofs(0);
  forged.mutable_join_proof()->set_silo("s1");
  h.from_silo("s2", forged);
  EXPECT_TRUE(h.up().empty());

  // The server reconnects: the new challenge goes to every silo and none is announced until it
  // signs again.
  h.relay().on_server_down();
  h.server_up("nonce-of-connection-2");
  up = h.up();
  ASSERT_FALSE(up.empty());
  EXPECT_EQ(up.back().region_status().silos_size(), 0);
  for (auto s : {"s1", "s2"}) {
    const auto to = h.to(s);
    ASSERT_TRUE(Harness::has(to, wire::Envelope::kJoinChallenge));
    EXPECT_EQ(to.back().join_challenge().nonce(), "nonce-of-connection-2");
  }
  h.sign_join("s2", "nonce-of-connection-2");
  up = h.up();
  ASSERT_EQ(up.size(), 1u);
  ASSERT_EQ(up[0].region_status().silos_size(), 1);
  EXPECT_EQ(up[0].region_status().silos(0), "s2");
  EXPECT_EQ(up[0].region_status().proofs_size(), 1);

  // A new nonce within the connection (the server rotates it when a silo leaves): silos already
  // announced stay listed, every silo signs again, and the fresh proofs go up once.
  h.sign_join("s1", "nonce-of-connection-2");
  h.up();
  wire::Envelope rotate;
  rotate.mutable_join_challenge()->set_nonce("nonce-2b");
  h.from_server(rotate);
  for (auto s : {"s1", "s2"}) EXPECT_EQ(h.to(s).back().join_challenge().nonce(), "nonce-2b");
  h.sign_join("s1", "nonce-2b");
  up = h.up();
  ASSERT_EQ(up.size(), 1u);
  EXPECT_EQ(up[0].region_status().silos_size(), 2);  // s2 still listed, though not signed again yet
  ASSERT_EQ(up[0].region_status().proofs_size(), 1);
  EXPECT_EQ(up[0].region_status().proofs(0).nonce(), "nonce-2b");
}

TEST(Relay, SumsItsSilosOneUploadAtATimeAndSendsOnePartialSum) {
  for (const bool views : {false, true}) {
    SCOPED_TRACE(views ? "chunks read as views" : "whole envelopes");
    Harness h;
    h.views = views;
    h.server_up();
    for (auto s : {"s1", "s2", "s3"}) h.silo_up(s);
    h.up();
    for (auto s : {"s1", "s2", "s3"}) h.round_start(1, s);
    for (auto s : {"s1", "s2", "s3"}) EXPECT_TRUE(Harness::has(h.to(s), wire::Envelope::kRoundStart));
    h.ready("s1", 1, 10);
    h.ready("s2", 1, 20);
    auto up = h.up();
    ASSERT_EQ(up.size(), 2u);  // relayed, naming the silo
    EXPECT_EQ(up[0].silo(), "s1");
    // One grant at a time: s1 now, s2 after s1's upload is folded.
    EXPECT_TRUE(Harness::has(h.to("s1"), wire::Envelope::kUploadGrant));
    EXPECT_FALSE(Harness::has(h.to("s2"), wire::Envelope::kUploadGrant));
    h.upload("s1", 1, {1, 1, 1, 1, 1, 1}, 10);
    EXPECT_TRUE(Harness::has(h.to("s2"), wire::Envelope::kUploadGrant));
    h.upload("s2", 1, {2, 2, 2, 2, 2, 4}, 20);
    EXPECT_TRUE(h.up().empty());  // s3 is still training
    h.ready("s3", 1, 5);
    h.up();
    h.upload("s3", 1, {0, 0, 0, 0, 0, 1}, 5);
    up = h.up();
    ASSERT_EQ(up.size(), 1u);
    ASSERT_TRUE(up[0].has_update_ready());
    EXPECT_EQ(up[0].update_ready().num_samples(), 35u);
    h.grant_region(1);
    up = h.up();
    ASSERT_EQ(h.streamed.size(), 1u);
    EXPECT_EQ(floats(h.streamed[0]), (std::vector<float>{3, 3, 3, 3, 3, 6}));
    ASSERT_EQ(up.size(), 1u);
    ASSERT_TRUE(up[0].has_update_end());
    EXPECT_DOUBLE_EQ(up[0].update_end().weight(), 35);
    EXPECT_EQ(up[0].update_end().contributors_size(), 3);
    EXPECT_EQ(h.viewed > 2, views);  // every silo's chunks came in as views, or none
  }
}

TEST(Relay, ASiloLostMidUploadLeavesNoTraceAndTheNextIsGranted) {
  Harness h;
  h.two_silos_in_round_one();
  h.ready("s1", 1, 10);
  h.ready("s2", 1, 10);
  h.upload("s1", 1, {9, 9, 9, 9, 9, 9}, 10, /*stop_after=*/1);  // half of it
  h.silo_down("s1");
  EXPECT_TRUE(Harness::has(h.to("s2"), wire::Envelope::kUploadGrant));
  h.upload("s2", 1, {1, 2, 3, 4, 5, 6}, 10);
  h.up();
  h.grant_region(1);
  ASSERT_EQ(h.streamed.size(), 1u);
  EXPECT_EQ(floats(h.streamed[0]), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  const auto up = h.up();
  ASSERT_EQ(up.back().update_end().contributors_size(), 1);
  EXPECT_EQ(up.back().update_end().contributors(0).silo(), "s2");
}

TEST(Relay, ANonFiniteUploadIsRefusedAndLeftOutOfTheSum) {
  Harness h;
  h.two_silos_in_round_one();
  h.ready("s1", 1, 10);
  h.ready("s2", 1, 10);
  h.upload("s1", 1, {1, std::numeric_limits<float>::quiet_NaN(), 1, 1, 1, 1}, 10);
  const auto to1 = h.to("s1");
  ASSERT_TRUE(Harness::has(to1, wire::Envelope::kError));
  EXPECT_NE(to1.back().error().message().find("NaN"), std::string::npos);
  h.upload("s2", 1, {1, 1, 1, 1, 1, 1}, 10);
  h.up();
  h.grant_region(1);
  EXPECT_EQ(floats(h.streamed.at(0)), (std::vector<float>{1, 1, 1, 1, 1, 1}));
}

TEST(Relay, AnUploadThatIsNotWhatItsSiloDeclaredIsRefusedAndLeftOutOfTheSum) {
  // The third: what a peer declared is shown escaped (the relay echoed it raw before; the check
  // is now the server's own, protocol::verify_upload).
  for (const std::string& declared : {std::string(), crypto::sha256_hex("something else"), std::string("\x1b[2Jforged")}) {
    Harness h;
    h.two_silos_in_round_one();
    h.ready("s1", 1, 10);
    h.ready("s2", 1, 10);
    h.upload("s1", 1, {5, 5, 5, 5, 5, 5}, 10, -1, declared);
    const auto to1 = h.to("s1");
    ASSERT_TRUE(Harness::has(to1, wire::Envelope::kError));
    EXPECT_NE(to1.back().error().message().find("SHA-256"), std::string::npos) << to1.back().error().message();
    EXPECT_EQ(to1.back().error().message().find('\x1b'), std::string::npos) << to1.back().error().message();
    h.upload("s2", 1, {1, 1, 1, 1, 1, 1}, 10);
    h.up();
    h.grant_region(1);
    EXPECT_EQ(floats(h.streamed.at(0)), (std::vector<float>{1, 1, 1, 1, 1, 1}));
    const auto up = h.up();
    ASSERT_FALSE(up.empty());
    EXPECT_EQ(up.back().update_end().update_sha256().size(), 64u);  // the partial sum declares its own
  }
}

TEST(Relay, StopsWaitingForASiloTheServerEndedTheRoundFor) {
  Harness h;
  h.two_silos_in_round_one();
  h.ready("s1", 1, 10);
  h.upload("s1", 1, {1, 1, 1, 1, 1, 1}, 10);
  EXPECT_FALSE(Harness::region_ready(h.up()));  // s2 pending
  wire::Envelope end;
  end.set_round(1);
  end.set_silo("s2");
  end.mutable_round_end()->set_reason("you were dropped from this round: secure group 2 failed");
  h.from_server(end);
  EXPECT_TRUE(Harness::has(h.to("s2"), wire::Envelope::kRoundEnd));  // forwarded
  EXPECT_TRUE(Harness::region_ready(h.up()));  // and the region is ready
}

// Silos of two secure groups behind one edge: one masked partial sum per group, one grant each,
// `more` on all but the last; words add up mod 2^64.
TEST(Relay, SendsOneMaskedPartialSumPerSecureGroupOnePerGrant) {
  Harness h;
  h.server_up();
  for (auto s : {"a1", "a2", "b1"}) h.silo_up(s);
  h.round_start(1, "a1", 1);
  h.round_start(1, "a2", 1);
  h.round_start(1, "b1", 2);
  for (auto s : {"a1", "a2"}) h.settled(1, s, {"a1", "a2"});
  h.settled(1, "b1", {"b1", "b2"});
  for (auto s : {"a1", "a2", "b1"}) h.ready(s, 1, 1);
  const std::uint64_t big = ~std::uint64_t{0};
  h.upload_words("a1", 1, {1, 2, 3, 4, 5, 6, big});
  h.upload_words("a2", 1, {1, 1, 1, 1, 1, 1, 2});
  h.upload_words("b1", 1, {7, 7, 7, 7, 7, 7, 7});
  h.up();
  h.grant_region(1);
  auto up = h.up();
  ASSERT_EQ(h.streamed.size(), 1u);
  ASSERT_EQ(up.size(), 1u);
  EXPECT_EQ(up[0].update_end().group(), 1u);
  EXPECT_TRUE(up[0].update_end().more());
  EXPECT_EQ(up[0].update_end().contributors_size(), 2);
  std::vector<std::uint64_t> g1(7);
  std::memcpy(g1.data(), h.streamed[0].data(), 56);
  EXPECT_EQ(g1, (std::vector<std::uint64_t>{2, 3, 4, 5, 6, 7, 1}));  // big + 2 wraps to 1
  h.grant_region(1);  // the server folded group 1: the slot again
  up = h.up();
  ASSERT_EQ(h.streamed.size(), 2u);
  EXPECT_EQ(up[0].update_end().group(), 2u);
  EXPECT_FALSE(up[0].update_end().more());
  EXPECT_EQ(up[0].update_end().contributors(0).silo(), "b1");
}

// The packed wire (issue 42): distributed DP at 20 bits in the 32-bit ring. The edge unpacks its
// silos' 20-bit words, adds them, and sends the sum reduced mod 2^20 and packed the same way
// (9 words: 23 bytes, not 36). A packed chunk of the wrong length is refused with the reason
// before anything is added, and the silo is out; a setup whose wire is not its DP's bits is
// refused at the round start.
TEST(Relay, SumsPackedWordsModTheirBitsAndRefusesAPackedChunkOfTheWrongLength) {
  Harness h;
  h.server_up();
  for (auto s : {"a1", "a2", "a3", "a4"}) h.silo_up(s);
  for (auto s : {"a1", "a2", "a3", "a4"}) h.round_start(1, s, 1, 32, 20);
  for (auto s : {"a1", "a2", "a3", "a4"}) h.settled(1, s, {"a1", "a2", "a3", "a4"});
  for (auto s : {"a1", "a2", "a3", "a4"}) h.ready(s, 1, 1);
  const std::uint32_t top = (1u << 20) - 1;
  h.upload_words<std::uint32_t>("a1", 1, {1, 2, 3, 4, 5, 6, 7, 8, top}, 20);
  wire::Envelope bad;
  bad.set_round(1);
  auto* c = bad.mutable_tensor_chunk();
  c->set_name("masked");
  c->set_dtype(wire::PACKED);
  c->add_shape(9);
  c->set_count(9);
  c->set_data(std::string(22, '\x11'));  // 9 words of 20 bits take 23 bytes
  h.from_silo("a2", bad);  // the next grant is a2's (ready in that order)
  const auto why = h.refusal("a2");
  EXPECT_NE(why.find("22 bytes for 9 words packed 20 bits each, not 23"), std::string::npos) << why;
  h.upload_words<std::uint32_t>("a3", 1, {0xFFFFFFFFu, 1, 1, 1, 1, 1, 1, 1, 2}, 20);  // sent mod 2^20: 0xFFFFF
  h.upload_words<std::uint32_t>("a4", 1, std::vector<std::uint32_t>(9, std::uint32_t{1} << 20), 20);  // 2^20: sent as 0
  const auto up = h.granted(1);
  ASSERT_EQ(h.streamed.size(), 1u);
  ASSERT_EQ(h.streamed[0].size(), 23u);
  std::vector<std::uint32_t> sum(9);
  ASSERT_TRUE(protocol::unpack_words(h.streamed[0], 20, std::span<std::uint32_t>(sum)));
  EXPECT_EQ(sum, (std::vector<std::uint32_t>{0, 3, 4, 5, 6, 7, 8, 9, 1}));  // mod 2^20: top + 1 = 0, top + 2 = 1
  ASSERT_FALSE(up.empty());
  EXPECT_EQ(up.back().update_end().contributors_size(), 3);
  // The reduced sum is what the edge declares.
  EXPECT_EQ(up.back().update_end().update_sha256(),
            crypto::sha256_hex(std::string_view(reinterpret_cast<const char*>(sum.data()), sum.size() * 4)));
}

// A server that signs a packed wire of another width than its DP's bits is refused with the
// reason (protocol::check_wire_bits): the words would be decoded in bits they never had.
TEST(Relay, RefusesARoundWhoseWireIsNotItsDistributedDpsBits) {
  Harness h;
  h.server_up();
  h.silo_up("a1");
  (void)h.up();
  h.round_start(1, "a1", 1, 32, /*wire_bits=*/16, /*dp_bits=*/20);
  const auto up = h.up();
  ASSERT_TRUE(Harness::has(up, wire::Envelope::kError));
  EXPECT_NE(up.back().error().message().find("packs its words in 16 bits, not the 20 bits its distributed DP is decoded in"),
            std::string::npos)
      << up.back().error().message();
  EXPECT_FALSE(Harness::has(h.to("a1"), wire::Envelope::kRoundStart));  // not passed on
}

// The region's sum is kept in the words of the round's first start: a later start of the same
// round in other words (whole 32-bit words where the first packs 20 bits, a 16-bit ring, a plain
// start) is refused with the reason, naming its silo so that the server drops it
// at once, and not passed on; the first words stand, and the region's sum is of them.
TEST(Relay, RefusesALaterStartOfTheRoundInOtherSecureWords) {
  Harness h;
  h.server_up();
  for (auto s : {"a1", "a2", "a3", "a4", "a5"}) h.silo_up(s);
  (void)h.up();
  h.round_start(1, "a1", 1, 32, /*wire_bits=*/20);
  EXPECT_TRUE(Harness::has(h.to("a1"), wire::Envelope::kRoundStart));
  h.round_start(1, "a2", 1, 32, /*wire_bits=*/0, /*dp_bits=*/20);  // no width: whole words
  h.round_start(1, "a3", 1, 16);
  h.round_start(1, "a4", 1, 32, /*wire_bits=*/20);
  h.round_start(1, "a5", 0);  // plain
  const auto up = h.up();
  std::vector<std::string> refused;
  for (const auto& e : up) {
    if (e.has_error() && e.error().message().find("are not those of the round's first start") != std::string::npos) {
      refused.push_back(e.silo());
    }
  }
  EXPECT_EQ(refused, (std::vector<std::string>{"a2", "a3", "a5"}));
  for (auto s : {"a2", "a3", "a5"}) EXPECT_FALSE(Harness::has(h.to(s), wire::Envelope::kRoundStart)) << s;
  h.round_start(1, "a2", 1, 32, /*wire_bits=*/20);  // the same words as the first: passed on
  EXPECT_TRUE(Harness::has(h.to("a2"), wire::Envelope::kRoundStart));
  for (auto s : {"a1", "a2", "a4"}) h.settled(1, s, {"a1", "a2", "a4"});
  for (auto s : {"a1", "a2", "a4"}) h.ready(s, 1, 1);
  for (auto s : {"a1", "a2", "a4"}) h.upload_words<std::uint32_t>(s, 1, {1, 2, 3, 4, 5, 6, 7, 8, 9}, 20);
  const auto sent = h.granted(1);
  ASSERT_EQ(h.streamed.size(), 1u);
  std::vector<std::uint32_t> sum(9);
  ASSERT_TRUE(protocol::unpack_words(h.streamed[0], 20, std::span(sum)));  // as it travels: packed 20 bits
  EXPECT_EQ(sum, (std::vector<std::uint32_t>{3, 6, 9, 12, 15, 18, 21, 24, 27}));
  ASSERT_FALSE(sent.empty());
  EXPECT_EQ(sent.back().update_end().contributors_size(), 3);
}

// A 16-bit ring: words of 2 bytes, summed mod 2^16. An upload of other words (another ring, or
// bytes that are not whole words) is refused before anything is added, and the silo is out.
TEST(Relay, SumsSixteenBitWordsAndRefusesChunksOfAnotherWordSize) {
  Harness h;
  h.server_up();
  for (auto s : {"a1", "a2", "a3", "a4"}) h.silo_up(s);
  for (auto s : {"a1", "a2", "a3", "a4"}) h.round_start(1, s, 1, 16);
  for (auto s : {"a1", "a2", "a3", "a4"}) h.settled(1, s, {"a1", "a2", "a3", "a4"});
  for (auto s : {"a1", "a2", "a3", "a4"}) h.ready(s, 1, 1);
  h.upload_words<std::uint16_t>("a1", 1, {1, 2, 3, 4, 5, 6, 65535});
  // 32-bit words for a 16-bit ring: the dtype is not the ring's.
  h.upload_words<std::uint32_t>("a2", 1, {9, 9, 9, 9, 9, 9, 9});
  const auto to2 = h.to("a2");  // the refusal of its first chunk (then: its UpdateEnd has no grant left)
  EXPECT_TRUE(std::any_of(to2.begin(), to2.end(), [](const auto& e) {
    return e.has_error() && e.error().message().find("must be U16") != std::string::npos;
  }));
  // U16 declared, but 13 bytes: not whole words.
  wire::Envelope odd;
  odd.set_round(1);
  auto* c = odd.mutable_tensor_chunk();
  c->set_name("masked");
  c->set_dtype(wire::U16);
  c->add_shape(7);
  c->set_data(std::string(13, '\x11'));
  h.from_silo("a3", odd);
  const auto why = h.refusal("a3");
  EXPECT_NE(why.find("not a positive multiple of 2"), std::string::npos) << why;
  h.upload_words<std::uint16_t>("a4", 1, {1, 1, 1, 1, 1, 1, 2});
  const auto up = h.granted(1);
  ASSERT_EQ(h.streamed.size(), 1u);
  ASSERT_EQ(h.streamed[0].size(), 14u);
  std::vector<std::uint16_t> sum(7);
  std::memcpy(sum.data(), h.streamed[0].data(), 14);
  EXPECT_EQ(sum, (std::vector<std::uint16_t>{2, 3, 4, 5, 6, 7, 1}));  // 65535 + 2 wraps to 1
  ASSERT_FALSE(up.empty());
  EXPECT_EQ(up.back().update_end().contributors_size(), 2);
}

// Only a silo the server settled into its secure group may add to the edge's partial sum: one
// left out of the settled list (excluded, or silent) is refused before anything is folded.
TEST(Relay, ASecureSiloTheServerDidNotSettleCannotUpload) {
  Harness h;
  h.server_up();
  for (auto s : {"a1", "a2"}) h.silo_up(s);
  h.round_start(1, "a1", 1);
  h.round_start(1, "a2", 1);
  h.settled(1, "a1", {"a1", "a3"});  // a2 was excluded
  h.settled(1, "a2", {"a1", "a3"});
  EXPECT_TRUE(Harness::has(h.to("a2"), wire::SecureAggregation::kSecaggSettled));  // it learns that it is out
  h.ready("a1", 1, 1);
  h.ready("a2", 1, 1);
  const auto to2 = h.to("a2");
  ASSERT_TRUE(Harness::has(to2, wire::Envelope::kError));
  EXPECT_NE(to2.back().error().message().find("before the server settled"), std::string::npos)
      << to2.back().error().message();
  EXPECT_FALSE(Harness::has(h.to("a1"), wire::Envelope::kError));
}

wire::Compression eight_bit_broadcast() {
  wire::Compression b;
  b.set_scheme(wire::Compression::QUANTIZE);
  b.set_bits(8);
  b.set_block(8);
  return b;
}

// The harness's layout: a[4], b[2].
Model layout_a4_b2() {
  Model m;
  m.add("a", {4});
  m.add("b", {2});
  return m;
}

// The server's RoundStart of a compressed broadcast round for `silo`: model `m` as a delta
// against the model of `base` where the receiver holds it.
wire::Envelope broadcast_start(std::uint64_t round, const std::string& silo, const Model& m, const wire::Compression& b,
                               const std::string& base) {
  wire::Envelope e;
  e.set_round(round);
  e.set_silo(silo);
  auto* rs = e.mutable_round_start();
  rs->set_round(round);
  protocol::add_layout(*rs, m.tensors());
  rs->set_model_sha256(crypto::sha256_hex(m.flat()));
  *rs->mutable_broadcast() = b;
  rs->set_base_sha256(base);
  return e;
}

// A compressed broadcast through an edge: the edge rebuilds the model in its own copy; a silo
// that said it holds the round's base gets the server's delta chunks, the others each chunk's
// new values; both end with the round's model, and the edge tells the server it holds it. A
// delta against a base the edge does not hold is refused up, with the reason.
TEST(Relay, PassesABroadcastDeltaToSilosThatHoldTheBaseAndValuesToTheOthers) {
  Harness h;
  h.server_up();
  for (auto s : {"s1", "s2"}) h.silo_up(s);
  const wire::Compression b = eight_bit_broadcast();
  Model m1 = layout_a4_b2();
  for (std::size_t i = 0; i < m1.size(); ++i) m1.flat()[i] = 0.25f * static_cast<float>(i);
  auto start = [&](std::uint64_t round, const std::string& silo, const Model& m, const std::string& base) {
    h.from_server(broadcast_start(round, silo, m, b, base));
  };
  auto from_server = [&](std::uint64_t round, const std::vector<wire::TensorChunk>& chunks) {
    for (const auto& ch : chunks) {
      wire::Envelope e;
      e.set_round(round);
      *e.mutable_tensor_chunk() = ch;
      h.from_server(e);
    }
  };
  // What a silo makes of the chunks it was sent, starting from `held` (have_base when it holds one).
  auto rebuild = [&](const std::vector<wire::Envelope>& got, Model held, bool have_base, std::size_t& deltas) {
    protocol::TensorReceiver rx;
    rx.reset_model(held.flat(), held.tensors(), b, have_base);
    deltas = 0;
    for (const auto& e : got) {
      if (!e.has_tensor_chunk()) continue;
      deltas += e.tensor_chunk().encoding() != wire::Compression::NONE;
      EXPECT_TRUE(rx.add(e.tensor_chunk()));
    }
    EXPECT_TRUE(rx.complete());
    return rx.finish_sha256();
  };
  auto region_holds = [&](const std::vector<wire::Envelope>& up) {
    std::string sha;
    for (const auto& e : up) {
      if (e.has_region_status()) sha = e.region_status().model_sha256();
    }
    return sha;
  };

  // Round 1: the whole model, passed on as it is.
  const std::string sha1 = crypto::sha256_hex(m1.flat());
  for (auto s : {"s1", "s2"}) start(1, s, m1, "");
  h.to("s1");
  h.to("s2");
  h.up();
  std::vector<wire::TensorChunk> whole;
  protocol::ChunkSource src(nullptr, m1.flat(), m1.tensors(), "fed", 1, 12);
  while (auto e = src.next()) whole.push_back(e->tensor_chunk());
  from_server(1, whole);
  std::size_t deltas = 0;
  EXPECT_EQ(rebuild(h.to("s1"), m1.zeros_like(), false, deltas), sha1);
  EXPECT_EQ(region_holds(h.up()), sha1);
  wire::Envelope ready;
  ready.set_round(1);
  ready.mutable_update_ready()->set_num_samples(3);
  ready.mutable_update_ready()->set_model_sha256(sha1);
  h.from_silo("s1", ready);  // s1 holds m1; s2 says nothing
  h.ready("s2", 1, 3);
  h.up();
  h.to("s1");
  h.to("s2");

  // Round 2: the delta against m1.
  Model m2 = m1;
  for (std::size_t i = 0; i < m2.size(); ++i) m2.flat()[i] -= 0.1f * static_cast<float>(i % 3);
  const auto enc = protocol::encode_model_delta(b, m1.flat(), m2.flat(), m2.tensors(), 3, 11);
  const std::string sha2 = crypto::sha256_hex(m2.flat());
  for (auto s : {"s1", "s2"}) start(2, s, m2, sha1);
  from_server(2, enc.chunks);
  EXPECT_EQ(rebuild(h.to("s1"), m1, true, deltas), sha2);
  EXPECT_EQ(deltas, enc.chunks.size());
  EXPECT_EQ(rebuild(h.to("s2"), m1.zeros_like(), false, deltas), sha2);
  EXPECT_EQ(deltas, 0u);
  EXPECT_EQ(region_holds(h.up()), sha2);

  // Round 3: a delta against m1, which the edge no longer holds (nor do its silos): each silo is
  // out of the round at once, and the server and the silo are told why.
  for (auto s : {"s1", "s2"}) start(3, s, m2, sha1);
  h.up();
  h.to("s1");
  h.to("s2");
  from_server(3, enc.chunks);
  std::set<std::string> failed;
  for (const auto& e : h.up()) {
    if (!e.has_error()) continue;
    EXPECT_NE(e.error().message().find("does not hold"), std::string::npos) << e.error().message();
    failed.insert(e.silo());
  }
  EXPECT_EQ(failed, (std::set<std::string>{"s1", "s2"}));
  for (auto s : {"s1", "s2"}) {
    const auto got = h.to(s);
    EXPECT_FALSE(Harness::has(got, wire::Envelope::kTensorChunk)) << s;
    EXPECT_TRUE(Harness::has(got, wire::Envelope::kError)) << s;
  }
}

// An edge that cannot rebuild the model (here it never held one) still passes the server's
// delta on to the silos that hold its base: they check it themselves.
TEST(Relay, AnEdgeWithoutTheBasePassesTheDeltaToSilosThatHoldIt) {
  Harness h;
  const wire::Compression b = eight_bit_broadcast();
  Model m1 = layout_a4_b2();
  for (std::size_t i = 0; i < m1.size(); ++i) m1.flat()[i] = 1.0f + static_cast<float>(i);
  const std::string sha1 = crypto::sha256_hex(m1.flat());
  // Round 1 is not compressed: the edge keeps no copy; s1 trains on m1 and says so.
  h.two_silos_in_round_one();
  wire::Envelope ready;
  ready.set_round(1);
  ready.mutable_update_ready()->set_num_samples(2);
  ready.mutable_update_ready()->set_model_sha256(sha1);
  h.from_silo("s1", ready);
  Model m2 = m1;
  for (auto& v : m2.flat()) v *= 1.5f;
  const auto enc = protocol::encode_model_delta(b, m1.flat(), m2.flat(), m2.tensors(), 3, 2);
  for (auto s : {"s1", "s2"}) h.from_server(broadcast_start(2, s, m2, b, sha1));
  h.to("s1");
  h.to("s2");
  h.up();
  for (const auto& ch : enc.chunks) {
    wire::Envelope e;
    e.set_round(2);
    *e.mutable_tensor_chunk() = ch;
    h.from_server(e);
  }
  // s2 is out of the round (the server is told); s1 got every chunk as the server sent it.
  const auto up = h.up();
  ASSERT_EQ(std::count_if(up.begin(), up.end(), [](const auto& e) { return e.has_error(); }), 1);
  EXPECT_EQ(std::find_if(up.begin(), up.end(), [](const auto& e) { return e.has_error(); })->silo(), "s2");
  Model held = m1;
  protocol::TensorReceiver rx;
  rx.reset_model(held.flat(), held.tensors(), b, true);
  std::size_t chunks = 0;
  for (const auto& e : h.to("s1")) {
    if (!e.has_tensor_chunk()) continue;
    ASSERT_TRUE(rx.add(e.tensor_chunk()));
    ++chunks;
  }
  EXPECT_EQ(chunks, enc.chunks.size());
  EXPECT_EQ(rx.finish_sha256(), crypto::sha256_hex(m2.flat()));
  EXPECT_FALSE(Harness::has(h.to("s2"), wire::Envelope::kTensorChunk));
}

}  // namespace
}  // namespace xsilo::edge
