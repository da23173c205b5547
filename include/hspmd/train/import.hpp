#pragma once
// Importing weights saved by other tools (Hugging Face safetensors files) into an hspmd
// checkpoint, with a name table per shipped model (docs/checkpoint.md lists them):
//
//   "gpt2"  -> models::trace_bert_lm  (the shipped "BERT" is a pre-norm causal LM with learned
//              positions: GPT-2's structure; Hugging Face's BERT is post-norm with token types)
//   "llama" -> models::trace_llama_lm (Hugging Face's Llama, grouped-query attention included:
//              the key/value projections keep their kv_heads heads; run with --kv-heads)
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
#include <hspmd/train/import_rules.hpp>
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
  /// Import what matches even when most source tensors or most of the model's parameters do
  /// not (otherwise refused: the files are likely another family's).
  bool partial = false;
};

/// What an import did.
struct import_report {
  std::filesystem::path dir;                            ///< the committed checkpoint
  std::vector<std::pair<std::string, std::string>> map; ///< source -> hspmd, in rule order
  std::vector<std::string> ignored;                     ///< sources with nothing to keep
  std::vector<std::string> unmatched;                   ///< sources no rule names
  std::vector<std::string> missing;                     ///< the model's parameters no source filled
  std::size_t layers = 0;
  /// The normalization epsilon config.json gives (rms_norm_eps, layer_norm_eps or
  /// layer_norm_epsilon), recorded in the checkpoint as meta.imported.norm_eps; 0: none.
  double norm_eps = 0.0;
  std::string norm_eps_field;
};

namespace detail {

// The name table that names most of `sources`: "give --names X" when it is not `tried`.
[[nodiscard]] inline std::string
likely_family(const std::map<std::string, import_source_tensor>& sources,
              const import_family& tried) {
  const import_family* best = nullptr;
  std::size_t most = 0;
  for (const import_family& f : import_families()) {
    std::size_t named = 0;
    for (const auto& [stored, s] : sources) {
      std::string_view name = stored;
      if (name.starts_with(f.prefix))
        name.remove_prefix(f.prefix.size());
      if (std::ranges::any_of(f.rules, [&](const import_rule& r) {
            return match_pattern(r.source, name).has_value();
          }))
        ++named;
    }
    if (named > most) {
      most = named;
      best = &f;
    }
  }
  if (best != nullptr && best != &tried)
    return "the files look like a " + std::string(best->name) + " model (" + std::to_string(most) +
           " of " + std::to_string(sources.size()) + " named): give --names " +
           std::string(best->name);
  return "give the files of a " + std::string(tried.name) +
         " model, or the name table of the files' model family";
}

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
      // [heads d, hidden] for the queries; [kv_heads d, hidden] for grouped keys: the head
      // size is the model's, hidden / heads.
      if (o.heads == 0 || b % o.heads != 0 || (b / o.heads) % 2 != 0)
        bad(std::to_string(o.heads) + " heads for " + std::to_string(b) + " features",
            "the source's head count (--heads, or num_attention_heads in its config.json), "
            "dividing the features into even head sizes");
      const std::size_t d = b / o.heads;
      if (a % d != 0 || a > b)
        bad("has shape " + shape_string(t.shape) + ": " + std::to_string(a) +
                " rows are not whole heads of " + std::to_string(d),
            "the source's head count (--heads, or num_attention_heads in its config.json)");
      for (std::size_t h = 0; h < a / d; ++h)
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
  import_report rep;
  {
    const fs::path dir = fs::is_directory(source) ? source : source.parent_path();
    if (std::ifstream f(dir / "config.json"); f) {
      try {
        const auto c = nlohmann::json::parse(f);
        if (o.heads == 0)
          o.heads = c.value("num_attention_heads", std::size_t{0});
        for (const char* field : {"rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"})
          if (c.contains(field) && c[field].is_number() && rep.norm_eps == 0.0) {
            rep.norm_eps = c[field].get<double>();
            rep.norm_eps_field = field;
          }
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
                       detail::likely_family(sources, family) + " (docs/checkpoint.md)");
  for (const std::string& t : import_targets(family, rep.layers))
    if (!made.contains(t))
      rep.missing.push_back(t);
  const std::size_t considered = sources.size() - rep.ignored.size();
  const std::size_t expected = rep.missing.size() + made.size();
  if (!o.partial && (2 * rep.unmatched.size() > considered || 2 * rep.missing.size() > expected))
    throw config_error(
        source.string(),
        "matches the " + std::string(family.name) +
            " name table poorly: " + std::to_string(considered - rep.unmatched.size()) + " of " +
            std::to_string(considered) + " source tensors named, " + std::to_string(made.size()) +
            " of " + std::to_string(expected) + " " + std::string(family.model) +
            " parameters filled",
        detail::likely_family(sources, family) + ", or --partial to import only these");
  nlohmann::json meta;
  meta["imported"] = {{"from", fs::absolute(source).string()},
                      {"names", std::string(family.name)},
                      {"model", std::string(family.model)}};
  if (rep.norm_eps > 0.0) {
    meta["imported"]["norm_eps"] = rep.norm_eps;
    meta["imported"]["norm_eps_field"] = "config.json's " + rep.norm_eps_field;
  }
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
