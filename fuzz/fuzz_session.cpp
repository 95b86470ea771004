// A silo agent's session: arbitrary messages from its upstream (a malicious edge can send
// anything), connections coming and going. A trainer that returns a fixed update stands in for
// training; jobs run inline. A RoundStart may carry a secure group the server signed (the
// complete graph or a SecAgg+ graph), so that what follows reaches the secure-aggregation
// handlers of a silo that takes part, and a compressed broadcast, its model whole or as a delta
// against the previous round's (the base the silo may or may not hold).
#include "crypto/hash.h"
#include "crypto/keys.h"
#include "fuzz/fuzz_input.h"
#include "protocol/compression.h"
#include "protocol/round_start.h"
#include "protocol/secagg_wire.h"
#include "protocol/tensor_stream.h"
#include "silo_agent/session.h"

namespace {

using namespace xsilo;

class FixedTrainer : public agent::Trainer {
 public:
  wire::TrainMetrics evaluate(const Model&, const agent::TrainTask&) override { return {}; }
  agent::TrainResult train(const Model& global, const agent::TrainTask&, Model& local) override {
    local = global;
    for (auto& v : local.flat()) v += 0.01f;
    agent::TrainResult r;
    r.num_samples = 10;
    return r;
  }
};

// silo-0 and 2-7 others, the complete graph or a ring of degree 2 or 4, signed by the server.
void add_secure_group(wire::RoundStart& rs, fuzz::Input& in, std::uint64_t round, std::size_t elements) {
  const auto& box = fuzz::server_box();
  const auto& pki = fuzz::pki();
  auto* s = rs.mutable_secagg();
  s->set_group(1);
  const std::uint32_t n = 3 + in.u8() % 6;
  for (std::uint32_t i = 0; i < n; ++i) s->add_members("silo-" + std::to_string(i));
  const std::uint32_t degree = n >= 5 && (in.u8() & 1) ? 2 + 2 * (in.u8() % ((n - 3) / 2)) : 0;
  s->set_degree(degree);
  if (degree) s->set_graph_seed(in.bytes(8));
  s->set_threshold(degree ? degree / 2 + 1 + in.u8() % (degree / 2 + 1) : n / 2 + 1);  // above half the holders
  s->set_min_survivors(s->threshold());
  s->set_modulus_bits(in.u8() & 1 ? 32 : 64);
  s->set_fraction_bits(16);
  s->set_vector_length(elements + 1);  // the weight coordinate after the update
  s->set_clip_norm(100);
  s->set_max_weight(1000);
  s->set_server_key(std::string(box.public_key.begin(), box.public_key.end()));
  s->set_server_certificate(pki.server.certificate());
  s->set_server_signature(pki.server.sign(protocol::setup_statement(*s, "fed", round)));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const auto& pki = fuzz::pki();
  agent::SessionConfig cfg;
  cfg.federation = "fed";
  cfg.chunk_bytes = 16u << in.u8() % 8;
  cfg.signer = pki.silo;
  cfg.ca = pki.ca;
  cfg.max_model_elements = fuzz::kMaxFuzzModel;
  // Groups of 3-8 with small thresholds, which the default floor refuses before any key: the
  // fuzzer goes past advertise() into the handlers behind it (the floor is tested on its own).
  cfg.floor = crypto::secagg::Floor{2, 0.0};
  FixedTrainer trainer;
  agent::FaultHook hook;
  agent::Session session(cfg, trainer, hook);
  auto pump = [&] {
    for (int guard = 0; guard < 64; ++guard) {
      auto actions = session.take_actions();
      if (actions.empty()) return;
      for (auto& a : actions) {
        if (auto* j = std::get_if<agent::action::Job>(&a)) session.on_job_done(j->id, j->work());
        if (auto* s = std::get_if<agent::action::SendStream>(&a)) {
          for (int k = 0; k < 1024; ++k) {
            if (!s->source->next()) break;
          }
        }
      }
    }
  };
  session.on_connected("silo-0", "127.0.0.1:1", in.u8() & 1 ? "server" : "edge-0", "server server");
  pump();
  std::uint64_t round = 0;
  std::shared_ptr<Model> last;  // the model of the last RoundStart, a broadcast's base
  std::string last_sha;
  while (in.more() && !session.finished()) {
    switch (in.u8() % 8) {
      case 0:
        session.on_disconnected();
        pump();
        session.on_connected("silo-0", "127.0.0.1:1", "server", "server server");
        break;
      case 1:
      case 2: {  // a RoundStart the server signed (so that the session gets past its checks), then its model
        round = in.u8();
        auto model = std::make_shared<Model>(fuzz::small_model());
        for (auto& v : model->flat()) v = in.u8() & 1 ? in.f32() : 0.5f;
        wire::Envelope e;
        e.set_federation("fed");
        e.set_round(round);
        auto* rs = e.mutable_round_start();
        rs->set_round(round);
        const std::string plan = in.bytes(in.u8());
        (void)rs->mutable_plan()->ParseFromString(plan);
        protocol::add_layout(*rs, model->tensors());
        // A compressed broadcast: the model whole, or as a delta against the last one sent
        // (which the session holds if it trained on it and said so), against the base named.
        const std::uint8_t how = in.u8();
        std::shared_ptr<const std::vector<wire::TensorChunk>> delta;
        if (how & 2) {
          wire::Compression b;
          b.set_scheme(wire::Compression::QUANTIZE);
          b.set_bits(how & 16 ? 4 : 8);
          b.set_block(8);
          *rs->mutable_broadcast() = b;
          rs->set_base_sha256(how & 4 ? last_sha : "0");
          if ((how & 8) && last && last->same_layout(*model)) {
            delta = std::make_shared<const std::vector<wire::TensorChunk>>(
                protocol::encode_model_delta(b, last->flat(), model->flat(), model->tensors(), 4, in.u8()).chunks);
          }
        }
        const std::string sha = crypto::sha256_hex(model->flat());
        rs->set_model_sha256(how & 1 ? sha : "0");
        if (in.u8() & 1) add_secure_group(*rs, in, round, model->size());
        protocol::sign_round_start(*rs, pki.server, "fed");
        session.on_message(e);
        pump();
        auto src = delta ? protocol::ChunkSource(delta, "fed", round)
                         : protocol::ChunkSource(model, model->flat(), model->tensors(), "fed", round, 4 * (1 + in.u8() % 8));
        while (auto c = src.next()) session.on_message(*c);
        last = model;
        last_sha = sha;
        break;
      }
      default: session.on_message(in.envelope("fed", in.u8() & 1 ? round : in.u8())); break;
    }
    pump();
  }
  return 0;
}
