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

/// Named sizes of those models for planning at datacenter scale: a preset picks the model and
/// its sizes, and any size a user gives still wins. Their graphs carry shapes only (tracing
/// allocates no weights), so a 70B-parameter model plans on any machine. The Llama presets use
/// fused attention (llama_config::fused_attention), as models of that size train: 2048-token
/// scores kept per layer would need ~2.5 GiB per sequence and layer in f32; so does the
/// GPT-3-class preset (bert_config::fused_attention). `kv_heads`: key/value heads of
/// grouped-query attention (0: one per query head).
struct model_preset {
  std::string_view name;
  std::string_view model;
  std::size_t layers, hidden, ffn, heads, kv_heads, seq, vocab, experts;
  std::string_view what;
};
inline constexpr std::array<model_preset, 6> model_presets = {{
    {"bert-large", "bert", 24, 1024, 4096, 16, 0, 512, 30522, 0,
     "BERT-large sizes, 0.37B parameters (the LM head untied)"},
    {"llama-7b", "llama", 32, 4096, 11008, 32, 0, 2048, 32000, 0, "Llama-2-7B sizes, 6.7B"},
    {"llama-13b", "llama", 40, 5120, 13824, 40, 0, 2048, 32000, 0, "Llama-2-13B sizes, 13B"},
    {"llama-70b", "llama", 80, 8192, 28672, 64, 8, 2048, 32000, 0,
     "Llama-2-70B sizes with its 8 key/value heads (grouped-query attention), 69B"},
    {"gpt3-175b", "bert", 96, 12288, 49152, 96, 0, 2048, 50257, 0,
     "GPT-3 175B's sizes on bert's GPT-2 structure (learned positions, untied head), 175B"},
    {"moe-19b", "bert-moe", 32, 4096, 14336, 32, 0, 2048, 32000, 8,
     "Mixtral-8x7B's widths and 8 experts, in every second layer as bert-moe places them, 19B"},
}};

/// The preset named `name`, if any.
[[nodiscard]] constexpr const model_preset* find_preset(std::string_view name) noexcept {
  for (const model_preset& p : model_presets)
    if (p.name == name)
      return &p;
  return nullptr;
}

/// Sizes a user may change; 0 keeps the model's default.
struct model_options {
  std::size_t layers = 0; ///< transformer layers (bert, bert-moe, vit), hidden layers (mlp)
  std::size_t hidden = 0; ///< hidden size; FFN is 4x unless `ffn` is given
  std::size_t ffn = 0;
  std::size_t heads = 0;        ///< default: hidden / 64
  std::size_t seq = 0;          ///< bert, bert-moe, llama
  std::size_t vocab = 0;        ///< bert, bert-moe, llama (default 30522)
  std::size_t experts = 0;      ///< bert-moe (default 8)
  double width = 1.0;           ///< vgg19: channel multiplier
  bool fused_attention = false; ///< llama, bert: one fused attention op (always for the presets
                                ///< of size: llama-*, gpt3-175b)
  std::size_t kv_heads = 0;     ///< llama: key/value heads (grouped-query); 0: as many as heads
};

/// Traces model `name` for `batch` samples in element type T; throws `config_error` naming the
/// model for an unknown name or impossible sizes.
template <class T>
[[nodiscard]] graph::graph trace_model(std::string_view name, const model_options& given,
                                       std::size_t batch) {
  model_options o = given;
  if (const model_preset* p = find_preset(name)) {
    const auto keep = [](std::size_t& v, std::size_t preset) { v = v != 0 ? v : preset; };
    keep(o.layers, p->layers);
    keep(o.hidden, p->hidden);
    keep(o.ffn, p->ffn);
    keep(o.heads, p->heads);
    // A preset's key/value heads go with its query heads: given --heads alone means full MHA.
    if (given.heads == 0 || given.heads == p->heads)
      keep(o.kv_heads, p->kv_heads);
    keep(o.seq, p->seq);
    keep(o.vocab, p->vocab);
    keep(o.experts, p->experts);
    o.fused_attention = o.fused_attention || p->model == "llama" || p->name == "gpt3-175b";
    name = p->model;
  }
  const auto pick = [](std::size_t v, std::size_t dflt) { return v != 0 ? v : dflt; };
  const std::size_t hidden = pick(o.hidden, 768);
  const std::size_t ffn = pick(o.ffn, 4 * hidden);
  const std::size_t heads = pick(o.heads, std::max<std::size_t>(1, hidden / 64));
  if (hidden % heads != 0)
    throw config_error("model " + std::string(name),
                       "hidden " + std::to_string(hidden) + " is not a multiple of " +
                           std::to_string(heads) + " heads",
                       "--hidden a multiple of --heads");
  if (o.kv_heads != 0 && name != "llama")
    throw config_error("model " + std::string(name),
                       std::to_string(o.kv_heads) + " key/value heads: only llama has "
                                                    "grouped-query attention",
                       "drop --kv-heads, or plan llama");
  if (name == "bert" || name == "bert-moe") {
    bert_config c;
    c.layers = pick(o.layers, 12);
    c.hidden = hidden;
    c.ffn = ffn;
    c.heads = heads;
    c.seq = pick(o.seq, 128);
    c.vocab = pick(o.vocab, 30522);
    c.moe_experts = name == "bert-moe" ? pick(o.experts, 8) : 0;
    c.fused_attention = o.fused_attention;
    return trace_bert_lm<T>(c, batch);
  }
  if (name == "llama") {
    llama_config c;
    c.layers = pick(o.layers, 12);
    c.hidden = hidden;
    c.ffn = pick(o.ffn, (8 * hidden / 3 + 7) / 8 * 8);
    c.heads = heads;
    c.kv_heads = o.kv_heads;
    c.seq = pick(o.seq, 128);
    c.vocab = pick(o.vocab, 30522);
    c.fused_attention = o.fused_attention;
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
  for (const model_preset& p : model_presets)
    known += ", " + std::string(p.name);
  throw config_error("model \"" + std::string(name) + "\"", "unknown model", "one of " + known);
}

} // namespace hspmd::models
