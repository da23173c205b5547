#pragma once
// The name tables of weight import (train/import.hpp): per shipped model family, which source
// tensor (a pattern with {i} for the layer) becomes which hspmd parameter and how its values
// move, with the matching of names against the patterns.

#include <hspmd/core/error.hpp>
#include <hspmd/train/namespace.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::train {

/// How a source tensor becomes an hspmd parameter.
enum class import_how {
  copy,          ///< as is
  transpose,     ///< [a, rest...] -> [prod(rest), a]
  split_last,    ///< part `part` of `parts` equal parts of the last dimension
  rotary_rows,   ///< re-order each head's rows from halves to pairs, then transpose
  drop_leading,  ///< leading dimensions of extent 1 removed
  rows,          ///< the first --seq rows (all without --seq)
  zeros_of_rows, ///< zeros of shape [rows of the source] (a bias the source model has not)
};

struct import_rule {
  std::string_view source; ///< the source name with its family's prefix removed; {i}: a layer
  std::string_view target; ///< the hspmd parameter; {i}: the same layer
  import_how how = import_how::copy;
  std::size_t part = 0;
  std::size_t parts = 1;
  bool fallback = false; ///< used only when an earlier rule has not produced the target
};

/// A family of source names: the prefix its files may put before every name, the rules, and
/// the source tensors that hold nothing hspmd keeps (buffers, a pooler).
struct import_family {
  std::string_view name;
  std::string_view model; ///< the shipped model it initializes
  std::string_view prefix;
  std::span<const import_rule> rules;
  std::span<const std::string_view> ignored;
};

namespace import_tables {

using enum import_how;

inline constexpr std::array gpt2_rules{
    import_rule{"wte.weight", "tok.table"},
    import_rule{"wpe.weight", "pos.table", rows},
    import_rule{"h.{i}.ln_1.weight", "layers.{i}.ln1.gamma"},
    import_rule{"h.{i}.ln_1.bias", "layers.{i}.ln1.beta"},
    import_rule{"h.{i}.attn.c_attn.weight", "layers.{i}.attn.wq.weight", split_last, 0, 3},
    import_rule{"h.{i}.attn.c_attn.weight", "layers.{i}.attn.wk.weight", split_last, 1, 3},
    import_rule{"h.{i}.attn.c_attn.weight", "layers.{i}.attn.wv.weight", split_last, 2, 3},
    import_rule{"h.{i}.attn.c_attn.bias", "layers.{i}.attn.wq.bias", split_last, 0, 3},
    import_rule{"h.{i}.attn.c_attn.bias", "layers.{i}.attn.wk.bias", split_last, 1, 3},
    import_rule{"h.{i}.attn.c_attn.bias", "layers.{i}.attn.wv.bias", split_last, 2, 3},
    import_rule{"h.{i}.attn.c_proj.weight", "layers.{i}.attn.wo.weight"},
    import_rule{"h.{i}.attn.c_proj.bias", "layers.{i}.attn.wo.bias"},
    import_rule{"h.{i}.ln_2.weight", "layers.{i}.ln2.gamma"},
    import_rule{"h.{i}.ln_2.bias", "layers.{i}.ln2.beta"},
    import_rule{"h.{i}.mlp.c_fc.weight", "layers.{i}.fc1.weight"},
    import_rule{"h.{i}.mlp.c_fc.bias", "layers.{i}.fc1.bias"},
    import_rule{"h.{i}.mlp.c_proj.weight", "layers.{i}.fc2.weight"},
    import_rule{"h.{i}.mlp.c_proj.bias", "layers.{i}.fc2.bias"},
    import_rule{"ln_f.weight", "ln_f.gamma"},
    import_rule{"ln_f.bias", "ln_f.beta"},
    import_rule{"lm_head.weight", "head.weight", transpose},
    import_rule{"wte.weight", "head.weight", transpose, 0, 1, true}, // tied output embedding
    import_rule{"wte.weight", "head.bias", zeros_of_rows, 0, 1, true},
};
inline constexpr std::array<std::string_view, 2> gpt2_ignored{"h.{i}.attn.bias",
                                                              "h.{i}.attn.masked_bias"};

inline constexpr std::array llama_rules{
    import_rule{"embed_tokens.weight", "tok.table"},
    import_rule{"layers.{i}.input_layernorm.weight", "layers.{i}.attn_norm.weight"},
    import_rule{"layers.{i}.self_attn.q_proj.weight", "layers.{i}.attn.wq.weight", rotary_rows},
    import_rule{"layers.{i}.self_attn.k_proj.weight", "layers.{i}.attn.wk.weight", rotary_rows},
    import_rule{"layers.{i}.self_attn.v_proj.weight", "layers.{i}.attn.wv.weight", transpose},
    import_rule{"layers.{i}.self_attn.o_proj.weight", "layers.{i}.attn.wo.weight", transpose},
    import_rule{"layers.{i}.post_attention_layernorm.weight", "layers.{i}.mlp_norm.weight"},
    import_rule{"layers.{i}.mlp.gate_proj.weight", "layers.{i}.mlp.gate.weight", transpose},
    import_rule{"layers.{i}.mlp.up_proj.weight", "layers.{i}.mlp.up.weight", transpose},
    import_rule{"layers.{i}.mlp.down_proj.weight", "layers.{i}.mlp.down.weight", transpose},
    import_rule{"norm.weight", "norm.weight"},
    import_rule{"lm_head.weight", "head.weight", transpose},
    import_rule{"embed_tokens.weight", "head.weight", transpose, 0, 1, true}, // tied
};
inline constexpr std::array<std::string_view, 1> llama_ignored{
    "layers.{i}.self_attn.rotary_emb.inv_freq"};

inline constexpr std::array vit_rules{
    import_rule{"embeddings.cls_token", "cls"},
    import_rule{"embeddings.position_embeddings", "pos.table", drop_leading},
    import_rule{"embeddings.patch_embeddings.projection.weight", "patch_embed.weight", transpose},
    import_rule{"embeddings.patch_embeddings.projection.bias", "patch_embed.bias"},
    import_rule{"encoder.layer.{i}.layernorm_before.weight", "layers.{i}.ln1.gamma"},
    import_rule{"encoder.layer.{i}.layernorm_before.bias", "layers.{i}.ln1.beta"},
    import_rule{"encoder.layer.{i}.attention.attention.query.weight", "layers.{i}.attn.wq.weight",
                transpose},
    import_rule{"encoder.layer.{i}.attention.attention.query.bias", "layers.{i}.attn.wq.bias"},
    import_rule{"encoder.layer.{i}.attention.attention.key.weight", "layers.{i}.attn.wk.weight",
                transpose},
    import_rule{"encoder.layer.{i}.attention.attention.key.bias", "layers.{i}.attn.wk.bias"},
    import_rule{"encoder.layer.{i}.attention.attention.value.weight", "layers.{i}.attn.wv.weight",
                transpose},
    import_rule{"encoder.layer.{i}.attention.attention.value.bias", "layers.{i}.attn.wv.bias"},
    import_rule{"encoder.layer.{i}.attention.output.dense.weight", "layers.{i}.attn.wo.weight",
                transpose},
    import_rule{"encoder.layer.{i}.attention.output.dense.bias", "layers.{i}.attn.wo.bias"},
    import_rule{"encoder.layer.{i}.layernorm_after.weight", "layers.{i}.ln2.gamma"},
    import_rule{"encoder.layer.{i}.layernorm_after.bias", "layers.{i}.ln2.beta"},
    import_rule{"encoder.layer.{i}.intermediate.dense.weight", "layers.{i}.fc1.weight", transpose},
    import_rule{"encoder.layer.{i}.intermediate.dense.bias", "layers.{i}.fc1.bias"},
    import_rule{"encoder.layer.{i}.output.dense.weight", "layers.{i}.fc2.weight", transpose},
    import_rule{"encoder.layer.{i}.output.dense.bias", "layers.{i}.fc2.bias"},
    import_rule{"layernorm.weight", "ln_f.gamma"},
    import_rule{"layernorm.bias", "ln_f.beta"},
    import_rule{"classifier.weight", "head.weight", transpose},
    import_rule{"classifier.bias", "head.bias"},
};
inline constexpr std::array<std::string_view, 2> vit_ignored{"pooler.dense.weight",
                                                             "pooler.dense.bias"};

} // namespace import_tables

