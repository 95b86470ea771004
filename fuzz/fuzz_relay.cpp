// The edge's relay: arbitrary messages from the server above and the silos below, with silos
// coming and going and the server reconnecting. Jobs (folds) run inline. Some rounds are
// well-formed compressed broadcasts (a RoundStart per silo, the model whole or as a delta
// against the edge's last one, the silos saying which model they hold), so that the edge's
// rebuilding and per-silo forwarding are reached with values from the input.
#include "crypto/hash.h"
#include "edge_aggregator/relay.h"
#include "proto/message.h"
#include "fuzz/fuzz_input.h"
#include "protocol/compression.h"
#include "protocol/round_start.h"
#include "protocol/tensor_stream.h"

namespace {

using namespace xsilo;

// A broadcast round from the input: starts for the silos the input picks, then the model.
void broadcast_round(edge::Relay& relay, fuzz::Input& in, Model& last, std::string& last_sha) {
  const std::uint8_t how = in.u8();
  wire::Compression b;
  b.set_scheme(wire::Compression::QUANTIZE);
  b.set_bits(how & 16 ? 4 : 8);
  b.set_block(8);
  const std::uint64_t round = relay.round() + (how & 2 ? 1 : 0);
  Model m = fuzz::small_model();
  for (auto& v : m.flat()) v = in.u8() & 1 ? in.f32() : v + 0.01f * static_cast<float>(in.u8());
  const bool delta = (how & 8) && last.same_layout(m);
  std::vector<wire::TensorChunk> chunks;
  if (delta) {
    chunks = protocol::encode_model_delta(b, last.flat(), m.flat(), m.tensors(), 4, in.u8()).chunks;
  } else {
    protocol::ChunkSource src(nullptr, m.flat(), m.tensors(), "fed", round, 16);
    while (auto e = src.next()) chunks.push_back(e->tensor_chunk());
  }
  const std::string sha = crypto::sha256_hex(m.flat());
  const std::uint8_t silos = in.u8();
  for (int i = 0; i < 4; ++i) {
    if (!(silos >> i & 1)) continue;
    wire::Envelope e;
    e.set_federation("fed");
    e.set_round(round);
    e.set_silo("silo-" + std::to_string(i));
    auto* rs = e.mutable_round_start();
    rs->set_round(round);
    protocol::add_layout(*rs, m.tensors());
    rs->set_model_sha256(sha);
    *rs->mutable_broadcast() = b;
    rs->set_base_sha256(how & 4 ? last_sha : in.bytes(in.u8() % 65));
    relay.on_server_message(e);
  }
  for (const auto& ch : chunks) {
    if (in.u8() % 16 == 0) continue;  // a chunk lost on the way
    wire::Envelope e;
    e.set_federation("fed");
    e.set_round(round);
    *e.mutable_tensor_chunk() = ch;
    relay.on_server_message(e);
  }
  for (int i = 0; i < 4; ++i) {  // the silos that say they trained on it
    if (!(silos >> (4 + i) & 1)) continue;
    wire::Envelope e;
    e.set_federation("fed");
    e.set_round(round);
    e.mutable_update_ready()->set_num_samples(1 + in.u8());
    e.mutable_update_ready()->set_model_sha256(in.u8() & 1 ? sha : last_sha);
    relay.on_silo_message("silo-" + std::to_string(i), e);
  }
  last = std::move(m);
  last_sha = sha;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  edge::Relay relay({"fed", 16u << in.u8() % 8, fuzz::kMaxFuzzModel});
  auto pump = [&] {
    for (int guard = 0; guard < 64; ++guard) {
      auto actions = relay.take_actions();
      if (actions.empty()) return;
      for (auto& a : actions) {
        if (auto* j = std::get_if<edge::action::Job>(&a)) relay.on_job_done(j->id, j->work());
        if (auto* b = std::get_if<edge::action::Background>(&a)) b->work();
        if (auto* s = std::get_if<edge::action::StreamToServer>(&a)) {
          for (int k = 0; k < 1024; ++k) {
            if (!s->source->next()) break;
          }
        }
      }
    }
  };
  Model last;
  std::string last_sha;
  std::uint64_t silo_chunks = 0;
  while (in.more() && !relay.finished()) {
    const std::string silo = "silo-" + std::to_string(in.u8() % 4);
    switch (in.u8() % 7) {
      case 0: relay.on_server_up(); break;
      case 1: relay.on_server_down(); break;
      case 2: relay.on_silo_up(silo); break;
      case 3: relay.on_silo_down(silo); break;
      case 4: relay.on_server_message(in.envelope("fed", relay.round())); break;
      case 5:
        if (in.u8() & 1) {
          broadcast_round(relay, in, last, last_sha);
        } else {
          relay.on_server_message(in.envelope("fed", relay.round()));
        }
        break;
      default: {
        // Every other chunk as the edge daemon reads it, its data a view of the frame (the
        // input's bytes are read the same either way, so the corpus keeps its meaning).
        wire::Envelope e = in.envelope("fed", relay.round());
        if (e.has_tensor_chunk() && (silo_chunks++ & 1)) {
          if (auto msg = proto::as_read(e)) {
            relay.on_silo_message(silo, *msg);
            break;
          }
        }
        relay.on_silo_message(silo, e);
        break;
      }
    }
    pump();
  }
  return 0;
}
