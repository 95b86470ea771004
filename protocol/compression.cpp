#include "protocol/compression.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fnmatch.h>

#include "protocol/codec.h"
#include "protocol/codecs/detail.h"

namespace xsilo::protocol {

using wire::Compression;
using detail::chunk_of;
using detail::length;
using detail::splitmix64;

namespace {

// The codec of `c`'s scheme; an unknown one is refused by check_compression() before any use.
const Codec& codec_of(const wire::Compression& c) {
  const Codec* codec = find_codec(c.scheme());
  if (!codec) throw std::invalid_argument("unknown compression scheme " + std::to_string(static_cast<int>(c.scheme())));
  return *codec;
}

}  // namespace

bool compressed(const wire::Compression& c) { return c.scheme() != Compression::NONE; }

const std::vector<std::string>& scheme_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const Codec* c : codecs()) n.emplace_back(c ? c->name() : "");
    return n;
  }();
  return names;
}

wire::Compression::Scheme scheme_of_name(std::string_view name) {
  const auto& n = scheme_names();
  const auto it = std::find(n.begin(), n.end(), name);
  return it == n.end() || name.empty() ? Compression::NONE : static_cast<Compression::Scheme>(it - n.begin());
}

Status check_compression(const wire::Compression& c) {
  if (c.dense_size() > static_cast<int>(kMaxDensePatterns)) {
    return Error("at most " + std::to_string(kMaxDensePatterns) + " dense patterns, not " +
                 std::to_string(c.dense_size()));
  }
  for (const auto& p : c.dense()) {
    if (p.empty() || p.size() > kMaxDensePattern || p.find('\0') != std::string::npos) {
      return Error("a dense pattern must be 1.." + std::to_string(kMaxDensePattern) + " characters without NUL");
    }
  }
  const Codec* codec = find_codec(c.scheme());
  if (!codec) return Error("unknown compression scheme " + std::to_string(static_cast<int>(c.scheme())));
  return codec->check(c);
}

std::string describe(const wire::Compression& c) {
  const Codec* codec = find_codec(c.scheme());
  if (!codec) return "unknown";
  if (!compressed(c)) return "none";
  const std::string s = codec->describe(c);
  return c.error_feedback() ? s + "+ef" : s;
}

nlohmann::json to_json(const wire::Compression& c) {
  const Codec* codec = find_codec(c.scheme());
  if (!codec) return {{"scheme", "unknown"}};
  nlohmann::json j = {{"scheme", std::string(codec->name())}};
  if (!compressed(c)) return j;
  codec->parameters(c, j);
  j["error_feedback"] = c.error_feedback();
  if (c.seed()) j["seed"] = c.seed();
  j["dense"] = std::vector<std::string>(c.dense().begin(), c.dense().end());  // [] too: none, not the defaults
  return j;
}

std::size_t kept_count(const wire::Compression& c, std::size_t d) {
  if (d == 0) return 0;
  // Two statements: no fused multiply-add, the same k on every build of silo and server.
  const double p = c.fraction() * static_cast<double>(d);
  const double k = std::ceil(p - 1e-9);
  return std::clamp<std::size_t>(static_cast<std::size_t>(std::max(k, 1.0)), 1, d);
}

const std::vector<std::string>& default_dense_patterns() {
  static const std::vector<std::string> p = {"*running_mean", "*running_var", "*num_batches_tracked", "*moving_mean",
                                             "*moving_variance"};
  return p;
}

std::vector<bool> dense_tensors(const wire::Compression& c, const std::vector<TensorInfo>& layout) {
  std::vector<bool> dense(layout.size(), false);
  if (!compressed(c)) return dense;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    for (const auto& p : c.dense()) {
      if (fnmatch(p.c_str(), layout[i].name.c_str(), 0) == 0) dense[i] = true;
    }
  }
  return dense;
}

std::size_t encoded_bytes(const wire::Compression& c, std::size_t count, std::size_t nonzeros) {
  const Codec* codec = find_codec(c.scheme());
  return codec ? codec->bytes(c, count, nonzeros) : 4 * count;
}

