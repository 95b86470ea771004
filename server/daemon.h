// `xsilo server`: the coordinator behind the TLS listener. One network thread runs Asio and
// the coordinator; CPU and disk work (folding updates, the optimizer step, checkpoints) runs
// on a worker thread and reports back to the network thread.
#pragma once

#include "server/config.h"

namespace xsilo::server {

// Runs until every round is done (exit 0), a fatal error (1) or SIGINT/SIGTERM (130).
int run_server(const ServerConfig& cfg);

}  // namespace xsilo::server
