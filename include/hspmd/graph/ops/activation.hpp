#pragma once
// Registry entries of the activations, elementwise on any shape.
//
//   op        forward FLOPs                        backward FLOPs
//   relu      n                                    n
//   gelu      6 n  (x/sqrt2, erf, +1, *0.5, *x)    9 n
//   tanh      n                                    3 n
//   sigmoid   3 n  (neg, exp, 1/(1+e))             3 n
//   silu      4 n  (sigmoid, *x)                   8 n  (sigmoid again, s (1 + x (1 - s)) dy)
//   swiglu    5 n  (silu(a) * b)                   13 n (da: 10, db: silu again and *)

#include <hspmd/graph/ops/common.hpp>

namespace hspmd::graph {

template <>
struct op_traits<op::relu> : unary_elementwise<1, 1> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "max(x, 0)";
};
template <>
struct op_traits<op::gelu> : unary_elementwise<6, 9> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "exact GELU: x * Phi(x)";
};
template <>
struct op_traits<op::tanh> : unary_elementwise<1, 3> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "tanh(x)";
};
template <>
struct op_traits<op::sigmoid> : unary_elementwise<3, 3> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "1 / (1 + exp(-x))";
};

template <>
struct op_traits<op::silu> : unary_elementwise<4, 8> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "x * sigmoid(x) (SiLU, swish)";
};

/// The gate of a SwiGLU MLP: silu(a) * b, a and b of one shape (the gate and up projections).
/// Splits along every dimension (after column-parallel projections, along the features);
/// linear in b.
template <>
struct op_traits<op::swiglu> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "silu(a) * b, a and b of one shape";
  static constexpr std::size_t arity = 2;
  static hspmd::shape shape(const node_view& v) {
    if (v.in(0).dims != v.in(1).dims)
      v.fail("gate " + v.in(0).to_string() + " and value " + v.in(1).to_string(),
             "two operands of one shape");
    hspmd::shape out = v.in(0);
    if (!out.batch_dim)
      out.batch_dim = v.in(1).batch_dim;
    return out;
  }
  static node_cost cost(const node_view& v) { return v.per_element_cost(5, 13); }
  static constexpr void signature(signature_builder& b) {
    b.fresh(0);
    auto& s = b.sig();
    s.in_rank[1] = s.in_rank[0];
    s.in[1] = s.in[0];
    b.same_as_input(0);
    b.linear_in(signature::linearity::each, 2);
  }
  static std::vector<op_example> examples() { return {{"", {{{3, 5}}, {{3, 5}}}}}; }
};

} // namespace hspmd::graph
