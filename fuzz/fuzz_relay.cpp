// The edge's relay: arbitrary messages from the server above and the silos below, with silos
// coming and going and the server reconnecting. Jobs (folds) run inline.
#include "edge_aggregator/relay.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace xsilo;
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
  while (in.more() && !relay.finished()) {
    const std::string silo = "silo-" + std::to_string(in.u8() % 4);
    switch (in.u8() % 7) {
      case 0: relay.on_server_up(); break;
      case 1: relay.on_server_down(); break;
      case 2: relay.on_silo_up(silo); break;
      case 3: relay.on_silo_down(silo); break;
      case 4:
      case 5: relay.on_server_message(in.envelope("fed", relay.round())); break;
      default: relay.on_silo_message(silo, in.envelope("fed", relay.round())); break;
    }
    pump();
  }
  return 0;
}
