// xsilo: the one command-line front of the framework.
#include <malloc.h>

#include <iostream>

#include "common/build_info.h"
#include "common/config.h"
#include "silo_agent/collective/gpu_info.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  // Frames and chunks are 1-4 MiB: keep such buffers on the heap and the heap's top in the
  // process, instead of an mmap, page faults and munmap for every frame (measured: 4x less
  // throughput on TLS loopback without this).
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  CLI::App app{"xsilo: cross-silo federated learning with secure aggregation", "xsilo"};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] {
    return xsilo::build_info() + "; " + xsilo::collective::gpu_info().describe() + "; CPU " + xsilo::cpu_info();
  });
  int exit_code = 0;
  xsilo::tools::add_server(app, exit_code);
  xsilo::tools::add_edge(app, exit_code);
  xsilo::tools::add_agent(app, exit_code);
  xsilo::tools::add_sim(app, exit_code);
  xsilo::tools::add_pki(app, exit_code);
  xsilo::tools::add_audit(app, exit_code);
  xsilo::tools::add_bench(app, exit_code);
  xsilo::tools::add_collective(app, exit_code);
  xsilo::tools::add_admin(app, exit_code);
  xsilo::tools::add_report(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  } catch (const xsilo::ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "xsilo: " << e.what() << "\n";
    return 1;
  }
  return exit_code;
}
