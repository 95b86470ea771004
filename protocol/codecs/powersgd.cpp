// POWER_SGD (Vogels et al., NeurIPS 2019): a 2-D tensor [m, n] that low_rank() admits travels as
// rank-r factors from one power iteration, in chunks of whole rows: the chunk's rows of P
// (rows x r), then all of Q (n x r), float32 row-major; the value at (i, j) is sum_k P[i][k]
// Q[j][k], summed in k order. Every other tensor travels as its float32 values. Every silo starts
// the iteration from the round's seed.
#include <random>

#include "common/eigen.h"
#include "protocol/codecs/detail.h"

namespace xsilo::protocol {

bool low_rank(const TensorInfo& t, std::uint32_t rank) {
  if (t.shape.size() != 2 || rank == 0) return false;
  const std::uint64_t m = t.shape[0], n = t.shape[1];
  return m > 0 && n > 0 && n <= kMaxChunkCount && 2 * std::uint64_t{rank} * (m + n) <= m * n;
}

namespace detail {

namespace {

// The decoding: out (rows x cols) = P (rows x r) Q^T (Q: cols x r), each value summed in k order
// from zero, one product at a time (no fused multiply-add: the build passes -ffp-contract=off, so
// every instruction set gets the same bits and the silo's hash matches the receiver's).
// Vectorizes across a row.
void low_rank_product(const float* p, const float* q, std::size_t rows, std::size_t cols, std::size_t r, float* out) {
  std::vector<float> qt(cols * r);
  for (std::size_t j = 0; j < cols; ++j) {
    for (std::size_t k = 0; k < r; ++k) qt[k * cols + j] = q[j * r + k];
  }
  for (std::size_t i = 0; i < rows; ++i) {
    float* o = out + i * cols;
    std::fill(o, o + cols, 0.0f);
    for (std::size_t k = 0; k < r; ++k) {
      const float pk = p[i * r + k];
      const float* qk = qt.data() + k * cols;
      for (std::size_t j = 0; j < cols; ++j) {
        const float prod = pk * qk[j];
        o[j] = o[j] + prod;
      }
    }
  }
}

class PowerSgd final : public Codec {
 public:
  std::string_view name() const override { return "powersgd"; }
  Status check(const wire::Compression& c) const override {
    if (c.rank() < 1 || c.rank() > 64) return Error("rank must be 1..64, not " + std::to_string(c.rank()));
    return {};
  }
  std::vector<std::string> keys() const override { return {"rank"}; }
  void configure(const ConfigNode& cn, wire::Compression& c) const override {
    c.set_rank(static_cast<std::uint32_t>(cn.integer("rank", 4, 1, 64)));
  }
  Status secure(const wire::Compression& /*c*/) const override {
    return Error("each silo's low-rank factors are its own (PowerSGD over secure sums is not built)");
  }
  std::string describe(const wire::Compression& c) const override { return "powersgd-r" + std::to_string(c.rank()); }
  void parameters(const wire::Compression& c, nlohmann::json& j) const override { j["rank"] = c.rank(); }
  // Per chunk, the size of a tensor it leaves as it is (its factors' size depends on the tensor).
  std::size_t bytes(const wire::Compression& /*c*/, std::size_t count, std::size_t /*nonzeros*/) const override {
    return 4 * count;
  }
  std::uint64_t update_seed(const wire::Compression& c, std::uint64_t /*own*/) const override { return c.seed(); }

