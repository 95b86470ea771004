// The session's masking part: a secure round's update as the worker thread masks it, once both
// the update and the group's share deliveries are here: the update encoded in the setup's fixed
// point (RANDOM_K: only the round's shared coordinates), a simulation's encoding hooks, the
// member's masks added (one PRG expansion per group member), the masked words' hash. Like the
// training job, the session fills one on the network thread and queues it as an action::Job; it
// holds no session state, only what it was given.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/model.h"
#include "crypto/noise.h"
#include "proto/xsilo.pb.h"
#include "silo_agent/secure/member.h"
#include "silo_agent/session_types.h"

namespace xsilo::agent {

struct MaskingJob {
  std::shared_ptr<secure::Member> member;  // the round's secure client (the worker holds it meanwhile)
  wire::SecAggSetup setup;                 // as the server signed it: the encoding's parameters
  std::shared_ptr<Model> update;           // weight * delta
  double weight = 0;
  std::shared_ptr<const std::vector<std::uint64_t>> kept;  // secure RANDOM_K: the coordinates sent
  FaultHook* hook;
  std::uint64_t seed = 0;  // the silo's own randomness for the encoding (drawn on the network thread)
  // Distributed DP (setup.skellam): the key of the silo's Skellam noise and rounding, from its
  // own random source (drawn on the network thread); never known to the server.
  crypto::NoiseSource::Key noise_key{};

  MaskDone operator()() const;
};

}  // namespace xsilo::agent
