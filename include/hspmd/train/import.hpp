#pragma once
// Importing weights saved by other tools (Hugging Face safetensors files) into an hspmd
// checkpoint, with a name table per shipped model (docs/checkpoint.md lists them):
//
//   "gpt2"  -> models::trace_bert_lm  (the shipped "BERT" is a pre-norm causal LM with learned
//              positions: GPT-2's structure; Hugging Face's BERT is post-norm with token types)
//   "llama" -> models::trace_llama_lm (Hugging Face's Llama without grouped-query attention)
//   "vit"   -> models::trace_vit      (Hugging Face's ViT with the 3-channel patch convolution)
//
// Each rule names a source tensor (a pattern with {i} for the layer), the hspmd parameter and how
// the values move: copied, transposed (Hugging Face's nn.Linear keeps [out, in], hspmd's linear
// [in, out]; a convolution's [out, c, kh, kw] is flattened to [out, c kh kw] first), a part of a
// fused tensor (GPT-2's query/key/value), rotary rows re-ordered (Hugging Face's Llama rotates
// the two halves of a head, hspmd adjacent pairs), or leading ones dropped. The checkpoint is
// written at step 0 with one rank's file; a run starts from it with --init-from (parameters only:
// the optimizer starts fresh). Sources may be F32, F64, F16 or BF16 (converted to F32, or F64
// when any source is F64).

#include <hspmd/core/error.hpp>
#include <hspmd/core/half.hpp>
#include <hspmd/io/safetensors.hpp>
#include <hspmd/train/checkpoint.hpp>
#include <hspmd/train/namespace.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
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

/// One tensor of the source files.
struct import_source_tensor {
  std::filesystem::path file;
  io::safetensors_entry entry;
};

/// The source tensors at `path`: a .safetensors file, a model.safetensors.index.json (its
/// weight_map's files), or a directory holding either (else every *.safetensors in it). Names
/// are as stored (prefix included).
[[nodiscard]] inline std::map<std::string, import_source_tensor>
import_sources(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  fs::path index;
  if (fs::is_directory(path)) {
    if (fs::exists(path / "model.safetensors.index.json"))
      index = path / "model.safetensors.index.json";
    else if (fs::exists(path / "model.safetensors"))
      files.push_back(path / "model.safetensors");
    else {
      for (const auto& e : fs::directory_iterator(path))
        if (e.path().extension() == ".safetensors")
          files.push_back(e.path());
      std::ranges::sort(files);
    }
  } else if (path.string().ends_with(".json")) {
    index = path;
  } else if (fs::exists(path)) {
    files.push_back(path);
  }
  if (!index.empty()) {
    nlohmann::json j;
    try {
      std::ifstream f(index);
      j = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      throw config_error(index.string(), std::string("is not valid JSON: ") + e.what(),
                         "give the index Hugging Face wrote (weight_map: tensor -> file)");
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw config_error(index.string() + ": field weight_map", "is missing or not an object",
                         "give the index Hugging Face wrote (weight_map: tensor -> file)");
    std::set<std::string> names;
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string())
        throw config_error(index.string() + ": weight_map." + tensor, "is not a file name",
                           "map every tensor to the file holding it");
      names.insert(file.get<std::string>());
    }
    for (const std::string& n : names)
      files.push_back(index.parent_path() / n);
  }
  if (files.empty())
    throw config_error(path.string(), "holds no safetensors files",
                       "give a .safetensors file, a model.safetensors.index.json, or the "
                       "directory holding them");
  std::map<std::string, import_source_tensor> out;
  for (const fs::path& file : files) {
    if (!fs::exists(file))
      throw config_error(file.string(), "missing: the index names it",
                         "download every file of the model");
    const io::safetensors_header h = io::read_safetensors_header(file);
    for (const auto& [name, e] : h.tensors)
      if (!out.emplace(name, import_source_tensor{file, e}).second)
        throw config_error(file.string() + ": tensor " + name,
                           "is also in " + out[name].file.string(),
                           "give files that hold each tensor once");
  }
  return out;
}

