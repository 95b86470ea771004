// Hosts made of network namespaces for tests that need several machines (scripts/netns-hosts.sh).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

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
class NamespaceHosts {
 public:
  NamespaceHosts(const std::filesystem::path& dir, int hosts, int rate_mbit)
      : prefix_("xh" + std::to_string(::getpid() % 100000)), log_(dir / "netns-hosts.log") {
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
  ~NamespaceHosts() { (void)std::system(("bash " + script() + " down " + prefix_ + " 2>/dev/null").c_str()); }
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
  std::string prefix_;
  std::filesystem::path log_;
  int code_ = -1;
  std::vector<std::string> addresses_;
};

}  // namespace xsilo::test
