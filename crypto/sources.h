// What a protocol core may not take from the world itself (docs/architecture.md, "Protocol cores
// are sans-I/O"): the wall clock and fresh randomness reach the coordinator, the relay and the
// session through a Sources, which their daemons fill with the real ones and their tests with
// whatever the test decides. tests/layering_check.py refuses a clock or a random source in a
// core's own code.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

namespace xsilo::crypto {

// The system's clock and libsodium's generator: the defaults.
std::int64_t system_unix_ms();
void system_random_bytes(std::span<std::uint8_t> out);

struct Sources {
  std::function<std::int64_t()> unix_ms = system_unix_ms;                          // milliseconds since the epoch
  std::function<void(std::span<std::uint8_t>)> random_bytes = system_random_bytes;  // unpredictable bytes

  static Sources system() { return Sources{}; }
};

// A seed for one purpose, derived from a federation's seed and a round: the first 8 bytes of
// SHA-256("xsilo-seed", purpose, seed, round), so that two uses of one seed (which silos a round
// selects, how a robust rule buckets its inputs) never draw the same numbers.
std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t round, std::string_view purpose);
// The same for one party's use of a purpose (a silo's row order, one bucket's rounding): the party
// (its length first) follows the round in the hash, so two silos, or two buckets of one step,
// never draw the same numbers for one purpose either.
std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t round, std::string_view purpose, std::string_view party);

}  // namespace xsilo::crypto
