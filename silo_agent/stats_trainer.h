// The federation's feature statistics, computed by a federation of their own before round 1
// (docs/bring-your-own-model.md, "Feature statistics"), so that no silo's own statistics leave it
// in the clear: each silo's contribution is its update, masked by secure aggregation like any.
//
// The "model" is two tensors of one value per feature, `feature_stats.mean` and
// `feature_stats.var`, zero at first; the server runs two rounds of FedAvg with learning rate 1,
// so each round's new model is the silos' mean of their local models, weighted by their row
// counts:
//   round 1: a silo's local model is (its rows' mean, 0): the new mean is the federation's mean;
//   round 2: (that mean, its rows' mean squared deviation from it): the new var is the
//            federation's variance (the population variance of all silos' rows).
// Two rounds rather than one of sums and sums of squares: a deviation from the federation's
// mean stays small in float32 and in the fixed-point ring where a square of a raw value would not.
#pragma once

#include "common/dataset.h"
#include "common/feature_stats.h"
#include "silo_agent/trainer.h"

namespace xsilo::agent {

inline constexpr const char* kStatsMean = "feature_stats.mean";
inline constexpr const char* kStatsVar = "feature_stats.var";

// The statistics federation's initial model: both tensors, [features], zero.
Model feature_stats_model(std::size_t features);
// The statistics after its second round (`model`), over `count` rows.
FeatureStats feature_stats_from(const Model& model, std::uint64_t count);

// trainer.kind "feature_stats": the silo's part of the statistics federation.
class FeatureStatsTrainer final : public Trainer {
 public:
  explicit FeatureStatsTrainer(Dataset train) : train_(std::move(train)) {}
  wire::TrainMetrics evaluate(const Model&, const TrainTask&) override { return {}; }
  TrainResult train(const Model& global, const TrainTask& task, Model& local) override;

 private:
  Dataset train_;
};

}  // namespace xsilo::agent
