// Compressed uploads (docs/compression.md): the schemes a federation may choose, the chunk codec
// both ends share, and the silo's side with error feedback.
//
// A compressed upload travels as TensorChunks like a dense one, in model order, but each chunk's
// `data` is encoded (`encoding`, `count` elements):
//   QUANTIZE  one float32 scale per block, then a code per element: int8 in [-127, 127] for 8
//             bits, or two 4-bit codes per byte (low nibble first) holding q + 7 for q in [-7, 7];
//             the value is q * scale.
//   SIGN      one float32 scale per block, then a bit per element (1: +scale, 0: -scale), LSB
//             first, unused bits of the last byte zero.
//   TOP_K, RANDOM_K (plain)
//             uint32 m, then m strictly increasing uint32 indices into the chunk, then their m
//             float32 values; every other element is zero.
//   POWER_SGD a 2-D tensor [m, n] that low_rank() admits travels in chunks of whole rows: the
//             chunk's rows of P (rows x rank) then all of Q (n x rank), float32 row-major; the
//             value at (i, j) is sum_k P[i][k] Q[j][k], summed in k order. Other tensors: their
//             float32 values as they are.
// All little-endian. Blocks start at the chunk's first element. The receiver decodes each chunk
// into its float32 buffer, so everything after it (hashes, robust rules, the edge's sums) sees
// the decoded update, the same values the silo computed when it encoded it.
//
// Tensors named by `dense` patterns travel as float32 chunks of encoding NONE under every scheme.
//
// Under secure aggregation only RANDOM_K applies: every silo keeps the same coordinates (drawn
// from the round's seed) and masks just those; the server puts the unmasked sum back in place.
// No I/O here.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/model.h"
#include "common/result.h"
#include "proto/xsilo.pb.h"

