#include "common/build_info.h"

#include <fstream>

namespace xsilo {

std::string build_version() { return XSILO_VERSION; }

std::string build_info() {
  // The number is proto::kProtocolVersion (common/ sits below proto/; Frame.TheVersionLine...
  // holds the two together).
  return "xsilo " + build_version() + ", wire protocol 5, -march=" + XSILO_BUILD_ARCH;
}

std::string cpu_info() {
  std::ifstream in("/proc/cpuinfo");
  std::string model = "unknown CPU", flags;
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    if (key == "model name" && model == "unknown CPU") model = line.substr(colon + 2);
    if (key == "flags" && flags.empty()) flags = line.substr(colon) + " ";  // ": f1 f2 ... "
    if (model != "unknown CPU" && !flags.empty()) break;
  }
  const char* widest = flags.find(" avx512f ") != std::string::npos ? "avx512f"
                       : flags.find(" avx2 ") != std::string::npos  ? "avx2"
                       : flags.find(" sse4_2 ") != std::string::npos ? "sse4.2"
                                                                     : "baseline x86-64";
  return model + " (" + widest + ")";
}

}  // namespace xsilo
