#pragma once
// A Llama-style decoder language model: token embedding, N pre-norm blocks of causal
// self-attention with rotary position embeddings on the queries and keys and a SwiGLU MLP, each
// normalized by RMSNorm, a final RMSNorm and an untied output head. No biases, no dropout.
//
//     models::llama_config c;  c.layers = 2;  c.hidden = 64;  c.heads = 4;  c.ffn = 176;
//     graph::graph g = models::trace_llama_lm<float>(c, /*batch=*/8);
//
// Grouped-query attention (Llama-2-70B, Llama 3): `kv_heads` key/value heads, fewer than the
// query heads, each shared by heads / kv_heads query heads in order (Hugging Face's repeat_kv).
// The fused attention op reads the grouped keys and values as they are; the products path
// repeats them with a broadcast first, as Hugging Face's eager attention does.
//
// Inputs: "tokens" (batch, seq) int64 and "targets" (batch * seq) int64 (tokens shifted by one).
// Loss: the mean over all positions of -log p(target).

#include <hspmd/core/dtype.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/nn/layers.hpp>
#include <hspmd/nn/ops.hpp>
#include <hspmd/nn/tracer.hpp>
#include <hspmd/nn/transformer.hpp>

#include <cmath>
#include <cstddef>
#include <string>

namespace hspmd::models {

/// Llama sizes; the defaults are Llama-small for this project's runs (a 2-layer, 256-wide
/// decoder), not a published checkpoint.
struct llama_config {
  std::size_t layers = 2;
  std::size_t hidden = 256;
  std::size_t heads = 4;
  std::size_t kv_heads = 0; ///< key/value heads (grouped-query attention); 0: as many as `heads`
  std::size_t ffn = 688;    ///< SwiGLU width (about 8/3 hidden, as Llama sizes it)
  std::size_t seq = 64;
  std::size_t vocab = 2000;
  double rope_base = 10000.0;
  double eps = 1e-6; ///< RMSNorm epsilon
  /// Attention as one fused op (nn::attention: the scores are recomputed in the backward, never
  /// stored) instead of products, a causal softmax and products that keep the (S, S) scores. The
  /// same numbers to rounding; what lets long sequences fit (the big presets of models/zoo.hpp).
  bool fused_attention = false;
};

namespace detail {

// Causal self-attention with rotary embeddings over x (B, S, H): projections without bias.
template <class T, extents_type E>
nn::value<T, E> llama_attention(nn::tracer& t, const nn::value<T, E>& x, const llama_config& c) {
  constexpr std::size_t dyn = dynamic_extent;
  const auto scope = t.scope("attn");
  const std::size_t b = x.extent(0);
  const std::size_t s = x.extent(1);
  const std::size_t d = c.hidden / c.heads;
  const std::size_t kv = c.kv_heads == 0 ? c.heads : c.kv_heads;
  // (B, S, n d) -> (B, S, n, d), rotated or not
  const auto heads_of = [&](const char* name, std::size_t n, bool rotate) {
    const nn::linear<T, dyn, dyn> proj(name, c.hidden, n * d, /*with_bias=*/false);
    auto v = nn::reshape(proj(t, x), extents<dyn, dyn, dyn, dyn>(b, s, n, d));
    if (rotate)
      v = nn::rotary(v, c.rope_base);
    return v;
  };
  // (B, S, kv, d) -> (B, S, heads, d): each key/value head repeated heads / kv times in place.
  const auto repeated = [&](const auto& v) {
    if (kv == c.heads || c.fused_attention)
      return v;
    const auto one = nn::reshape(v, extents<dyn, dyn, dyn, dyn, dyn>(b, s, kv, 1, d));
    const auto all = nn::broadcast_to(
        one, t.bind<extents<hspmd::batch, dyn, dyn, dyn, dyn>>(s, kv, c.heads / kv, d));
    return nn::reshape(all, extents<dyn, dyn, dyn, dyn>(b, s, c.heads, d));
  };
  const auto q = nn::permute(heads_of("wq", c.heads, true), {0, 2, 1, 3}); // (B, heads, S, d)
  const auto k = nn::permute(repeated(heads_of("wk", kv, true)), {0, 2, 1, 3});
  const auto v = nn::permute(repeated(heads_of("wv", kv, false)), {0, 2, 1, 3});
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto attend = [&] { // (B, heads, S, d)
    if (c.fused_attention)
      return nn::attention(q, k, v, scale, /*causal=*/true);
    auto scores = nn::scale(nn::batched_matmul(q, k, /*transpose_b=*/true), scale); // (.., S, S)
    return nn::batched_matmul(nn::causal_softmax(scores), v);
  };
  const auto ctx = nn::permute(attend(), {0, 2, 1, 3}); // (B, S, heads, d)
  const nn::value<T, E> merged(t, nn::reshape(ctx, extents<dyn, dyn, dyn>(b, s, c.hidden)).id(),
                               x.extents());
  const nn::linear<T, dyn, dyn> wo("wo", c.hidden, c.hidden, /*with_bias=*/false);
  return nn::value<T, E>(t, wo(t, merged).id(), x.extents());
}

} // namespace detail

/// Traces the Llama-style decoder LM for `batch` sequences in element type T.
template <class T>
[[nodiscard]] graph::graph trace_llama_lm(const llama_config& c, std::size_t batch) {
  constexpr std::size_t dyn = dynamic_extent;
  if (c.heads == 0 || c.hidden % c.heads != 0 || (c.hidden / c.heads) % 2 != 0)
    throw config_error(
        "llama", std::to_string(c.hidden) + " features for " + std::to_string(c.heads) + " heads",
        "a head count that divides the hidden size into even head sizes "
        "(rotary embeddings rotate pairs)");
  if (c.kv_heads != 0 && c.heads % c.kv_heads != 0)
    throw config_error("llama",
                       std::to_string(c.kv_heads) + " key/value heads for " +
                           std::to_string(c.heads) + " query heads",
                       "a key/value head count that divides the query heads (grouped-query "
                       "attention), or 0 for one per query head");
  nn::tracer t(dtype_of<T>, batch);
  auto tokens = t.input<std::int64_t, extents<hspmd::batch, dyn>>("tokens", c.seq);
  auto targets = t.input<std::int64_t, extents<dyn>>("targets", batch * c.seq);
  const nn::embedding<T, dyn, dyn> tok{"tok", c.vocab, c.hidden};
  auto h = tok(t, tokens); // (B, S, H)
  using hidden_t = decltype(h);
  for (std::size_t i = 0; i < c.layers; ++i) {
    const auto scope = t.scope("layers." + std::to_string(i));
    const nn::rms_norm<T, dyn> norm1{"attn_norm", c.eps, c.hidden};
    const nn::rms_norm<T, dyn> norm2{"mlp_norm", c.eps, c.hidden};
    const nn::swiglu_mlp<T, dyn, dyn> mlp{"mlp", c.hidden, c.ffn};
    const hidden_t normed(t, norm1(t, h).id(), h.extents());
    h = hidden_t(t, nn::add(h, detail::llama_attention(t, normed, c)).id(), h.extents());
    h = hidden_t(t, nn::add(h, mlp(t, norm2(t, h))).id(), h.extents());
  }
  const nn::rms_norm<T, dyn> norm_f{"norm", c.eps, c.hidden};
  const nn::linear<T, dyn, dyn> head("head", c.hidden, c.vocab, /*with_bias=*/false);
  auto logits = head(t, norm_f(t, h)); // (B, S, V)
  auto flat = nn::reshape(logits, extents<dyn, dyn>(batch * c.seq, c.vocab));
  t.set_loss(nn::cross_entropy(flat, targets));
  return t.take();
}

} // namespace hspmd::models
