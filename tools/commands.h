// Each `xsilo` subcommand registers itself on the CLI11 app; its callback stores the exit
// code. Usage and configuration errors are thrown as xsilo::ConfigError and leave with code 2.
#pragma once

#include <CLI/CLI.hpp>

namespace xsilo::tools {

void add_pki(CLI::App& app, int& exit_code);
void add_server(CLI::App& app, int& exit_code);
void add_edge(CLI::App& app, int& exit_code);
void add_agent(CLI::App& app, int& exit_code);
void add_sim(CLI::App& app, int& exit_code);
void add_audit(CLI::App& app, int& exit_code);
void add_bench(CLI::App& app, int& exit_code);
void add_collective(CLI::App& app, int& exit_code);
void add_admin(CLI::App& app, int& exit_code);  // status and admin
void add_report(CLI::App& app, int& exit_code);  // report tensorboard

}  // namespace xsilo::tools