std::string encode_chunk(const wire::Compression& c, std::span<const float> x, std::uint64_t seed,
                         std::span<float> decoded) {
  return codec_of(c).encode(c, x, seed, decoded);
}

Status decode_chunk(const wire::Compression& c, std::string_view data, std::span<float> out, std::size_t& nonzeros,
                    const TensorInfo* tensor, std::uint64_t offset) {
  nonzeros = 0;
  const Codec* codec = find_codec(c.scheme());
  if (!codec) return Error("unknown compression scheme " + std::to_string(static_cast<int>(c.scheme())));
  return codec->decode(c, data, out, nonzeros, tensor, offset);
}

namespace {

// With error feedback, residual += update (what this round would send uncompressed); returns
// the values to compress (the residual's span then, else the update's).
std::span<float> with_residual(std::span<float> update, std::span<float> residual) {
  if (residual.empty()) return update;
  for (std::size_t i = 0; i < update.size(); ++i) residual[i] += update[i];
  return residual;
}

// The coordinates a sparsifier chooses among (Ranges, protocol/codec.h).
Ranges compressible_ranges(const std::vector<TensorInfo>& layout, const std::vector<bool>& dense) {
  Ranges r;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const auto& t = layout[i];
    if (dense[i] || t.size() == 0) continue;
    if (!r.empty() && r.back().second == t.offset) {
      r.back().second += t.size();
    } else {
      r.emplace_back(t.offset, t.offset + t.size());
    }
  }
  return r;
}

// Keeps `set` (sorted, within `parts`) of v: `update` becomes zero in `parts` but there, where it
// holds v (scaled when `strata_of` is not 0, for random-k without error feedback: the j-th kept
// coordinate stands for the j-th of `set.size()` strata of `strata_of` coordinates); outside
// `parts` it is left as it is. With error feedback `residual` (which is v) loses what is sent.
// Returns the values sent. `v` may be `update` itself: each value is read before it is written.
// Every coordinate of `set` lies in `parts`.
std::vector<float> keep(std::span<const float> v, const std::vector<std::uint64_t>& set, const Ranges& parts,
                        std::span<float> update, std::span<float> residual, std::size_t strata_of = 0) {
  const std::size_t k = set.size();
  const bool scaled = strata_of != 0;
  std::vector<float> vals(k);
  detail::Strata strata(std::max<std::size_t>(strata_of, 1), std::max<std::size_t>(k, 1));
  // One pass, a block at a time: the block's kept values gathered, the block zeroed (one memset,
  // not one per gap) and the values put back while it is in the L1 cache.
  constexpr std::size_t kBlock = 4096;
  std::size_t j = 0;
  for (const auto& [begin, end] : parts) {
    for (std::size_t b = begin; b < end; b += kBlock) {
      const std::size_t e = std::min(end, b + kBlock), first = j;
      for (; j < k && set[j] < e; ++j) {
        const std::size_t i = set[j];
        float val = v[i];
        if (scaled) {
          const auto [sb, se] = strata.next();
          val *= static_cast<float>(se - sb);
        }
        vals[j] = val;
        if (!residual.empty()) residual[i] -= val;
      }
      std::fill(update.begin() + static_cast<std::ptrdiff_t>(b), update.begin() + static_cast<std::ptrdiff_t>(e), 0.0f);
      for (std::size_t q = first; q < j; ++q) update[set[q]] = vals[q];
    }
  }
  return vals;
}

}  // namespace

std::size_t compressible(const std::vector<TensorInfo>& layout, const std::vector<bool>& dense) {
  return length(compressible_ranges(layout, dense));
}

