// The config loaders of every daemon and of the sim: a hospital's hand-edited JSON. Every bad
// file must end in a ConfigError (file, key, reason), never in a crash or another exception.
#include <fstream>
#include <stdexcept>
#include <unistd.h>

#include "common/config.h"
#include "edge_aggregator/config.h"
#include "fuzz/fuzz_input.h"
#include "server/config.h"
#include "silo_agent/config.h"
#include "tools/sim.h"

namespace {

// A folder of this process's own, removed at exit.
struct Folder {
  Folder() : path(std::filesystem::temp_directory_path() / ("xsilo-fuzz-config-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~Folder() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::filesystem::path path;
};

const std::filesystem::path& config_file() {
  static const Folder folder;
  return folder.path;
}

template <class F>
void load(F&& f) {
  try {
    f();
  } catch (const xsilo::ConfigError&) {
    // The expected outcome of a bad file; any other exception escapes and is a finding.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  xsilo::fuzz::Input in(data, size);
  const std::uint8_t which = in.u8() % 4;
  const auto file = config_file() / "config.json";
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    const std::string rest = in.bytes(size);
    out.write(rest.data(), static_cast<std::streamsize>(rest.size()));
  }
  switch (which) {
    case 0: load([&] { (void)xsilo::server::load_server_config(file); }); break;
    case 1: load([&] { (void)xsilo::edge::load_edge_config(file); }); break;
    case 2: load([&] { (void)xsilo::agent::load_agent_config(file); }); break;
    default: load([&] { (void)xsilo::tools::load_sim_config(file); }); break;
  }
  return 0;
}
