#include "silo_agent/collective/reduce_op.h"

#include <algorithm>
#include <cstddef>

namespace xsilo::collective {

namespace {

struct Sum {
  float operator()(float a, float b) const { return a + b; }
};
struct Product {
  float operator()(float a, float b) const { return a * b; }
};
// b replaces a when it is smaller, or when it is NaN; a NaN a stays. Equal values keep a.
struct Min {
  float operator()(float a, float b) const { return (b < a || b != b) ? b : a; }
};
struct Max {
  float operator()(float a, float b) const { return (b > a || b != b) ? b : a; }
};

// One loop per (reduction, order), with the choice made outside it, so that each vectorizes.
template <class F>
void apply(F f, float* __restrict acc, const float* __restrict in, std::size_t n, Operands order) {
  if (order == Operands::acc_first) {
    for (std::size_t i = 0; i < n; ++i) acc[i] = f(acc[i], in[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) acc[i] = f(in[i], acc[i]);
  }
}

}  // namespace

std::string_view op_name(Op op) {
  switch (op) {
    case Op::sum: return "sum";
    case Op::min: return "min";
    case Op::max: return "max";
    case Op::product: return "product";
  }
  return "?";
}

const std::vector<std::string>& op_names() {
  static const std::vector<std::string> names{"sum", "min", "max", "product"};
  return names;
}

std::optional<Op> parse_op(std::string_view name) {
  for (Op op : {Op::sum, Op::min, Op::max, Op::product}) {
    if (op_name(op) == name) return op;
  }
  return std::nullopt;
}

void combine(Op op, std::span<float> acc, std::span<const float> in, Operands order) {
  const std::size_t n = std::min(acc.size(), in.size());
  switch (op) {
    case Op::sum: return apply(Sum{}, acc.data(), in.data(), n, order);
    case Op::min: return apply(Min{}, acc.data(), in.data(), n, order);
    case Op::max: return apply(Max{}, acc.data(), in.data(), n, order);
    case Op::product: return apply(Product{}, acc.data(), in.data(), n, order);
  }
}

}  // namespace xsilo::collective
