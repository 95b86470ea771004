#include "server/group_sum.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace xsilo::server {

GroupSum::GroupSum(protocol::MaskedVector words, const crypto::FixedPointParams& codec, std::size_t d,
                   std::shared_ptr<const std::vector<std::uint64_t>> kept)
    : words_(std::move(words)), codec_(codec), d_(d), kept_(std::move(kept)) {
  const std::size_t held = kept_ ? kept_->size() : d_;
  if (words_.words() < held) {
    throw std::invalid_argument("group sum: " + std::to_string(words_.words()) + " words for " +
                                std::to_string(held) + " coordinates");
  }
  extras_ = words_.words() - held;
  if (kept_ && (!std::is_sorted(kept_->begin(), kept_->end()) || (!kept_->empty() && kept_->back() >= d_))) {
    throw std::invalid_argument("group sum: the kept coordinates must be ascending and below d");
  }
}

GroupSum::GroupSum(std::vector<double> decoded, std::size_t d) : decoded_(std::move(decoded)), d_(d) {
  if (decoded_.size() < d_) throw std::invalid_argument("group sum: fewer values than coordinates");
  extras_ = decoded_.size() - d_;
}

double GroupSum::at(std::size_t k) const {
  double v = 0;
  decode(k, {&v, 1});
  return v;
}

void GroupSum::decode(std::size_t from, std::span<double> out) const {
  if (from + out.size() > size()) throw std::out_of_range("group sum: coordinates past its end");
  if (!decoded_.empty()) {
    std::copy_n(decoded_.begin() + static_cast<std::ptrdiff_t>(from), out.size(), out.begin());
    return;
  }
  // Words [j, j + n) decoded into `to`.
  const auto words = [&](std::size_t j, std::span<double> to) {
    words_.visit([&](auto w) { crypto::decode(codec_, w.subspan(j, to.size()), to); });
  };
  if (!kept_) {  // word k is coordinate k
    words(from, out);
    return;
  }
  // The weighted coordinates: zero but for the kept ones, which are words [lo, hi).
  const std::size_t end = std::min(from + out.size(), d_);
  if (from < end) {
    const auto first = std::lower_bound(kept_->begin(), kept_->end(), from);
    const auto last = std::lower_bound(first, kept_->end(), end);
    std::fill(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(end - from), 0.0);
    const auto lo = static_cast<std::size_t>(first - kept_->begin());
    const auto hi = static_cast<std::size_t>(last - kept_->begin());
    std::vector<double> values(hi - lo);
    words(lo, values);
    for (std::size_t j = lo; j < hi; ++j) out[(*kept_)[j] - from] = values[j - lo];
  }
  // The extras after d are the words after the kept ones.
  if (from + out.size() > d_) {
    const std::size_t first_extra = std::max(from, d_);
    words(kept_->size() + (first_extra - d_), out.subspan(first_extra - from));
  }
}

}  // namespace xsilo::server
