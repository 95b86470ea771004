#include "common/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/close_range.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace xsilo {

std::string self_exe() {
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

Process::Process(std::vector<std::string> argv, const std::filesystem::path& log, const ProcessOptions& opts)
    : own_group_(opts.own_group) {
  const auto& cwd = opts.cwd;
  if (log.has_parent_path()) std::filesystem::create_directories(log.parent_path());
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot open log " + log.string() + ": " + std::strerror(errno));
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  // The child's environment, built before fork (nothing that allocates runs in the child).
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string_view entry(*e);
    const auto key = entry.substr(0, entry.find('='));
    const bool replaced = std::any_of(opts.env.begin(), opts.env.end(), [&](const auto& kv) { return kv.first == key; });
    if (!replaced) env_strings.emplace_back(entry);
  }
  for (const auto& [k, v] : opts.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<int> keep_sorted(opts.keep_fds);
  std::sort(keep_sorted.begin(), keep_sorted.end());
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) {
    ::close(fd);
    throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  }
  if (pid_ == 0) {
    if (opts.die_with_parent_thread) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
    }
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    if (opts.own_group) ::setpgid(0, 0);
    // Nothing of the parent's but stdio and the descriptors it hands over: no socket of the
    // parent's (Asio does not mark its sockets close-on-exec) reaches the child.
    int from = 3;
    for (int kfd : keep_sorted) {
      if (kfd > from) ::close_range(static_cast<unsigned>(from), static_cast<unsigned>(kfd - 1), 0);
      ::fcntl(kfd, F_SETFD, ::fcntl(kfd, F_GETFD) & ~FD_CLOEXEC);
      from = std::max(from, kfd + 1);
    }
    ::close_range(static_cast<unsigned>(from), ~0u, 0);
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) {
      const char* msg = "cannot change to the working folder\n";
      [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg, std::strlen(msg));
      ::_exit(127);
    }
    ::execvpe(args[0], args.data(), envp.data());
    const char* msg = "exec failed\n";
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg, std::strlen(msg));
    ::_exit(127);
  }
  ::close(fd);
}

Process::~Process() {
  if (pid_ > 0 && !exit_code_) {
    ::kill(own_group_ ? -pid_ : pid_, SIGKILL);
    reap(true);
  }
}

bool Process::reap(bool block) {
  if (exit_code_) return true;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
  if (r == pid_) {
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return true;
  }
  return false;
}

bool Process::running() { return !reap(false); }

void Process::signal(int sig) {
  // Its whole process group when it has its own: children it started (a trainer's data
  // loaders) go with it.
  if (!exit_code_) ::kill(own_group_ ? -pid_ : pid_, sig);
}

std::optional<int> Process::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!reap(false)) {
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exit_code_;
}

int Process::stop(std::chrono::milliseconds grace) {
  signal(SIGTERM);
  if (auto c = wait(grace)) return *c;
  signal(SIGKILL);
  reap(true);
  return *exit_code_;
}

std::optional<ProcessResources> process_resources(pid_t pid) {
  const bool self = pid == 0 || pid == ::getpid();
  const std::filesystem::path proc = self ? std::string("/proc/self") : "/proc/" + std::to_string(pid);
  ProcessResources r;
  {
    std::ifstream status(proc / "status");  // closed before the descriptors are counted
    if (!status) return std::nullopt;
    bool seen = false;
    for (std::string line; std::getline(status, line);) {
      // "VmRSS:    1234 kB"
      const bool rss = line.rfind("VmRSS:", 0) == 0, hwm = line.rfind("VmHWM:", 0) == 0;
      if (!rss && !hwm) continue;
      const std::uint64_t bytes = std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
      (rss ? r.rss_bytes : r.peak_rss_bytes) = bytes;
      seen = true;
    }
    if (!seen) return std::nullopt;
  }
  std::error_code ec;
  for (std::filesystem::directory_iterator it(proc / "fd", ec), end; !ec && it != end; it.increment(ec)) {
    ++r.open_descriptors;
  }
  if (ec) return std::nullopt;
  // Listing our own descriptors holds one open: the listing's.
  if (self && r.open_descriptors > 0) --r.open_descriptors;
  return r;
}

}  // namespace xsilo
