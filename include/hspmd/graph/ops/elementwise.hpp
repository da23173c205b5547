#pragma once
// Registry entries of elementwise arithmetic: add, sub, mul (numpy-style broadcasting over
// trailing dimensions), scale, dropout, broadcast.
//
//   op          forward FLOPs                 backward FLOPs
//   add, sub    n                             n (broadcast gradients are summed: <= n adds)
//   mul         n                             2 n
//   scale       n                             n
//   dropout     2 n (draw+compare, scale)     n
//   broadcast   0 (a copy)                    n (the reduction of the gradient)

#include <hspmd/graph/ops/common.hpp>

namespace hspmd::graph {

/// Shared entry of the broadcasting binary ops.
template <int F, int B, signature::linearity L>
struct broadcasting_binary {
  static constexpr std::size_t arity = 2;
  static hspmd::shape shape(const node_view& v) { return broadcast_shapes(v, v.in(0), v.in(1)); }
  static node_cost cost(const node_view& v) { return v.per_element_cost(F, B); }
  static constexpr void signature(signature_builder& b) {
    b.broadcasting();
    b.linear_in(L, 3);
  }
  static std::vector<op_example> examples() {
    return {{"", {{{3, 4}}, {{3, 4}}}},
            {"broadcast", {{{2, 3, 4}}, {{4}}}},
            {"broadcast both", {{{2, 3, 1}}, {{3, 4}}}}};
  }
};

/// a + b.
template <>
struct op_traits<op::add> : broadcasting_binary<1, 1, signature::linearity::joint> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "a + b, broadcast over trailing dimensions";
};
/// a - b.
template <>
struct op_traits<op::sub> : broadcasting_binary<1, 1, signature::linearity::joint> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "a - b, broadcast over trailing dimensions";
};
/// a * b.
template <>
struct op_traits<op::mul> : broadcasting_binary<1, 2, signature::linearity::each> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "a * b, broadcast over trailing dimensions";
};

/// x * attrs.scalar.
template <>
struct op_traits<op::scale> : unary_elementwise<1, 1> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "x * attrs.scalar";
  static constexpr void signature(signature_builder& b) {
    unary_elementwise::signature(b);
    b.linear_in(signature::linearity::joint, 1);
  }
  static std::vector<op_example> examples() {
    attributes a;
    a.scalar = -2.5;
    return {{"", {{{3, 4}}}, a}};
  }
};

/// Zero with probability attrs.scalar, scale the rest by 1 / (1 - p); the identity outside
/// training. Masks are drawn by (seed, step, node, global index).
template <>
struct op_traits<op::dropout> : unary_elementwise<2, 1> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary =
      "zero with probability attrs.scalar, the rest scaled by 1/(1-p); training only";
  static hspmd::shape shape(const node_view& v) {
    if (!(v.attrs().scalar >= 0.0 && v.attrs().scalar < 1.0))
      v.fail("dropout probability " + std::to_string(v.attrs().scalar), "0 <= p < 1");
    return v.in(0);
  }
  static constexpr void signature(signature_builder& b) {
    unary_elementwise::signature(b);
    b.linear_in(signature::linearity::joint, 1);
  }
  static std::vector<op_example> examples() {
    attributes a;
    a.scalar = 0.3;
    return {{"", {{{4, 5}}}, a}};
  }
};

/// x repeated numpy-style to attrs.dims (a CLS token per image); flag: dim 0 is the batch.
template <>
struct op_traits<op::broadcast> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary =
      "x repeated to attrs.dims (numpy rules); flag: dimension 0 is the batch";
  static constexpr std::size_t arity = 1;
  static hspmd::shape shape(const node_view& v) {
    hspmd::shape target;
    target.dims = v.attrs().dims;
    hspmd::shape out = broadcast_shapes(v, v.in(0), target);
    if (out.dims != target.dims)
      v.fail("cannot broadcast " + v.in(0).to_string() + " to " + target.to_string(),
             "a target whose trailing dimensions match or are 1 in the input");
    if (v.attrs().flag) // the target's outermost dimension is the batch
      out.batch_dim = 0;
    return out;
  }
  static node_cost cost(const node_view& v) { return v.per_element_cost(0, 1); }
  static constexpr void signature(signature_builder& b) {
    b.broadcasting();
    b.linear_in(signature::linearity::joint, 1);
  }
  static std::vector<op_example> examples() {
    attributes a;
    a.dims = {3, 2, 4};
    return {{"", {{{1, 4}}}, a}};
  }
};

} // namespace hspmd::graph
