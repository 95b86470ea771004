// `xsilo agent`: a silo's daemon. It dials out to its upstream (an edge or the server; it
// cannot tell which), receives each round's model, evaluates it on the local test split,
// trains on the local training data off the network thread, and uploads
// weight * (local model - global model) when the server grants it. It never listens.
#pragma once

#include <memory>

#include "common/dataset.h"
#include "common/model.h"
#include "proto/xsilo.pb.h"
#include "silo_agent/config.h"

namespace xsilo::agent {

struct LocalData {
  Dataset train, test;
  std::vector<HonestData> honest;  // simulated colluding attackers only
  std::filesystem::path workers_train;  // local.workers > 1: the prepared rows the workers read
};

// Loads and standardizes the local data as the config says.
LocalData load_local_data(const AgentConfig& cfg);

struct RoundOutput {
  std::shared_ptr<Model> update;   // weight * delta
  std::uint64_t num_samples = 0;
  double weight = 0;
  std::string sha256;              // of the update bytes as sent
  wire::TrainMetrics metrics;
};

// One silo's work in a round: evaluate `global`, train a copy, return the weighted delta.
// Pure: the multi-process tests compare daemons against this very function.
// `reuse`, when given and not shared, becomes the update buffer (no fresh allocation).
RoundOutput run_local_round(const AgentConfig& cfg, const LocalData& data, const Model& global,
                            const wire::TrainingPlan& plan, std::uint64_t round,
                            const std::string& silo, std::shared_ptr<Model> reuse = nullptr);

// Runs until the federation finishes (0), reconnects are exhausted (1), or a signal (130).
int run_agent(const AgentConfig& cfg);

}  // namespace xsilo::agent
