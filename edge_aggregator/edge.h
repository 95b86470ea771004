// `xsilo edge`: a regional aggregator. Downwards it speaks the server's protocol (a silo
// cannot tell an edge from the server); upwards it dials the server as an edge identity,
// announces the silos behind it, relays their round messages, passes the model through chunk
// by chunk, and sums its silos' updates so that one partial sum per round crosses the WAN.
// It holds the regional sum and one upload buffer: O(model), whatever the number of silos.
#pragma once

#include "edge_aggregator/config.h"

namespace xsilo::edge {

// Runs until the federation finishes (0), the server is unreachable for good (1), or a
// signal (130).
int run_edge(const EdgeConfig& cfg);

}  // namespace xsilo::edge
