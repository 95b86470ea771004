// Mesh over TCP with Boost.Asio: one connection per pair of ranks, one io_context driven by
// the calling thread, every exchange bounded by the step timeout.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <algorithm>
#include <cerrno>
#include <thread>

#include <spdlog/spdlog.h>

#include "silo_agent/collective/communicator.h"
#include "silo_agent/collective/exchange.h"
#include "silo_agent/collective/failure_policy.h"
#include "silo_agent/collective/gpu_info.h"
#include "silo_agent/collective/nccl.h"

namespace xsilo::collective {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

std::pair<int, std::uint16_t> listen_any(const std::string& host) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw CollectiveError("cannot create a socket", -1);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    ::close(fd);
    throw CollectiveError("cannot listen on " + host + ": not an IPv4 address", -1);
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 64) != 0) {
    ::close(fd);
    throw CollectiveError("cannot listen on " + host, -1);
  }
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return {fd, ntohs(a.sin_port)};
}

namespace detail {

namespace {

// Closes the descriptors gathered so far when forming the links fails half-way.
struct FdGuard {
  std::vector<int>& fds;
  bool keep = false;
  ~FdGuard() {
    if (keep) return;
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
};

}  // namespace

std::vector<int> connect_peers(int rank, const std::vector<PeerAddress>& peers, int listen_fd,
                               std::chrono::milliseconds timeout) {
  const int size = static_cast<int>(peers.size());
  std::vector<int> fds(peers.size(), -1);
  FdGuard guard{fds};
  asio::io_context io;
  const auto deadline = Clock::now() + timeout;
  // Connect to every lower rank (retrying while it starts), then accept every higher one.
  for (int peer = 0; peer < rank; ++peer) {
    for (;;) {
      tcp::socket s(io);
      boost::system::error_code ec;
      s.connect({asio::ip::make_address(peers[static_cast<std::size_t>(peer)].host), peers[static_cast<std::size_t>(peer)].port}, ec);
      if (!ec) {
        const std::uint32_t me = static_cast<std::uint32_t>(rank);
        asio::write(s, asio::buffer(&me, 4), ec);
        if (!ec) {
          fds[static_cast<std::size_t>(peer)] = s.release();
          break;
        }
      }
      if (Clock::now() > deadline) throw CollectiveError("rank " + std::to_string(peer) + " is unreachable", peer);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Accept the higher ranks with plain poll + accept: a one-time step, bounded by the deadline.
  for (int k = rank + 1; k < size; ++k) {
    int fd = -1;
    while (fd < 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) throw CollectiveError("a higher rank did not connect in time", -1);
      pollfd p{listen_fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000))) > 0) {
        fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      }
    }
    tcp::socket s(io);
    s.assign(tcp::v4(), fd);
    std::uint32_t who = 0;
    boost::system::error_code ec;
    asio::read(s, asio::buffer(&who, 4), ec);
    if (ec || who <= static_cast<std::uint32_t>(rank) || who >= static_cast<std::uint32_t>(size) || fds[who] >= 0) {
      throw CollectiveError("unexpected connection while forming the mesh", -1);
    }
    fds[who] = s.release();
  }
  guard.keep = true;
  return fds;
}

}  // namespace detail

