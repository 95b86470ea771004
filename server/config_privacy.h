// The server config's "privacy" block (server/config.cpp calls it; docs/configs.md documents it).
#pragma once

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "server/config.h"

namespace xsilo::server {

// Reads "privacy" into c.central_dp, after the selection, allow-list, aggregation and secure
// blocks (its checks read them). Throws ConfigError naming the key.
void parse_privacy(const ConfigNode& root, ServerConfig& c);
// The block as parse_privacy reads it back (the chosen noise multiplier, not the rounds).
nlohmann::json privacy_json(const CentralDpConfig& dp);
nlohmann::json privacy_json(const DistributedDpConfig& dp);
// Distributed mode, once the model's size d is known (the daemon, the sim): chooses gamma and mu
// (server/distributed_dp.h). Throws ConfigError naming `where` (the config file) and the key
// when the bits cannot hold the sum or the noise does not last one round.
void check_distributed_dp(DistributedDpConfig& dp, std::size_t d, const std::string& where);

}  // namespace xsilo::server