/// A source tensor's values, as double (exact for F16, BF16, F32 and F64).
[[nodiscard]] inline std::vector<double> import_values(const std::string& name,
                                                       const import_source_tensor& s) {
  std::vector<std::byte> raw(static_cast<std::size_t>(s.entry.bytes));
  io::read_file_range(s.file, s.entry.begin, raw);
  const std::size_t n = raw.size() / size_of(s.entry.type);
  std::vector<double> v(n);
  const std::byte* p = raw.data();
  switch (s.entry.type) {
  case dtype::f32:
    for (std::size_t i = 0; i < n; ++i) {
      float f = 0.0F;
      std::memcpy(&f, p + 4 * i, 4);
      v[i] = static_cast<double>(f);
    }
    break;
  case dtype::f64:
    for (std::size_t i = 0; i < n; ++i)
      std::memcpy(&v[i], p + 8 * i, 8);
    break;
  case dtype::f16:
  case dtype::bf16:
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t b = 0;
      std::memcpy(&b, p + 2 * i, 2);
      v[i] = static_cast<double>(s.entry.type == dtype::f16
                                     ? hspmd::detail::f16_to_float(b)
                                     : std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16U));
    }
    break;
  default:
    throw config_error(s.file.string() + ": tensor " + name,
                       "holds " + std::string(io::safetensors_dtype(s.entry.type)) +
                           " values, not floating point",
                       "give the model's floating-point weights");
  }
  return v;
}

struct import_options {
  std::size_t seq = 0;   ///< keep the first `seq` rows of a position table (0: all)
  std::size_t heads = 0; ///< attention heads (rotary rows); 0: from config.json next to the files
};

/// What an import did.
struct import_report {
  std::filesystem::path dir;                            ///< the committed checkpoint
  std::vector<std::pair<std::string, std::string>> map; ///< source -> hspmd, in rule order
  std::vector<std::string> ignored;                     ///< sources with nothing to keep
  std::vector<std::string> unmatched;                   ///< sources no rule names
  std::size_t layers = 0;
};

namespace detail {

struct import_tensor {
  std::vector<std::size_t> shape;
  std::vector<double> v;
};

[[nodiscard]] inline import_tensor apply_import(const import_rule& r, import_tensor t,
                                                const import_options& o, const std::string& where) {
  const auto bad = [&](const std::string& what, const std::string& fix) {
    throw config_error(where, what, fix);
  };
  switch (r.how) {
  case import_how::copy:
    return t;
  case import_how::rows:
    if (o.seq > 0 && !t.shape.empty()) {
      if (o.seq > t.shape[0])
        bad("has " + std::to_string(t.shape[0]) + " rows, fewer than --seq " +
                std::to_string(o.seq),
            "a sequence length the source model has positions for");
      t.v.resize(t.v.size() / t.shape[0] * o.seq);
      t.shape[0] = o.seq;
    }
    return t;
  case import_how::drop_leading:
    while (t.shape.size() > 1 && t.shape.front() == 1)
      t.shape.erase(t.shape.begin());
    return t;
  case import_how::zeros_of_rows:
    if (t.shape.empty())
      bad("is a scalar", "a table with rows");
    return {{t.shape[0]}, std::vector<double>(t.shape[0], 0.0)};
  case import_how::split_last: {
    if (t.shape.empty() || t.shape.back() % r.parts != 0)
      bad("has shape " + shape_string(t.shape) + ", whose last dimension does not split into " +
              std::to_string(r.parts) + " equal parts",
          "give the fused tensor the source model saved");
    const std::size_t last = t.shape.back();
    const std::size_t w = last / r.parts;
    const std::size_t rows = t.v.size() / last;
    import_tensor out{t.shape, std::vector<double>(rows * w)};
    out.shape.back() = w;
    for (std::size_t i = 0; i < rows; ++i)
      std::copy_n(t.v.begin() + static_cast<std::ptrdiff_t>(i * last + r.part * w), w,
                  out.v.begin() + static_cast<std::ptrdiff_t>(i * w));
    return out;
  }
  case import_how::rotary_rows:
  case import_how::transpose: {
    if (t.shape.size() < 2)
      bad("has shape " + shape_string(t.shape) + ", not a matrix", "the source model's weight");
    const std::size_t a = t.shape[0];
    const std::size_t b = t.v.size() / std::max<std::size_t>(a, 1);
    std::vector<std::size_t> from(a); // hspmd's output feature k is source row from[k]
    for (std::size_t k = 0; k < a; ++k)
      from[k] = k;
    if (r.how == import_how::rotary_rows) {
      if (a != b)
        bad("has shape " + shape_string(t.shape) +
                ": fewer key/value heads than query heads (grouped-query attention)",
            "a model with as many key/value heads as query heads (the shipped llama has no "
            "grouped-query attention)");
      if (o.heads == 0 || a % o.heads != 0 || (a / o.heads) % 2 != 0)
        bad(std::to_string(o.heads) + " heads for " + std::to_string(a) + " features",
            "the source's head count (--heads, or num_attention_heads in its config.json), "
            "dividing the features into even head sizes");
      const std::size_t d = a / o.heads;
      for (std::size_t h = 0; h < o.heads; ++h)
        for (std::size_t i = 0; i < d / 2; ++i) {
          from[h * d + 2 * i] = h * d + i;
          from[h * d + 2 * i + 1] = h * d + i + d / 2;
        }
    }
    import_tensor out{{b, a}, std::vector<double>(a * b)};
    for (std::size_t k = 0; k < a; ++k)
      for (std::size_t j = 0; j < b; ++j)
        out.v[j * a + k] = t.v[from[k] * b + j];
    return out;
  }
  }
  return t;
}

} // namespace detail

