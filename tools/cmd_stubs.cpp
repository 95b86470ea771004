// Subcommands whose work lands in later changes.
#include "common/config.h"
#include "tools/commands.h"

namespace xsilo::tools {

namespace {
void stub(CLI::App& app, const char* name, const char* help) {
  auto* cmd = app.add_subcommand(name, help);
  cmd->allow_extras();
  cmd->callback([name] { throw ConfigError(std::string("xsilo ") + name + ": not built yet"); });
}
}  // namespace

void add_edge(CLI::App& app, int&) { stub(app, "edge", "run a regional edge aggregator"); }

}  // namespace xsilo::tools
