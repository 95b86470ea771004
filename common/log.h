#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace xsilo {

// Sets up the default logger: "[time] [role] [level] message" on stderr, or in a file.
// level: trace, debug, info, warn, error.
void init_logging(const std::string& role, const std::string& level = "info",
                  const std::string& file = "");

}  // namespace xsilo
