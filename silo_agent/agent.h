// `xsilo agent`: a silo's daemon. It dials out to its upstream (an edge or the server; it cannot
// tell which), and runs the silo's Session on the connection: each round's model in, the
// trainer's update (clipped, encoded, masked when the round is secure) out when the server
// grants it. It never listens.
#pragma once

#include <memory>

#include "silo_agent/config.h"
#include "silo_agent/session.h"
#include "silo_agent/trainer.h"

namespace xsilo::agent {

// What a simulation swaps in: another trainer, a fault hook. Empty: the configured trainer and
// no faults (production).
struct AgentHooks {
  std::unique_ptr<Trainer> trainer;
  std::unique_ptr<FaultHook> faults;
};

// The trainer the config names (the built-in one loads the silo's data now).
std::unique_ptr<Trainer> make_trainer(const AgentConfig& cfg);

// Runs until the federation finishes (0), reconnects are exhausted or the trainer failed for
// good (1), or a signal (130).
int run_agent(const AgentConfig& cfg, AgentHooks hooks = {});

}  // namespace xsilo::agent
