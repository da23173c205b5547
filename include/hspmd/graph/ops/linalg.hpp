#pragma once
// Registry entries of the products: matmul, linear (matmul + bias), batched matmul.
//
//   op              forward FLOPs          backward FLOPs
//   matmul m,k,n    2 m k n                4 m k n            (dA and dB)
//   linear          2 m k n + m n          4 m k n + m n      (+ bias gradient)
//   batched_matmul  2 b m k n              4 b m k n

#include <hspmd/graph/ops/common.hpp>

namespace hspmd::graph {

/// x (..., m, k) times w (k, n) -> (..., m, n): the weight is shared by the leading dimensions.
template <>
struct op_traits<op::matmul> {
  static constexpr work rate = work::gemm;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "(..., m, k) x (k, n) -> (..., m, n)";
  static constexpr std::size_t arity = 2;
  static hspmd::shape shape(const node_view& v) {
    const auto& a = v.in(0);
    const auto& w = v.in(1);
    if (a.rank() < 2 || w.rank() != 2 || a.dims.back() != w.dims[0])
      v.fail("cannot multiply " + a.to_string() + " by " + w.to_string(), "(..., m, k) by (k, n)");
    if (v.arity() == 3 && (v.in(2).rank() != 1 || v.in(2).dims[0] != w.dims[1]))
      v.fail("bias " + v.in(2).to_string() + " for " + std::to_string(w.dims[1]) + " outputs",
             "a bias of shape (n)");
    hspmd::shape out = a;
    out.dims.back() = w.dims[1];
    return out;
  }
  static node_cost cost(const node_view& v) {
    const double m = static_cast<double>(rows_of(v.in(0)));
    const double k = static_cast<double>(v.in(1).dims[0]);
    const double n = static_cast<double>(v.in(1).dims[1]);
    node_cost c = v.memory_cost();
    c.forward_flops = 2.0 * m * k * n;
    c.backward_flops = 4.0 * m * k * n;
    if (v.arity() == 3) { // the bias, and its gradient
      c.forward_flops += m * n;
      c.backward_flops += m * n;
    }
    return c;
  }
  // x (..., m, k), w (k, n) [, b (n)] -> (..., m, n); k summed over.
  static constexpr void signature(signature_builder& b) {
    b.fresh(0);
    const label k = b.sig().in[0][b.last(b.in(0))];
    const label n = b.make(b.in(1)[1]);
    b.set_in(1, {k, n});
    b.sig().out_rank = b.out().rank;
    for (std::size_t i = 0; i + 1 < b.out().rank; ++i)
      b.sig().out[i] = b.sig().in[0][i];
    b.sig().out[b.last(b.out())] = n;
    if (b.arity() > 2) {
      b.set_in(2, {n});
      b.sig().bias = 2;
    }
    b.sum_over(k);
    b.linear_in(signature::linearity::each, b.arity() > 2 ? 1 : 3);
  }
  static std::vector<op_example> examples() { return {{"", {{{2, 3, 4}}, {{4, 5}}}}}; }
};

/// matmul plus a bias: (..., m, k) x (k, n) + (n).
template <>
struct op_traits<op::linear> : op_traits<op::matmul> {
  static constexpr work rate = work::gemm;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "(..., m, k) x (k, n) + bias (n)";
  static constexpr std::size_t arity = 3;
  static std::vector<op_example> examples() { return {{"", {{{3, 4}}, {{4, 5}}, {{5}}}}}; }
};

/// (b..., m, k) x (b..., k, n) -> (b..., m, n); attrs.flag: B is stored (b..., n, k), transposed.
template <>
struct op_traits<op::batched_matmul> {
  static constexpr work rate = work::gemm;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary =
      "(b..., m, k) x (b..., k, n) -> (b..., m, n); flag: B transposed";
  static constexpr std::size_t arity = 2;
  static hspmd::shape shape(const node_view& v) {
    const auto& a = v.in(0);
    const auto& b = v.in(1);
    const std::size_t r = a.rank();
    const bool bt = v.attrs().flag;
    if (r < 3 || b.rank() != r || !std::equal(a.dims.begin(), a.dims.end() - 2, b.dims.begin()) ||
        a.dims[r - 1] != (bt ? b.dims[r - 1] : b.dims[r - 2]))
      v.fail("cannot batch-multiply " + a.to_string() + " by " + b.to_string() +
                 (bt ? " transposed" : ""),
             "(b..., m, k) by (b..., k, n), or by (b..., n, k) transposed");
    hspmd::shape out = a;
    out.dims[r - 1] = bt ? b.dims[r - 2] : b.dims[r - 1];
    return out;
  }
  static node_cost cost(const node_view& v) {
    const double k = static_cast<double>(v.in(0).dims.back());
    node_cost c = v.memory_cost();
    c.forward_flops = 2.0 * v.out_size() * k; // out = b m n
    c.backward_flops = 4.0 * v.out_size() * k;
    return c;
  }
  // a (b..., m, k), b (b..., k, n) or, transposed, (b..., n, k) -> (b..., m, n)
  static constexpr void signature(signature_builder& b) {
    b.fresh(0);
    const std::size_t r = b.in(0).rank;
    auto& s = b.sig();
    const label k = s.in[0][r - 1];
    const label n = b.make(b.in(1)[b.flag() ? r - 2 : r - 1]);
    s.in_rank[1] = r;
    for (std::size_t i = 0; i + 2 < r; ++i)
      s.in[1][i] = b.in(1)[i] == b.in(0)[i] ? s.in[0][i] : b.make(b.in(1)[i], false);
    s.in[1][r - 2] = b.flag() ? n : k;
    s.in[1][r - 1] = b.flag() ? k : n;
    s.out_rank = r;
    for (std::size_t i = 0; i + 1 < r; ++i)
      s.out[i] = s.in[0][i];
    s.out[r - 1] = n;
    b.sum_over(k);
    b.linear_in(signature::linearity::each, 3);
  }
  static std::vector<op_example> examples() {
    attributes transposed;
    transposed.flag = true;
    return {{"", {{{2, 2, 3, 4}}, {{2, 2, 4, 5}}}},
            {"B transposed", {{{2, 2, 3, 4}}, {{2, 2, 5, 4}}}, transposed}};
  }
};

} // namespace hspmd::graph
