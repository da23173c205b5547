#pragma once
// Multi-head attention (composite: projections, batched matmuls, softmax with an optional causal
// mask) and a pre-norm transformer block. The attention projections are linear nodes of their own,
// so their FLOPs count (HAP's cost model left them out).
//
//     nn::multi_head_attention<float, 256> attn{"attn", /*heads=*/4, /*causal=*/true};
//     auto y = attn(t, x);                 // x, y: (batch, S, 256)

#include <hspmd/core/error.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/nn/layers.hpp>
#include <hspmd/nn/ops.hpp>
#include <hspmd/nn/tracer.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <utility>

namespace hspmd::nn {

/// Self-attention over x (B, S, H) with `heads` heads of H / heads features.
template <class T, std::size_t H>
struct multi_head_attention {
  std::string name;
  std::size_t heads = 1;
  bool causal = false;
  double dropout = 0.0; ///< on the attention probabilities
  std::size_t hidden = H;

  // Composite layers work on the unpinned view of x: pins propagate through their nodes at
  // run time (tracer::op), not through their types.
  template <extents_type E, class P>
  requires(E::rank() == 3) value<T, E>
  operator()(tracer& t, const value<T, E, P>& pinned_x) const {
    const value<T, E> x(t, pinned_x.id(), pinned_x.extents());
    const auto scope = t.scope(name);
    if (heads == 0 || hidden % heads != 0)
      throw plan_error("multi_head_attention \"" + t.qualified("") + "\"",
                       std::to_string(hidden) + " features for " + std::to_string(heads) + " heads",
                       "a head count that divides the hidden size");
    const std::size_t b = x.extent(0);
    const std::size_t s = x.extent(1);
    const std::size_t d = hidden / heads;
    const auto proj = [&](const char* n) { return linear<T, H, H>(n, hidden, hidden)(t, x).id(); };
    // (B, S, H) -> (B, S, heads, d) -> (B, heads, S, d)
    const auto split_heads = [&](graph::node_id v) {
      const auto r = t.op(graph::op::reshape, {v}, graph::attributes{0.0, {b, s, heads, d}, false});
      return t.op(graph::op::permute, {r}, graph::attributes{0.0, {0, 2, 1, 3}, false});
    };
    const auto q = split_heads(proj("wq"));
    const auto k = split_heads(proj("wk"));
    const auto v = split_heads(proj("wv"));
    graph::attributes qk;
    qk.flag = true;                                            // q k^T
    auto scores = t.op(graph::op::batched_matmul, {q, k}, qk); // (B, heads, S, S)
    graph::attributes sc;
    sc.scalar = 1.0 / std::sqrt(static_cast<double>(d));
    scores = t.op(graph::op::scale, {scores}, sc);
    graph::attributes sm;
    sm.flag = causal;
    auto probs = t.op(graph::op::softmax, {scores}, sm);
    if (dropout > 0.0) {
      graph::attributes dr;
      dr.scalar = dropout;
      probs = t.op(graph::op::dropout, {probs}, dr);
    }
    const auto ctx = t.op(graph::op::batched_matmul, {probs, v}); // (B, heads, S, d)
    const auto merged =
        t.op(graph::op::permute, {ctx}, graph::attributes{0.0, {0, 2, 1, 3}, false});
    const auto flat =
        t.op(graph::op::reshape, {merged}, graph::attributes{0.0, {b, s, hidden}, false});
    const value<T, E> attended(t, flat, x.extents());
    return linear<T, H, H>("wo", hidden, hidden)(t, attended);
  }
};

/// Top-2 mixture of experts over the last dimension of x (..., H): a gate (H -> E, no bias) and
/// softmax choose two experts per token; each expert is a GELU FFN H -> F -> H with its own
/// weights; each expert processes at most capacity = ceil(capacity_factor * 2 T / E) tokens
/// (overflow is dropped); outputs are combined with the two renormalized gate probabilities.
template <class T, std::size_t H, std::size_t F>
struct moe {
  std::string name;
  std::size_t experts = 8;
  double capacity_factor = 1.25;
  std::size_t hidden = H;
  std::size_t ffn = F;

