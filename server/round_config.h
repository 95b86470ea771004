// What a round needs to know: selection, deadlines, the training plan, how updates are
// combined and whether they are securely aggregated. The protocol core (the coordinator and
// its parts) sees only this; the daemon's transport settings live in server/config.h.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>

#include "crypto/certs.h"
#include "crypto/fixed_point.h"
#include "crypto/sources.h"
#include "proto/xsilo.pb.h"
#include "robust/rule.h"
#include "server/central_dp.h"
#include "server/distributed_dp.h"
#include "server/schedule.h"   // ScheduleConfig
#include "server/selection.h"  // SelectionConfig

namespace xsilo::server {

struct Deadlines {
  std::chrono::milliseconds join{30000};
  std::chrono::milliseconds train{120000};
  std::chrono::milliseconds upload{60000};
};

// How the updates of a round are combined (docs/robust.md has the exact definitions).
struct AggregationConfig {
  robust::RuleSpec rule;          // fedavg, or a robust rule with its parameters
  double clip_norm = 0;           // clip each update to this L2 norm first (0: off)
  // Adaptive clipping (Andrew et al. 2021): the clip norm follows the `quantile` of the update
  // norms, C <- C exp(-lr (b - quantile)) after each committed round, b the fraction of updates
  // not clipped; starts at `initial` (or where the audit log left it). Plain mode.
  struct AdaptiveClip {
    double quantile = 0;  // 0: off
    double lr = 0.2;
    double initial = 1.0;
    double min = 1e-3;    // the norm never goes below (default: initial / 1000)
    bool on() const { return quantile > 0; }
  } adaptive_clip;
  robust::Fallback fallback = robust::Fallback::Median;  // when dropouts leave too few inputs
  // The rule or a pre-aggregation step looks at each input (an update, or a group's mean).
  bool inspects_inputs() const { return rule.rule != robust::Rule::FedAvg || rule.nnm || rule.bucket > 1; }
  bool needs_all_updates() const { return inspects_inputs() || clip_norm > 0 || adaptive_clip.on(); }
};

enum class SecureMode { Off, Global, Grouped };
std::string_view name(SecureMode m);
// The protocol every secure group runs (server/secure/group.h).
enum class SecureProtocol { SecAgg, LightSecAgg };
std::string_view name(SecureProtocol p);

// Secure aggregation (docs/security.md).
struct SecureConfig {
  SecureMode mode = SecureMode::Off;
  // Fresh randomness for the groups' graph seeds: the coordinator sets it from its own
  // RoundConfig::sources.
  std::function<void(std::span<std::uint8_t>)> random_bytes = crypto::Sources::system().random_bytes;
  std::size_t min_group = 3;       // grouped: every group has at least this many silos
  // grouped: every group is drawn large enough that this many of its members may drop out and
  // its sum still be revealed (secure_round.h, group_size())
  std::size_t group_dropouts = 1;
  double threshold = 2.0 / 3.0;    // t = max(2, floor(n / 2) + 1, ceil(threshold * n)) for a group of n
  std::uint32_t bits = 32;
  std::uint32_t fraction_bits = 16;
  double clip_norm = 1.0;
  double max_weight = 1000.0;
  std::chrono::milliseconds keys_deadline{30000};    // each of the key, share and receipt phases
  std::chrono::milliseconds unmask_deadline{30000};  // each of the confirmation and unmask phases
  // SecAgg+ neighbour graphs, chosen per group for these rates (crypto/secagg_graph.h); off:
  // every member masks with every other.
  bool graph = false;
  double graph_dropout = 0.3;  // the fraction of a group expected to drop out in a round
  double graph_corrupt = 0.05; // the fraction of silos that may collude with the server
  // SecAgg (SecAgg+ with `graph`), or LightSecAgg (crypto/lightsecagg.h): every survivor's mask
  // removed by decoding one aggregate, at the price of encoded mask shares sent ahead. Its T (the
  // colluding members that learn nothing of one mask) is max(1, corrupt_count(n, privacy_corrupt)).
  SecureProtocol protocol = SecureProtocol::SecAgg;
  double privacy_corrupt = 0.05;
  // The largest message the transport carries (transport.max_frame_bytes): a LightSecAgg group
  // whose members' encoded shares would not fit in one fails with the reason.
  std::size_t max_message_bytes = std::size_t{4} << 20;
  // Distributed DP's masked words travel packed in the mechanism's bits (protocol/packed.h)
  // wherever that is valid (SecAgg/SecAgg+, no adaptive count word); off: whole ring words.
  bool packed_wire = true;
  bool on() const { return mode != SecureMode::Off; }
  crypto::FixedPointParams codec() const {
    return {.bits = bits, .fraction_bits = fraction_bits, .clip_norm = clip_norm, .max_weight = max_weight};
  }
};

// Uploads of a model over `over_bytes` are staged in a temporary file in `dir` rather than in a
// buffer of the model's size (fedavg without clipping or robust rules: server/upload_stage.h).
struct UploadStaging {
  std::uint64_t over_bytes = std::uint64_t{1024} << 20;
  std::filesystem::path dir;  // the server daemon sets its state_dir; empty: the system's temporary folder
  bool stages(std::uint64_t model_bytes) const { return model_bytes > over_bytes; }
};

struct RoundConfig {
  std::string federation;
  std::string config_sha256;
  std::uint64_t rounds = 1;
  std::uint64_t seed = 1;
  // The wall clock and randomness (join and round nonces, graph seeds), which the coordinator
  // never takes from the world itself (crypto/sources.h).
  crypto::Sources sources = crypto::Sources::system();
  SelectionConfig selection;
  // When rounds commit: synchronous (the default) or buffered (server/schedule.h).
  ScheduleConfig schedule;
  Deadlines deadlines;
  wire::TrainingPlan plan;
  std::set<std::string> expected_silos;  // the silo allow-list when it names silos
  bool any_silo = true;   // the allow-list admits every silo ("*"); else only expected_silos
  AggregationConfig aggregation;
  SecureConfig secure;
  wire::Compression compression;  // how silos compress their uploads (docs/compression.md)
  // How the model goes out: as a quantized delta against the model a receiver holds, where it
  // holds the previous one (QUANTIZE), or whole (NONE). docs/compression.md, "The model broadcast".
  wire::Compression broadcast;
  std::size_t chunk_bytes = 1u << 20;  // of the model's (and a delta broadcast's) chunks
  UploadStaging staging;
  // Silo-level differential privacy, central mode (server/central_dp.h): set when the config's
  // "privacy" block asks for it.
  std::optional<CentralDpConfig> central_dp;
  // Distributed mode (server/distributed_dp.h): the silos add the noise under secure aggregation.
  // Parsed from the config; ready() once finalize_distributed_dp knows the model's size.
  std::optional<DistributedDpConfig> distributed_dp;
  // How many uploads the server receives at the same time, each into a buffer (or staged
  // file) of its own, folded in the order they were granted (docs/architecture.md, "A round").
  std::size_t uploads_at_once = 1;
  // The federation CA (and its revocation list): checks the signed joins of silos behind edges
  // and, in secure mode, the silos' protocol signatures. Not read from a config file: the server
  // daemon sets it from its TLS files. Without it, no silo is admitted through an edge.
  std::optional<crypto::CertVerifier> ca;
  // Who the server is in the protocol: its certificate key. It signs each RoundStart (so an
  // edge cannot change the model, layout or plan it relays) and, in secure mode, each group's
  // setup and settled members. Set by the server daemon from its TLS files, like `ca`;
  // required in secure mode.
  std::optional<crypto::CertSigner> signer;
};

// The round's compression as the silos receive it: under secure aggregation, RANDOM_K's
// coordinate set is drawn from a seed of the federation's seed and the round (every silo of the
// round keeps the same coordinates; the next round keeps others); PowerSGD's random start Q0
// likewise (crypto::derive_seed, purpose "compression").
wire::Compression round_compression(const RoundConfig& cfg, std::uint64_t round);
// The seed of the unbiased rounding of round `round`'s broadcast delta (replayable from the
// config, like the rest of the round; purpose "broadcast").
std::uint64_t broadcast_seed(const RoundConfig& cfg, std::uint64_t round);

}  // namespace xsilo::server