namespace {

class TcpMesh : public Mesh {
 public:
  TcpMesh(int rank, const std::vector<PeerAddress>& peers, int listen_fd, std::chrono::milliseconds timeout)
      : rank_(rank), size_(static_cast<int>(peers.size())), timeout_(timeout) {
    socks_.resize(peers.size());
    const auto fds = detail::connect_peers(rank, peers, listen_fd, timeout);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      auto s = std::make_unique<tcp::socket>(io_);
      s->assign(tcp::v4(), fds[static_cast<std::size_t>(peer)]);
      setup(*s);
      socks_[static_cast<std::size_t>(peer)] = std::move(s);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // The hot path works on the sockets' native handles with poll(2): one non-blocking send and
  // one recv per ready event, no handler allocations, so a 4 KiB exchange costs a few
  // syscalls and the big ones run at the speed of the kernel's copies.
  void stream(int dst, const Outgoing& out, int src, std::size_t in_bytes, std::size_t chunk, const Landing& land,
              const OnChunk& on_chunk) override {
    const std::size_t out_total = dst < 0 ? 0 : out.total;
    std::size_t sent = 0, got = (src < 0) ? in_bytes : 0;
    const int out_fd = dst < 0 ? -1 : socks_.at(static_cast<std::size_t>(dst))->native_handle();
    const int in_fd = src < 0 ? -1 : socks_.at(static_cast<std::size_t>(src))->native_handle();
    std::size_t chunk_start = got, chunk_len = 0;
    std::uint8_t* landing = nullptr;
    StepDeadline deadline(timeout_, Clock::now());
    int spins = 0;
    while (sent < out_total || got < in_bytes) {
      // Try both directions first; poll only when neither can move.
      bool moved = false;
      const std::size_t ready = sent < out_total ? std::min(out_total, out.ready()) : out_total;
      if (sent < ready) {
        const auto run = out.at(sent);
        const std::size_t len = std::min(run.size(), ready - sent);
        const ssize_t n = ::send(out_fd, run.data(), len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
          sent += static_cast<std::size_t>(n);
          moved = true;
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          fail(dst, "closed its connection");
        }
      } else if (sent < out_total && got == in_bytes) {
        throw std::logic_error("collective stream: outgoing bytes wait on input that will never come");
      }
      if (got < in_bytes) {
        if (!landing) {
          chunk_start = got;
          const auto where = land(chunk_start, std::min(chunk, in_bytes - got));
          chunk_len = where.size();
          landing = where.data();
        }
        const std::size_t have = got - chunk_start;
        const ssize_t n = ::recv(in_fd, landing + have, chunk_len - have, MSG_DONTWAIT);
        if (n > 0) {
          got += static_cast<std::size_t>(n);
          moved = true;
          if (got - chunk_start == chunk_len) {
            on_chunk(chunk_start, chunk_len);
            landing = nullptr;
          }
        } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          fail(src, "closed its connection");
        }
      }
      if (moved) {
        deadline.moved(Clock::now());
        spins = 0;
        continue;
      }
      // Small messages arrive within microseconds: yield a few times before sleeping in poll.
      if (spins++ < kSpins) {
        ::sched_yield();
        continue;
      }
      pollfd fds[2];
      nfds_t count = 0;
      if (sent < ready) fds[count++] = {out_fd, POLLOUT, 0};
      if (got < in_bytes) fds[count++] = {in_fd, POLLIN, 0};
      const auto left = deadline.left(Clock::now()).count();
      if (left <= 0 || (::poll(fds, count, static_cast<int>(left)) == 0 && deadline.expired(Clock::now()))) {
        const int peer = got < in_bytes ? src : dst;
        fail(peer, "did not answer within " + std::to_string(timeout_.count()) + " ms");
      }
    }
  }

  int first_ready(std::span<const int> peers, const std::function<bool()>& local_done) override {
    std::vector<pollfd> fds;
    for (int p : peers) fds.push_back({socks_.at(static_cast<std::size_t>(p))->native_handle(), POLLIN, 0});
    // The local side has no descriptor: look at it between polls of 100 us (a step's compute is
    // milliseconds; a peer's bytes wake the poll at once).
    const timespec slice{0, 100000};
    for (;;) {
      if (local_done()) return -1;
      const int n = ::ppoll(fds.data(), fds.size(), &slice, nullptr);
      if (n < 0 && errno != EINTR) fail(-1, "poll failed");
      for (std::size_t i = 0; n > 0 && i < fds.size(); ++i) {
        if (fds[i].revents != 0) return peers[i];
      }
    }
  }

 private:
  // A failed exchange closes every link, so that the peers fail fast too instead of waiting
  // for their own timeouts, and the group re-forms.
  [[noreturn]] void fail(int peer, const std::string& what) {
    for (auto& s : socks_) {
      boost::system::error_code ec;
      if (s) s->close(ec);
    }
    throw CollectiveError("rank " + std::to_string(peer) + " " + what, peer);
  }

  static void setup(tcp::socket& s) {
    s.set_option(tcp::no_delay(true));
    s.set_option(asio::socket_base::send_buffer_size(4 << 20));
    s.set_option(asio::socket_base::receive_buffer_size(4 << 20));
    s.non_blocking(true);
  }

