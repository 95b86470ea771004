#pragma once

#include <cstdint>
#include <string>

namespace xsilo {

struct Endpoint {
  std::string host;
  std::uint16_t port = 0;
  std::string str() const { return host + ":" + std::to_string(port); }
};

// "host:port" or "[v6]:port"; port 0 means "any free port" when listening.
// Throws std::invalid_argument with a message naming the text.
Endpoint parse_endpoint(const std::string& text);

}  // namespace xsilo
