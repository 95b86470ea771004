// Collectives between the local workers of one silo: all-reduce (sum, min, max or product),
// broadcast, barrier on float32 spans. Backends: "ring" (scatter-reduce + all-gather over TCP,
// ours), "hd" (recursive halving-doubling over TCP, ours), "tree" (pipelined binary-tree reduce
// and broadcast), "butterfly" (recursive doubling), "hierarchical" (a ring inside each host, a
// ring across the hosts' leaders), "auto" (hd below a size threshold, ring above) and "nccl" (GPU). Every algorithm is written against Mesh, a small vocabulary (send to
// a peer while receiving from another, chunk by chunk), never against a socket.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "silo_agent/collective/reduce_op.h"

namespace xsilo::collective {

// A collective failed: a peer vanished or did not answer within the step timeout. The
// communicator is unusable afterwards; the group re-forms without the failed rank.
class CollectiveError : public std::runtime_error {
 public:
  CollectiveError(const std::string& what, int peer) : std::runtime_error(what), peer_(peer) {}
  int peer() const { return peer_; }  // the rank that failed us, -1 if unknown

 private:
  int peer_;
};

// This worker is out of the group for good: excluded by the coordinator, or the coordinator is
// gone. Retrying cannot help.
class GroupEnded : public CollectiveError {
 public:
  explicit GroupEnded(const std::string& what) : CollectiveError(what, -1) {}
};

struct PeerAddress {
  std::string host;
  std::uint16_t port = 0;
};

// Point-to-point links between every pair of ranks.
class Mesh {
 public:
  virtual ~Mesh() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where incoming bytes land: for the stream offset `offset`, a buffer of at most `want`
  // bytes (shorter at a boundary the caller cares about, such as the end of a segment).
  using Landing = std::function<std::span<std::uint8_t>(std::size_t offset, std::size_t want)>;
  using OnChunk = std::function<void(std::size_t offset, std::size_t length)>;
  // An outgoing byte stream that may still be in the making: `at(o)` is the contiguous run
  // of bytes from stream offset o, `ready()` how many bytes from the start may go out now.
  struct Outgoing {
    std::size_t total = 0;
    std::function<std::span<const std::uint8_t>(std::size_t offset)> at;
    std::function<std::size_t()> ready;
  };
  // Sends `out` to `dst` while receiving `in_bytes` from `src` (either side may be empty), in
  // chunks of at most `chunk` bytes: each chunk lands where `land` says, then `on_chunk` runs
  // on it, so the caller reduces one chunk while the next is on the wire, and what it
  // finishes may be sent on at once. Throws CollectiveError when a peer fails or stays silent
  // for the step timeout.
  virtual void stream(int dst, const Outgoing& out, int src, std::size_t in_bytes, std::size_t chunk,
                      const Landing& land, const OnChunk& on_chunk) = 0;
  // The common case: the outgoing bytes are all ready.
  void exchange(int dst, std::span<const std::uint8_t> out, int src, std::size_t in_bytes, std::size_t chunk,
                const Landing& land, const OnChunk& on_chunk) {
    Outgoing o{dst < 0 ? 0 : out.size(), [out](std::size_t off) { return out.subspan(off); },
               [n = dst < 0 ? 0 : out.size()] { return n; }};
    stream(dst, o, src, in_bytes, chunk, land, on_chunk);
  }
  // Waits until `local_done()` is true (returns -1; checked first) or one of `peers` has bytes
  // to read or has closed its link (returns that peer; the read that follows says which).
  // There is no timeout: the caller's local work ends, or is cut short, on its own, and a dead
  // peer is seen as readable. For the replicated all-reduce (replicated_all_reduce.h), whose
  // groups take whichever copy of a gradient is ready first; a mesh that cannot wait on several
  // peers at once throws std::logic_error.
  virtual int first_ready(std::span<const int> peers, const std::function<bool()>& local_done);
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;
  // In-place reduction over all ranks, element by element; every rank ends with the same
  // values, bit for bit.
  virtual void all_reduce(std::span<float> data, Op op) = 0;
  void all_reduce(std::span<float> data) { all_reduce(data, Op::sum); }
  void all_reduce_mean(std::span<float> data);
  virtual void broadcast(std::span<float> data, int root) = 0;
  virtual void barrier() = 0;
  // The point-to-point links under a TCP communicator, for algorithms other than these (the
  // 8-bit all-reduce of silo_agent/quantized_all_reduce.h); null for NCCL.
  virtual Mesh* mesh() { return nullptr; }
};

// Segment k of n elements cut into `parts` pieces whose sizes differ by at most one: (begin,
// length). The ring's segments, and those of any algorithm that splits the work the same way.
std::pair<std::size_t, std::size_t> segment(std::size_t n, std::size_t parts, std::size_t k);

// The algorithms, usable on any Mesh. Each leaves every rank with op over all ranks' data.
// Ring: 2(N - 1) pipelined steps, each rank sends 2(N - 1)/N of the data (bandwidth-optimal).
void ring_all_reduce(Mesh& mesh, std::span<float> data, std::size_t chunk_bytes, Op op = Op::sum);
// Halving-doubling: 2 log2(p) steps, the ring's bytes. Below `doubling_bytes` it runs the
// butterfly instead: half the steps, each one latency-bound anyway.
void halving_doubling_all_reduce(Mesh& mesh, std::span<float> data, std::size_t chunk_bytes, Op op = Op::sum,
                                 std::size_t doubling_bytes = 64u << 10);
// Butterfly (recursive doubling on a hypercube): log2(p) steps, each swapping the whole vector
// with the partner r ^ 2^k; the N - p extra ranks of a count that is not a power of two fold
// into partners first and get the result back at the end (two more steps).
void butterfly_all_reduce(Mesh& mesh, std::span<float> data, std::size_t chunk_bytes, Op op = Op::sum);
// Tree: reduce up a binary tree to rank 0, then broadcast down it, each in pieces of
// `chunk_bytes` that follow one another through the levels: 2 floor(log2 N) levels for a small
// vector, any N.
void tree_all_reduce(Mesh& mesh, std::span<float> data, std::size_t chunk_bytes, Op op = Op::sum);
void tree_broadcast(Mesh& mesh, std::span<float> data, int root, std::size_t chunk_bytes);

// Which host each rank runs on. Hosts are numbered in the order of their lowest rank; a host's
// first rank is its leader.
class HostLayout {
 public:
  // host_of[r]: any label, equal for the ranks of one host.
  explicit HostLayout(std::span<const int> host_of);
  std::size_t ranks() const { return host_.size(); }
  std::size_t hosts() const { return members_.size(); }
  std::size_t host(int rank) const { return host_.at(static_cast<std::size_t>(rank)); }
  const std::vector<int>& members(std::size_t host) const { return members_.at(host); }
  const std::vector<int>& leaders() const { return leaders_; }

