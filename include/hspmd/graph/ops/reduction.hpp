#pragma once
// Registry entries of the full reductions to a scalar: sum and mean (a local piece's mean
// divides by the whole tensor's element count, so partial means add up).
//
//   op     forward FLOPs    backward FLOPs
//   sum    n                n
//   mean   n + 1            n

#include <hspmd/graph/ops/common.hpp>

namespace hspmd::graph {

/// Shared entry of the reductions over all elements.
template <int Extra>
struct full_reduction {
  static constexpr std::size_t arity = 1;
  static hspmd::shape shape(const node_view& /*v*/) { return {}; }
  static node_cost cost(const node_view& v) {
    node_cost c = v.memory_cost();
    c.forward_flops = v.in_size(0) + Extra;
    c.backward_flops = v.in_size(0);
    return c;
  }
  static constexpr void signature(signature_builder& b) {
    b.fresh(0);
    b.sig().out_rank = 0;
    for (std::size_t i = 0; i < b.in(0).rank; ++i)
      b.sum_over(b.sig().in[0][i]);
    b.linear_in(signature::linearity::joint, 1);
  }
  static std::vector<op_example> examples() { return {{"", {{{3, 4}}}}}; }
};

template <>
struct op_traits<op::sum> : full_reduction<0> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "the sum of all elements: ()";
};
template <>
struct op_traits<op::mean> : full_reduction<1> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "the mean of all elements: ()";
};

} // namespace hspmd::graph
