// The agent's side of the trainer protocol (silo_agent/trainer_protocol.h): any bytes a
// trainer writes to its socket, cut into pieces anywhere, and every message that frames through
// the checks of a hello, a task's answer, a train result and an evaluate result.
#include "fuzz/fuzz_input.h"
#include "silo_agent/trainer_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace tp = xsilo::agent::trainer_protocol;
  xsilo::fuzz::Input in(data, size);
  const std::uint64_t task_id = in.u8();
  tp::Reader reader;
  while (in.more()) {
    reader.feed(in.bytes(1 + in.u8()));
    std::string error;
    while (auto message = reader.next(error)) {
      if (!message->is_object()) __builtin_trap();  // the reader hands on objects only
      std::int64_t protocol = 0;
      (void)tp::check_hello(*message, protocol);
      (void)tp::check_result(*message, task_id);
      tp::TrainAnswer answer;
      if (tp::parse_train_answer(*message, "/dev/shm/xsilo-exchange", answer) &&
          answer.weights.parent_path() != "/dev/shm/xsilo-exchange") {
        __builtin_trap();  // a weights file outside the exchange folder must be refused
      }
      (void)tp::parse_eval_metrics(*message);
    }
    if (!error.empty()) {
      std::string again;
      if (reader.next(again) || again != error) __builtin_trap();  // a broken stream stays broken
      break;
    }
  }
  return 0;
}
