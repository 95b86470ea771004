// The "nccl" backend: all-reduce, broadcast and barrier with NCCL between the GPUs of a silo's
// workers, one GPU per worker (worker rank r uses device r % devices). The communicator is
// non-blocking (ncclConfig_t.blocking = 0): every call is polled with ncclCommGetAsyncError
// against the step timeout, so a dead or stuck peer ends in ncclCommAbort and a
// CollectiveError instead of a hang. On re-formation the survivors shrink the old
// communicator (ncclCommShrink with NCCL_SHRINK_ABORT) rather than rebuilding from scratch.
//
// The rendezvous (the ncclUniqueId) travels over the workers' TCP mesh, which also stays as
// the group's control path. Built only where CUDA and NCCL are found; elsewhere creating one
// throws CollectiveError saying so.
#pragma once

#include <memory>
#include <vector>

#include "silo_agent/collective/communicator.h"

namespace xsilo::collective {

// `boot`: the TCP communicator of the same ranks. `previous`: the NCCL communicator of the
// group before it re-formed (or null) and the ranks it lost.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> boot, const Options& opts,
                                                     Communicator* previous = nullptr,
                                                     const std::vector<int>& excluded_ranks = {});

}  // namespace xsilo::collective
