// Silo-level differential privacy, central mode (issue 42 item 2; docs/privacy.md): the server,
// trusted with every silo's update, bounds each silo's influence on a round's step and adds
// Gaussian noise to the step, so that the released models say little about any one silo's
// participation (its whole data set). DP-FedAvg (McMahan, Ramage, Talwar, Zhang, ICLR 2018,
// "Learning differentially private recurrent language models"), with the fixed denominator:
//
//   step = (1 / W) sum_{i in round} clip_C(delta_i) + N(0, (z C / W)^2 I)
//
//   clip_C(v) = v min(1, C / ||v||_2): every silo's update, whatever its sample count, weighs 1.
//   W, the denominator: fixed by the config (the expected participants), never the number of
//     updates that arrived, which depends on who took part.
//   Sensitivity: adding or removing one silo changes the sum by one clipped vector, of norm at
//     most C, so the step moves by at most C / W in L2; the noise's standard deviation is z times
//     that. The step is the Gaussian mechanism with noise multiplier z (RDP alpha / (2 z^2) a
//     round, privacy/rdp.h at q = 1), whatever W is: W scales signal and noise alike.
//   Fewer updates than W (dropouts) shrink the step by n / W; more (W below the round's size)
//     enlarge it. Neither changes the guarantee.
//   Sample rate q: 1. The rounds' selection is drawn from the federation's seed (in the config)
//     and the audit log names each round's participants, so who took part is no secret and no
//     amplification by subsampling is claimed; q is recorded so that a later mode that samples
//     in secret can claim it, and the audit check composes whatever q a record states.
//
// Adaptive clipping under central DP (aggregation.adaptive_clip; Andrew, Thakkar, McMahan,
// Ramaswamy, NeurIPS 2021, "Differentially Private Learning with Adaptive Clipping"): C is the
// round's, and the server also releases the count of unclipped updates with its own noise,
//
//   b~ = (sum_i (b_i - 1/2) + N(0, sigma_b^2)) / W + 1/2,   b_i = [||delta_i|| <= C],
//   C <- C exp(-lr (b~ - quantile))
//
// The centred bits move the released sum by 1/2 when a silo is added or removed, so the pair
// (step, count) is one Gaussian mechanism on the concatenated vector, of noise multiplier
//
//   z_round = (z^-2 + (2 sigma_b)^-2)^-1/2     (the paper's Theorem 1; in RDP: the sum of
//                                               alpha / (2 z^2) and alpha / (2 (2 sigma_b)^2))
//
// z, the update's own multiplier (`noise_multiplier`), is derived from the z_round the budget
// allows (`rounds`) and sigma_b (`count_stddev`), so the federation spends exactly its budget.
//
// The noise comes from crypto::NoiseSource under a fresh key each round from the round's random
// source (RoundConfig::sources: the daemon gives the system's), never from the federation seed
// (which anyone with the config knows).
//
// Only committed rounds spend: an aborted round releases no model. The spend of every committed
// round is in its audit record ("privacy"); the server rebuilds it from the audit chain when it
// starts (every committed record, those an operator's resume superseded included: their models
// were released), and `xsilo audit verify` recomposes it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "crypto/noise.h"
#include "privacy/accountant.h"

namespace xsilo::server {

struct CentralDpConfig {
  double epsilon = 0;           // the federation's budget (> 0)
  double delta = 1e-5;
  double clip_norm = 1.0;       // C
  double noise_multiplier = 0;  // z (chosen from epsilon, delta and rounds when the config gives rounds)
  std::uint64_t rounds = 0;     // the rounds z was chosen for (0: z fixed by the config)
  double denominator = 0;       // W (>= 1)
  double sample_rate = 1.0;     // q: see above
  // sigma_b, the standard deviation of adaptive clipping's unclipped count (0: C is fixed, no
  // count is released). clip_norm is then the first round's C.
  double count_stddev = 0;
  // What committed rounds have spent before this server started (rebuilt from the audit chain).
  privacy::Ledger spent;
};

// One committed round's mechanism: the subsampled Gaussian at (q, z), or at (q, z_round) when
// the round also releases the unclipped count.
privacy::Mechanism round_mechanism(const CentralDpConfig& c);
// z_round = (z^-2 + (2 sigma_b)^-2)^-1/2 (z itself when sigma_b is 0): the step and the count
// together.
double round_noise_multiplier(double z, double count_stddev);
// The update's z that, with the count's sigma_b, makes z_round. Throws std::invalid_argument
// when 2 sigma_b <= z_round (the count alone would spend the round's budget).
double update_noise_multiplier(double z_round, double count_stddev);
// sigma_b when the config gives none: the paper's W / 20, but never so little that the count
// takes more than a tenth of a round's RDP ((z_round / (2 sigma_b))^2 <= 1/10; at 10 silos the
// paper's 0.5 would cost more than the update itself at any useful epsilon).
double default_count_stddev(double denominator, double z_round);
// z C / W: the standard deviation of each coordinate's noise.
double noise_stddev(const CentralDpConfig& c);
// The epsilon of a ledger at `delta`.
double epsilon_of(const privacy::Ledger& spent, double delta);
// Whether one more committed round keeps the spend within the budget.
bool fits_another_round(const CentralDpConfig& c, const privacy::Ledger& spent);
// The noise multiplier that lasts `rounds` rounds within (epsilon, delta).
double noise_multiplier_for_rounds(double epsilon, double delta, double sample_rate, std::uint64_t rounds);

// A committed round's "privacy" record part, `spent` including the round itself.
// A silo-level round's "privacy" part: the mechanism's own `fields`, and what every mode states
// alike (level, mechanism, delta, the epsilon spent so far, the budget and the rounds spent).
nlohmann::json silo_level_record(const char* mechanism, nlohmann::json fields, double delta, double max_epsilon,
                                 const privacy::Ledger& spent);
nlohmann::json round_privacy_record(const CentralDpConfig& c, const privacy::Ledger& spent);
// The mechanism a round record states, when it is a committed central-DP round (nullopt for any
// other record). Throws std::invalid_argument when its privacy part cannot be read.
std::optional<privacy::Mechanism> central_mechanism_of(const nlohmann::json& record);

// Adds N(0, stddev^2) to every coordinate of `step`, drawn from `noise`.
void add_gaussian_noise(std::span<float> step, double stddev, crypto::NoiseSource& noise);

}  // namespace xsilo::server
