#pragma once
// Registry entries of the ops that move elements without arithmetic: reshape (a view), permute,
// slice and concat (copies: bytes only).

#include <hspmd/graph/ops/common.hpp>

namespace hspmd::graph {

/// The same elements in a new shape (attrs.dims).
template <>
struct op_traits<op::reshape> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::reshaped;
  static constexpr std::string_view summary = "the same elements with shape attrs.dims";
  static constexpr std::size_t arity = 1;
  static hspmd::shape shape(const node_view& v) {
    const auto& x = v.in(0);
    hspmd::shape out;
    out.dims = v.attrs().dims;
    if (out.size() != x.size() || out.rank() == 0)
      v.fail("cannot reshape " + x.to_string() + " to " + out.to_string(),
             "the same number of elements");
    // The batch stays the outermost dimension when rows are only merged or split within it.
    if (x.batch_dim == 0 && (out.dims[0] == x.dims[0] || out.dims[0] % x.dims[0] == 0))
      out.batch_dim = 0;
    return out;
  }
  static node_cost cost(const node_view& /*v*/) { return {}; } // a view
  static constexpr void signature(signature_builder& b) {
    b.reshape_groups();
    b.linear_in(signature::linearity::joint, 1);
  }
  static std::vector<op_example> examples() {
    attributes a;
    a.dims = {6, 4};
    return {{"", {{{2, 3, 4}}}, a}};
  }
};

/// Shared cost of the copies: forward reads and writes, backward moves the gradient back.
inline node_cost copy_cost(const node_view& v) {
  node_cost c = v.memory_cost();
  c.backward_bytes = 2.0 * v.out_size() * v.element_bytes();
  return c;
}

/// Dimensions reordered: output dimension i is input dimension attrs.dims[i].
template <>
struct op_traits<op::permute> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::strided;
  static constexpr std::string_view summary =
      "dimensions reordered: output dimension i is input dimension attrs.dims[i]";
  static constexpr std::size_t arity = 1;
  static hspmd::shape shape(const node_view& v) {
    const auto& x = v.in(0);
    const auto& perm = v.attrs().dims;
    if (perm.size() != x.rank())
      v.fail("permutation of " + std::to_string(perm.size()) + " dimensions for " + x.to_string(),
             "one entry per dimension");
    std::vector<bool> seen(x.rank(), false);
    hspmd::shape out;
    out.dims.reserve(x.rank()); // (appended, not resized: GCC 12 -O3 warns of a null pointer)
    for (std::size_t i = 0; i < x.rank(); ++i) {
      const std::size_t from = perm[i];
      if (from >= x.rank() || seen[from])
        v.fail("invalid permutation", "each dimension exactly once");
      seen[from] = true;
      out.dims.push_back(x.dims[from]);
      if (x.batch_dim == from)
        out.batch_dim = i;
    }
    return out;
  }
  static node_cost cost(const node_view& v) { return copy_cost(v); }
  static constexpr void signature(signature_builder& b) {
    b.fresh(0);
    auto& s = b.sig();
    s.out_rank = b.out().rank;
    for (std::size_t i = 0; i < b.out().rank && i < b.attr_dims().size(); ++i)
      s.out[i] = s.in[0][b.attr_dims()[i]];
    b.linear_in(signature::linearity::joint, 1);
  }
  static std::vector<op_example> examples() {
    attributes a;
    a.dims = {2, 0, 1};
    return {{"", {{{2, 3, 4}}}, a}};
  }
};

/// Shared signature of slice and concat: every dimension but the axis (attrs.dims[0]) is shared
/// by the operands and the output; the axis cannot be split.
inline constexpr void axis_copy_signature(signature_builder& b) {
  const std::size_t axis = b.attr_dims().empty() ? 0 : b.attr_dims()[0];
  b.fresh(0);
  auto& s = b.sig();
  for (std::size_t k = 1; k < b.arity(); ++k) {
    s.in_rank[k] = b.in(k).rank;
    for (std::size_t i = 0; i < b.in(k).rank; ++i)
      s.in[k][i] = i == axis ? b.make(b.in(k)[i], false) : s.in[0][i];
  }
  b.same_as_input(0);
  b.forbid(s.in[0][axis]);
  s.out[axis] = b.make(b.out()[axis], false);
  b.linear_in(signature::linearity::joint, static_cast<std::uint8_t>((1U << b.arity()) - 1U));
}

/// attrs.dims = {axis, start, length}: that range of the axis.
template <>
struct op_traits<op::slice> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "the range attrs.dims = {axis, start, length}";
  static constexpr std::size_t arity = 1;
  static hspmd::shape shape(const node_view& v) {
    const auto& x = v.in(0);
    const auto& a = v.attrs().dims;
    if (a.size() != 3 || a[0] >= x.rank() || a[1] + a[2] > x.dims[a[0]])
      v.fail("slice {axis, start, length} " + std::to_string(a.size()) + " values of " +
                 x.to_string(),
             "an axis of the input and start + length within it");
    hspmd::shape out = x;
    out.dims[a[0]] = a[2];
    return out;
  }
  static node_cost cost(const node_view& v) { return copy_cost(v); }
  static constexpr void signature(signature_builder& b) { axis_copy_signature(b); }
  static std::vector<op_example> examples() {
    attributes a;
    a.dims = {1, 2, 3};
    return {{"", {{{2, 6, 3}}}, a}};
  }
};

/// The inputs joined along attrs.dims[0].
template <>
struct op_traits<op::concat> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "the inputs joined along attrs.dims[0]";
  static constexpr std::size_t arity = variadic;
  static hspmd::shape shape(const node_view& v) {
    if (v.attrs().dims.size() != 1 || v.attrs().dims[0] >= v.in(0).rank())
      v.fail("concat of " + std::to_string(v.arity()) + " inputs",
             "at least one input and attrs.dims = {axis}");
    const std::size_t axis = v.attrs().dims[0];
    hspmd::shape out = v.in(0);
    out.dims[axis] = 0;
    for (std::size_t i = 0; i < v.arity(); ++i) {
      auto a = v.in(i);
      if (a.rank() != out.rank())
        v.fail("ranks differ: " + v.in(0).to_string() + " and " + a.to_string(), "equal ranks");
      out.dims[axis] += a.dims[axis];
      a.dims[axis] = v.in(0).dims[axis];
      if (a.dims != v.in(0).dims)
        v.fail("shapes differ off the axis: " + v.in(0).to_string() + " and " + v.in(i).to_string(),
               "equal sizes in every other dimension");
    }
    return out;
  }
  static node_cost cost(const node_view& v) { return copy_cost(v); }
  static constexpr void signature(signature_builder& b) { axis_copy_signature(b); }
  static std::vector<op_example> examples() {
    attributes a;
    a.dims = {1};
    return {{"", {{{2, 1, 3}}, {{2, 4, 3}}, {{2, 2, 3}}}, a}};
  }
};

} // namespace hspmd::graph
