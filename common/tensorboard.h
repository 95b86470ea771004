// TensorBoard event files: the round metrics as scalars that `tensorboard --logdir DIR` plots
// and its reader (EventAccumulator) reads back. A file is a TFRecord stream (each record: its
// length, a masked CRC-32C of the length, the bytes, a masked CRC-32C of the bytes) of
// serialized `tensorflow.Event` messages: the first names the file version, each later one
// holds one step's scalars (`Summary.Value{tag, simple_value}`).
//
// The three messages are encoded here by hand (a dozen bytes of protobuf wire format each, the
// field numbers of tensorflow/core/util/event.proto and summary.proto) rather than by pulling
// protobuf and TensorFlow's schema into xsilo_common.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xsilo {

// CRC-32C (Castagnoli), as TFRecord frames use it.
std::uint32_t crc32c(std::string_view bytes);

class TensorBoardWriter {
 public:
  // Creates `dir` and a new events.out.tfevents.<seconds>.<host>.<pid>.xsilo file in it.
  // Throws std::runtime_error naming the file when it cannot be written.
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  // One step's scalars (tag -> value), stamped with the current wall time; flushed at once so
  // that a running TensorBoard sees each round as it ends.
  void write(std::int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  const std::filesystem::path& file() const { return file_; }

 private:
  void record(const std::string& event);
  std::filesystem::path file_;
  std::ofstream out_;
};

}  // namespace xsilo