  static constexpr int kSpins = 64;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  asio::io_context io_;
  std::vector<std::unique_ptr<tcp::socket>> socks_;
};

// The all-reduce a TCP communicator runs; "auto" picks hd or ring by size.
enum class Algorithm { ring, hd, tree, butterfly, hierarchical, automatic };

Algorithm parse_algorithm(const std::string& backend) {
  if (backend == "ring") return Algorithm::ring;
  if (backend == "hd") return Algorithm::hd;
  if (backend == "tree") return Algorithm::tree;
  if (backend == "butterfly") return Algorithm::butterfly;
  if (backend == "hierarchical") return Algorithm::hierarchical;
  if (backend == "auto") return Algorithm::automatic;
  std::string known;  // "nccl": see nccl.h
  for (const auto& b : tcp_backends()) known += (known.empty() ? "" : ", ") + b;
  throw std::invalid_argument("TCP backends are " + known + ", not " + backend);
}

}  // namespace

HostLayout host_layout(const std::vector<PeerAddress>& peers, std::size_t ranks_per_host) {
  std::vector<int> labels;
  std::vector<std::string> seen;
  for (std::size_t r = 0; r < peers.size(); ++r) {
    if (ranks_per_host > 0) {
      labels.push_back(static_cast<int>(r / ranks_per_host));
      continue;
    }
    auto it = std::find(seen.begin(), seen.end(), peers[r].host);
    if (it == seen.end()) it = seen.insert(seen.end(), peers[r].host);
    labels.push_back(static_cast<int>(it - seen.begin()));
  }
  return HostLayout(labels);
}

namespace {

// Some ranks of a mesh as a communicator of their own (the ring, the binomial broadcast): the
// bootstrap of an NCCL communicator among a host's workers, whose unique id it carries.
class SubMeshCommunicator : public Communicator {
 public:
  SubMeshCommunicator(Mesh& parent, std::vector<int> ranks, int me, std::size_t chunk_bytes)
      : mesh_(parent, std::move(ranks), me), chunk_bytes_(chunk_bytes) {}
  int rank() const override { return mesh_.rank(); }
  int size() const override { return mesh_.size(); }
  std::string backend() const override { return "ring"; }
  using Communicator::all_reduce;
  void all_reduce(std::span<float> data, Op op) override { ring_all_reduce(mesh_, data, chunk_bytes_, op); }
  void broadcast(std::span<float> data, int root) override { tree_broadcast(mesh_, data, root, chunk_bytes_); }
  void barrier() override {
    float one = 1;
    butterfly_all_reduce(mesh_, std::span<float>(&one, 1), chunk_bytes_);
  }
  Mesh* mesh() override { return &mesh_; }

