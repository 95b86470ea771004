// The session's training part: a round's training as the worker thread runs it, from the model
// received (or, streamed, its hash) to the update ready to upload: the model checked against
// the SHA-256 its RoundStart announced, the trainer, the silo's momentum, a simulation's
// tamper hook, compression with its error feedback staged beside the silo's file, the update's
// hash. The session fills one of these on the network thread and queues it as an action::Job;
// it holds no session state, only what it was given.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/model.h"
#include "proto/xsilo.pb.h"
#include "silo_agent/session_types.h"
#include "silo_agent/trainer.h"

namespace xsilo::agent {

// A round whose whole model is held (global_).
struct TrainingJob {
  Trainer* trainer;
  FaultHook* hook;
  std::shared_ptr<Model> model;  // the round's global model
  TrainTask task;
  std::string sha;                // the SHA-256 the RoundStart announced ("" unchecked)
  std::shared_ptr<Model> spare;   // last round's update buffer, reused
  // The session's generation when the job was queued, and the live one: a job whose round moved
  // on before it started does nothing.
  std::shared_ptr<std::atomic<std::uint64_t>> live;
  std::uint64_t generation = 0;
  std::shared_ptr<std::optional<Model>> momentum;  // the silo's, across rounds (one job at a time)
  std::filesystem::path momentum_file;
  wire::Compression compression;  // the round's upload scheme
  bool secure = false;            // secure aggregation: random-k keeps the shared coordinates
  std::shared_ptr<std::optional<Model>> residual;  // the error feedback, across rounds
  std::filesystem::path residual_file;
  std::size_t chunk_bytes = 0;
  std::uint64_t seed = 0;  // the silo's own randomness for the encoding (drawn on the network thread)

  TrainDone operator()();
};

// A streamed round (Trainer::streams()): the model was hashed as it came and is not kept.
struct StreamedTrainingJob {
  Trainer* trainer;
  TrainTask task;
  std::string sha, received_sha;  // announced, and of the chunks received
  std::vector<TensorInfo> layout;
  std::shared_ptr<std::atomic<std::uint64_t>> live;
  std::uint64_t generation = 0;
  std::size_t chunk_elems = 0;

  TrainDone operator()();
};

}  // namespace xsilo::agent
