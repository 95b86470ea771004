// The server's round coordinator: connections, disconnections, timers and arbitrary messages
// from silos and edges (every envelope the network can carry, plus well-formed uploads with
// hostile values so that the fuzzer gets past the first checks), in plain, robust and secure
// rounds. Jobs run inline, as the daemon's worker would run them.
#include "fuzz/fuzz_input.h"
#include "protocol/tensor_stream.h"
#include "server/coordinator.h"
#include "crypto/hash.h"

namespace {

using namespace xsilo;
using namespace xsilo::server;

// As the server writes records and status: bytes that are not UTF-8 are replaced, not fatal.
std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

class NullStore : public Store {
 public:
  AuditHead commit(std::uint64_t, const Model&, const Model&, const nlohmann::json& rec, const MetricsRow&) override {
    (void)dump(rec);
    return {.seq = ++seq, .sha256 = "h", .signature = "s", .line = {}};
  }
  AuditHead record(const nlohmann::json& rec, const MetricsRow*) override {
    (void)dump(rec);
    return {.seq = ++seq, .sha256 = "h", .signature = "s", .line = {}};
  }
  std::uint64_t seq = 0;
};

constexpr SessionId kSilos = 4, kEdge = 10;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const auto& pki = fuzz::pki();
  RoundConfig cfg;
  cfg.federation = "fed";
  cfg.rounds = 1 + in.u8() % 3;
  cfg.ca = pki.ca;
  cfg.signer = pki.server;
  cfg.any_silo = false;
  for (SessionId i = 0; i < kSilos; ++i) cfg.expected_silos.insert("silo-" + std::to_string(i));
  cfg.selection.min_silos = 2;
  cfg.selection.min_updates = 1 + in.u8() % 2;
  switch (in.u8() % 4) {
    case 0: break;  // FedAvg
    case 1:
      cfg.aggregation.rule.rule = robust::Rule::Median;
      cfg.aggregation.clip_norm = 1.0;
      break;
    case 2:
      cfg.secure.mode = SecureMode::Global;
      cfg.secure.min_group = 2;
      break;
    default:
      cfg.aggregation.rule.rule = robust::Rule::Krum;
      cfg.aggregation.rule.f = 1;
      cfg.aggregation.adaptive_clip.quantile = 0.5;
      break;
  }
  const Model initial = fuzz::small_model();
  NullStore store;
  Coordinator coord(cfg, initial, ServerOptimizer({}, initial), store, 1);
  std::int64_t now = 1'700'000'000'000;
  auto pump = [&] {
    for (int guard = 0; guard < 64; ++guard) {
      auto actions = coord.take_actions();
      if (actions.empty()) return;
      for (auto& a : actions) {
        if (auto* j = std::get_if<action::Job>(&a)) coord.on_job_done(j->id, j->work(), now);
        if (auto* b = std::get_if<action::Background>(&a)) b->work();
      }
    }
  };
  coord.start(now);
  pump();
  while (in.more()) {
    const SessionId who = 1 + in.u8() % (kEdge + 1);  // 1..4 silos, 10 an edge, the rest strangers
    switch (in.u8() % 9) {
      case 0: coord.on_connect(who, "silo-" + std::to_string((who - 1) % kSilos), now); break;
      case 1: coord.on_edge_connect(kEdge, "edge-0", now); break;
      case 2: coord.on_disconnect(who, now); break;
      case 3:
        coord.on_timer(static_cast<Timer>(in.u8() % 5), now);
        pump();
        (void)dump(coord.status(now));  // an operator reads the status as a phase ends
        break;
      case 4: now += in.u16(); break;
      case 5: {  // an UpdateReady for this round
        wire::Envelope e;
        e.set_federation("fed");
        e.set_round(coord.round());
        e.mutable_update_ready()->set_num_samples(in.u8());
        if (who == kEdge) e.set_silo("silo-" + std::to_string(in.u8() % kSilos));
        coord.on_message(who, e, now);
        break;
      }
      case 6: {  // a whole upload of the model's layout, values from the input, then UpdateEnd
        auto m = std::make_shared<Model>(initial.zeros_like());
        for (auto& v : m->flat()) v = in.f32();
        protocol::ChunkSource src(m, m->flat(), m->tensors(), "fed", coord.round(), 4 * (1 + in.u8() % 8));
        while (auto e = src.next()) coord.on_message(who, *e, now);
        wire::Envelope end;
        end.set_federation("fed");
        end.set_round(coord.round());
        auto* u = end.mutable_update_end();
        u->set_weight(static_cast<double>(in.f32()));
        u->set_update_sha256(in.u8() & 1 ? crypto::sha256_hex(m->flat()) : in.bytes(8));
        if (who == kEdge) {
          auto* c = u->add_contributors();
          c->set_silo("silo-" + std::to_string(in.u8() % kSilos));
          c->set_weight(static_cast<double>(in.f32()));
          c->set_num_samples(in.u8());
        }
        coord.on_message(who, end, now);
        break;
      }
      default: coord.on_message(who, in.envelope("fed", coord.round()), now); break;
    }
    pump();
  }
  // And at the end. Not after every step: writing it took two fifths of each input's time.
  (void)dump(coord.status(now));
  return 0;
}
