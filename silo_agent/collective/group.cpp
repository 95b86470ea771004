#include "silo_agent/collective/group.h"

#include "silo_agent/collective/failure_policy.h"
#include "silo_agent/collective/nccl.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <sstream>

namespace xsilo::collective {

namespace {

void send_line(int fd, const std::string& line) {
  const std::string s = line + "\n";
  std::size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

// Next complete line from fd (blocking), or nullopt on EOF.
std::optional<std::string> read_line(int fd, std::string& buffer) {
  for (;;) {
    const auto nl = buffer.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      return line;
    }
    char tmp[4096];
    const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) return std::nullopt;
    buffer.append(tmp, static_cast<std::size_t>(n));
  }
}

int connect_to(const std::string& host, std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  for (int attempt = 0; attempt < 500; ++attempt) {
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::close(fd);
  throw CollectiveError("cannot reach the workers' coordinator at " + host + ":" + std::to_string(port), -1);
}

}  // namespace

// ---- coordinator ----------------------------------------------------------------------------

Coordinator::Coordinator(int expected, std::chrono::milliseconds grace, const std::string& host, int backups,
                         Membership membership)
    : expected_(expected), backups_(backups), grace_(grace), membership_(membership) {
  auto [fd, port] = listen_any(host);
  listen_fd_ = fd;
  port_ = port;
  thread_ = std::thread([this] { loop(); });
}

Coordinator::~Coordinator() {
  stop_ = true;
  thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, w] : workers_) {
    if (w.fd >= 0) ::close(w.fd);
  }
  ::close(listen_fd_);
}

void Coordinator::on_excluded(std::function<void(const std::vector<int>&)> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  on_excluded_ = std::move(fn);
}

std::vector<int> Coordinator::members() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;
  for (const auto& [id, w] : workers_) {
    if (w.member) out.push_back(id);
  }
  return out;
}

std::vector<int> Coordinator::gone() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gone_;
}

std::vector<int> Coordinator::silent(std::chrono::milliseconds quiet) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  std::vector<int> ids;
  for (const auto& [id, w] : workers_) {
    // Waiting for the table is not a stall: quiet counts from the table at the earliest.
    if (w.member && w.fd >= 0 && !w.done && epoch_ >= 0 && now - std::max(w.heard, table_at_) >= quiet) {
      ids.push_back(id);
    }
  }
  return ids;
}

void Coordinator::broadcast_table(std::uint64_t resume) {
  const int epoch = epoch_ + 1;
  std::ostringstream line;
  std::vector<int> ids;
  for (const auto& [id, w] : workers_) {
    if (w.member) ids.push_back(id);
  }
  line << "TABLE " << epoch << " " << resume << " " << ids.size();
  for (int id : ids) line << " " << id << " " << workers_[id].host << " " << workers_[id].port;
  for (int id : ids) send_line(workers_[id].fd, line.str());
  for (auto& [id, w] : workers_) w.failed_op.reset();
  epoch_ = epoch;
  table_at_ = std::chrono::steady_clock::now();
  failure_since_.reset();
}

// The first table goes out once every member and every standby has joined, or once every
// member has and the standbys still missing have had `grace` to come: a standby that never
// starts must not hold the training back. One that comes later still stands by.
void Coordinator::maybe_start() {
  if (epoch_ >= 0) return;
  const auto members = std::count_if(workers_.begin(), workers_.end(), [](const auto& w) { return w.second.member; });
  if (members < expected_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!members_since_) members_since_ = now;
  if (static_cast<int>(workers_.size()) == expected_ + backups_ || now - *members_since_ >= grace_) broadcast_table(0);
}

