// When the server commits: at the end of each synchronous round (the default), or, buffered
// (FedBuff, Nguyen et al., AISTATS 2022), whenever K updates have arrived, whatever model
// version each was trained on. Pure functions, no clock and no I/O.
//
// Buffered rounds. Model version v is the model committed by round v (version 0: the initial
// model). A silo trains on the newest version it holds, its base b, and uploads; when the update
// arrives while version v is the newest, its staleness is tau = v - b. An update with
// tau > max_staleness is refused (it is counted in the next commit's record, never folded).
// Every admitted update i carries w_i * delta_i and w_i (its sample weight) as in a synchronous
// round; the buffer folds s(tau_i) * w_i * delta_i with weight w_i, so the commit's step is
//
//     step = sum_i s(tau_i) w_i delta_i / sum_i w_i
//
// (FedBuff's (1/K) sum_i s(tau_i) delta_i, weighted by sample counts): a stale update moves the
// model less, and a buffer of stale updates makes a smaller step, instead of only redistributing
// weight among them. The server optimizer then takes the step as it takes a round's mean delta.
//
// Staleness functions s(tau), s(0) = 1 for each:
//   polynomial (default, FedBuff's): s(tau) = (1 + tau)^(-a), a = 0.5 unless set
//   constant:                        s(tau) = 1
//   hinge (FedAsync's):              s(tau) = 1 for tau <= b, else 1 / (a (tau - b) + 1)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace xsilo::server {

enum class ScheduleMode { Synchronous, Buffered };
enum class Staleness { Polynomial, Constant, Hinge };
std::string_view name(ScheduleMode m);
std::string_view name(Staleness s);

struct ScheduleConfig {
  ScheduleMode mode = ScheduleMode::Synchronous;
  std::size_t k = 0;                   // buffered: updates per commit (>= 1)
  std::uint64_t max_staleness = 0;     // buffered: S, the oldest base admitted is newest - S
  Staleness staleness = Staleness::Polynomial;
  double a = 0.5;                      // polynomial's exponent, hinge's slope
  std::uint64_t b = 0;                 // hinge's knee
  bool buffered() const { return mode == ScheduleMode::Buffered; }
};

// s(tau) as above: in (0, 1], non-increasing in tau.
double staleness_weight(const ScheduleConfig& c, std::uint64_t tau);

// Whether an update trained on version `base` may join the buffer while `newest` is the newest
// committed version: its staleness, or the sentence that refuses it (a base newer than the
// newest was never sent by this server, and is refused too).
struct Admission {
  bool admitted = false;
  std::uint64_t staleness = 0;
  std::string reason;  // when refused
};
Admission admit(const ScheduleConfig& c, std::uint64_t base, std::uint64_t newest);

// The config's "schedule" block as load_server_config reads it back (empty for synchronous).
nlohmann::json to_json(const ScheduleConfig& c);

}  // namespace xsilo::server
