// Child processes for `xsilo sim` and the benchmarks: real daemons, their output in log files,
// and never left behind (they die with the parent and are killed when the handle goes).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace xsilo {

struct ProcessOptions {
  std::filesystem::path cwd;                               // empty: this process's folder
  std::vector<std::pair<std::string, std::string>> env;    // set (or replaced) in the child
  std::vector<int> keep_fds;                               // descriptors the child inherits
  bool own_group = true;                                   // its own process group
  // SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG follows the thread, not the
  // process). Off for a child that has its own way to learn of the parent's end and must get
  // the chance to end cleanly after the thread that started it is gone: the external trainer,
  // whose channel closes when the agent dies and which is sent a shutdown task at the end.
  bool die_with_parent_thread = true;
};

class Process {
 public:
  // Starts argv[0] with the arguments, stdout and stderr appended to `log`.
  Process(std::vector<std::string> argv, const std::filesystem::path& log, const ProcessOptions& opts = {});
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  void signal(int sig);
  // Exit code (128 + signal for a killed process), or nullopt on timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  // SIGTERM, a grace period, then SIGKILL.
  int stop(std::chrono::milliseconds grace = std::chrono::milliseconds(2000));
  std::optional<int> exit_code() const { return exit_code_; }

 private:
  bool reap(bool block);
  pid_t pid_ = -1;
  bool own_group_ = true;
  std::optional<int> exit_code_;
};

// The path of the running xsilo binary.
std::string self_exe();

// What /proc says of a process: its resident memory now and at its peak (VmRSS, VmHWM) and its
// open descriptors (entries of /proc/PID/fd). nullopt where there is no such process (it ended,
// or is being restarted) or no /proc. `pid` 0: this process.
struct ProcessResources {
  std::uint64_t rss_bytes = 0;
  std::uint64_t peak_rss_bytes = 0;
  std::size_t open_descriptors = 0;
};
std::optional<ProcessResources> process_resources(pid_t pid = 0);

}  // namespace xsilo
