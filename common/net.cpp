#include "common/net.h"

#include <stdexcept>

namespace xsilo {

Endpoint parse_endpoint(const std::string& text) {
  std::string host, port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      throw std::invalid_argument("\"" + text + "\" is not host:port");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos) throw std::invalid_argument("\"" + text + "\" is not host:port");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty() || port.empty() || port.find_first_not_of("0123456789") != std::string::npos ||
      port.size() > 5 || std::stoul(port) > 65535) {
    throw std::invalid_argument("\"" + text + "\" is not host:port with a port in 0..65535");
  }
  return {host, static_cast<std::uint16_t>(std::stoul(port))};
}

}  // namespace xsilo
