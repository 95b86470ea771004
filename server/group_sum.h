// A secure group's unmasked sum, kept as the ring's words it was added up in and decoded a block
// at a time where it is read. Decoding every group's sum into doubles at once held 2 models'
// worth of bytes a group beside the words (issue 43: a secure round over 8 silos and 10M
// parameters peaked at 649 MiB against 184 MiB for 3 models + 64 MiB); the words are exact, so
// decoding them where they are read gives the same doubles, bit for bit.
//
// The sum's coordinates: d weighted coordinates, then the summed weight, then (when the round
// counts unclipped members) the unclipped count. Under RANDOM_K the words hold only the shared
// kept coordinates; the others read as zero.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "crypto/fixed_point.h"
#include "protocol/masked.h"

namespace xsilo::server {

class GroupSum {
 public:
  // Coordinates decode this many at a time: 512 KiB of doubles, whatever the model's size.
  static constexpr std::size_t kBlock = std::size_t{1} << 16;

  GroupSum() = default;
  // The unmasked words of a group's sum over d coordinates (`kept`, sorted ascending: the
  // coordinates RANDOM_K kept, or null for all d).
  GroupSum(protocol::MaskedVector words, const crypto::FixedPointParams& codec, std::size_t d,
           std::shared_ptr<const std::vector<std::uint64_t>> kept = nullptr);
  // A sum already decoded: distributed DP's, whose words must be rotated back as a whole
  // (crypto::decode_skellam) before any coordinate can be read.
  explicit GroupSum(std::vector<double> decoded, std::size_t d);

  std::size_t d() const { return d_; }
  std::size_t size() const { return d_ + extras_; }  // d, then the weight and the count
  double weight() const { return at(d_); }
  // Coordinate k (k < size()).
  double at(std::size_t k) const;
  // Coordinates [from, from + out.size()) decoded into `out`.
  void decode(std::size_t from, std::span<double> out) const;
  // f(from, block) for every block of the d weighted coordinates, in order; `block` is reused.
  template <class F>
  void for_each_block(F&& f) const {
    std::vector<double> block(std::min(kBlock, d_));
    for (std::size_t from = 0; from < d_; from += kBlock) {
      const std::span<double> part(block.data(), std::min(kBlock, d_ - from));
      decode(from, part);
      f(from, std::span<const double>(part));
    }
  }

 private:
  protocol::MaskedVector words_;
  std::vector<double> decoded_;  // when constructed from doubles
  crypto::FixedPointParams codec_{};
  std::size_t d_ = 0, extras_ = 0;
  std::shared_ptr<const std::vector<std::uint64_t>> kept_;
};

}  // namespace xsilo::server