/// Writes the tensors at `source` (import_sources), renamed and reshaped by the name table
/// `family`, as checkpoint step 0 under `root` (one rank's file; the load reshards it). Sources
/// the table ignores or does not name are reported, not written; a target the sources do not
/// fill is left to the load, which names it.
inline import_report import_checkpoint(const std::filesystem::path& source,
                                       const std::filesystem::path& root,
                                       const import_family& family, import_options o = {}) {
  namespace fs = std::filesystem;
  const auto sources = import_sources(source);
  if (o.heads == 0) {
    const fs::path dir = fs::is_directory(source) ? source : source.parent_path();
    if (std::ifstream f(dir / "config.json"); f) {
      try {
        const auto c = nlohmann::json::parse(f);
        o.heads = c.value("num_attention_heads", std::size_t{0});
        if (c.value("num_key_value_heads", o.heads) != o.heads)
          throw config_error((dir / "config.json").string(),
                             "num_key_value_heads " +
                                 std::to_string(c["num_key_value_heads"].get<std::size_t>()) +
                                 " differs from num_attention_heads " + std::to_string(o.heads) +
                                 " (grouped-query attention)",
                             "import a model without grouped-query attention: the shipped llama "
                             "has none");
      } catch (const nlohmann::json::exception& e) {
        throw config_error((dir / "config.json").string(),
                           std::string("is not valid JSON: ") + e.what(),
                           "restore it, or give --heads");
      }
    }
  }
  const auto unprefixed = [&](std::string_view stored) {
    if (stored.starts_with(family.prefix))
      stored.remove_prefix(family.prefix.size());
    return stored;
  };
  import_report rep;
  bool f64 = false;
  std::map<std::string, detail::import_tensor> made;
  std::set<std::string> used;
  for (const auto& [stored, s] : sources) {
    const std::string_view name = unprefixed(stored);
    bool any = false;
    for (const std::string_view ig : family.ignored)
      any = any || detail::match_pattern(ig, name).has_value();
    if (any) {
      rep.ignored.push_back(stored);
      continue;
    }
    for (const import_rule& r : family.rules)
      if (const auto layer = detail::match_pattern(r.source, name)) {
        any = true;
        if (*layer >= 0)
          rep.layers = std::max(rep.layers, static_cast<std::size_t>(*layer) + 1);
      }
    if (!any)
      rep.unmatched.push_back(stored);
  }
  // Rules in order: a fallback fills only what nothing before it filled.
  for (const import_rule& r : family.rules)
    for (const auto& [stored, s] : sources) {
      const std::string_view name = unprefixed(stored);
      const auto layer = detail::match_pattern(r.source, name);
      if (!layer)
        continue;
      const std::string target = detail::fill_pattern(r.target, *layer);
      if (made.contains(target)) {
        if (r.fallback)
          continue;
        throw config_error(s.file.string() + ": tensor " + stored,
                           "fills " + target + ", which another source tensor filled already",
                           "give one copy of the model (names with and without the " +
                               std::string(family.prefix) + " prefix both present?)");
      }
      f64 = f64 || s.entry.type == dtype::f64;
      detail::import_tensor t{s.entry.shape, import_values(stored, s)};
      made.emplace(
          target, detail::apply_import(r, std::move(t), o, s.file.string() + ": tensor " + stored));
      rep.map.emplace_back(stored, target);
      used.insert(stored);
    }
  if (made.empty())
    throw config_error(source.string(),
                       "holds no tensor the " + std::string(family.name) + " name table knows",
                       "give the files of a " + std::string(family.name) +
                           " model, or another name table (docs/checkpoint.md)");
  nlohmann::json meta;
  meta["imported"] = {{"from", fs::absolute(source).string()},
                      {"names", std::string(family.name)},
                      {"model", std::string(family.model)}};
  solo_communicator solo;
  const auto save = [&]<class T>(T /*type*/) {
    std::vector<std::vector<T>> values;
    std::vector<checkpoint_piece<T>> pieces;
    values.reserve(made.size());
    for (const auto& [name, t] : made) {
      values.emplace_back(t.v.begin(), t.v.end());
      pieces.push_back({name, t.shape, {box::whole(t.shape)}, std::span<const T>(values.back())});
    }
    return save_checkpoint<T>(solo, root, 0, std::span<const checkpoint_piece<T>>(pieces), meta,
                              {});
  };
  rep.dir = f64 ? save(double{}) : save(float{});
  return rep;
}

} // namespace hspmd::train
