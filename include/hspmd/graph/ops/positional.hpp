#pragma once
// Registry entry of the rotary position embedding (RoFormer; LLaMA's queries and keys).
//
//   op       forward FLOPs                              backward FLOPs
//   rotary   4 n  (cos, sin, 4 mul, 2 add per pair)     4 n  (the inverse rotation)

#include <hspmd/graph/ops/common.hpp>

namespace hspmd::graph {

/// x (..., S, heads, d), d even: each pair (x[2i], x[2i+1]) of the position p along dimension
/// rank-3 is rotated by the angle p * attrs.scalar^(-2i/d) (attrs.scalar: the base, 10000).
/// Splits along every dimension but the pairs'; a split sequence rotates by global positions.
template <>
struct op_traits<op::rotary> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary =
      "x (..., S, heads, d): pairs of position p rotated by p * attrs.scalar^(-2i/d)";
  static constexpr std::size_t arity = 1;
  static hspmd::shape shape(const node_view& v) {
    const auto& x = v.in(0);
    if (x.rank() < 3 || x.dims.back() % 2 != 0)
      v.fail("rotary embedding of " + x.to_string(), "x (..., S, heads, d) with an even d");
    if (!(v.attrs().scalar > 1.0))
      v.fail("base " + std::to_string(v.attrs().scalar), "a base above 1 (10000)");
    return x;
  }
  static node_cost cost(const node_view& v) { return v.per_element_cost(4, 4); }
  static constexpr void signature(signature_builder& b) {
    b.fresh(0);
    b.same_as_input(0);
    b.forbid(b.sig().in[0][b.last(b.in(0))]); // the pairs
    b.linear_in(signature::linearity::joint, 1);
  }
  static std::vector<op_example> examples() {
    attributes a;
    a.scalar = 10000.0;
    attributes small_base;
    small_base.scalar = 3.0; // large angles at every pair
    return {{"", {{{2, 3, 2, 4}}}, a}, {"base 3", {{{1, 5, 1, 6}}}, small_base}};
  }
};

} // namespace hspmd::graph
