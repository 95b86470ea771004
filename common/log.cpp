#include "common/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

namespace xsilo {

void init_logging(const std::string& role, const std::string& level, const std::string& file) {
  std::shared_ptr<spdlog::logger> logger;
  if (file.empty()) {
    logger = spdlog::stderr_color_mt(role);
  } else {
    logger = spdlog::basic_logger_mt(role, file);
  }
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e [%n] [%^%l%$] %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace xsilo
