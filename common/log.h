#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace xsilo {

// Sets up the default logger on stderr, or in a file. level: trace, debug, info, warn, error.
// format "text": "time [role] [level] message"; "json": one object per line with time (UTC),
// level, role, round (when the message is about one) and event.
void init_logging(const std::string& role, const std::string& level = "info",
                  const std::string& file = "", const std::string& format = "text");

}  // namespace xsilo