namespace xsilo::protocol {

// The most elements one encoded chunk may stand for (receivers refuse more: a small chunk must
// not make them decode a whole tensor at once).
inline constexpr std::uint64_t kMaxChunkCount = std::uint64_t{1} << 22;
// Limits on Compression.dense that check_compression() enforces.
inline constexpr std::size_t kMaxDensePatterns = 64, kMaxDensePattern = 256;

// Success when the scheme's parameters are usable (bits 8 or 4, block 8..65536, fraction in
// (0, 1], rank 1..64), else why not.
Status check_compression(const wire::Compression& c);
bool compressed(const wire::Compression& c);
// The schemes' names in configs and audit records ("none", "quantize", "sign", "top_k",
// "random_k", "powersgd"), in Scheme order; and back (NONE for a name that is none of them).
const std::vector<std::string>& scheme_names();
wire::Compression::Scheme scheme_of_name(std::string_view name);
// "quantize-8/256+ef" and the like, for logs and tables.
std::string describe(const wire::Compression& c);
nlohmann::json to_json(const wire::Compression& c);

// How many coordinates a sparsifier keeps of `d`: ceil(fraction * d), at least 1.
std::size_t kept_count(const wire::Compression& c, std::size_t d);

// Dense tensors (`c.dense()`, fnmatch patterns of names): for each tensor of `layout`, whether
// it travels dense under `c` (never when `c` compresses nothing). A dense tensor goes as float32
// chunks of encoding NONE, keeps no residual, and is not counted in a sparsifier's k: a
// sparsifier keeps kept_count(c, compressible(layout, dense)) of the other coordinates.
std::vector<bool> dense_tensors(const wire::Compression& c, const std::vector<TensorInfo>& layout);
std::size_t compressible(const std::vector<TensorInfo>& layout, const std::vector<bool>& dense);

// The default patterns: PyTorch's BatchNorm statistics (`running_mean`, `running_var`,
// `num_batches_tracked`) and Keras's (`moving_mean`, `moving_variance`).
const std::vector<std::string>& default_dense_patterns();

// `k` distinct coordinates of [0, d), sorted, drawn from `seed` (the same set for the same
// arguments on every machine): one coordinate at random in each of k strata of consecutive
// coordinates (stratum j is [floor(j d / k), floor((j + 1) d / k))).
std::vector<std::uint64_t> random_k_set(std::uint64_t seed, std::size_t d, std::size_t k);

// POWER_SGD: whether tensor `t` travels as rank-`rank` factors (2-D, rows of at most the largest
// chunk, and the factors at most half of the tensor's values); both ends decide alike.
bool low_rank(const TensorInfo& t, std::uint32_t rank);

// The bytes of an encoded chunk of `count` elements (`nonzeros` of them kept, for sparse chunks).
std::size_t encoded_bytes(const wire::Compression& c, std::size_t count, std::size_t nonzeros = 0);

// Encodes `x` as one chunk; writes what the receiver will decode into `decoded` (same size as
// x, not overlapping it). Sparse schemes encode the nonzero elements of x. `seed` drives the
// unbiased rounding of QUANTIZE. A non-finite input gives a NaN scale (which every receiver
// refuses).
std::string encode_chunk(const wire::Compression& c, std::span<const float> x, std::uint64_t seed,
                         std::span<float> decoded);

// Decodes one chunk into `out` (its `count` elements), checking sizes, codes, indices and scales
// first: success when it was valid, else why not (and `out` is then unspecified). `nonzeros` gets the
// number of kept elements of a sparse chunk. POWER_SGD needs the chunk's tensor and its offset
// in it.
Status decode_chunk(const wire::Compression& c, std::string_view data, std::span<float> out, std::size_t& nonzeros,
                    const TensorInfo* tensor = nullptr, std::uint64_t offset = 0);

// A silo's upload, compressed: its chunks with encoded data, in order.
struct EncodedUpdate {
  std::vector<wire::TensorChunk> chunks;
  std::uint64_t bytes = 0;  // of encoded data, all chunks
};

// Compresses `update` (laid out as `layout`) for a plain round: with error feedback, what was
// left out last time (`residual`) is added first and what is left out now is kept in it.
// `update` becomes the decoded update (what the server will receive). `residual` is empty when
// the scheme has no error feedback. `seed` is the silo's own randomness (rounding, random-k;
// PowerSGD starts from the round's `c.seed()` instead).
// Random-k without error feedback scales each kept coordinate by its stratum's size (unbiased).
EncodedUpdate compress_update(const wire::Compression& c, std::span<float> update, std::span<float> residual,
                              const std::vector<TensorInfo>& layout, std::size_t chunk_elems, std::uint64_t seed);

// The model broadcast (server -> silos) as a delta against the model the receiver holds
// (docs/compression.md, "The model broadcast"): success when `c` can be a broadcast's scheme
// (QUANTIZE, 8 or 4 bits, no error feedback), else why not.
Status check_broadcast(const wire::Compression& c);

// Encodes `model` (laid out as `layout`) as a delta against `base`: a QUANTIZE chunk of
// model - base per chunk of the compressible tensors (unbiased rounding from `seed`), and float32
// chunks of encoding NONE holding the new values of the dense ones (and of a chunk whose step
// is not finite in float). On return `model` is what a
// receiver that holds `base` makes of the chunks: base + the decoded delta, the same bits on
// every build. `base` and `model` do not overlap.
EncodedUpdate encode_model_delta(const wire::Compression& c, std::span<const float> base, std::span<float> model,
                                 const std::vector<TensorInfo>& layout, std::size_t chunk_elems, std::uint64_t seed);

// The broadcast of `model` to receivers that hold it already (after an aborted round, which
// changed nothing): the chunks encode_model_delta makes of a step of zeros (codes and scales,
// a quarter of the model at 8 bits; the dense tensors' values). Empty when a receiver adding the
// decoded zeros would not get `model` back bit for bit (a delta-coded coordinate that is -0.0:
// -0.0 + 0.0 is +0.0). Holds a copy of the model while it checks.
std::optional<EncodedUpdate> encode_same_model(const wire::Compression& c, std::span<const float> model,
                                               const std::vector<TensorInfo>& layout, std::size_t chunk_elems,
                                               std::uint64_t seed);

// Secure RANDOM_K: the coordinates every silo masks, sorted: random_k_set(c.seed, d', k) over
// the d' coordinates of the tensors that do not travel dense (in model order), and every
// coordinate of those that do.
std::vector<std::uint64_t> shared_kept_set(const wire::Compression& c, const std::vector<TensorInfo>& layout);

// Secure RANDOM_K: keeps the coordinates of shared_kept_set() of `update` (plus the residual,
// which keeps the rest) and zeroes the others. Returns the set.
std::vector<std::uint64_t> keep_shared_random_k(const wire::Compression& c, std::span<float> update,
                                                std::span<float> residual, const std::vector<TensorInfo>& layout);

}  // namespace xsilo::protocol
