// Silo-level differential privacy, distributed mode (issue 42 item 2; docs/privacy.md): under
// secure aggregation, each silo adds its share of Skellam noise to its clipped, rotated, scaled
// and rounded update inside the masked ring (crypto/skellam.h), so the sum the server unmasks
// already carries the whole noise and nobody, the server included, sees a less noisy value.
//
//   step = (1 / W) (sum_{i in round} clip_C(delta_i) + Skellam noise / gamma)
//
// as in central mode (server/central_dp.h): every silo weighs 1, W is the fixed denominator.
//
// Parameters, all in the signed secure setup (what a silo does) and the audit record:
//   P       the rotated length, the next power of two >= d (the model's coordinates).
//   gamma   the scale before rounding: chosen (choose_gamma) as the largest for which the sum fits
//           the mechanism's ring 2^bits with probability >= 1 - kWrapFailure a round. Tail bound:
//           a coordinate of the sum is sum_i (gamma y_ij + e_ij) + Z_j, |e_ij| < 1 (rounding),
//           y_ij a coordinate of silo i's rotated vector (norm <= C) and Z_j the noise.
//           Hoeffding over the random signs: P(|y_ij| > k C / sqrt(P)) <= 2 exp(-k^2 / 2); the
//           silos' coordinates may be aligned, so their sum is bounded by n times the largest.
//           Z_j is Skellam of variance V <= 2 mu (n / n_min < 2: a group's threshold is more than
//           half its members), a difference of Poissons: Bernstein, P(|Z_j| > t) <= 2 exp(-t^2 /
//           (2 (V + t / 3))). With the failure split in two halves, a union bound over the n P
//           rotated coordinates and the P noise coordinates:
//             n (gamma C k / sqrt(P) + 1) + t <= 2^(bits - 1) - 1,
//             k = sqrt(2 ln(4 n P / b)), t = L / 3 + sqrt(L^2 / 9 + 2 L V), L = ln(4 P / b),
//           b = kWrapFailure. A config whose bits cannot hold gamma C above the rounding's own
//           noise (gamma C >= sqrt(P)) is refused with the numbers.
//   Delta_2 = rounded_l2_bound(gamma C, P, beta), Delta_1 = min(sqrt(P) Delta_2, Delta_2^2).
//   mu      the Skellam variance of the sum of the n_min least silos a group may reveal:
//           (z Delta_2)^2, z the noise multiplier (the noise's standard deviation over the L2
//           sensitivity, as in central mode), chosen from (epsilon, delta, rounds) by bisection
//           on the Skellam RDP. Each of a group's members adds mu / n_min, n_min its setup's
//           min_survivors, so any sum the protocol reveals carries at least mu: dropouts cannot
//           weaken it.
// One round is privacy::SkellamSum{Delta_1, Delta_2, mu} at the parameters its setups signed
// (as_signed), whatever the config says; a committed round spends, and so does an aborted one
// whose noisy sums were unmasked (the server saw them), and any round whose unmasking began (the
// server asked for unmask shares: UnmaskingWatch), its record written or not; the spend is rebuilt from the audit
// chain at start, as in central mode.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "crypto/skellam.h"
#include "privacy/accountant.h"
#include "proto/xsilo.pb.h"
#include "protocol/secagg_wire.h"

