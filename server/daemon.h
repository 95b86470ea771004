// `xsilo server`: the coordinator behind the TLS listener. One network thread runs Asio and
// the coordinator; CPU and disk work (folding updates, the optimizer step, checkpoints) runs
// on a worker thread and reports back to the network thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "proto/xsilo.pb.h"
#include "server/config.h"

namespace xsilo::server {

// What the operator decided at start (command-line flags, not config: they are one start's).
struct StartOptions {
  // Go on from this committed round although a later one is committed (its model lost, or
  // unwanted): the rounds after it are superseded, and an audit record says so.
  std::optional<std::uint64_t> resume_from_round;
};

// Where a simulation reaches into the server (a deviating server, in tests: docs/security.md):
// every message the server sends to a silo, directly or through its edge, passes through
// to_silo first (false drops it), every message from a silo through from_silo before the
// coordinator sees it, and what take_out() returns is sent to those silos by the route their
// last message came in on. (Model streams do not pass.) The production server
// runs without one.
class ServerHook {
 public:
  virtual ~ServerHook() = default;
  virtual bool to_silo(const std::string& /*silo*/, wire::Envelope& /*e*/) { return true; }
  virtual void from_silo(const std::string& /*silo*/, const wire::Envelope& /*e*/) {}
  virtual std::vector<std::pair<std::string, wire::Envelope>> take_out() { return {}; }
};

// Runs until every round is done (exit 0, whatever rounds aborted), a fatal error (1) or
// SIGINT/SIGTERM (130). A config, port or state folder it cannot run with throws ConfigError
// (exit 2) before anything is written to the audit log.
int run_server(const ServerConfig& cfg, const StartOptions& start = {}, std::unique_ptr<ServerHook> hook = nullptr);

}  // namespace xsilo::server
