#pragma once
// Multi-head attention (composite: projections, batched matmuls, softmax with an optional causal
// mask) and a pre-norm transformer block. The attention projections are linear nodes of their own,
// so their FLOPs count (HAP's cost model left them out).
//
//     nn::multi_head_attention<float, 256> attn{"attn", /*heads=*/4, /*causal=*/true};
//     auto y = attn(t, x);                 // x, y: (batch, S, 256)

#include <hspmd/core/error.hpp>
#include <hspmd/nn/layers.hpp>
#include <hspmd/nn/ops.hpp>
#include <hspmd/nn/tracer.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <utility>

namespace hspmd::nn {

/// Self-attention over x (B, S, H) with `heads` heads of H / heads features; `fused`: one
/// attention op that keeps no (S, S) scores (graph/ops/attention.hpp), without dropout on the
/// probabilities (the op has none).
template <class T, std::size_t H>
struct multi_head_attention {
  std::string name;
  std::size_t heads = 1;
  bool causal = false;
  double dropout = 0.0; ///< on the attention probabilities (not applied when fused)
  std::size_t hidden = H;
  bool fused = false;

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
    constexpr std::size_t dyn = dynamic_extent;
    // (B, S, H) -> (B, S, heads, d) -> (B, heads, S, d)
    const auto heads_of = [&](const char* n) {
      const auto projected = linear<T, H, H>(n, hidden, hidden)(t, x);
      return permute(reshape(projected, extents<dyn, dyn, dyn, dyn>(b, s, heads, d)), {0, 2, 1, 3});
    };
    const auto q = heads_of("wq");
    const auto k = heads_of("wk");
    const auto v = heads_of("wv");
    const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(d));
    const auto attend = [&] { // (B, heads, S, d)
      if (fused)
        return attention(q, k, v, inv_sqrt_d, causal);
      const auto scores = scale(batched_matmul(q, k, /*transpose_b=*/true), inv_sqrt_d);
      const auto probs =
          functional::dropout(causal ? causal_softmax(scores) : softmax(scores), dropout);
      return batched_matmul(probs, v);
    };
    const auto ctx = permute(attend(), {0, 2, 1, 3}); // (B, S, heads, d)
    const value<T, E> attended(t, reshape(ctx, extents<dyn, dyn, dyn>(b, s, hidden)).id(),
                               x.extents());
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
    const auto flat = reshape(x, extents<dyn, dyn>(tokens, hidden));
    const auto wg = t.parameter<T>("gate.weight", extents<dyn, dyn>(hidden, experts),
                                   normal_init(1.0 / std::sqrt(static_cast<double>(hidden))));
    const auto probs = softmax(matmul(flat, wg));
    const auto buffers = moe_dispatch(flat, probs, capacity); // (E, C, H)
    const auto w1 = t.parameter<T>("experts.w1", extents<dyn, dyn, dyn>(experts, hidden, ffn),
                                   normal_init(1.0 / std::sqrt(static_cast<double>(hidden))));
    const auto b1 =
        t.parameter<T>("experts.b1", extents<dyn, 1, dyn>(experts, ffn), constant_init(0.0));
    const auto w2 = t.parameter<T>("experts.w2", extents<dyn, dyn, dyn>(experts, ffn, hidden),
                                   normal_init(1.0 / std::sqrt(static_cast<double>(ffn))));
    const auto b2 =
        t.parameter<T>("experts.b2", extents<dyn, 1, dyn>(experts, hidden), constant_init(0.0));
    const auto up = add_broadcast(batched_matmul(buffers, w1), b1);
    const auto down = add_broadcast(batched_matmul(gelu(up), w2), b2);
    return reshape(moe_combine(down, probs), x.extents());
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
  bool fused_attention = false; ///< multi_head_attention::fused
  double eps = 1e-5;            ///< the layer norms' epsilon

  template <extents_type E, class P>
  requires(E::rank() == 3) value<T, E>
  operator()(tracer& t, const value<T, E, P>& pinned_x) const {
    const value<T, E> x(t, pinned_x.id(), pinned_x.extents());
    const auto scope = t.scope(name);
    const layer_norm<T, H> ln1{"ln1", eps, hidden};
    const layer_norm<T, H> ln2{"ln2", eps, hidden};
    const multi_head_attention<T, H> attn{"attn", heads, causal, dropout, hidden, fused_attention};
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
  V maybe_dropout(tracer& /*t*/, const V& v) const {
    return functional::dropout(v, dropout);
  }
};

/// The SwiGLU MLP of Llama: down(silu(gate(x)) * up(x)), projections without bias.
template <class T, std::size_t H, std::size_t F>
struct swiglu_mlp {
  std::string name;
  std::size_t hidden = H;
  std::size_t ffn = F;

  template <extents_type E, class P>
  value<T, E> operator()(tracer& t, const value<T, E, P>& pinned_x) const {
    const value<T, E> x(t, pinned_x.id(), pinned_x.extents());
    const auto scope = t.scope(name);
    const linear<T, H, F> gate("gate", hidden, ffn, /*with_bias=*/false);
    const linear<T, H, F> up("up", hidden, ffn, /*with_bias=*/false);
    const linear<T, F, H> down("down", ffn, hidden, /*with_bias=*/false);
    const auto g = gate(t, x); // in this order: names and node ids are the same on every compiler
    const auto u = up(t, x);
    return value<T, E>(t, down(t, swiglu(g, u)).id(), x.extents());
  }
};

} // namespace hspmd::nn
