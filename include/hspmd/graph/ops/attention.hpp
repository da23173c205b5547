#pragma once
// Registry entry of fused scaled-dot-product attention: softmax(scale q k^T [causal mask]) v in
// one op that never stores the (S, T) scores. The forward keeps one number per query row (the
// log of its softmax denominator) and the backward recomputes the scores from q and k, so a
// layer's attention keeps q, k, v and its output (O(S d)) instead of five O(S^2) tensors: what
// makes long sequences and big models fit (the memory model counts what the graph keeps).
//
//   op          forward FLOPs                 backward FLOPs
//   attention   P (2 d + 2 e + 4)             P (8 d + 6 e + 6) + 2 R S e
// with P the (query, key) pairs computed: R S T, or R S (S + 1) / 2 causal (masked pairs are
// skipped, not computed), R the product of the leading dimensions. Forward: the score (2 d), the
// running maximum, exp and sum (4) and the weighted sum of values (2 e). Backward: the scores
// twice (once for dq, once for dk and dv: no two rows write one gradient row), exp, the value
// products (2 e, twice), dq, dk (2 d each), dv (2 e); plus the rows' dot(dout, out).

#include <hspmd/graph/ops/common.hpp>

namespace hspmd::graph {

/// q (b..., S, d), k (b..., T, d), v (b..., T, e) -> (b..., S, e): row i of the output is
/// sum_j softmax_j(attrs.scalar * q_i . k_j) v_j. attrs.flag: causal (S = T; query i sees keys
/// j <= i). Splits along the leading dimensions (batch, heads) and the queries (each piece masks
/// by its global positions); never the keys, the head size or the value width.
///
/// Grouped-query attention: k and v may have fewer heads (the dimension before T, rank >= 4)
/// than q when theirs divide q's; query head h reads key/value head h / (H_q / H_kv), as
/// Hugging Face's repeat_kv lays them out. The head dimensions of q, k, v and the output share one
/// label, so a split divides them in whole groups alike (synth/shards.hpp: units of the gcd).
template <>
struct op_traits<op::attention> {
  static constexpr work rate = work::gemm;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary =
      "softmax(attrs.scalar q k^T) v over (b..., S, d), (b..., T, d), (b..., T, e); flag: causal";
  static constexpr std::size_t arity = 3;
  static hspmd::shape shape(const node_view& v) {
    const auto& q = v.in(0);
    const auto& k = v.in(1);
    const auto& x = v.in(2);
    const std::size_t r = q.rank();
    // The leading dimensions equal q's, but for the head dimension (r - 3), which may divide it.
    const auto lead_equal = [&](const hspmd::shape& o) {
      if (o.rank() != r)
        return false;
      for (std::size_t i = 0; i + 2 < r; ++i) {
        const bool heads = r >= 4 && i + 3 == r;
        if (heads ? o.dims[i] == 0 || q.dims[i] % o.dims[i] != 0 : o.dims[i] != q.dims[i])
          return false;
      }
      return true;
    };
    if (r < 3 || !lead_equal(k) || !lead_equal(x) || k.dims[r - 1] != q.dims[r - 1] ||
        x.dims[r - 2] != k.dims[r - 2] || (r >= 4 && x.dims[r - 3] != k.dims[r - 3]))
      v.fail("attention of q " + q.to_string() + ", k " + k.to_string() + ", v " + x.to_string(),
             "q (b..., S, d), k (b..., T, d) and v (b..., T, e); k and v may have fewer heads "
             "(dimension -3) when theirs divide q's");
    if (v.attrs().flag && q.dims[r - 2] != k.dims[r - 2])
      v.fail("causal attention of " + std::to_string(q.dims[r - 2]) + " queries over " +
                 std::to_string(k.dims[r - 2]) + " keys",
             "as many keys as queries (S = T)");
    if (!(v.attrs().scalar > 0.0))
      v.fail("scale " + std::to_string(v.attrs().scalar), "a positive scale (1 / sqrt(d))");
    hspmd::shape out = q;
    out.dims[r - 1] = x.dims[r - 1];
    return out;
  }
  static node_cost cost(const node_view& v) {
    const auto& q = v.in(0);
    const std::size_t r = q.rank();
    const double s = static_cast<double>(q.dims[r - 2]);
    const double t = static_cast<double>(v.in(1).dims[r - 2]);
    const double d = static_cast<double>(q.dims[r - 1]);
    const double e = static_cast<double>(v.in(2).dims[r - 1]);
    const double rows = s == 0.0 ? 0.0 : static_cast<double>(q.size()) / (s * d);
    const double pairs = rows * (v.attrs().flag ? s * (s + 1.0) / 2.0 : s * t);
    node_cost c = v.memory_cost();
    c.forward_flops = pairs * (2.0 * d + 2.0 * e + 4.0);
    c.backward_flops = pairs * (8.0 * d + 6.0 * e + 6.0) + 2.0 * rows * s * e;
    return c;
  }
  // q (b..., S, d), k (b..., T, d), v (b..., T, e) -> (b..., S, e)
  static constexpr void signature(signature_builder& b) {
    b.fresh(0);
    const std::size_t r = b.in(0).rank;
    auto& s = b.sig();
    const label queries = s.in[0][r - 2];
    const label d = s.in[0][r - 1];
    b.forbid(d); // the scores are not linear in a piece of the head
    const label keys = b.make(b.in(1)[r - 2], false);
    // Not the value width either: every piece would recompute all the scores, which the cost
    // model (work scaled by the share) would price at a fraction.
    const label e = b.make(b.in(2)[r - 1], false);
    for (std::size_t k = 1; k < 3; ++k) {
      s.in_rank[k] = r;
      for (std::size_t i = 0; i + 2 < r; ++i)
        s.in[k][i] = s.in[0][i];
      s.in[k][r - 2] = keys;
    }
    s.in[1][r - 1] = d;
    s.in[2][r - 1] = e;
    s.out_rank = r;
    for (std::size_t i = 0; i + 2 < r; ++i)
      s.out[i] = s.in[0][i];
    s.out[r - 2] = queries;
    s.out[r - 1] = e;
  }
  static std::vector<op_example> examples() {
    attributes a;
    a.scalar = 0.5;
    attributes causal;
    causal.scalar = 0.6;
    causal.flag = true;
    return {{"", {{{2, 3, 4}}, {{2, 5, 4}}, {{2, 5, 3}}}, a},
            {"causal", {{{1, 2, 4, 3}}, {{1, 2, 4, 3}}, {{1, 2, 4, 2}}}, causal},
            {"grouped", {{{2, 4, 3, 2}}, {{2, 2, 3, 2}}, {{2, 2, 3, 3}}}, causal}};
  }
};

} // namespace hspmd::graph
