// One compression scheme behind one interface (docs/compression.md). Each codec is one file
// under protocol/codecs/, registered by its Compression.Scheme value in codecs/registry.cpp; the
// wire formats are those protocol/compression.h lists. compression.cpp drives them: dense
// tensors, error feedback, chunking, the broadcast's deltas, and secure random-k.
//
// A new codec: a Scheme value in proto/xsilo.proto (append, never renumber), a file under
// protocol/codecs/ that implements Codec (its config keys included), and a line in the registry.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/model.h"
#include "common/result.h"
#include "proto/xsilo.pb.h"

namespace xsilo::protocol {

struct EncodedUpdate;

// The coordinates a sparsifier chooses among: those of the tensors that do not travel dense, as
// sorted, disjoint [begin, end) ranges of the whole vector (adjacent tensors merged).
using Ranges = std::vector<std::pair<std::uint64_t, std::uint64_t>>;

class Codec {
 public:
  virtual ~Codec() = default;

  // The scheme's name in configs and audit records ("quantize").
  virtual std::string_view name() const = 0;
  // Success when the scheme's own parameters in `c` are usable, else why not.
  virtual Status check(const wire::Compression& c) const = 0;
  // Its keys in the config's "compression" block (server/config.cpp refuses another scheme's),
  // and reading them into `c`, with their defaults and ranges.
  virtual std::vector<std::string> keys() const { return {}; }
  virtual void configure(const ConfigNode& /*block*/, wire::Compression& /*c*/) const {}
  // Success when uploads so compressed can be securely aggregated, else why not (the server sums
  // masked ring words: every silo must send the same coordinates, linearly encoded).
  virtual Status secure(const wire::Compression& c) const = 0;
  // "quantize-8/256" and the like, for logs and tables (compression.h's describe adds "+ef").
  virtual std::string describe(const wire::Compression& c) const = 0;
  // The scheme's own parameters, added to an audit record's "compression" object.
  virtual void parameters(const wire::Compression& c, nlohmann::json& j) const = 0;
  // The bytes of an encoded chunk of `count` elements (`nonzeros` of them kept, for a sparsifier).
  virtual std::size_t bytes(const wire::Compression& c, std::size_t count, std::size_t nonzeros) const = 0;

  // Encodes `x` as one chunk and writes what the receiver decodes into `decoded` (compression.h,
  // encode_chunk). `seed` drives any randomness of the encoding.
  virtual std::string encode(const wire::Compression& c, std::span<const float> x, std::uint64_t seed,
                             std::span<float> decoded) const = 0;
  // Decodes one chunk into `out`, checking it first: success or why not (compression.h, decode_chunk).
  virtual Status decode(const wire::Compression& c, std::string_view data, std::span<float> out,
                             std::size_t& nonzeros, const TensorInfo* tensor, std::uint64_t offset) const = 0;

  // Error feedback. A sparsifier chooses its coordinates over the whole update (the values with
  // what was left out before already added, within `parts`), and the driver sends those as
  // index + value chunks and keeps the rest in the residual as it goes.
  virtual bool sparse() const { return false; }
  virtual std::vector<std::uint64_t> select(const wire::Compression& /*c*/, std::span<const float> /*v*/,
                                            const Ranges& /*parts*/, std::uint64_t /*seed*/) const {
    return {};
  }
  // A sparsifier that scales what it keeps to stay unbiased (random-k without error feedback):
  // the j-th kept coordinate stands for the j-th of k strata of the compressible coordinates.
  virtual bool scales_kept(const wire::Compression& /*c*/) const { return false; }
  // The seed an update's encoding starts from: the silo's own, or (PowerSGD) the round's, which
  // every silo shares.
  virtual std::uint64_t update_seed(const wire::Compression& /*c*/, std::uint64_t own) const { return own; }
  // A codec that encodes tensor `t` itself (PowerSGD: its factors, or its values) rather than
  // chunk by chunk: appends its chunks of at most `chunk_elems` elements to `out`, writes the
  // decoded values into `dec` and returns true; false leaves the tensor to encode(), one chunk
  // at a time, each seeded with splitmix64(seeds). `seeds` is the update's seed sequence: a
  // codec draws from it only as it needs, so the other tensors' seeds stay where they were.
  virtual bool encode_tensor(const wire::Compression& /*c*/, const TensorInfo& /*t*/, std::span<const float> /*v*/,
                             std::span<float> /*dec*/, std::size_t /*chunk_elems*/, std::uint64_t& /*seeds*/,
                             EncodedUpdate& /*out*/) const {
    return false;
  }
};

// The codec of `scheme`, or nullptr for a value no codec has (a peer's unknown scheme).
const Codec* find_codec(wire::Compression::Scheme scheme);
// Every codec, in Scheme order from NONE.
const std::vector<const Codec*>& codecs();

}  // namespace xsilo::protocol
