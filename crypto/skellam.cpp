#include "crypto/skellam.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "crypto/hash.h"

namespace xsilo::crypto {

namespace {

// The rotation's signs: a NoiseSource keyed by SHA-256("xsilo skellam-rotation" || seed), one
// bit of its stream a coordinate. Public: every silo and the server derive the same.
std::vector<signed char> rotation_signs(std::size_t n, std::uint64_t seed) {
  std::string label = "xsilo skellam-rotation ";
  label += std::to_string(seed);
  const auto digest = sha256(std::string_view(label));
  NoiseSource::Key key{};
  for (std::size_t i = 0; i < key.size(); ++i) key[i] = digest[i];
  NoiseSource bits(key);
  std::vector<signed char> s(n);
  std::uint64_t word = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 64 == 0) word = bits();
    s[i] = (word >> (i % 64)) & 1 ? 1 : -1;
  }
  return s;
}

template <class Word>
double encode_words(const SkellamParams& p, std::span<const float> delta, NoiseSource& noise, std::span<Word> out) {
  const std::size_t d = delta.size(), n = padded_length(d);
  if (out.size() != skellam_words(p, d)) throw std::invalid_argument("skellam: the output needs skellam_words() words");
  if (p.bits > 8 * sizeof(Word) || p.bits < 2) throw std::invalid_argument("skellam: bits must be in [2, ring]");
  double sq = 0;
  for (const float v : delta) sq += static_cast<double>(v) * static_cast<double>(v);
  const double norm = std::sqrt(sq);
  if (!std::isfinite(norm)) throw std::invalid_argument("skellam: the update is not finite");
  const double factor = norm > p.clip_norm ? p.clip_norm / norm : 1.0;
  std::vector<double> y(n, 0.0);
  for (std::size_t i = 0; i < d; ++i) y[i] = static_cast<double>(delta[i]) * factor * p.gamma;
  rotate(y, p.rotation_seed);
  // Conditional stochastic rounding: unbiased per coordinate, tried again while the rounded
  // vector is longer than the bound the accountant charges for.
  const double bound = rounded_l2_bound(p.gamma * p.clip_norm, n, p.beta);
  std::vector<std::int64_t> z(n);
  bool fits = false;
  for (int attempt = 0; attempt < 10000 && !fits; ++attempt) {
    double zsq = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double f = std::floor(y[i]);
      const double up = y[i] - f;
      const double r = f + (noise.uniform() < up ? 1.0 : 0.0);
      if (!(std::fabs(r) < 0x1p62)) throw std::runtime_error("skellam: a scaled coordinate does not fit in 62 bits");
      z[i] = static_cast<std::int64_t>(r);
      zsq += r * r;
    }
    fits = std::sqrt(zsq) <= bound;
  }
  if (!fits) throw std::runtime_error("skellam: the conditional rounding failed 10000 times");
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t v = z[i] + skellam(noise, p.silo_variance);
    out[i] = static_cast<Word>(static_cast<std::uint64_t>(v));  // two's complement, mod 2^ring
  }
  out[n] = Word{1};
  if (p.count_scale > 0) {
    if (p.count_scale >= (std::uint64_t{1} << 62)) throw std::invalid_argument("skellam: the count scale is too large");
    const auto h = static_cast<std::int64_t>(p.count_scale);
    const std::int64_t v = (norm <= p.clip_norm ? h : -h) + skellam(noise, p.silo_variance);
    out[n + 1] = static_cast<Word>(static_cast<std::uint64_t>(v));
  }
  return factor;
}

template <class Word>
std::vector<double> decode_words(const SkellamParams& p, std::span<const Word> sum, std::size_t d) {
  const std::size_t n = padded_length(d);
  if (sum.size() != skellam_words(p, d)) throw std::invalid_argument("skellam: the sum needs skellam_words() words");
  std::vector<double> y(n);
  for (std::size_t i = 0; i < n; ++i) y[i] = static_cast<double>(centred(sum[i], p.bits));
  unrotate(y, p.rotation_seed);
  std::vector<double> out(d + 1);
  for (std::size_t i = 0; i < d; ++i) out[i] = y[i] / p.gamma;
  out[d] = static_cast<double>(centred(sum[n], p.bits));
  // The count word's sum reaches n h plus the noise: read in the whole masking ring (a wider
  // ring than 2^bits costs nothing here, one word), reduction being post-processing either way.
  if (p.count_scale > 0) {
    out.push_back(static_cast<double>(centred(sum[n + 1], p.ring)) / (2.0 * static_cast<double>(p.count_scale)));
  }
  return out;
}

}  // namespace

std::size_t skellam_words(const SkellamParams& p, std::size_t d) {
  return padded_length(d) + 1 + (p.count_scale > 0 ? 1 : 0);
}

std::size_t padded_length(std::size_t d) {
  std::size_t n = 1;
  while (n < d) n <<= 1;
  return n;
}

