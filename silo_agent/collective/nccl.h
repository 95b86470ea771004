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
//
// Starting with `agree` (intra_host "auto": NCCL where it starts, the mesh where it does not),
// the start is three steps, each ended by a vote of every rank over `agree` (a min over the TCP
// mesh), so that all ranks take the same path whoever fails: (1) the device and its stream, (2)
// the unique id (rank 0 broadcasts it with whether it has one), (3) the communicator's init,
// waited for half the step timeout (a rank that failed earlier waits in the vote for the whole
// step timeout, so the slowest reaches it in time). A step that fails on any rank releases what
// this rank made and throws NcclUnavailable on every rank alike.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "silo_agent/collective/communicator.h"

namespace xsilo::collective {

// NCCL did not start on every rank; `agree` said so to all of them.
class NcclUnavailable : public CollectiveError {
 public:
  explicit NcclUnavailable(const std::string& why) : CollectiveError(why, -1) {}
};

// Every rank's vote: true when every rank passed true (a collective: all ranks call it).
using Agree = std::function<bool(bool mine)>;

// `boot`: the TCP communicator of the same ranks. `previous`: the NCCL communicator of the
// group before it re-formed (or null) and the ranks it lost. `agree`: see above (not with
// `previous`: a shrink is not voted on).
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> boot, const Options& opts,
                                                     Communicator* previous = nullptr,
                                                     const std::vector<int>& excluded_ranks = {},
                                                     const Agree& agree = {});

}  // namespace xsilo::collective
