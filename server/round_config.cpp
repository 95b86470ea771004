#include "server/round_config.h"

namespace xsilo::server {

std::string_view name(SecureMode m) {
  switch (m) {
    case SecureMode::Off: return "off";
    case SecureMode::Global: return "global";
    case SecureMode::Grouped: return "grouped";
  }
  return "?";
}

}  // namespace xsilo::server
