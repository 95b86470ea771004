#include "silo_agent/stats_trainer.h"

#include <algorithm>

namespace xsilo::agent {

Model feature_stats_model(std::size_t features) {
  Model m;
  m.add(kStatsMean, {features});
  m.add(kStatsVar, {features});
  return m;
}

FeatureStats feature_stats_from(const Model& model, std::uint64_t count) {
  FeatureStats s;
  const auto mean = model.tensor(kStatsMean), var = model.tensor(kStatsVar);
  s.mean.assign(mean.begin(), mean.end());
  for (float v : var) s.var.push_back(std::max(0.0, static_cast<double>(v)));  // a fixed-point sum may round below 0
  s.count = count;
  return s;
}

TrainResult FeatureStatsTrainer::train(const Model& global, const TrainTask& task, Model& local) {
  const std::size_t d = train_.features;
  const auto* m = global.find(kStatsMean);
  const auto* v = global.find(kStatsVar);
  if (!m || !v || m->size() != d || v->size() != d || global.tensors().size() != 2) {
    throw TrainerError(wire::LOCAL_DATA_MISMATCH, "the statistics federation's model is not two tensors of " +
                                                      std::to_string(d) + " values (" + kStatsMean + ", " + kStatsVar +
                                                      "), one per feature of the silo's data");
  }
  if (train_.rows == 0) throw TrainerError(wire::TRAINER_NO_SAMPLES, "the silo has no training rows");
  std::copy(global.flat().begin(), global.flat().end(), local.flat().begin());
  auto mean = local.tensor(kStatsMean), var = local.tensor(kStatsVar);
  const auto n = static_cast<double>(train_.rows);
  if (task.round <= 1) {
    for (std::size_t j = 0; j < d; ++j) {
      double sum = 0;
      for (std::size_t i = 0; i < train_.rows; ++i) sum += train_.row(i)[j];
      mean[j] = static_cast<float>(sum / n);
    }
  } else {
    for (std::size_t j = 0; j < d; ++j) {
      double sq = 0;
      for (std::size_t i = 0; i < train_.rows; ++i) {
        const double c = train_.row(i)[j] - static_cast<double>(mean[j]);
        sq += c * c;
      }
      var[j] = static_cast<float>(sq / n);
    }
  }
  TrainResult out;
  out.num_samples = train_.rows;
  return out;
}

}  // namespace xsilo::agent
