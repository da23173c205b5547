#pragma once
// A BERT-style encoder trained as a language model with next-token loss and a causal mask (as
// HAP's benchmark used it). Defaults are BERT-base: 12 layers, hidden 768, FFN 3072, 12 heads,
// sequence 128. With `moe_experts` set it is BERT-MoE: every second layer's FFN is a top-2
// mixture of experts.
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

#include <cstddef>
#include <string>

namespace hspmd::models {

/// BERT-LM sizes.
struct bert_config {
  std::size_t layers = 12;
  std::size_t hidden = 768;
  std::size_t ffn = 3072;
  std::size_t heads = 12;
  std::size_t seq = 128;
  std::size_t vocab = 30522;
  double dropout = 0.1;
  /// BERT-MoE: every second layer's FFN is a top-2 mixture of this many experts (0: plain BERT).
  std::size_t moe_experts = 0;
  double capacity_factor = 1.25;
  /// Attention as one fused op that keeps no (S, S) scores (nn::multi_head_attention::fused);
  /// the attention probabilities then get no dropout (the residual dropouts stay).
  bool fused_attention = false;
  double eps = 1e-5; ///< LayerNorm epsilon (GPT-2's layer_norm_epsilon)
};

/// Traces the BERT-LM for `batch` sequences in element type T.
template <class T>
[[nodiscard]] graph::graph trace_bert_lm(const bert_config& c, std::size_t batch) {
  constexpr std::size_t dyn = dynamic_extent;
  nn::tracer t(dtype_of<T>, batch);
  auto tokens = t.input<std::int64_t, extents<hspmd::batch, dyn>>("tokens", c.seq);
  auto targets = t.input<std::int64_t, extents<dyn>>("targets", batch * c.seq);
  const nn::embedding<T, dyn, dyn> tok{"tok", c.vocab, c.hidden};
  auto h = tok(t, tokens); // (B, S, H)
  const auto pos =
      t.parameter<T>("pos.table", extents<dyn, dyn>(c.seq, c.hidden), nn::normal_init(0.02));
  h = nn::add_broadcast(h, pos);
  for (std::size_t i = 0; i < c.layers; ++i) {
    const nn::transformer_block<T, dyn, dyn> block{"layers." + std::to_string(i),
                                                   c.heads,
                                                   /*causal=*/true,
                                                   c.dropout,
                                                   c.hidden,
                                                   c.ffn,
                                                   i % 2 == 1 ? c.moe_experts : 0,
                                                   c.capacity_factor,
                                                   c.fused_attention,
                                                   c.eps};
    h = block(t, h);
  }
  const nn::layer_norm<T, dyn> ln_f{"ln_f", c.eps, c.hidden};
  const nn::linear<T, dyn, dyn> head("head", c.hidden, c.vocab);
  auto logits = head(t, ln_f(t, h)); // (B, S, V)
  auto flat = nn::reshape(logits, extents<dyn, dyn>(batch * c.seq, c.vocab));
  t.set_loss(nn::cross_entropy(flat, targets));
  return t.take();
}

} // namespace hspmd::models