  template <extents_type E, class P>
  value<T, E> operator()(tracer& t, const value<T, E, P>& pinned_x) const {
    const value<T, E> x(t, pinned_x.id(), pinned_x.extents());
    const auto scope = t.scope(name);
    if (experts < 2)
      throw plan_error("moe \"" + t.qualified("") + "\"", std::to_string(experts) + " experts",
                       "at least 2 experts for top-2 routing");
    const std::size_t tokens = x.extents().size() / hidden;
    const auto capacity = static_cast<std::size_t>(std::ceil(
        capacity_factor * 2.0 * static_cast<double>(tokens) / static_cast<double>(experts)));
    constexpr std::size_t dyn = dynamic_extent;
    const auto flat =
        t.op(graph::op::reshape, {x.id()}, graph::attributes{0.0, {tokens, hidden}, false});
    const auto wg = t.parameter<T>("gate.weight", extents<dyn, dyn>(hidden, experts),
                                   normal_init(1.0 / std::sqrt(static_cast<double>(hidden))));
    const auto probs = t.op(graph::op::softmax, {t.op(graph::op::matmul, {flat, wg.id()})});
    const auto buffers =
        t.op(graph::op::moe_dispatch, {flat, probs}, graph::attributes{0.0, {capacity}, false});
    const auto w1 = t.parameter<T>("experts.w1", extents<dyn, dyn, dyn>(experts, hidden, ffn),
                                   normal_init(1.0 / std::sqrt(static_cast<double>(hidden))));
    const auto b1 =
        t.parameter<T>("experts.b1", extents<dyn, 1, dyn>(experts, ffn), constant_init(0.0));
    const auto w2 = t.parameter<T>("experts.w2", extents<dyn, dyn, dyn>(experts, ffn, hidden),
                                   normal_init(1.0 / std::sqrt(static_cast<double>(ffn))));
    const auto b2 =
        t.parameter<T>("experts.b2", extents<dyn, 1, dyn>(experts, hidden), constant_init(0.0));
    auto up = t.op(graph::op::add, {t.op(graph::op::batched_matmul, {buffers, w1.id()}), b1.id()});
    auto down =
        t.op(graph::op::add,
             {t.op(graph::op::batched_matmul, {t.op(graph::op::gelu, {up}), w2.id()}), b2.id()});
    const auto combined = t.op(graph::op::moe_combine, {down, probs});
    graph::attributes back;
    back.dims = x.extents().shape().dims;
    return {t, t.op(graph::op::reshape, {combined}, back), x.extents()};
  }
};

/// A pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(x)) with GELU; with
/// `moe_experts` > 0 the MLP is a top-2 mixture of that many experts.
template <class T, std::size_t H, std::size_t F>
struct transformer_block {
  std::string name;
  std::size_t heads = 1;
  bool causal = false;
  double dropout = 0.0;
  std::size_t hidden = H;
  std::size_t ffn = F;
  std::size_t moe_experts = 0;
  double capacity_factor = 1.25;

  template <extents_type E, class P>
  requires(E::rank() == 3) value<T, E>
  operator()(tracer& t, const value<T, E, P>& pinned_x) const {
    const value<T, E> x(t, pinned_x.id(), pinned_x.extents());
    const auto scope = t.scope(name);
    const layer_norm<T, H> ln1{"ln1", 1e-5, hidden};
    const layer_norm<T, H> ln2{"ln2", 1e-5, hidden};
    const multi_head_attention<T, H> attn{"attn", heads, causal, dropout, hidden};
    const linear<T, H, F> up("fc1", hidden, ffn);
    const linear<T, F, H> down("fc2", ffn, hidden);
    auto h = add(x, maybe_dropout(t, attn(t, ln1(t, x))));
    if (moe_experts > 0) {
      const moe<T, H, F> experts{"moe", moe_experts, capacity_factor, hidden, ffn};
      return add(h, maybe_dropout(t, experts(t, ln2(t, h))));
    }
    return add(h, maybe_dropout(t, down(t, gelu(up(t, ln2(t, h))))));
  }

private:
  template <class V>
  V maybe_dropout(tracer& t, const V& v) const {
    if (dropout <= 0.0)
      return v;
    graph::attributes a;
    a.scalar = dropout;
    return V(t, t.op(graph::op::dropout, {v.id()}, a), v.extents());
  }
};

} // namespace hspmd::nn