EncodedUpdate compress_update(const wire::Compression& c, std::span<float> update, std::span<float> residual,
                              const std::vector<TensorInfo>& layout, std::size_t chunk_elems, std::uint64_t seed) {
  const Codec& codec = codec_of(c);
  if (!c.error_feedback()) residual = {};
  seed = codec.update_seed(c, seed);
  const auto dense = dense_tensors(c, layout);
  std::span<float> v = with_residual(update, residual);
  std::vector<float> scratch;
  std::vector<std::uint64_t> set;
  std::vector<float> vals;
  const bool sparse = codec.sparse();
  if (sparse) {  // the dense tensors are left alone in v (and in the update)
    const auto parts = compressible_ranges(layout, dense);
    set = codec.select(c, v, parts, seed);
    vals = keep(v, set, parts, update, residual, codec.scales_kept(c) ? length(parts) : 0);
  } else if (v.data() == update.data()) {
    scratch.assign(update.begin(), update.end());  // the codec reads v and writes the update apart
    v = scratch;
  }
  EncodedUpdate out;
  // A sparse chunk carries an index and a value per kept element: half the span keeps it within
  // chunk_bytes. No chunk stands for more than the receivers take.
  if (sparse) chunk_elems /= 2;
  chunk_elems = std::clamp<std::size_t>(chunk_elems, 1, kMaxChunkCount);
  std::uint64_t chunk_seed = seed;
  std::size_t next = 0;  // sparse: the first kept coordinate not yet in a chunk
  for (std::size_t ti = 0; ti < layout.size(); ++ti) {
    const auto& t = layout[ti];
    if (dense[ti]) {  // float32 as it is (the update holds v there), no residual left
      auto dec = update.subspan(t.offset, t.size());
      const auto src = v.subspan(t.offset, t.size());
      if (src.data() != dec.data()) std::copy(src.begin(), src.end(), dec.begin());
      // Sparse schemes are done with the residual; the others take the update out of it below.
      if (sparse && !residual.empty()) std::fill(src.begin(), src.end(), 0.0f);
      for (std::size_t off = 0; off < t.size(); off += chunk_elems) {
        const std::size_t n = std::min(chunk_elems, t.size() - off);
        auto ch = chunk_of(c, t, off, n);
        ch.set_encoding(Compression::NONE);
        ch.clear_count();
        ch.set_data(std::string(reinterpret_cast<const char*>(dec.data() + off), 4 * n));
        out.bytes += ch.data().size();
        out.chunks.push_back(std::move(ch));
      }
      continue;
    }
    if (!sparse && codec.encode_tensor(c, t, v.subspan(t.offset, t.size()), update.subspan(t.offset, t.size()),
                                       chunk_elems, chunk_seed, out)) {
      continue;
    }
    for (std::size_t off = 0; off < t.size(); off += chunk_elems) {
      const std::size_t n = std::min(chunk_elems, t.size() - off);
      const std::size_t at = t.offset + off;
      auto ch = chunk_of(c, t, off, n);
      if (sparse) {
        std::size_t last = next;
        while (last < set.size() && set[last] < at + n) ++last;
        ch.set_data(detail::sparse_chunk(set, vals, next, last, at));
        next = last;
      } else {
        ch.set_data(codec.encode(c, v.subspan(at, n), splitmix64(chunk_seed), update.subspan(at, n)));
      }
      out.bytes += ch.data().size();
      out.chunks.push_back(std::move(ch));
    }
  }
  // What was left out stays for next round (sparse schemes took out what they sent already).
  if (!sparse) {
    for (std::size_t i = 0; i < residual.size(); ++i) residual[i] -= update[i];
  }
  return out;
}

Status check_broadcast(const wire::Compression& c) {
  if (c.scheme() != Compression::QUANTIZE) {
    return Error("a model broadcast is sent as a quantized delta (scheme quantize), not " + describe(c));
  }
  if (c.error_feedback()) return Error("a broadcast has no error feedback: the model the silos receive is the model");
  return check_compression(c);
}

