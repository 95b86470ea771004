// What a simulation adds to the server, and nothing in production has: `xsilo server --config
// FILE --simulate SIMFILE` runs the ordinary server with a hostile hook (server::ServerHook): the
// server as the threat table lets it deviate (docs/security.md), signing what it sends with its
// own key, to show that the silos refuse what it asks:
//   "split_view"  in each secure group, tells the victim (its first survivor by name) and every
//                 other survivor in turn that the victim survived, the rest that it dropped, each
//                 set signed with the server's key; once the "dropped" side has confirmed its
//                 set, asks that side to unmask with their signatures, for their shares of the
//                 victim's mask key beside the self-mask shares the other side sends the
//                 ordinary server. What it told and asked each silo, and what each answered, is
//                 written to `record` (JSON lines, tools/sim_server.cpp) for the tests.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "server/config.h"
#include "server/daemon.h"

namespace xsilo::tools {

struct SimServerConfig {
  std::string hostile;
  std::filesystem::path record;  // where the hook writes what it did and what the silos answered
};

SimServerConfig load_sim_server_config(const std::filesystem::path& file);
nlohmann::json to_json(const SimServerConfig& c);
std::unique_ptr<server::ServerHook> make_sim_server_hook(const server::ServerConfig& cfg, const SimServerConfig& sim);

}  // namespace xsilo::tools
