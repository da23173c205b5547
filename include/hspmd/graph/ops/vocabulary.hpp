#pragma once
// Registry entries of the ops over a vocabulary: the embedding lookup and the cross-entropy
// loss. Both split along the vocabulary (a lookup yields a partial sum; the loss all-reduces
// the per-row maximum and sum, see graph/rules.hpp).
//
//   op             forward FLOPs        backward FLOPs
//   embedding      0 (a gather)         N H (scatter-add)
//   cross_entropy  5 V N + N            3 V N

#include <hspmd/graph/ops/common.hpp>

namespace hspmd::graph {

/// table (V, H), integer ids (...) -> (..., H).
template <>
struct op_traits<op::embedding> {
  static constexpr work rate = work::elementwise;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary = "rows of table (V, H) picked by ids (...): (..., H)";
  static constexpr std::size_t arity = 2;
  static hspmd::shape shape(const node_view& v) {
    if (v.in(0).rank() != 2)
      v.fail("table " + v.in(0).to_string(), "a (vocabulary, hidden) table");
    hspmd::shape out = v.in(1);
    out.dims.push_back(v.in(0).dims[1]);
    return out;
  }
  static node_cost cost(const node_view& v) {
    const double es = v.element_bytes();
    node_cost c;
    c.backward_flops = v.out_size(); // scatter-add of the output gradient into the table's
    c.forward_bytes = (2.0 * v.out_size() + v.in_size(1)) * es;
    c.backward_bytes = (2.0 * v.out_size() + v.in_size(1)) * es + v.in_size(0) * es;
    return c;
  }
  // table (V, H), ids (...) -> (..., H): a one-hot product, summed over V
  static constexpr void signature(signature_builder& b) {
    b.fresh(0);
    b.fresh(1);
    auto& s = b.sig();
    s.out_rank = b.out().rank;
    for (std::size_t i = 0; i < b.in(1).rank; ++i)
      s.out[i] = s.in[1][i];
    s.out[b.last(b.out())] = s.in[0][1];
    b.sum_over(s.in[0][0]);
    b.linear_in(signature::linearity::each, 1);
  }
  static std::vector<op_example> examples() {
    return {{"", {{{7, 3}}, {{2, 5}, dtype::i64}}, {}, 7}};
  }
};

/// logits (N, V), integer targets (N) -> (): the mean (or sum) over rows of -log softmax[target].
/// `attrs.scalar` is the divisor of a mean: the whole batch's row count, fixed when traced so a
/// rank's piece divides by it too; 0 means a sum.
template <>
struct op_traits<op::cross_entropy> {
  static constexpr work rate = work::softmax;
  static constexpr view_kind view = view_kind::none;
  static constexpr std::string_view summary =
      "logits (N, V), targets (N) -> (): mean (attrs.scalar = N) or sum (0) over rows of -log "
      "softmax(row)[target]";
  static constexpr std::size_t arity = 2;
  static hspmd::shape shape(const node_view& v) {
    const auto& logits = v.in(0);
    if (logits.rank() != 2 || v.in(1).rank() != 1 || v.in(1).dims[0] != logits.dims[0])
      v.fail("logits " + logits.to_string() + " and targets " + v.in(1).to_string(),
             "logits (N, V) and targets (N)");
    if (const double d = v.attrs().scalar; d < 0.0 || d != static_cast<double>(std::size_t(d)))
      v.fail("mean divisor " + std::to_string(d), "a whole row count, or 0 for a summed loss");
    return {};
  }
  static node_cost cost(const node_view& v) {
    const double rows = static_cast<double>(v.in(0).dims[0]);
    const double vocab = static_cast<double>(v.in(0).dims[1]);
    node_cost c = v.memory_cost();
    c.forward_flops = 5.0 * vocab * rows + rows;
    c.backward_flops = 3.0 * vocab * rows;
    return c;
  }
  // logits (N, V), targets (N) -> (): summed over rows; the vocabulary splits with care
  static constexpr void signature(signature_builder& b) {
    b.fresh(0);
    auto& s = b.sig();
    b.set_in(1, {s.in[0][0]});
    s.out_rank = 0;
    b.sum_over(s.in[0][0]);
    s.vocabulary = s.in[0][1];
  }
  static std::vector<op_example> examples() {
    return {{"sum", {{{4, 6}}, {{4}, dtype::i64}}, {}, 6},
            {"mean", {{{4, 6}}, {{4}, dtype::i64}}, {4.0, {}, false}, 6}};
  }
};

} // namespace hspmd::graph