namespace detail {

inline const std::array<import_family, 3>& import_families() {
  using namespace import_tables;
  static const std::array<import_family, 3> f{
      import_family{"gpt2", "bert", "transformer.", gpt2_rules, gpt2_ignored},
      import_family{"llama", "llama", "model.", llama_rules, llama_ignored},
      import_family{"vit", "vit", "vit.", vit_rules, vit_ignored}};
  return f;
}

// The layer of `name` when it matches `pattern` ({i}: a run of digits; -1: matched, no {i}).
[[nodiscard]] inline std::optional<long> match_pattern(std::string_view pattern,
                                                       std::string_view name) {
  const auto at = pattern.find("{i}");
  if (at == std::string_view::npos)
    return pattern == name ? std::optional<long>(-1) : std::nullopt;
  const auto head = pattern.substr(0, at);
  const auto tail = pattern.substr(at + 3);
  if (name.size() <= head.size() + tail.size() || !name.starts_with(head) || !name.ends_with(tail))
    return std::nullopt;
  const auto digits = name.substr(head.size(), name.size() - head.size() - tail.size());
  if (digits.size() > 6 ||
      !std::ranges::all_of(digits, [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  long v = 0;
  for (char c : digits)
    v = v * 10 + (c - '0');
  return v;
}

[[nodiscard]] inline std::string fill_pattern(std::string_view pattern, long layer) {
  std::string s(pattern);
  if (const auto at = s.find("{i}"); at != std::string::npos)
    s.replace(at, 3, std::to_string(layer));
  return s;
}

[[nodiscard]] inline std::string shape_string(const std::vector<std::size_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i)
    s += (i > 0 ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

} // namespace detail

/// The name table called `name` ("gpt2", "llama", "vit"); a config_error listing them otherwise.
[[nodiscard]] inline const import_family& import_family_named(std::string_view name) {
  std::string all;
  for (const import_family& f : detail::import_families()) {
    if (f.name == name)
      return f;
    all += (all.empty() ? "" : ", ") + std::string(f.name);
  }
  throw config_error("import names " + std::string(name), "is not a known name table",
                     "one of " + all + " (docs/checkpoint.md)");
}

/// The names of the tensors an import fills for `layers` layers (fallbacks included once):
/// every parameter of the family's model, to compare with a traced model's.
[[nodiscard]] inline std::set<std::string> import_targets(const import_family& f,
                                                          std::size_t layers) {
  std::set<std::string> out;
  for (const import_rule& r : f.rules) {
    if (r.target.find("{i}") == std::string_view::npos)
      out.insert(std::string(r.target));
    else
      for (std::size_t i = 0; i < layers; ++i)
        out.insert(detail::fill_pattern(r.target, static_cast<long>(i)));
  }
  return out;
}

} // namespace hspmd::train
