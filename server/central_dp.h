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
  // What committed rounds have spent before this server started (rebuilt from the audit chain).
  privacy::Ledger spent;
};

// One committed round's mechanism: the subsampled Gaussian at (q, z).
privacy::Mechanism round_mechanism(const CentralDpConfig& c);
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