double rounded_l2_bound(double c, std::size_t padded, double beta) {
  const double P = static_cast<double>(padded);
  const double cond = c * c + P / 4 + std::sqrt(2 * std::log(1 / beta)) * (c + std::sqrt(P) / 2);
  const double worst = (c + std::sqrt(P)) * (c + std::sqrt(P));
  return std::sqrt(std::min(cond, worst));
}

double skellam_noise_multiplier(double variance, double gamma, double clip_norm, std::size_t padded, double beta,
                                std::uint64_t count_scale) {
  if (!(variance >= 0) || !(gamma > 0) || !(clip_norm > 0) || padded == 0 || !(beta > 0 && beta < 1)) return 0;
  const double l2 = rounded_l2_bound(gamma * clip_norm, padded, beta), h = static_cast<double>(count_scale);
  return std::sqrt(variance) / std::sqrt(l2 * l2 + h * h);
}

void walsh_hadamard(std::span<double> x) {
  const std::size_t n = x.size();
  if (n == 0 || (n & (n - 1)) != 0) throw std::invalid_argument("walsh_hadamard: the length must be a power of two");
  // Butterflies of width h: (a, b) -> (a + b, a - b), log2(n) passes.
  for (std::size_t h = 1; h < n; h <<= 1) {
    for (std::size_t i = 0; i < n; i += 2 * h) {
      for (std::size_t j = i; j < i + h; ++j) {
        const double a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

void rotate(std::span<double> x, std::uint64_t seed) {
  const auto s = rotation_signs(x.size(), seed);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] *= s[i];
  walsh_hadamard(x);
  const double inv = 1 / std::sqrt(static_cast<double>(x.size()));
  for (auto& v : x) v *= inv;
}

void unrotate(std::span<double> x, std::uint64_t seed) {
  walsh_hadamard(x);
  const auto s = rotation_signs(x.size(), seed);
  const double inv = 1 / std::sqrt(static_cast<double>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] *= s[i] * inv;
}

std::uint64_t poisson(NoiseSource& noise, double lambda) {
  if (!(lambda >= 0) || !std::isfinite(lambda)) throw std::invalid_argument("poisson: lambda must be finite and >= 0");
  if (lambda > kMaxPoissonMean) throw std::invalid_argument("poisson: lambda above 2^52 cannot be drawn exactly");
  if (lambda == 0) return 0;
  if (lambda < 10) {
    const double limit = std::exp(-lambda);
    std::uint64_t k = 0;
    double prod = noise.uniform();
    while (prod >= limit) {
      ++k;
      prod *= noise.uniform();
    }
    return k;
  }
  // PTRS (Hörmann 1993), with its constants.
  const double slam = std::sqrt(lambda), loglam = std::log(lambda);
  const double b = 0.931 + 2.53 * slam;
  const double a = -0.059 + 0.02483 * b;
  const double invalpha = 1.1239 + 1.1328 / (b - 3.4);
  const double vr = 0.9277 - 3.6224 / (b - 2);
  for (;;) {
    const double u = noise.uniform() - 0.5;
    const double v = noise.uniform();
    const double us = 0.5 - std::fabs(u);
    const double k = std::floor((2 * a / us + b) * u + lambda + 0.43);
    if (us >= 0.07 && v <= vr) return static_cast<std::uint64_t>(k);
    if (k < 0 || (us < 0.013 && v > us)) continue;
    if (std::log(v) + std::log(invalpha) - std::log(a / (us * us) + b) <= -lambda + k * loglam - std::lgamma(k + 1)) {
      return static_cast<std::uint64_t>(k);
    }
  }
}

std::int64_t skellam(NoiseSource& noise, double variance) {
  const double half = variance / 2;
  return static_cast<std::int64_t>(poisson(noise, half)) - static_cast<std::int64_t>(poisson(noise, half));
}

std::int64_t centred(std::uint64_t word, std::uint32_t bits) {
  const std::uint64_t mask = bits >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1;
  const std::uint64_t w = word & mask;
  if (bits >= 64) return static_cast<std::int64_t>(w);
  const std::uint64_t half = std::uint64_t{1} << (bits - 1);
  return w >= half ? static_cast<std::int64_t>(w) - static_cast<std::int64_t>(std::uint64_t{1} << bits)
                   : static_cast<std::int64_t>(w);
}

// The header's overloads, one pair per word width, each the templates above.
#define XSILO_SKELLAM_WORD(Word)                                                                              \
  double encode_skellam(const SkellamParams& p, std::span<const float> delta, NoiseSource& noise,              \
                        std::span<Word> out) {                                                                \
    return encode_words(p, delta, noise, out);                                                                \
  }                                                                                                           \
  std::vector<double> decode_skellam(const SkellamParams& p, std::span<const Word> sum, std::size_t d) {      \
    return decode_words(p, sum, d);                                                                           \
  }
XSILO_SKELLAM_WORD(std::uint8_t)
XSILO_SKELLAM_WORD(std::uint16_t)
XSILO_SKELLAM_WORD(std::uint32_t)
XSILO_SKELLAM_WORD(std::uint64_t)
#undef XSILO_SKELLAM_WORD

}  // namespace xsilo::crypto
