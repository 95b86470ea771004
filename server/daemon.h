// `xsilo server`: the coordinator behind the TLS listener. One network thread runs Asio and
// the coordinator; CPU and disk work (folding updates, the optimizer step, checkpoints) runs
// on a worker thread and reports back to the network thread.
#pragma once

#include <optional>

#include "server/config.h"

namespace xsilo::server {

// What the operator decided at start (command-line flags, not config: they are one start's).
struct StartOptions {
  // Go on from this committed round although a later one is committed (its model lost, or
  // unwanted): the rounds after it are superseded, and an audit record says so.
  std::optional<std::uint64_t> resume_from_round;
};

// Runs until every round is done (exit 0, whatever rounds aborted), a fatal error (1) or
// SIGINT/SIGTERM (130). A config, port or state folder it cannot run with throws ConfigError
// (exit 2) before anything is written to the audit log.
int run_server(const ServerConfig& cfg, const StartOptions& start = {});

}  // namespace xsilo::server