// After a failure: once every live member has reported (or the grace period is over), keep
// those who reported and resume from the earliest operation any of them was in
// (decide_reformation).
void Coordinator::maybe_reform() {
  std::vector<WorkerStatus> status;
  for (const auto& [id, w] : workers_) {
    status.push_back({.id = id, .member = w.member, .done = w.done, .connected = w.fd >= 0, .failed_op = w.failed_op});
  }
  const auto r = decide_reformation(status, failure_since_, grace_, std::chrono::steady_clock::now());
  if (!r) return;
  for (int id : r->left) workers_[id].member = false;  // finished before the failure: nobody kills it
  for (int id : r->excluded) {
    Worker& w = workers_[id];
    w.member = false;
    if (w.fd >= 0) send_line(w.fd, "EXCLUDED");
  }
  if (!r->excluded.empty() && on_excluded_) on_excluded_(r->excluded);
  // The backup pool: a connected standby (lowest id first) for each member excluded.
  std::size_t promote = r->excluded.size();
  for (auto& [id, w] : workers_) {
    if (promote == 0) break;
    if (!w.standby || w.fd < 0) continue;
    w.standby = false;
    w.member = true;
    --promote;
  }
  broadcast_table(r->resume_op);
}

// Once every member has finished, a standby still waiting has nothing left to stand by for.
void Coordinator::release_standbys() {
  if (epoch_ < 0) return;
  for (const auto& [id, w] : workers_) {
    if (w.member && !w.done) return;
  }
  for (auto& [id, w] : workers_) {
    if (!w.standby || w.fd < 0) continue;
    send_line(w.fd, "RELEASED");
    w.standby = false;
  }
}

void Coordinator::loop() {
  while (!stop_) {
    std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
    std::vector<int> ids;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, w] : workers_) {
        if (w.fd >= 0) {
          fds.push_back({w.fd, POLLIN, 0});
          ids.push_back(id);
        }
      }
    }
    ::poll(fds.data(), fds.size(), 50);
    std::lock_guard<std::mutex> lock(mu_);
    if (fds[0].revents & POLLIN) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        // HELLO arrives right after connect; a connection that stays silent (not a worker) must
        // not hold the coordinator up for long.
        timeval tv{2, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        std::string buffer;
        auto line = read_line(fd, buffer);
        std::istringstream in(line.value_or(""));
        std::string word, host;
        int id = -1;
        std::uint16_t port = 0;
        in >> word >> id >> host >> port;
        if (word == "HELLO" && id >= 0 && !workers_.count(id)) {
          workers_[id] = Worker{.fd = fd,
                               .host = host,
                               .port = port,
                               .buffer = buffer,
                               .member = id < expected_,
                               .standby = id >= expected_,
                               .done = false,
                               .heard = std::chrono::steady_clock::now(),
                               .failed_op = std::nullopt};
        } else {
          ::close(fd);
        }
      }
    }
    for (std::size_t k = 1; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Worker& w = workers_[ids[k - 1]];
      char tmp[4096];
      const ssize_t n = ::recv(w.fd, tmp, sizeof tmp, MSG_DONTWAIT);
      if (n <= 0) {  // the worker exited or died
        ::close(w.fd);
        w.fd = -1;
        gone_.push_back(ids[k - 1]);
        if (w.member && !w.done && epoch_ >= 0 && !failure_since_ && membership_ == Membership::reform) {
          failure_since_ = std::chrono::steady_clock::now();
        }
        continue;
      }
      w.buffer.append(tmp, static_cast<std::size_t>(n));
      w.heard = std::chrono::steady_clock::now();
      std::size_t nl;
      while ((nl = w.buffer.find('\n')) != std::string::npos) {
        std::istringstream in(w.buffer.substr(0, nl));
        w.buffer.erase(0, nl + 1);
        std::string word;
        int epoch = -1;
        std::uint64_t op = 0;
        in >> word >> epoch >> op;
        if (word == "DONE") w.done = true;
        if (word == "FAILED" && epoch == epoch_ && membership_ == Membership::reform) {
          w.failed_op = op;
          if (!failure_since_) failure_since_ = std::chrono::steady_clock::now();
        }
      }
    }
    maybe_start();
    maybe_reform();
    release_standbys();
  }
}

