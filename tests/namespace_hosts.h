// Hosts made of network namespaces for tests that need several machines (scripts/netns-hosts.sh).
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/fs.h"

namespace xsilo::test {

// Hosts made of network namespaces (scripts/netns-hosts.sh), removed when the value goes. The
// script exits 3 where it cannot make them (not root, no iproute2): skipped() then says why.
// One set at a time on a machine: every set puts 10.79.0.254/24 on a veth of the root namespace,
// so two at once (ctest -j2 runs the test programs that make them side by side) would route to
// either. A set left by a test process that was killed would do the same: it is removed first.
class NamespaceHosts {
 public:
  NamespaceHosts(const std::filesystem::path& dir, int hosts, int rate_mbit)
      : prefix_("xh" + std::to_string(::getpid() % 100000)), log_(dir / "netns-hosts.log") {
    lock_ = ::open("/tmp/xsilo-netns-hosts.lock", O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (lock_ >= 0) {
      while (::flock(lock_, LOCK_EX) != 0 && errno == EINTR) {
      }
    }
    remove_stale();
    const std::string cmd = "bash " + script() + " up " + prefix_ + " " + std::to_string(hosts) + " " +
                            std::to_string(rate_mbit) + " 2>" + log_.string();
    FILE* out = ::popen(cmd.c_str(), "r");
    std::string words;
    char buf[256];
    while (out && std::fgets(buf, sizeof buf, out)) words += buf;
    const int status = out ? ::pclose(out) : -1;
    code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::istringstream in(words);
    for (std::string a; in >> a;) addresses_.push_back(a);
  }
  ~NamespaceHosts() {
    down(prefix_);
    if (lock_ >= 0) ::close(lock_);  // releases the lock
  }
  NamespaceHosts(const NamespaceHosts&) = delete;
  NamespaceHosts& operator=(const NamespaceHosts&) = delete;

  bool skipped() const { return code_ == 3; }
  int code() const { return code_; }
  std::string log() const { return read_file(log_); }
  const std::vector<std::string>& addresses() const { return addresses_; }
  // The launcher `local.launcher` takes: the worker's command run inside its host's namespace.
  nlohmann::json launcher() const { return {"ip", "netns", "exec", prefix_ + "-{host}"}; }
  // That launcher with {host} replaced: the words that run a command on host `address`.
  std::vector<std::string> launch_on(const std::string& address) const { return {"ip", "netns", "exec", prefix_ + "-" + address}; }
  static constexpr const char* reachable_at = "10.79.0.254";  // this machine, seen from the hosts

 private:
  static std::string script() { return (std::filesystem::path(XSILO_SOURCE_DIR) / "scripts" / "netns-hosts.sh").string(); }
  static void down(const std::string& prefix) {
    (void)std::system(("bash " + script() + " down " + prefix + " 2>/dev/null").c_str());
  }
  // Under the lock no other test's set is in use: any left (namespaces named xhDIGITS-...) is a
  // killed test's.
  void remove_stale() const {
    FILE* in = ::popen("ip netns list 2>/dev/null", "r");
    if (!in) return;
    std::vector<std::string> stale;
    char buf[256];
    while (std::fgets(buf, sizeof buf, in)) {
      const std::string name(buf);
      const auto dash = name.find('-');
      if (name.rfind("xh", 0) != 0 || dash == std::string::npos || dash == 2) continue;
      const std::string prefix = name.substr(0, dash);
      if (prefix.find_first_not_of("0123456789", 2) != std::string::npos) continue;
      if (std::find(stale.begin(), stale.end(), prefix) == stale.end()) stale.push_back(prefix);
    }
    ::pclose(in);
    for (const auto& prefix : stale) down(prefix);
  }
  int lock_ = -1;
  std::string prefix_;
  std::filesystem::path log_;
  int code_ = -1;
  std::vector<std::string> addresses_;
};

}  // namespace xsilo::test