  // A chunk of a tensor it leaves as it is: its values.
  std::string encode(const wire::Compression& /*c*/, std::span<const float> x, std::uint64_t /*seed*/,
                     std::span<float> decoded) const override {
    std::copy(x.begin(), x.end(), decoded.begin());
    return std::string(reinterpret_cast<const char*>(x.data()), 4 * x.size());
  }
  Status decode(const wire::Compression& c, std::string_view data, std::span<float> out, std::size_t& nonzeros,
                const TensorInfo* tensor, std::uint64_t offset) const override;
  bool encode_tensor(const wire::Compression& c, const TensorInfo& t, std::span<const float> v, std::span<float> dec,
                     std::size_t chunk_elems, std::uint64_t& seeds, EncodedUpdate& out) const override;
};

Status PowerSgd::decode(const wire::Compression& c, std::string_view data, std::span<float> out,
                        std::size_t& nonzeros, const TensorInfo* tensor, std::uint64_t offset) const {
  const std::size_t n = out.size();
  nonzeros = 0;
  if (!tensor) return Error("a PowerSGD chunk needs its tensor");
  if (!low_rank(*tensor, c.rank())) {  // sent as it is
    if (data.size() != 4 * n) {
      return Error("dense chunk of " + std::to_string(n) + " elements has " + std::to_string(data.size()) + " bytes");
    }
    std::memcpy(out.data(), data.data(), data.size());
    return {};
  }
  const std::uint64_t cols = tensor->shape[1], r = c.rank();
  if (offset % cols || n % cols) return Error("a PowerSGD chunk must cover whole rows of " + xsilo::describe(*tensor));
  const std::uint64_t rows = n / cols;
  const std::uint64_t need = 4 * (rows * r + cols * r);
  if (data.size() != need) {
    return Error("PowerSGD chunk of " + std::to_string(rows) + " rows has " + std::to_string(data.size()) +
                 " bytes, not " + std::to_string(need) + " (rank " + std::to_string(r) + ")");
  }
  std::vector<float> f(data.size() / 4);
  std::memcpy(f.data(), data.data(), data.size());
  for (float v : f) {
    if (!std::isfinite(v)) return Error("a PowerSGD factor is NaN or infinite");
  }
  low_rank_product(f.data(), f.data() + rows * r, rows, cols, r, out.data());
  return {};
}

// One power iteration from a random start: P = M Q0, P orthonormalized, Q = M^T P; M ~ P Q^T.
// Appends the tensor's chunks of whole rows and writes the decoded values into `dec`. A tensor
// low_rank() does not admit goes chunk by chunk as its values, and draws no seed.
bool PowerSgd::encode_tensor(const wire::Compression& c, const TensorInfo& t, std::span<const float> v,
                             std::span<float> dec, std::size_t chunk_elems, std::uint64_t& seeds,
                             EncodedUpdate& out) const {
  if (!low_rank(t, c.rank())) {
    for (std::size_t off = 0; off < t.size(); off += chunk_elems) {
      const std::size_t n = std::min(chunk_elems, t.size() - off);
      auto ch = chunk_of(c, t, off, n);
      ch.set_data(encode(c, v.subspan(off, n), 0, dec.subspan(off, n)));
      out.bytes += ch.data().size();
      out.chunks.push_back(std::move(ch));
    }
    return true;
  }
  using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const auto m = static_cast<Eigen::Index>(t.shape[0]), n = static_cast<Eigen::Index>(t.shape[1]);
  const auto r = static_cast<Eigen::Index>(c.rank());
  const Eigen::Map<const RowMajor> mat(v.data(), m, n);
  RowMajor q0(n, r);
  std::mt19937_64 rng(splitmix64(seeds));
  std::normal_distribution<float> g;
  for (Eigen::Index i = 0; i < q0.size(); ++i) q0.data()[i] = g(rng);
  RowMajor p = mat * q0;
  // Gram-Schmidt on the columns of P. A column with (almost) nothing left beside the others is
  // rounding noise, not a direction of M: it becomes zero.
  for (Eigen::Index k = 0; k < r; ++k) {
    const float before = p.col(k).norm();
    for (Eigen::Index l = 0; l < k; ++l) p.col(k) -= p.col(l).dot(p.col(k)) * p.col(l);
    const float norm = p.col(k).norm();
    if (std::isfinite(norm) && norm > 1e-4f * before && norm > 1e-30f) p.col(k) /= norm;
    else p.col(k).setZero();
  }
  const RowMajor q = mat.transpose() * p;
  const std::size_t cols = t.shape[1], rows_per = std::max<std::size_t>(1, chunk_elems / cols);
  for (std::size_t row = 0; row < t.shape[0]; row += rows_per) {
    const std::size_t rows = std::min(rows_per, t.shape[0] - row);
    auto ch = chunk_of(c, t, row * cols, rows * cols);
    std::string data(4 * (rows + cols) * c.rank(), '\0');
    std::memcpy(data.data(), p.data() + row * c.rank(), 4 * rows * c.rank());
    std::memcpy(data.data() + 4 * rows * c.rank(), q.data(), 4 * cols * c.rank());
    low_rank_product(p.data() + row * c.rank(), q.data(), rows, cols, c.rank(), dec.data() + row * cols);
    out.bytes += data.size();
    ch.set_data(std::move(data));
    out.chunks.push_back(std::move(ch));
  }
  return true;
}

}  // namespace

const Codec& powersgd_codec() {
  static const PowerSgd codec;
  return codec;
}

}  // namespace detail
}  // namespace xsilo::protocol
