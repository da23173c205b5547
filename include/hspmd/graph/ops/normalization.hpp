#pragma once
// Registry entries of the ops that normalize over the last dimension: softmax, log-softmax,
// layer norm. The normalized axis cannot be split (every output needs the whole row).
//
//   op            forward FLOPs                          backward FLOPs
//   softmax (R,L) 5 L R  (max, sub, exp, sum, div)       4 L R
//   log_softmax   5 L R  (max, sub, exp, sum, log+sub)   4 L R
//   layer_norm    8 L R                                  11 L R + 4 L R (dgamma, dbeta)
//   rms_norm      4 L R  (square, sum, scale, weight)    8 L R + 2 L R (dweight)
// A causal softmax is counted like a full one (the masked half is skipped, not free of passes).

#include <hspmd/graph/ops/common.hpp>

namespace hspmd::graph {

/// Shared entry of the row-wise normalizations of one input.
struct row_normalization : unary_elementwise<5, 4> {
  static hspmd::shape shape(const node_view& v) {
    if (v.in(0).rank() == 0)
      v.fail("a scalar has no last dimension", "apply it to a tensor");
    return v.in(0);
  }
  static constexpr void signature(signature_builder& b) {
    unary_elementwise::signature(b);
    b.forbid(b.sig().in[0][b.last(b.in(0))]); // the normalized axis
  }
};

/// Softmax over the last dimension; attrs.flag: causal (of (..., S, S), row i sees j <= i).
template <>
struct op_traits<op::softmax> : row_normalization {
  static constexpr work rate = work::softmax;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary =
      "softmax over the last dimension; flag: causal, row i of (..., S, S) sees keys j <= i";
  static hspmd::shape shape(const node_view& v) {
    const auto& x = row_normalization::shape(v);
    if (v.attrs().flag && (x.rank() < 2 || x.dims[x.rank() - 1] != x.dims[x.rank() - 2]))
      v.fail("a causal softmax of " + x.to_string(), "scores of shape (..., S, S)");
    return x;
  }
  static std::vector<op_example> examples() {
    attributes causal;
    causal.flag = true;
    return {{"", {{{3, 5}}}}, {"causal", {{{2, 4, 4}}}, causal}};
  }
};

/// Log-softmax over the last dimension.
template <>
struct op_traits<op::log_softmax> : row_normalization {
  static constexpr work rate = work::softmax;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "log-softmax over the last dimension";
};

/// Layer normalization over the last dimension: x, gamma, beta; attrs.scalar = epsilon.
template <>
struct op_traits<op::layer_norm> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary =
      "(x - mean) / sqrt(var + attrs.scalar) * gamma + beta over the last dimension";
  static constexpr std::size_t arity = 3;
  static hspmd::shape shape(const node_view& v) {
    const auto& x = v.in(0);
    if (x.rank() == 0 || v.in(1).dims != std::vector<std::size_t>{x.dims.back()} ||
        v.in(2).dims != std::vector<std::size_t>{x.dims.back()})
      v.fail("gamma " + v.in(1).to_string() + " and beta " + v.in(2).to_string() + " for " +
                 x.to_string(),
             "gamma and beta of shape (last dimension)");
    return x;
  }
  static node_cost cost(const node_view& v) { return v.per_element_cost(8, 15); }
  static constexpr void signature(signature_builder& b) {
    b.fresh(0);
    b.same_as_input(0);
    const label axis = b.sig().in[0][b.last(b.in(0))];
    for (std::size_t k = 1; k < b.arity(); ++k)
      b.set_in(k, {axis});
    b.forbid(axis);
  }
  static std::vector<op_example> examples() {
    attributes a;
    a.scalar = 1e-5;
    return {{"", {{{2, 3, 6}}, {{6}}, {{6}}}, a}};
  }
};

/// RMS normalization over the last dimension: x / sqrt(mean(x^2) + attrs.scalar) * weight.
/// Splits along any other dimension (batch, sequence); linear in neither operand.
template <>
struct op_traits<op::rms_norm> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary =
      "x / sqrt(mean(x^2) + attrs.scalar) * weight over the last dimension";
  static constexpr std::size_t arity = 2;
  static hspmd::shape shape(const node_view& v) {
    const auto& x = v.in(0);
    if (x.rank() == 0 || v.in(1).dims != std::vector<std::size_t>{x.dims.back()})
      v.fail("weight " + v.in(1).to_string() + " for " + x.to_string(),
             "a weight of shape (last dimension)");
    if (!(v.attrs().scalar > 0.0))
      v.fail("epsilon " + std::to_string(v.attrs().scalar), "a positive epsilon (1e-5, 1e-6)");
    return x;
  }
  static node_cost cost(const node_view& v) { return v.per_element_cost(4, 10); }
  static constexpr void signature(signature_builder& b) {
    b.fresh(0);
    b.same_as_input(0);
    const label axis = b.sig().in[0][b.last(b.in(0))];
    b.set_in(1, {axis});
    b.forbid(axis);
  }
  static std::vector<op_example> examples() {
    attributes a;
    a.scalar = 1e-6;
    return {{"", {{{2, 3, 6}}, {{6}}}, a}};
  }
};

} // namespace hspmd::graph
