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

std::string_view name(SecureProtocol p) {
  switch (p) {
    case SecureProtocol::SecAgg: return "secagg";
    case SecureProtocol::LightSecAgg: return "lightsecagg";
  }
  return "?";
}

wire::Compression round_compression(const RoundConfig& cfg, std::uint64_t round) {
  wire::Compression c = cfg.compression;
  // PowerSGD's random start is the round's too: the silos' factorizations can be replayed.
  if ((cfg.secure.on() && c.scheme() == wire::Compression::RANDOM_K) || c.scheme() == wire::Compression::POWER_SGD) {
    c.set_seed(crypto::derive_seed(cfg.seed, round, "compression"));
  }
  return c;
}

std::uint64_t broadcast_seed(const RoundConfig& cfg, std::uint64_t round) {
  return crypto::derive_seed(cfg.seed, round, "broadcast");
}

}  // namespace xsilo::server