 private:
  detail::SubMesh mesh_;
  std::size_t chunk_bytes_;
};

// The NCCL communicator among this rank's host's workers that the hierarchical all-reduce runs
// its intra-host phases on, or null where they stay on the mesh (Options::intra_host). A host
// of one worker has nothing to do inside; under "auto" the host's workers agree (a min over
// their GPU counts on the mesh) so that all of them take the same path.
std::unique_ptr<Communicator> intra_host_communicator(Mesh& mesh, const HostLayout& hosts, const Options& opts) {
  const auto& names = intra_host_transports();
  if (std::find(names.begin(), names.end(), opts.intra_host) == names.end()) {
    throw std::invalid_argument("inside a host the hierarchical all-reduce runs on tcp, nccl or auto, not " + opts.intra_host);
  }
  const auto& mine = hosts.members(hosts.host(mesh.rank()));
  const auto m = mine.size();
  if (opts.intra_host == "tcp" || m == 1) return nullptr;
  const auto gpu = gpu_info();
  if (opts.intra_host == "auto" && !gpu.built) return nullptr;  // the same binary everywhere: no word needed
  const int local = static_cast<int>(std::find(mine.begin(), mine.end(), mesh.rank()) - mine.begin());
  auto boot = std::make_unique<SubMeshCommunicator>(mesh, mine, local, opts.chunk_bytes);
  float devices = static_cast<float>(opts.assume_gpus >= 0 ? opts.assume_gpus : gpu.devices);
  if (gpu.built) boot->all_reduce(std::span<float>(&devices, 1), Op::min);
  if (devices < static_cast<float>(m)) {
    if (opts.intra_host == "auto") return nullptr;
    throw CollectiveError("NCCL inside a host takes one GPU per worker: this host has " + std::to_string(m) +
                              " workers and " + (gpu.built ? std::to_string(static_cast<int>(devices)) + " GPU(s) visible to each of them"
                                                           : std::string("this build has no CUDA/NCCL")),
                          -1);
  }
  if (opts.intra_host == "nccl") return make_nccl_communicator(std::move(boot), opts);
  // "auto": NCCL where it starts on every worker of the host, the mesh where it does not. The
  // votes run on a second view of the same host's links (the same ranks make the same calls in
  // the same order, so the two never interleave).
  auto votes = std::make_shared<SubMeshCommunicator>(mesh, mine, local, opts.chunk_bytes);
  const Agree agree = [votes](bool mine_ok) {
    float ok = mine_ok ? 1.0f : 0.0f;
    votes->all_reduce(std::span<float>(&ok, 1), Op::min);
    return ok == 1.0f;
  };
  try {
    return make_nccl_communicator(std::move(boot), opts, nullptr, {}, agree);
  } catch (const NcclUnavailable& e) {
    spdlog::warn("local all-reduce: {}; this host's workers reduce over TCP instead (intra_host auto)", e.what());
    return nullptr;
  }
}

class TcpCommunicator : public Communicator {
 public:
  TcpCommunicator(int rank, const std::vector<PeerAddress>& peers, int listen_fd, const Options& opts)
      : opts_(opts),
        algorithm_(parse_algorithm(opts.backend)),
        across_(across_host_algorithm(opts.across_hosts)),
        mesh_(rank, peers, listen_fd, opts.step_timeout),
        hosts_(host_layout(peers, opts.ranks_per_host)),
        inside_(algorithm_ == Algorithm::hierarchical ? intra_host_communicator(mesh_, hosts_, opts_) : nullptr) {}
  int rank() const override { return mesh_.rank(); }
  int size() const override { return mesh_.size(); }
  std::string backend() const override { return opts_.backend; }
  using Communicator::all_reduce;
  void all_reduce(std::span<float> data, Op op) override {
    auto algorithm = algorithm_;
    if (algorithm == Algorithm::automatic) {
      algorithm = data.size() * sizeof(float) < opts_.hd_threshold_bytes ? Algorithm::hd : Algorithm::ring;
    }
    switch (algorithm) {
      case Algorithm::ring: return ring_all_reduce(mesh_, data, opts_.chunk_bytes, op);
      case Algorithm::hd: return halving_doubling_all_reduce(mesh_, data, opts_.chunk_bytes, op);
      case Algorithm::tree: return tree_all_reduce(mesh_, data, opts_.chunk_bytes, op);
      case Algorithm::butterfly: return butterfly_all_reduce(mesh_, data, opts_.chunk_bytes, op);
      case Algorithm::hierarchical:
        return hierarchical_all_reduce(mesh_, data, hosts_, opts_.chunk_bytes, op, across_, inside_.get());
      case Algorithm::automatic: break;
    }
  }
  void broadcast(std::span<float> data, int root) override { tree_broadcast(mesh_, data, root, opts_.chunk_bytes); }
  void barrier() override {
    float one = 1;
    butterfly_all_reduce(mesh_, std::span<float>(&one, 1), opts_.chunk_bytes);
  }
  Mesh* mesh() override { return &mesh_; }

 private:
  Options opts_;
  Algorithm algorithm_;  // before mesh_: a backend that is not ours is refused before the mesh forms
  FlatAllReduce across_;  // and so is an algorithm across hosts
  TcpMesh mesh_;
  HostLayout hosts_;
  std::unique_ptr<Communicator> inside_;  // hierarchical: NCCL among this host's workers, or null
};

}  // namespace

std::unique_ptr<Communicator> make_tcp_communicator(int rank, const std::vector<PeerAddress>& peers, int listen_fd,
                                                    const Options& opts) {
  return std::make_unique<TcpCommunicator>(rank, peers, listen_fd, opts);
}

}  // namespace xsilo::collective