// ---- worker ---------------------------------------------------------------------------------

Group::Group(const std::string& coordinator_host, std::uint16_t coordinator_port, int id, const std::string& host,
             Options opts)
    : id_(id), opts_(std::move(opts)), host_(host) {
  auto [fd, port] = listen_any(host);
  listen_fd_ = fd;
  listen_port_ = port;
  control_fd_ = connect_to(coordinator_host, coordinator_port);
  send_line(control_fd_, "HELLO " + std::to_string(id_) + " " + host_ + " " + std::to_string(listen_port_));
  first_op_ = wait_table();
  promoted_ = epoch_ > 0;  // the group's first table is epoch 0; each re-formation adds one
}

Group::~Group() {
  comm_.reset();
  if (control_fd_ >= 0 && std::uncaught_exceptions() == 0) send_line(control_fd_, "DONE");
  if (control_fd_ >= 0) ::close(control_fd_);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void Group::alive() {
  if (control_fd_ >= 0) send_line(control_fd_, "ALIVE");
}

std::uint64_t Group::wait_table() {
  for (;;) {
    auto line = read_line(control_fd_, buffer_);
    if (!line) throw GroupEnded("the workers' coordinator is gone");
    std::istringstream in(*line);
    std::string word;
    in >> word;
    if (word == "EXCLUDED") throw GroupEnded("this worker was excluded from the group");
    if (word == "RELEASED") throw StandbyReleased();
    if (word != "TABLE") continue;
    int epoch = 0;
    std::uint64_t resume = 0;
    std::size_t n = 0;
    in >> epoch >> resume >> n;
    std::vector<PeerAddress> peers;
    std::vector<int> ids;
    int rank = -1;
    for (std::size_t k = 0; k < n; ++k) {
      int id;
      PeerAddress a;
      in >> id >> a.host >> a.port;
      if (id == id_) rank = static_cast<int>(k);
      peers.push_back(a);
      ids.push_back(id);
    }
    if (rank < 0) throw GroupEnded("this worker is not in the group's table");
    epoch_ = epoch;
    rank_ = rank;
    peers_ = peers;
    if (!opts_.communicator) {
      comm_.reset();
    } else if (opts_.backend == "nccl") {
      // TCP carries the NCCL rendezvous; the old NCCL communicator, if any, is shrunk.
      Options tcp = opts_;
      tcp.backend = "auto";
      std::vector<int> gone;
      for (std::size_t k = 0; k < members_.size(); ++k) {
        if (std::find(ids.begin(), ids.end(), members_[k]) == ids.end()) gone.push_back(static_cast<int>(k));
      }
      auto next = make_nccl_communicator(make_tcp_communicator(rank, peers, listen_fd_, tcp), opts_, comm_.get(), gone);
      comm_ = std::move(next);
    } else {
      comm_.reset();
      comm_ = make_tcp_communicator(rank, peers, listen_fd_, opts_);
    }
    members_ = std::move(ids);
    return resume;
  }
}

std::optional<std::uint64_t> Group::attempt(std::uint64_t op, const std::function<void(Communicator&)>& fn) {
  try {
    fn(*comm_);
    return std::nullopt;
  } catch (const CollectiveError&) {
    // Report the operation we were in, then wait for the re-formed group.
    send_line(control_fd_, "FAILED " + std::to_string(epoch_) + " " + std::to_string(op));
    for (;;) {
      try {
        return wait_table();
      } catch (const GroupEnded&) {
        throw;
      } catch (const CollectiveError&) {
        // The new mesh failed to form (another worker died meanwhile): report and wait again.
        send_line(control_fd_, "FAILED " + std::to_string(epoch_) + " " + std::to_string(op));
      }
    }
  }
}

}  // namespace xsilo::collective
