// The server config's "secure" block (server/config.cpp calls it; docs/configs.md documents it):
// secure aggregation's mode, fixed-point codec, SecAgg+'s graph or LightSecAgg, and what the
// aggregation rule and a round's sums must allow with it.
#pragma once

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "server/config.h"

namespace xsilo::server {

// Reads "secure" into sc, checked on its own. Throws ConfigError naming the key.
void parse_secure(const ConfigNode& se, SecureConfig& sc);
// With secure aggregation on, after "aggregation" and "secure" are read (and the selection and
// allow-list before them): whether the rule can run on the sums a round reveals, and whether
// those sums fit the modulus. Throws ConfigError naming the key; adds c.warnings.
void check_secure_rule(const ConfigNode& ag, const ConfigNode& se, ServerConfig& c);
// The block as parse_secure reads it back.
nlohmann::json secure_json(const SecureConfig& sc);

}  // namespace xsilo::server