namespace xsilo::server {

inline constexpr double kWrapFailure = 1e-6;
// Adaptive clipping with `rounds`: z is chosen so that the planned rounds spend at most epsilon
// (1 - kPlanMargin), so that C's moving (rounds composed one by one, gamma' C an ulp below gamma C)
// never refuses a planned round by a rounding.
inline constexpr double kPlanMargin = 1e-9;

struct DistributedDpConfig {
  double epsilon = 0;
  double delta = 1e-5;
  double clip_norm = 1.0;         // C
  double noise_multiplier = 0;    // z (chosen from the rounds unless fixed)
  std::uint64_t rounds = 0;       // the rounds z was chosen for (0: z fixed)
  double denominator = 0;         // W
  std::uint32_t bits = 20;        // the mechanism's ring 2^bits
  std::uint32_t ring = 32;        // the masking ring (secure.bits)
  double beta = 0.6065306597126334;  // conditional rounding, e^-0.5
  std::size_t max_group = 0;      // the most silos one group's sum may hold (n)
  // Adaptive clipping (aggregation.adaptive_clip): each member also encodes a count word, +-h
  // whether its delta was within C, noised like every coordinate (crypto/skellam.h step 7).
  // `count_stddev` is sigma_b, the count's noise asked for in count units (0: the default,
  // default_count_stddev as in central mode); clip_norm is then the first round's C.
  bool counts_unclipped = false;
  double count_stddev = 0;
  // Set by finalize_distributed_dp once the model's size is known:
  std::size_t dim = 0;            // d
  std::size_t padded = 0;         // P
  double gamma = 0;
  double variance = 0;            // mu
  std::uint64_t count_scale = 0;  // h (adaptive clipping; 0: no count word)
  privacy::Ledger spent;
  bool ready() const { return padded > 0 && gamma > 0 && variance > 0; }
};

// Delta_2 and Delta_1 at a gamma.
double distributed_l2(const DistributedDpConfig& c, double gamma);
double distributed_l1(const DistributedDpConfig& c, double gamma);
// One committed round: SkellamSum{Delta_1, Delta_2, mu}; with the count word of scale h, the
// same Skellam vector one word longer: SkellamSum{Delta_1 + h, sqrt(Delta_2^2 + h^2), mu}.
privacy::Mechanism round_mechanism(const DistributedDpConfig& c);
// The round's noise multiplier, sqrt(mu) over the round's L2 sensitivity (the whole vector's, the
// count word included): what records, `xsilo status` and the start's log call noise_multiplier;
// c.noise_multiplier is the update's (update_noise_multiplier there when there is a count word).
double round_noise_multiplier(const DistributedDpConfig& c);
// The count's standard deviation in count units, sqrt(mu) / (2 h) (0 without a count word): at
// least the configured sigma_b (h = floor(sqrt(mu) / (2 sigma_b)), at least 1), below (h + 1) / h
// times it.
double count_noise_stddev(const DistributedDpConfig& c);
// The round's parameters at adaptive clipping's clip norm C: gamma C stays what it was chosen
// for (gamma' = gamma clip_norm / C, the largest whose product with C is not above gamma
// clip_norm: the same product for most C, an ulp below it for the rest), so the integer sum, its
// ring and its mechanism are the same whatever C is, never costlier; only what one integer means
// moves with C.
DistributedDpConfig at_clip_norm(DistributedDpConfig c, double clip_norm);
bool fits_another_round(const DistributedDpConfig& c, const privacy::Ledger& spent);
// The smallest z for which `rounds` rounds at (l1, l2) stay within (epsilon, delta).
double skellam_noise_multiplier_for(double epsilon, double delta, double l1, double l2, std::uint64_t rounds);
// Under RANDOM_K: a decoded sum over the kept coordinates (kept.size() values, then the count)
// spread over the model's d coordinates, zero elsewhere (d values, then the count).
std::vector<double> spread_kept(std::vector<double> decoded, const std::vector<std::uint64_t>& kept, std::size_t d);
// Sets dim, padded, gamma, z (when chosen from the rounds) and mu for d encoded coordinates,
// and with counts_unclipped h: z is then the update's multiplier, and the round's, of the vector
// and the count together, is (z^-2 + (2 sigma_b)^-2)^-1/2 (the central formula): with `rounds`,
// the round's is what lasts them, as in central mode. Throws std::invalid_argument with the
// numbers when the ring cannot hold it, or when sigma_b leaves no room for the update's noise.
void finalize_distributed_dp(DistributedDpConfig& c, std::size_t d);
// The largest value one coordinate of a sum may reach with probability >= 1 - kWrapFailure.
double ring_reach(const DistributedDpConfig& c, double gamma, double variance);

// What a member of a group of `min_survivors` adds: SkellamParams for its encoding.
crypto::SkellamParams skellam_params(const DistributedDpConfig& c, std::uint32_t min_survivors,
                                     std::uint64_t rotation_seed);

// The setup part every member of a round encodes with (signed with the setup): c's parameters.
wire::SkellamSetup signed_part(const DistributedDpConfig& c, std::uint64_t rotation_seed);
// A round's parameters as its signed setup part `k` states them (P: the setup's vector_length - 1),
// with the budget's delta, epsilon and denominator from `budget`: what the round spends and what
// its record states, whatever the server's config says (a deviating server that signs less noise
// than it is configured for is charged, and recorded, for the noise it signed).
DistributedDpConfig as_signed(const DistributedDpConfig& budget, const wire::SkellamSetup& k, std::size_t padded);
// A round's "privacy" part: the signed parameters (as_signed), the rotation seed and
// "setup_sha256" (protocol::skellam_sha256 of the signed part), and the spend so far.
nlohmann::json round_privacy_record(const DistributedDpConfig& budget, const wire::SkellamSetup& k, std::size_t padded,
                                    const privacy::Ledger& spent);
// A record whose distributed-DP parameters are not the signed setup it names, that names none, or
// that closes an unmask_begun record of another setup: the round would be charged at another
// setup than the one the silos were sent. Distinct from a spend that cannot be read, so that
// `xsilo audit verify` says which it is.
class SetupMismatch : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The mechanism a distributed-DP record states (nullopt for a record with no skellam part); it is
// recomputed from gamma, C, P, beta and mu, never read from the record's own sensitivities, and
// only once bits, gamma, mu, C, beta and the rotation seed hash to the record's setup_sha256
// (else SetupMismatch: the record's parameters are not those the silos were sent; a missing or
// malformed field is std::invalid_argument, and so is a stated noise_multiplier, l1 or l2, or with
// a count word count_stddev or update_noise_multiplier, that is not the recomputed one within a
// relative 1e-9, naming the field).
std::optional<privacy::Mechanism> recorded_skellam_mechanism(const nlohmann::json& record);
// The same, for a round that spent: committed, or aborted after unmasking a noisy sum (its
// privacy part's "sums_revealed" > 0); nullopt for any other record.
std::optional<privacy::Mechanism> distributed_mechanism_of(const nlohmann::json& record);
// Either silo-level mode's mechanism (central_mechanism_of or distributed_mechanism_of): what the
// recovery and the audit check compose.
std::optional<privacy::Mechanism> silo_level_mechanism_of(const nlohmann::json& record);

// A round whose unmasking began. Before it asks any silo for unmask shares (the survivor set
// that starts the unmasking, then the unmask requests), the server writes an "unmask_begun"
// record durably (the round, the signed parameters and setup_sha256 in its "privacy" part, with
// the spend were the round charged): from then on the server may hold shares that unmask a noisy
// sum, so the round spent, whatever becomes of it. Read in the log's order: the round record of
// the same round that follows closes it and is charged once (committed, or aborted: an abort after
// the unmasking began is charged whether or not it revealed a sum, as its record states); an
// unmask_begun record that none follows (the log ends, the server started again, or another
// round's record or unmasking comes first) spent as if committed: nobody can say no sum was seen.
// What the recovery and the audit check add to silo_level_mechanism_of's.
inline constexpr const char* kUnmaskBegun = protocol::kUnmaskBegun;
// A charge the watch adds: the round of an unmask_begun and its mechanism.
struct UnmaskCharge {
  std::uint64_t round = 0;
  privacy::Mechanism mechanism;
  // True: no round record closed it (interrupted). False: its round record closed it, aborted,
  // and does not charge itself (no sum revealed): the unmask_begun charges the round.
  bool interrupted = true;
};
class UnmaskingWatch {
 public:
  // The log's next record: the charge of an earlier round whose unmasking this record shows was
  // interrupted, or of this record's own round when it closes an unmask_begun and charges nothing
  // itself (to charge now), or nullopt. Throws SetupMismatch for an unmask_begun record whose
  // parameters are not the setup it names, or that names none, and for a round record that
  // closes an unmask_begun of its round but names another setup (the silos were sent one setup,
  // the round would be charged at another).
  std::optional<UnmaskCharge> take(const nlohmann::json& record);
  // At the log's end: the unmasking no round record closed (to charge), or nullopt.
  std::optional<privacy::Mechanism> open() const;
  // The round of that open unmasking (0: none).
  std::uint64_t open_round() const { return begun_ ? begun_->round : 0; }
  // Whether `record` closes the open unmask_begun (a round record of its round).
  bool closes(const nlohmann::json& record) const;

 private:
  struct Begun {
    std::uint64_t round = 0;
    privacy::Mechanism mechanism;
    std::string setup;  // the setup_sha256 it names
  };
  std::optional<Begun> begun_;
};

}  // namespace xsilo::server
