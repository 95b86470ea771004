// The element-wise reductions of an all-reduce: sum (gradients, the default), min, max and
// product. Every TCP algorithm reduces through combine(), so a new reduction is one enum value,
// one name and one case there; NCCL maps each to its own ncclRedOp_t.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xsilo::collective {

enum class Op { sum, min, max, product };

std::string_view op_name(Op op);
// "sum", "min", "max", "product"; nullopt for anything else.
std::optional<Op> parse_op(std::string_view name);
const std::vector<std::string>& op_names();

// Which operand stands on the left of op(a, b). Sum and product are commutative, but min and
// max of +0 and -0, or of two NaNs, return whichever operand stands first: where two ranks
// compute the same element from the same two values (recursive doubling), both must put the
// same rank's value first, or the replicas differ in those bits.
enum class Operands { acc_first, in_first };

// acc[i] = op(acc[i], in[i]), or op(in[i], acc[i]) with Operands::in_first. min and max
// propagate NaN (a NaN on any rank makes the element NaN on every rank, as a NaN sum does).
void combine(Op op, std::span<float> acc, std::span<const float> in, Operands order = Operands::acc_first);

}  // namespace xsilo::collective
