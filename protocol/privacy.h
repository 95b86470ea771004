// Record-level differential privacy as it travels and is recorded (docs/privacy.md): a round's
// DP-SGD spend (wire::PrivacySpend), the same in JSON (a line of the silo's sent.jsonl, a
// participant of an audit record), and the epsilon of a silo's rounds recomputed from their
// parameters by the accountant (privacy/accountant.h): what a silo enforces its budget with and
// what `xsilo audit verify` checks a record's claim against.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "proto/xsilo.pb.h"

namespace xsilo::protocol {

// The mechanism name of DP-SGD in a PrivacySpend: Poisson-subsampled Gaussian steps.
inline constexpr const char* kDpSgd = "dp_sgd";

nlohmann::json privacy_json(const wire::PrivacySpend& p);
// Throws std::invalid_argument, naming the key, when `j` is not a spend (an unknown mechanism, a
// sample rate outside (0, 1], a noise multiplier <= 0, a count of steps of 0, delta outside
// (0, 1), a missing key).
wire::PrivacySpend privacy_from_json(const nlohmann::json& j);
// The same checks on a spend that came over the wire: success when it is well formed.
Status check_privacy(const wire::PrivacySpend& p);

// The (epsilon, delta)-DP of the rounds `spends` run one after another: each is `steps` steps of
// the subsampled Gaussian at its sample rate and noise multiplier, composed by RDP.
double dp_sgd_epsilon(std::span<const wire::PrivacySpend> spends, double delta);

// A silo's DP-SGD rounds composed one at a time (what dp_sgd_epsilon() gives for all of them,
// without replaying the earlier rounds at each new one).
class DpSgdAccount {
 public:
  DpSgdAccount();
  ~DpSgdAccount();
  DpSgdAccount(DpSgdAccount&&) noexcept;
  DpSgdAccount& operator=(DpSgdAccount&&) noexcept;
  void add(const wire::PrivacySpend& round);
  double epsilon(double delta) const;
  std::size_t rounds() const { return rounds_; }

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::size_t rounds_ = 0;
};

// The smallest noise multiplier (to a relative 1e-6, rounded up) for which `rounds` more rounds of
// `steps` steps at rate q, after `spent`, keep epsilon at most max_epsilon; 0 when no noise
// multiplier up to 1e4 does.
double dp_sgd_noise_for(std::span<const wire::PrivacySpend> spent, double q, std::uint64_t steps,
                        std::uint64_t rounds, double max_epsilon, double delta);

}  // namespace xsilo::protocol
