#pragma once
// The benchmark models by name, for tools and examples: "mlp", "bert", "bert-moe", "vit",
// "vgg19" with HAP's settings as defaults (12 layers, hidden 768, FFN 3072, 12 heads, seq 128;
// VGG19 on 32x32 images), and "llama" (a Llama-style decoder: RMSNorm, rotary embeddings,
// SwiGLU; same defaults, FFN 8/3 of hidden rounded to 8), with the few sizes a command line
// changes.

#include <hspmd/core/error.hpp>
#include <hspmd/models/bert.hpp>
#include <hspmd/models/llama.hpp>
#include <hspmd/models/mlp.hpp>
#include <hspmd/models/vgg.hpp>
#include <hspmd/models/vit.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace hspmd::models {

/// The models `trace_model` knows.
inline constexpr std::array<std::string_view, 6> model_names = {"mlp", "bert",  "bert-moe",
                                                                "vit", "vgg19", "llama"};

/// Sizes a user may change; 0 keeps the model's default.
struct model_options {
  std::size_t layers = 0; ///< transformer layers (bert, bert-moe, vit), hidden layers (mlp)
  std::size_t hidden = 0; ///< hidden size; FFN is 4x unless `ffn` is given
  std::size_t ffn = 0;
  std::size_t heads = 0;   ///< default: hidden / 64
  std::size_t seq = 0;     ///< bert, bert-moe, llama
  std::size_t vocab = 0;   ///< bert, bert-moe, llama (default 30522)
  std::size_t experts = 0; ///< bert-moe (default 8)
  double width = 1.0;      ///< vgg19: channel multiplier
};

/// Traces model `name` for `batch` samples in element type T; throws `config_error` naming the
/// model for an unknown name or impossible sizes.
template <class T>
[[nodiscard]] graph::graph trace_model(std::string_view name, const model_options& o,
                                       std::size_t batch) {
  const auto pick = [](std::size_t v, std::size_t dflt) { return v != 0 ? v : dflt; };
  const std::size_t hidden = pick(o.hidden, 768);
  const std::size_t ffn = pick(o.ffn, 4 * hidden);
  const std::size_t heads = pick(o.heads, std::max<std::size_t>(1, hidden / 64));
  if (hidden % heads != 0)
    throw config_error("model " + std::string(name),
                       "hidden " + std::to_string(hidden) + " is not a multiple of " +
                           std::to_string(heads) + " heads",
                       "--hidden a multiple of --heads");
  if (name == "bert" || name == "bert-moe") {
    bert_config c;
    c.layers = pick(o.layers, 12);
    c.hidden = hidden;
    c.ffn = ffn;
    c.heads = heads;
    c.seq = pick(o.seq, 128);
    c.vocab = pick(o.vocab, 30522);
    c.moe_experts = name == "bert-moe" ? pick(o.experts, 8) : 0;
    return trace_bert_lm<T>(c, batch);
  }
  if (name == "llama") {
    llama_config c;
    c.layers = pick(o.layers, 12);
    c.hidden = hidden;
    c.ffn = pick(o.ffn, (8 * hidden / 3 + 7) / 8 * 8);
    c.heads = heads;
    c.seq = pick(o.seq, 128);
    c.vocab = pick(o.vocab, 30522);
    return trace_llama_lm<T>(c, batch);
  }
  if (name == "vit") {
    vit_config c;
    c.layers = pick(o.layers, 12);
    c.hidden = hidden;
    c.ffn = ffn;
    c.heads = heads;
    return trace_vit<T>(c, batch);
  }
  if (name == "vgg19") {
    vgg_config c;
    for (auto& stage : c.stages)
      for (auto& ch : stage)
        ch = std::max<std::size_t>(1, static_cast<std::size_t>(static_cast<double>(ch) * o.width));
    return trace_vgg<T>(c, batch);
  }
  if (name == "mlp") {
    mlp_config c;
    c.hidden.assign(pick(o.layers, 2), pick(o.hidden, 1024));
    return trace_mlp<T>(c, batch);
  }
  std::string known;
  for (auto n : model_names)
    known += (known.empty() ? "" : ", ") + std::string(n);
  throw config_error("model \"" + std::string(name) + "\"", "unknown model", "one of " + known);
}

} // namespace hspmd::models