 private:
  std::vector<std::size_t> host_;
  std::vector<std::vector<int>> members_;
  std::vector<int> leaders_;
};
// Any of the algorithms above, as the hierarchical all-reduce runs it among the leaders.
using FlatAllReduce = void (*)(Mesh&, std::span<float>, std::size_t, Op);
// The algorithms the leaders may run across hosts: ring, hd, tree, butterfly.
const std::vector<std::string>& across_host_algorithms();
FlatAllReduce across_host_algorithm(const std::string& name);  // std::invalid_argument if unknown

// Hierarchical: reduce inside each host (the ring's scatter-reduce, then each segment to the
// host's leader), `across` among the leaders across hosts (the ring by default: bandwidth-
// optimal; the tree or the butterfly for small vectors over high-latency links), then a
// pipelined chain broadcast inside each host. Only the leaders use the inter-host links. Any N,
// any host sizes. `inside`: the host's ranks' own communicator (NCCL between the host's GPUs),
// which then does phases 1 and 3 instead of the mesh: its all-reduce leaves the host's partial
// on every rank of the host, and after phase 2 it broadcasts the leader's result.
void hierarchical_all_reduce(Mesh& mesh, std::span<float> data, const HostLayout& hosts, std::size_t chunk_bytes,
                             Op op = Op::sum, FlatAllReduce across = nullptr, Communicator* inside = nullptr);

// The backends make_tcp_communicator takes: ring, hd, tree, butterfly, hierarchical, auto.
const std::vector<std::string>& tcp_backends();

struct Options {
  std::string backend = "auto";                  // tcp_backends() or nccl
  std::size_t chunk_bytes = 1u << 20;            // pipelining unit of the ring
  std::size_t hd_threshold_bytes = 256u << 10;   // auto: hd below, ring from here on
  std::chrono::milliseconds step_timeout{10000};
  // hierarchical: ranks r / ranks_per_host share a host (tests and benchmarks on one machine);
  // 0: ranks whose peers' addresses are equal share a host.
  std::size_t ranks_per_host = 0;
  // hierarchical: the algorithm among the hosts' leaders (across_host_algorithms()).
  std::string across_hosts = "ring";
  // hierarchical: inside each host, "tcp" (the mesh), "nccl" (NCCL between the host's GPUs, one
  // per worker; CollectiveError where the host has fewer GPUs than workers or the build has no
  // CUDA) or "auto" (NCCL where the build has CUDA and every worker of the host sees at least as
  // many GPUs as the host has workers, agreed among them when the communicator forms; else tcp;
  // and tcp too when NCCL then fails to start on any worker of the host: make_nccl_communicator's
  // `agree`).
  std::string intra_host = "tcp";
  // Tests: the GPUs each worker counts as visible in intra_host's agreement, instead of asking
  // CUDA (-1). On a machine without GPUs, "auto" then goes on to start NCCL and must fall back.
  int assume_gpus = -1;
  // false: a Group hands out the address table only (peers(), listen_fd()) and forms no
  // communicator; the gossip links (gossip_links.h) form their own.
  bool communicator = true;
};
const std::vector<std::string>& intra_host_transports();  // tcp, nccl, auto

// The host layout a TCP communicator's hierarchical all-reduce uses: ranks r / ranks_per_host
// share a host, or, with ranks_per_host 0, ranks whose addresses are equal.
HostLayout host_layout(const std::vector<PeerAddress>& peers, std::size_t ranks_per_host);

// A communicator over TCP: rank r listens (the caller bound `listen_fd`), connects to the
// lower ranks and accepts the higher ones. Throws CollectiveError when the mesh cannot form.
std::unique_ptr<Communicator> make_tcp_communicator(int rank, const std::vector<PeerAddress>& peers, int listen_fd,
                                                    const Options& opts);

// Binds a listening socket on host:0 and returns (fd, port).
std::pair<int, std::uint16_t> listen_any(const std::string& host);

}  // namespace xsilo::collective
