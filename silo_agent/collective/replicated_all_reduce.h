// Stragglers inside a silo: gradient coding by fractional repetition (Tandon, Lei, Dimakis and
// Karampatziakis, "Gradient Coding", ICML 2017). With `s` stragglers to tolerate, the N ranks
// form G = floor(N / (s + 1)) groups, rank r in group r % G, so every group has at least s + 1
// members. All members of a group compute the gradient of the same rows (the group's share of
// the batch): any s ranks may be slow and every group still has a finisher, and the sum over
// the groups of any one finisher's gradient each is the whole batch's. The price is compute:
// each rank computes 1/G of the batch instead of 1/N, N/G (>= s + 1) times the work of plain
// data parallelism, summed over the ranks.
//
// The sum is exact in the sense that matters for training: the members of a group compute the
// same bits from the same rows and parameters, so the result does not depend on who finished
// first: a step with a delayed rank equals the step without it, bit for bit, on every rank.
//
// Per call, in each group (leader = its lowest rank, g; mates g + G, g + 2G, ...), over the
// group's links, every message a header of two floats [kind, rank] and, for PULL's answer and
// RESULT, the vector:
//
//   mate                                           leader
//   ready first: OFFER ------------------------->  first_ready(mates, own ready):
//                                                    its own ready first: takes its own;
//                <--------------------- PULL         an OFFER first: PULLs that mate's vector
//   its vector --------------------------------->    (the first one only)
//                                                  the leaders all-reduce (`across`) their
//                                                  groups' vectors; then to every mate:
//   (any state) <------------------ RESULT + sum
//   END ---------------------------------------->  reads each mate's OFFER (if any) and END
//
// A mate whose result arrives before its own gradient is ready never offers; the caller is
// told (`have_result`) so that it stops computing what is no longer needed. Each link carries
// the same messages in the same order whoever is slow, so the next call starts clean. A mate's
// gradient crosses its link only when it is the first of its group; the leader sends one copy
// of the sum to each of its m - 1 mates (m the group's size).
#pragma once

#include <cstddef>
#include <functional>
#include <span>

#include "silo_agent/collective/communicator.h"

namespace xsilo::collective {

// The number of groups of fractional repetition for `ranks` ranks tolerating `stragglers`
// slow ones: floor(ranks / (stragglers + 1)), at least 1. Rank r is in group r % groups.
int replica_groups(int ranks, int stragglers);

struct ReplicatedResult {
  int supplier = -1;  // the rank whose gradient stood for this rank's group
};

// `own`: this rank's copy of its group's gradient, which may still be in the making; it is read
// only once `own_ready()` has returned true (the caller publishes it with release semantics).
// On return `result` holds the sum over the groups, the same bits on every rank, and
// `have_result` has run once (as soon as this rank's group has a gradient, on a leader; when the
// sum arrives, on a mate). `across`: the leaders' all-reduce (the ring if null). Throws
// CollectiveError as the other algorithms do.
ReplicatedResult replicated_all_reduce(Mesh& mesh, int stragglers, std::span<const float> own,
                                       const std::function<bool()>& own_ready, std::span<float> result,
                                       std::size_t chunk_bytes, FlatAllReduce across,
                                       const std::function<void()>& have_result);

}  // namespace xsilo::collective
