#pragma once
// Registry entries of the activations, elementwise on any shape.
//
//   op        forward FLOPs                        backward FLOPs
//   relu      n                                    n
//   gelu      6 n  (x/sqrt2, erf, +1, *0.5, *x)    9 n
//   tanh      n                                    3 n
//   sigmoid   3 n  (neg, exp, 1/(1+e))             3 n
//   silu      4 n  (sigmoid, *x)                   8 n  (sigmoid again, s (1 + x (1 - s)) dy)

#include <hspmd/graph/ops/common.hpp>

namespace hspmd::graph {

template <>
struct op_traits<op::relu> : unary_elementwise<1, 1> {
  static constexpr std::string_view summary = "max(x, 0)";
};
template <>
struct op_traits<op::gelu> : unary_elementwise<6, 9> {
  static constexpr std::string_view summary = "exact GELU: x * Phi(x)";
};
template <>
struct op_traits<op::tanh> : unary_elementwise<1, 3> {
  static constexpr std::string_view summary = "tanh(x)";
};
template <>
struct op_traits<op::sigmoid> : unary_elementwise<3, 3> {
  static constexpr std::string_view summary = "1 / (1 + exp(-x))";
};

template <>
struct op_traits<op::silu> : unary_elementwise<4, 8> {
  static constexpr std::string_view summary = "x * sigmoid(x) (SiLU, swish)";
};

} // namespace hspmd::graph
