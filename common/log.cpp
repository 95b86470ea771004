#include "common/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <regex>

#include <nlohmann/json.hpp>

namespace xsilo {

namespace {

// One JSON object per line, for a SIEM: time (UTC, ms), level, role, the round when the message
// is about one ("round N: ...", "round N/M: ...", "round N committed ..."), and the event (the
// message, without that prefix).
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    nlohmann::ordered_json j;  // in this order: time first, as a reader expects
    const auto t = msg.time;
    const auto secs = std::chrono::system_clock::to_time_t(t);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000;
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char when[64];
    std::snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                  tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
    j["time"] = when;
    const auto level = spdlog::level::to_string_view(msg.level);
    j["level"] = std::string(level.data(), level.size());
    j["role"] = std::string(msg.logger_name.data(), msg.logger_name.size());
    std::string text(msg.payload.data(), msg.payload.size());
    static const std::regex about_round(R"(^round (\d+)(?:/\d+)?:? )");
    if (std::smatch m; std::regex_search(text, m, about_round)) {
      const std::string digits = m[1].str();
      std::uint64_t round = 0;
      if (std::from_chars(digits.data(), digits.data() + digits.size(), round).ec == std::errc()) {
        j["round"] = round;
        text = m.suffix().str();
      }
    }
    j["event"] = text;
    // Bytes that are not UTF-8 (a peer's name, say) are replaced, never a broken line.
    const auto line = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(); }
};

}  // namespace

void init_logging(const std::string& role, const std::string& level, const std::string& file,
                  const std::string& format) {
  std::shared_ptr<spdlog::logger> logger;
  if (file.empty()) {
    logger = spdlog::stderr_color_mt(role);
  } else {
    logger = spdlog::basic_logger_mt(role, file);
  }
  if (format == "json") {
    logger->set_formatter(std::make_unique<JsonFormatter>());
  } else {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e [%n] [%^%l%$] %v");
  }
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace xsilo
