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
    c.set_seed((cfg.seed * 0x9e3779b97f4a7c15ull) ^ (round * 0xc2b2ae3d27d4eb4full) ^ 0x5851f42d4c957f2dull);
  }
  return c;
}

std::uint64_t broadcast_seed(const RoundConfig& cfg, std::uint64_t round) {
  return (cfg.seed * 0xd6e8feb86659fd93ull) ^ (round * 0x9e3779b97f4a7c15ull) ^ 0xb5026f5aa96619e9ull;
}

}  // namespace xsilo::server
