// `xsilo edge`: a regional aggregator. Downwards it speaks the server's protocol (a silo
// cannot tell an edge from the server); upwards it dials the server as an edge identity,
// announces the silos behind it, relays their round messages, passes the model through chunk
// by chunk, and sums its silos' updates so that one partial sum per round crosses the WAN.
// It holds the regional sum and one upload buffer: O(model), whatever the number of silos.
#pragma once

#include <memory>
#include <string>

#include "edge_aggregator/config.h"
#include "proto/xsilo.pb.h"

namespace xsilo::edge {

// Where a simulation reaches into an edge (a hostile edge, in tests): every message the edge
// sends to the server or to a silo passes through here first, and false drops it. (Upload
// streams do not.) The production edge runs without one.
class EdgeHook {
 public:
  virtual ~EdgeHook() = default;
  virtual bool to_server(wire::Envelope& /*e*/) { return true; }
  virtual bool to_silo(const std::string& /*silo*/, wire::Envelope& /*e*/) { return true; }
};

// Runs until the federation finishes (0), the server is unreachable for good (1), or a
// signal (130).
int run_edge(const EdgeConfig& cfg, std::unique_ptr<EdgeHook> hook = nullptr);

}  // namespace xsilo::edge
