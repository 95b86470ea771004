// What a simulation adds to an edge, and nothing in production has: `xsilo edge --config FILE
// --simulate SIMFILE` runs the ordinary edge with a hostile hook, to show that the server and
// the silos refuse or detect what it does (docs/security.md):
//   "hijack"      announce silos that are not behind it (the federation's other silos), with a
//                 proof one of its own silos signed, renamed
//   "forge_join"  announce a silo that does not exist, its join signed with the edge's own key
//   "swap_keys"   alter the mask keys it relays, up (a silo's advertisement) and down (the list)
//   "split_view"  alter the survivor set in every other silo's unmask request
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "edge_aggregator/edge.h"

namespace xsilo::tools {

struct SimEdgeConfig {
  std::string hostile;
  std::vector<std::string> victims;  // hijack: the names it claims
};

SimEdgeConfig load_sim_edge_config(const std::filesystem::path& file);
nlohmann::json to_json(const SimEdgeConfig& c);
std::unique_ptr<edge::EdgeHook> make_sim_edge_hook(const edge::EdgeConfig& cfg, const SimEdgeConfig& sim);

}  // namespace xsilo::tools