EncodedUpdate encode_model_delta(const wire::Compression& c, std::span<const float> base, std::span<float> model,
                                 const std::vector<TensorInfo>& layout, std::size_t chunk_elems, std::uint64_t seed) {
  const auto dense = dense_tensors(c, layout);
  chunk_elems = std::clamp<std::size_t>(chunk_elems, 1, kMaxChunkCount);
  std::vector<float> delta(std::min(chunk_elems, model.size())), decoded(delta.size());
  EncodedUpdate out;
  std::uint64_t chunk_seed = seed;
  for (std::size_t ti = 0; ti < layout.size(); ++ti) {
    const auto& t = layout[ti];
    for (std::size_t off = 0; off < t.size(); off += chunk_elems) {
      const std::size_t n = std::min(chunk_elems, t.size() - off);
      float* m = model.data() + t.offset + off;
      auto ch = chunk_of(c, t, off, n);
      const float* b = base.data() + t.offset + off;
      bool values = dense[ti];
      if (!values) {
        for (std::size_t i = 0; i < n; ++i) delta[i] = m[i] - b[i];
        values = !detail::max_abs(delta.data(), n).second;  // a step past float's range has no codes
      }
      if (values) {  // the new values themselves
        ch.set_encoding(Compression::NONE);
        ch.clear_count();
        ch.set_data(std::string(reinterpret_cast<const char*>(m), 4 * n));
      } else {
        ch.set_data(encode_chunk(c, {delta.data(), n}, splitmix64(chunk_seed), {decoded.data(), n}));
        // What every receiver computes from its copy of the base: the same bits (no fused
        // multiply-add anywhere in this sum, see cmake/XsiloTarget.cmake).
        for (std::size_t i = 0; i < n; ++i) m[i] = b[i] + decoded[i];
      }
      out.bytes += ch.data().size();
      out.chunks.push_back(std::move(ch));
    }
  }
  return out;
}

std::optional<EncodedUpdate> encode_same_model(const wire::Compression& c, std::span<const float> model,
                                               const std::vector<TensorInfo>& layout, std::size_t chunk_elems,
                                               std::uint64_t seed) {
  // The same chunks, seeds and checks as a delta: a step of zeros from the model to itself,
  // then what a receiver rebuilds compared with the model, bit for bit.
  std::vector<float> copy(model.begin(), model.end());
  auto out = encode_model_delta(c, model, copy, layout, chunk_elems, seed);
  if (!std::equal(copy.begin(), copy.end(), model.begin(), [](float a, float b) {
        return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
      })) {
    return std::nullopt;
  }
  return out;
}

std::vector<std::uint64_t> shared_kept_set(const wire::Compression& c, const std::vector<TensorInfo>& layout) {
  const auto dense = dense_tensors(c, layout);
  const auto parts = compressible_ranges(layout, dense);
  // Drawn among the compressible coordinates, counted without the dense tensors' in between.
  const std::size_t d = length(parts);
  const auto drawn = detail::to_flat(random_k_set(c.seed(), d, kept_count(c, d)), parts);
  // Every coordinate of the dense tensors joins it, in order.
  std::vector<std::uint64_t> set;
  set.reserve(drawn.size() + elements(layout) - d);
  auto next = drawn.begin();
  for (std::size_t i = 0; i < layout.size(); ++i) {
    if (!dense[i]) continue;
    const auto& t = layout[i];
    for (; next != drawn.end() && *next < t.offset; ++next) set.push_back(*next);
    for (std::uint64_t x = t.offset; x < t.offset + t.size(); ++x) set.push_back(x);
  }
  set.insert(set.end(), next, drawn.end());
  return set;
}

std::vector<std::uint64_t> keep_shared_random_k(const wire::Compression& c, std::span<float> update,
                                                std::span<float> residual, const std::vector<TensorInfo>& layout) {
  if (!c.error_feedback()) residual = {};
  const std::span<float> v = with_residual(update, residual);
  auto set = shared_kept_set(c, layout);
  // Never scaled: the fixed-point codec clips each update, so secure random-k needs error feedback.
  keep(v, set, {{0, update.size()}}, update, residual);
  return set;
}

}  // namespace xsilo::protocol
