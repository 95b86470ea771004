// The server config's "secure" block: secure aggregation's mode, the fixed-point codec, SecAgg+'s
// graph or LightSecAgg, and the checks of the aggregation rule and of a round's sums against it.
#include "server/config_secure.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "crypto/prime_field.h"
#include "robust/rule.h"
#include "server/secure_round.h"

namespace xsilo::server {

namespace {

// Whether a round can gather a secure sum, and whether the largest one it can gather fits the
// modulus.
void check_secure_sums(const ConfigNode& se, const ServerConfig& c) {
  const auto& sc = c.secure;
  // No sum of fewer than min_group silos is ever revealed: a round must be able to gather them
  // (silos_per_round and the allow-list are at least min_updates already).
  if (c.selection.min_updates < sc.min_group) {
    se.fail("min_group", "is " + std::to_string(sc.min_group) + " but selection.min_updates allows rounds of " +
                             std::to_string(c.selection.min_updates) +
                             " silos; a secure sum never covers fewer than min_group");
  }
  // The largest group a round can have.
  std::size_t largest = !c.expected_silos.empty() ? c.expected_silos.size() : 1000;
  if (c.selection.silos_per_round) {
    largest = std::min(largest, static_cast<std::size_t>(std::ceil(
                                    static_cast<double>(c.selection.silos_per_round) * (1 + c.selection.over_selection))));
  }
  if (sc.mode == SecureMode::Grouped) largest = std::min(largest, 2 * group_size(sc) - 1);
  auto codec = sc.codec();
  codec.unclipped_bit = c.aggregation.adaptive_clip.on();
  // Checked as the silos will see them: the setup carries both as float32.
  codec.clip_norm = static_cast<float>(codec.clip_norm);
  codec.max_weight = static_cast<float>(codec.max_weight);
  if (const auto st = crypto::check_overflow(codec, largest); !st) se.fail("modulus_bits", st.error().message());
  if (sc.protocol == SecureProtocol::LightSecAgg && sc.bits == 32) {
    if (const auto st = crypto::field::check_overflow_field(codec, largest); !st) {
      se.fail("fraction_bits", st.error().message());
    }
  }
}

// The rule sees one mean per group: its f counts groups (a Byzantine silo spoils its whole
// group), and its conditions are on the number of groups.
void check_rule_across_groups(const ConfigNode& ag, ServerConfig& c) {
  const auto& rule = c.aggregation.rule;
  const auto& sc = c.secure;
  const std::size_t n = c.selection.min_updates;
  const std::size_t size = group_size(sc), groups = std::max<std::size_t>(1, n / size);
  auto count = [](std::size_t k, const char* one, const char* many) { return std::to_string(k) + " " + (k == 1 ? one : many); };
  const std::string made = "min_updates " + std::to_string(n) + " silos make only " + count(groups, "group", "groups") +
                           " of " + std::to_string(size) + " (min_group " + std::to_string(sc.min_group) +
                           ", each surviving " + count(sc.group_dropouts, "dropout", "dropouts") + ")";
  if (const auto st = robust::check(rule, groups); !st) {
    ag.fail("rule", st.error().message() + " across secure groups, but " + made);
  }
  if (const auto st = robust::check_tolerance(rule, groups); !st) {
    ag.fail("f", "counts secure groups (a Byzantine silo spoils its group's mean): " + st.error().message() + ", and " + made);
  }
  if (const auto st = robust::check_protects(rule, groups); !st) {
    c.warnings.push_back(ag.key_path("rule") + ": across secure groups " + st.error().message() + "; " + made +
                         ": smaller groups or more silos per round make more groups (docs/robust.md)");
  }
}

}  // namespace

// "secure": the mode, the fixed-point codec, SecAgg+'s graph or LightSecAgg, checked on their own.
void parse_secure(const ConfigNode& se, SecureConfig& sc) {
  const auto mode = se.one_of("mode", "off", {"off", "global", "grouped"});
  sc.mode = mode == "global" ? SecureMode::Global : mode == "grouped" ? SecureMode::Grouped : SecureMode::Off;
  sc.min_group = static_cast<std::size_t>(se.integer("min_group", 3, 2, 1 << 20));
  sc.group_dropouts = static_cast<std::size_t>(se.integer("group_dropouts", 1, 0, 1 << 16));
  sc.threshold = se.number("threshold", 2.0 / 3.0, 0.5, 1.0);
  if (sc.threshold >= 1.0 && sc.group_dropouts > 0 && mode == "grouped") {
    se.fail("group_dropouts", "cannot be met with threshold 1 (every member must answer); lower threshold or set 0");
  }
  if (sc.threshold <= 0.5) {
    se.fail("threshold", "must be above 0.5: with half a group or less, two halves could each be shown a different "
                         "set of survivors and together unmask one silo");
  }
  sc.bits = static_cast<std::uint32_t>(se.integer("modulus_bits", 32, 8, 64));
  if (!crypto::ring_bits_supported(sc.bits)) se.fail("modulus_bits", std::string("must be ") + crypto::kRingBits);
  sc.fraction_bits = static_cast<std::uint32_t>(se.integer("fraction_bits", 16, 1, 52));
  sc.clip_norm = se.number("clip_norm", 1.0, 1e-9, 1e9);
  sc.max_weight = se.number("max_weight", 1000.0, 1e-9, 1e12);
  sc.keys_deadline = std::chrono::milliseconds(static_cast<long>(se.number("keys_s", 30, 0.01, 86400) * 1000));
  sc.unmask_deadline = std::chrono::milliseconds(static_cast<long>(se.number("unmask_s", 30, 0.01, 86400) * 1000));
  if (se.has("graph")) {
    const auto gr = se.child("graph");
    sc.graph = true;
    // At least 1 %: planned for no dropout at all, the graph is a ring that any two dropouts
    // apart from each other split, and every such round aborts.
    sc.graph_dropout = gr.number("dropout", 0.3, 0.01, 0.9);
    sc.graph_corrupt = gr.number("corrupt", 0.05, 0.0, 0.5);
    gr.finish();
  }
  sc.packed_wire = se.boolean("packed_wire", true);
  const auto protocol = se.one_of("protocol", "secagg", {"secagg", "lightsecagg"});
  sc.protocol = protocol == "lightsecagg" ? SecureProtocol::LightSecAgg : SecureProtocol::SecAgg;
  if (se.has("lightsecagg")) {
    if (sc.protocol != SecureProtocol::LightSecAgg) se.fail("lightsecagg", "is read only with \"protocol\": \"lightsecagg\"");
    const auto ls = se.child("lightsecagg");
    sc.privacy_corrupt = ls.number("corrupt", 0.05, 0.0, 0.5);
    ls.finish();
  }
  if (sc.protocol == SecureProtocol::LightSecAgg) {
    if (sc.graph) {
      se.fail("graph", "is SecAgg+'s neighbour graph; LightSecAgg shares each mask with every member of its group. "
                       "Remove graph, or use \"protocol\": \"secagg\"");
    }
    if (sc.bits != 32) {
      se.fail("modulus_bits", "LightSecAgg masks in the field of p = 2^32 - 5: modulus_bits must be 32, not " +
                                  std::to_string(sc.bits));
    }
  }
  se.finish();
}

// With secure aggregation the server sees only sums: what it would clip or choose from, and the
// sums a round can reveal.
void check_secure_rule(const ConfigNode& ag, const ConfigNode& se, ServerConfig& c) {
  const auto& a = c.aggregation;
  const auto& sc = c.secure;
  if (a.clip_norm > 0) {
    ag.fail("clip_norm", "the server cannot clip updates it never sees; with secure aggregation use secure.clip_norm");
  }
  if (a.adaptive_clip.on() && a.adaptive_clip.initial > sc.clip_norm) {
    ag.fail("adaptive_clip", "initial " + std::to_string(a.adaptive_clip.initial) + " is above secure.clip_norm " +
                                 std::to_string(sc.clip_norm) +
                                 ": with secure aggregation the clip norm adapts below secure.clip_norm, the bound "
                                 "the fixed-point codec's overflow check is made for");
  }
  if (sc.mode == SecureMode::Global && a.inspects_inputs()) {
    ag.fail("rule", "secure.mode global shows the server only the total, so a robust rule has nothing to "
                    "choose from; use secure.mode grouped");
  }
  check_secure_sums(se, c);
  if (sc.mode == SecureMode::Grouped && a.inspects_inputs()) check_rule_across_groups(ag, c);
}

nlohmann::json secure_json(const SecureConfig& sc) {
  nlohmann::json j = {{"mode", name(sc.mode)},
                      {"min_group", sc.min_group},
                      {"group_dropouts", sc.group_dropouts},
                      {"threshold", sc.threshold},
                      {"modulus_bits", sc.bits},
                      {"fraction_bits", sc.fraction_bits},
                      {"clip_norm", sc.clip_norm},
                      {"max_weight", sc.max_weight},
                      {"keys_s", secs_of(sc.keys_deadline)},
                      {"unmask_s", secs_of(sc.unmask_deadline)}};
  if (sc.graph) j["graph"] = {{"dropout", sc.graph_dropout}, {"corrupt", sc.graph_corrupt}};
  if (!sc.packed_wire) j["packed_wire"] = false;
  if (sc.protocol != SecureProtocol::SecAgg) {
    j["protocol"] = name(sc.protocol);
    j["lightsecagg"] = {{"corrupt", sc.privacy_corrupt}};
  }
  return j;
}

}  // namespace xsilo::server
