// Importing Hugging Face-named safetensors files (train/import.hpp): every name table fills exactly
// the parameters of its shipped model; values land transposed, split, re-ordered and converted as
// the table says (checked element by element against the source); Llama's re-ordered rotary rows
// give the same attention scores under hspmd's rotary kernel as the source's rotate-half rotation;
// bad input is one line naming the file or tensor.
#include <hspmd/core/half.hpp>
#include <hspmd/io/safetensors.hpp>
#include <hspmd/kernels/positional.hpp>
#include <hspmd/models/zoo.hpp>
#include <hspmd/train/checkpoint.hpp>
#include <hspmd/train/import.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

using namespace hspmd;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("hspmd-import-test-" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

struct source_tensor {
  std::vector<std::size_t> shape;
  std::vector<float> v; // values exactly representable in the stored type
  dtype type = dtype::f32;
};

std::vector<float> random_values(std::size_t n, std::mt19937& rng, dtype type) {
  std::uniform_real_distribution<float> u(-1.0F, 1.0F);
  std::vector<float> v(n);
  for (float& x : v) {
    x = u(rng);
    if (type == dtype::bf16)
      x = static_cast<float>(::hspmd::bfloat16{x});
    else if (type == dtype::f16)
      x = static_cast<float>(::hspmd::float16{x});
  }
  return v;
}

// A source tensor of random values, stored as `type`.
source_tensor random_tensor(std::vector<std::size_t> shape, std::mt19937& rng,
                            dtype type = dtype::f32) {
  std::size_t n = 1;
  for (std::size_t x : shape)
    n *= x;
  return {std::move(shape), random_values(n, rng, type), type};
}

// Writes `tensors` as one safetensors file in their stored types.
void write_source(const fs::path& file, const std::map<std::string, source_tensor>& tensors) {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<io::safetensors_tensor> ts;
  bytes.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    std::vector<std::byte> b;
    for (float x : t.v) {
      if (t.type == dtype::f32) {
        const auto a = std::bit_cast<std::array<std::byte, 4>>(x);
        b.insert(b.end(), a.begin(), a.end());
      } else {
        const std::uint16_t h =
            t.type == dtype::bf16 ? ::hspmd::bfloat16{x}.bits : ::hspmd::float16{x}.bits;
        const auto a = std::bit_cast<std::array<std::byte, 2>>(h);
        b.insert(b.end(), a.begin(), a.end());
      }
    }
    bytes.push_back(std::move(b));
    ts.push_back({name, t.type, t.shape, bytes.back()});
  }
  (void)io::write_safetensors(file, ts, {{"format", "pt"}});
}

// Every parameter of `g` whole, loaded from the checkpoint under `root`.
std::map<std::string, std::vector<float>> load_all(const graph::graph& g, const fs::path& root) {
  std::map<std::string, std::vector<float>> out;
  std::vector<train::checkpoint_target<float>> targets;
  for (graph::node_id p : g.parameters())
    out[g[p].name].resize(g[p].out.size());
  for (graph::node_id p : g.parameters()) {
    auto& v = out[g[p].name];
    targets.push_back({g[p].name, g[p].out.dims, exec::box::whole(g[p].out.dims), v});
  }
  train::solo_communicator solo;
  (void)train::load_checkpoint<float>(solo, root,
                                      std::span<const train::checkpoint_target<float>>(targets));
  return out;
}

std::set<std::string> parameter_names(const graph::graph& g) {
  std::set<std::string> s;
  for (graph::node_id p : g.parameters())
    s.insert(g[p].name);
  return s;
}

models::model_options tiny(std::size_t hidden, std::size_t heads) {
  models::model_options o;
  o.layers = 2;
  o.hidden = hidden;
  o.ffn = 12;
  o.heads = heads;
  o.seq = 5;
  o.vocab = 16;
  return o;
}

} // namespace

TEST_CASE("each name table fills exactly the parameters of its shipped model", "[import]") {
  for (const char* family : {"gpt2", "llama", "vit"}) {
    const auto& f = train::import_family_named(family);
    const graph::graph g = models::trace_model<float>(std::string(f.model), tiny(8, 2), 2);
    INFO("table " << family << " for model " << f.model);
    CHECK(train::import_targets(f, 2) == parameter_names(g));
  }
  CHECK_THROWS_WITH(train::import_family_named("bert"),
                    Catch::Contains("import names bert") && Catch::Contains("gpt2, llama, vit"));
}

TEST_CASE("Llama's files import: transposed, rotary rows re-ordered, tied head, bf16 and f16",
          "[import]") {
  const std::size_t h = 8;
  const std::size_t heads = 2;
  const std::size_t d = h / heads;
  const auto o = tiny(h, heads);
  const graph::graph g = models::trace_model<float>("llama", o, 2);
  std::mt19937 rng(7);
  std::map<std::string, source_tensor> src;
  const auto add = [&](const std::string& name, std::vector<std::size_t> shape, dtype type) {
    src[name] = random_tensor(std::move(shape), rng, type);
  };
  add("model.embed_tokens.weight", {16, h}, dtype::bf16);
  add("model.norm.weight", {h}, dtype::f32);
  for (int i = 0; i < 2; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    add(l + "input_layernorm.weight", {h}, dtype::f32);
    add(l + "post_attention_layernorm.weight", {h}, dtype::f16);
    for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"})
      add(l + "self_attn." + p + ".weight", {h, h}, dtype::bf16);
    add(l + "self_attn.rotary_emb.inv_freq", {d / 2}, dtype::f32);
    add(l + "mlp.gate_proj.weight", {12, h}, dtype::f32);
    add(l + "mlp.up_proj.weight", {12, h}, dtype::f32);
    add(l + "mlp.down_proj.weight", {h, 12}, dtype::f32);
  }
  const fs::path dir = scratch("llama");
  fs::create_directories(dir / "hf");
  write_source(dir / "hf" / "model.safetensors", src);
  std::ofstream(dir / "hf" / "config.json") << R"({"num_attention_heads": 2})";
  const auto rep =
      train::import_checkpoint(dir / "hf", dir / "ckpt", train::import_family_named("llama"));
  CHECK(rep.layers == 2);
  CHECK(rep.ignored.size() == 2);
  CHECK(rep.unmatched.empty());
  const auto got = load_all(g, dir / "ckpt");
  const auto at = [&](const std::string& name, std::size_t r, std::size_t c) {
    const auto& t = src.at(name);
    return t.v[r * t.shape[1] + c];
  };
  CHECK(got.at("tok.table") == src.at("model.embed_tokens.weight").v);
  CHECK(got.at("layers.1.mlp_norm.weight") ==
        src.at("model.layers.1.post_attention_layernorm.weight").v);
  bool same = true;
  for (std::size_t j = 0; j < h; ++j)
    for (std::size_t v = 0; v < 16; ++v) // tied: head [h, vocab] = embedding transposed
      same = same && got.at("head.weight")[j * 16 + v] == at("model.embed_tokens.weight", v, j);
  for (std::size_t j = 0; j < h; ++j)
    for (std::size_t k = 0; k < 12; ++k)
      same = same && got.at("layers.0.mlp.gate.weight")[j * 12 + k] ==
                         at("model.layers.0.mlp.gate_proj.weight", k, j);
  // hspmd's output feature 2i of head hd is the source's row i of the head, 2i + 1 its row
  // i + d/2 (the source rotates halves, hspmd pairs).
  for (std::size_t hd = 0; hd < heads; ++hd)
    for (std::size_t i = 0; i < d / 2; ++i)
      for (std::size_t j = 0; j < h; ++j) {
        const auto& wq = got.at("layers.1.attn.wq.weight");
        same = same &&
               wq[j * h + hd * d + 2 * i] ==
                   at("model.layers.1.self_attn.q_proj.weight", hd * d + i, j) &&
               wq[j * h + hd * d + 2 * i + 1] ==
                   at("model.layers.1.self_attn.q_proj.weight", hd * d + i + d / 2, j);
      }
  CHECK(same);

  // The scores q.k at positions (3, 1) under the source's convention (rotate halves of
  // W_hf x) equal those under hspmd's rotary kernel on x W_hspmd.
  std::vector<double> x3 = {0.3, -0.2, 0.5, 0.1, -0.4, 0.7, 0.2, -0.6};
  std::vector<double> x1 = {-0.1, 0.4, 0.2, -0.5, 0.6, 0.3, -0.7, 0.1};
  const auto hf_rotated = [&](const std::string& w, const std::vector<double>& x, double pos) {
    std::vector<double> y(h, 0.0);
    for (std::size_t r = 0; r < h; ++r)
      for (std::size_t j = 0; j < h; ++j)
        y[r] += static_cast<double>(at(w, r, j)) * x[j];
    std::vector<double> out(h);
    for (std::size_t hd = 0; hd < heads; ++hd)
      for (std::size_t i = 0; i < d / 2; ++i) {
        const double th =
            pos * std::pow(1e4, -2.0 * static_cast<double>(i) / static_cast<double>(d));
        const double a = y[hd * d + i];
        const double b = y[hd * d + i + d / 2];
        out[hd * d + i] = a * std::cos(th) - b * std::sin(th);
        out[hd * d + i + d / 2] = b * std::cos(th) + a * std::sin(th);
      }
    return out;
  };
  const auto ours_rotated = [&](const std::string& w, const std::vector<double>& x,
                                std::size_t pos) {
    std::vector<double> y(h, 0.0);
    for (std::size_t j = 0; j < h; ++j)
      for (std::size_t k = 0; k < h; ++k)
        y[k] += static_cast<double>(got.at(w)[j * h + k]) * x[j];
    std::vector<double> table(d);
    for (std::size_t k = 0; k < d / 2; ++k)
      exec::rotary_table<double>{table.data(), d / 2, pos, 1e4}(k);
    std::vector<double> out(h);
    for (std::size_t r = 0; r < heads; ++r)
      exec::rotary_rows<double, false>{y.data(), out.data(), table.data(), d, heads, 1}(r);
    return out;
  };
  const auto q_hf = hf_rotated("model.layers.0.self_attn.q_proj.weight", x3, 3.0);
  const auto k_hf = hf_rotated("model.layers.0.self_attn.k_proj.weight", x1, 1.0);
  const auto q = ours_rotated("layers.0.attn.wq.weight", x3, 3);
  const auto k = ours_rotated("layers.0.attn.wk.weight", x1, 1);
  for (std::size_t hd = 0; hd < heads; ++hd) {
    double s_hf = 0.0;
    double s = 0.0;
    for (std::size_t e = 0; e < d; ++e) {
      s_hf += q_hf[hd * d + e] * k_hf[hd * d + e];
      s += q[hd * d + e] * k[hd * d + e];
    }
    INFO("head " << hd);
    CHECK(std::abs(s - s_hf) <= 1e-12);
  }

  // An untied head wins over the tied fallback.
  add("lm_head.weight", {16, h}, dtype::f32);
  write_source(dir / "hf" / "model.safetensors", src);
  (void)train::import_checkpoint(dir / "hf", dir / "ckpt2", train::import_family_named("llama"));
  const auto untied = load_all(g, dir / "ckpt2");
  CHECK(untied.at("head.weight")[3 * 16 + 5] == at("lm_head.weight", 5, 3));
  fs::remove_all(dir);
}

TEST_CASE("Llama with grouped-query attention imports: keys and values keep their heads, rotary "
          "rows re-ordered per key/value head",
          "[import]") {
  const std::size_t h = 8;
  const std::size_t heads = 4;
  const std::size_t kv = 2;
  const std::size_t d = h / heads;
  auto o = tiny(h, heads);
  o.kv_heads = kv;
  const graph::graph g = models::trace_model<float>("llama", o, 2);
  std::mt19937 rng(9);
  std::map<std::string, source_tensor> src;
  const auto add = [&](const std::string& name, std::vector<std::size_t> shape) {
    src[name] = random_tensor(std::move(shape), rng);
  };
  add("model.embed_tokens.weight", {16, h});
  add("model.norm.weight", {h});
  for (int i = 0; i < 2; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    add(l + "input_layernorm.weight", {h});
    add(l + "post_attention_layernorm.weight", {h});
    add(l + "self_attn.q_proj.weight", {h, h});
    add(l + "self_attn.k_proj.weight", {kv * d, h});
    add(l + "self_attn.v_proj.weight", {kv * d, h});
    add(l + "self_attn.o_proj.weight", {h, h});
    add(l + "mlp.gate_proj.weight", {12, h});
    add(l + "mlp.up_proj.weight", {12, h});
    add(l + "mlp.down_proj.weight", {h, 12});
  }
  const fs::path dir = scratch("llama-gqa");
  fs::create_directories(dir / "hf");
  write_source(dir / "hf" / "model.safetensors", src);
  std::ofstream(dir / "hf" / "config.json")
      << R"({"num_attention_heads": 4, "num_key_value_heads": 2})";
  const auto rep =
      train::import_checkpoint(dir / "hf", dir / "ckpt", train::import_family_named("llama"));
  CHECK(rep.unmatched.empty());
  const auto got = load_all(g, dir / "ckpt"); // the shapes of the grouped model
  const auto at = [&](const std::string& name, std::size_t r, std::size_t c) {
    const auto& t = src.at(name);
    return t.v[r * t.shape[1] + c];
  };
  bool same = true;
  for (std::size_t hd = 0; hd < kv; ++hd)
    for (std::size_t i = 0; i < d / 2; ++i)
      for (std::size_t j = 0; j < h; ++j) {
        const auto& wk = got.at("layers.1.attn.wk.weight"); // [h, kv d]
        same = same &&
               wk[j * kv * d + hd * d + 2 * i] ==
                   at("model.layers.1.self_attn.k_proj.weight", hd * d + i, j) &&
               wk[j * kv * d + hd * d + 2 * i + 1] ==
                   at("model.layers.1.self_attn.k_proj.weight", hd * d + i + d / 2, j);
      }
  for (std::size_t r = 0; r < kv * d; ++r)
    for (std::size_t j = 0; j < h; ++j)
      same = same && got.at("layers.0.attn.wv.weight")[j * kv * d + r] ==
                         at("model.layers.0.self_attn.v_proj.weight", r, j);
  CHECK(same);
  fs::remove_all(dir);
}

TEST_CASE("GPT-2's files import into bert: fused attention split, positions cut, zero head bias",
          "[import]") {
  const std::size_t h = 8;
  const graph::graph g = models::trace_model<float>("bert", tiny(h, 2), 2);
  std::mt19937 rng(11);
  std::map<std::string, source_tensor> src;
  const auto add = [&](const std::string& name, std::vector<std::size_t> shape) {
    src[name] = random_tensor(std::move(shape), rng);
  };
  add("wte.weight", {16, h}); // GPT2Model's names: no "transformer." prefix
  add("wpe.weight", {9, h});
  add("ln_f.weight", {h});
  add("ln_f.bias", {h});
  for (int i = 0; i < 2; ++i) {
    const std::string l = "h." + std::to_string(i) + ".";
    for (const char* n : {"ln_1", "ln_2"}) {
      add(l + n + ".weight", {h});
      add(l + n + ".bias", {h});
    }
    add(l + "attn.c_attn.weight", {h, 3 * h});
    add(l + "attn.c_attn.bias", {3 * h});
    add(l + "attn.c_proj.weight", {h, h});
    add(l + "attn.c_proj.bias", {h});
    add(l + "attn.bias", {1, 1, 9, 9});
    add(l + "mlp.c_fc.weight", {h, 12});
    add(l + "mlp.c_fc.bias", {12});
    add(l + "mlp.c_proj.weight", {12, h});
    add(l + "mlp.c_proj.bias", {h});
  }
  add("extra.weight", {3});
  const fs::path dir = scratch("gpt2");
  write_source(dir / "gpt2.safetensors", src);
  const auto& f = train::import_family_named("gpt2");
  train::import_options o;
  o.seq = 5;
  const auto rep = train::import_checkpoint(dir / "gpt2.safetensors", dir / "ckpt", f, o);
  CHECK(rep.unmatched == std::vector<std::string>{"extra.weight"});
  CHECK(rep.ignored.size() == 2);
  const auto got = load_all(g, dir / "ckpt");
  const auto& fused = src.at("h.1.attn.c_attn.weight").v;
  bool same = true;
  for (std::size_t r = 0; r < h; ++r)
    for (std::size_t c = 0; c < h; ++c)
      same = same && got.at("layers.1.attn.wk.weight")[r * h + c] == fused[r * 3 * h + h + c] &&
             got.at("layers.1.attn.wv.weight")[r * h + c] == fused[r * 3 * h + 2 * h + c];
  CHECK(same);
  CHECK(got.at("layers.0.attn.wq.bias") ==
        std::vector<float>(src.at("h.0.attn.c_attn.bias").v.begin(),
                           src.at("h.0.attn.c_attn.bias").v.begin() + h));
  CHECK(got.at("pos.table") ==
        std::vector<float>(src.at("wpe.weight").v.begin(), src.at("wpe.weight").v.begin() + 5 * h));
  CHECK(got.at("head.bias") == std::vector<float>(16, 0.0F));
  CHECK(got.at("layers.0.fc2.weight") == src.at("h.0.mlp.c_proj.weight").v);
  // Without --seq the whole position table is kept, and the load names it and the fix.
  (void)train::import_checkpoint(dir / "gpt2.safetensors", dir / "whole", f);
  CHECK_THROWS_WITH(load_all(g, dir / "whole"), Catch::Contains("tensor pos.table") &&
                                                    Catch::Contains("[9, 8]") &&
                                                    Catch::Contains("[5, 8]"));
  o.seq = 10;
  CHECK_THROWS_WITH(train::import_checkpoint(dir / "gpt2.safetensors", dir / "long", f, o),
                    Catch::Contains("wpe.weight") && Catch::Contains("fewer than --seq 10"));
  fs::remove_all(dir);
}

TEST_CASE("ViT's files import: the patch convolution flattened and transposed", "[import]") {
  const std::size_t h = 8;
  models::model_options mo = tiny(h, 2);
  const graph::graph g = models::trace_model<float>("vit", mo, 2);
  std::size_t patches = 0;
  std::size_t patch_values = 0;
  for (graph::node_id p : g.parameters()) {
    if (g[p].name == "pos.table")
      patches = g[p].out.dims[0] - 1;
    if (g[p].name == "patch_embed.weight")
      patch_values = g[p].out.dims[0];
  }
  const auto p =
      static_cast<std::size_t>(std::lround(std::sqrt(static_cast<double>(patch_values) / 3.0)));
  REQUIRE(3 * p * p == patch_values);
  std::mt19937 rng(5);
  std::map<std::string, source_tensor> src;
  const auto add = [&](const std::string& name, std::vector<std::size_t> shape) {
    src[name] = random_tensor(std::move(shape), rng);
  };
  add("vit.embeddings.cls_token", {1, 1, h});
  add("vit.embeddings.position_embeddings", {1, patches + 1, h});
  add("vit.embeddings.patch_embeddings.projection.weight", {h, 3, p, p});
  add("vit.embeddings.patch_embeddings.projection.bias", {h});
  add("vit.layernorm.weight", {h});
  add("vit.layernorm.bias", {h});
  add("classifier.weight", {10, h});
  add("classifier.bias", {10});
  for (int i = 0; i < 2; ++i) {
    const std::string l = "vit.encoder.layer." + std::to_string(i) + ".";
    for (const char* n : {"layernorm_before", "layernorm_after"}) {
      add(l + n + ".weight", {h});
      add(l + n + ".bias", {h});
    }
    for (const char* n : {"attention.attention.query", "attention.attention.key",
                          "attention.attention.value", "attention.output.dense"}) {
      add(l + n + ".weight", {h, h});
      add(l + n + ".bias", {h});
    }
    add(l + "intermediate.dense.weight", {12, h});
    add(l + "intermediate.dense.bias", {12});
    add(l + "output.dense.weight", {h, 12});
    add(l + "output.dense.bias", {h});
  }
  const fs::path dir = scratch("vit");
  // Two files and an index, as Hugging Face shards a model.
  std::map<std::string, source_tensor> a;
  std::map<std::string, source_tensor> b;
  nlohmann::json index;
  for (const auto& [name, t] : src) {
    const bool first = name.find("encoder") == std::string::npos;
    (first ? a : b)[name] = t;
    index["weight_map"][name] =
        first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_source(dir / "model-00001-of-00002.safetensors", a);
  write_source(dir / "model-00002-of-00002.safetensors", b);
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  (void)train::import_checkpoint(dir, dir / "ckpt", train::import_family_named("vit"));
  const auto got = load_all(g, dir / "ckpt");
  const auto& conv = src.at("vit.embeddings.patch_embeddings.projection.weight").v;
  bool same = true;
  for (std::size_t o = 0; o < h; ++o)           // conv [out, c, kh, kw] -> [c kh kw, out]
    for (std::size_t k = 0; k < 3 * p * p; ++k) // k = (c p + kh) p + kw, as ViT's patches
      same = same && got.at("patch_embed.weight")[k * h + o] == conv[o * 3 * p * p + k];
  CHECK(same);
  CHECK(got.at("pos.table") == src.at("vit.embeddings.position_embeddings").v);
  CHECK(got.at("layers.1.attn.wv.bias") ==
        src.at("vit.encoder.layer.1.attention.attention.value.bias").v);
  fs::remove_all(dir);
}

TEST_CASE("bad import input is one line naming the file, the tensor and the fix", "[import]") {
  const fs::path dir = scratch("bad");
  const auto& llama = train::import_family_named("llama");
  CHECK_THROWS_WITH(train::import_checkpoint(dir, dir / "ckpt", llama),
                    Catch::Contains("holds no safetensors files"));
  std::mt19937 rng(3);
  std::map<std::string, source_tensor> src;
  src["model.layers.0.self_attn.k_proj.weight"] = {{6, 8}, random_values(48, rng, dtype::f32)};
  write_source(dir / "model.safetensors", src);
  train::import_options o;
  o.heads = 2;
  CHECK_THROWS_WITH(train::import_checkpoint(dir, dir / "ckpt", llama, o),
                    Catch::Contains("k_proj.weight") &&
                        Catch::Contains("6 rows are not whole heads of 4"));
  src["model.layers.0.self_attn.k_proj.weight"] = {{8, 8}, random_values(64, rng, dtype::f32)};
  write_source(dir / "model.safetensors", src);
  CHECK_THROWS_WITH(train::import_checkpoint(dir, dir / "ckpt", llama),
                    Catch::Contains("0 heads for 8 features") && Catch::Contains("--heads"));
  CHECK_THROWS_WITH(train::import_checkpoint(dir, dir / "ckpt", train::import_family_named("vit")),
                    Catch::Contains("holds no tensor the vit name table knows"));
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"weight_map": {"x": "gone.safetensors"}})";
  CHECK_THROWS_WITH(train::import_checkpoint(dir, dir / "ckpt", llama),
                    Catch::Contains("gone.safetensors") && Catch::Contains("missing"));
  fs::remove_all(dir);
}

TEST_CASE("an import that matches its name table poorly is refused, naming the likely table, and "
          "config.json's epsilon is recorded",
          "[import]") {
  // A Llama model's files (2 layers, complete) given to the gpt2 table: 1 of 19 named.
  std::mt19937 rng(11);
  std::map<std::string, source_tensor> src;
  const auto add = [&](const std::string& name, std::vector<std::size_t> shape) {
    src[name] = random_tensor(std::move(shape), rng, dtype::f32);
  };
  add("model.embed_tokens.weight", {16, 8});
  add("model.norm.weight", {8});
  for (int i = 0; i < 2; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    add(l + "input_layernorm.weight", {8});
    add(l + "post_attention_layernorm.weight", {8});
    for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"})
      add(l + "self_attn." + p + ".weight", {8, 8});
    add(l + "mlp.gate_proj.weight", {12, 8});
    add(l + "mlp.up_proj.weight", {12, 8});
    add(l + "mlp.down_proj.weight", {8, 12});
  }
  add("wpe.weight", {4, 8}); // one name gpt2's table knows
  const fs::path dir = scratch("poor");
  fs::create_directories(dir / "hf");
  write_source(dir / "hf" / "model.safetensors", src);
  std::ofstream(dir / "hf" / "config.json")
      << R"({"num_attention_heads": 2, "rms_norm_eps": 1e-05})";
  const auto& gpt2 = train::import_family_named("gpt2");
  CHECK_THROWS_WITH(train::import_checkpoint(dir / "hf", dir / "ckpt", gpt2),
                    Catch::Contains("matches the gpt2 name table poorly: 1 of 21 source tensors "
                                    "named, 1 of ") &&
                        Catch::Contains("give --names llama") && Catch::Contains("--partial"));
  CHECK_FALSE(fs::exists(dir / "ckpt"));
  // --partial imports the one tensor, naming what it left.
  train::import_options partial;
  partial.partial = true;
  const auto some = train::import_checkpoint(dir / "hf", dir / "ckpt-partial", gpt2, partial);
  CHECK(some.map.size() == 1);
  CHECK(some.unmatched.size() == 20);
  CHECK_FALSE(some.missing.empty());
  // The right table: everything named (wpe is not Llama's: 1 of 21 unmatched), the epsilon
  // recorded for the run (--norm-eps follows it).
  const auto rep =
      train::import_checkpoint(dir / "hf", dir / "ckpt-llama", train::import_family_named("llama"));
  CHECK(rep.missing.empty());
  CHECK(rep.unmatched.size() == 1);
  CHECK(rep.norm_eps == 1e-5);
  const auto meta = train::read_manifest(*train::find_checkpoint(dir / "ckpt-llama"))["meta"];
  CHECK(meta["imported"]["norm_eps"].get<double>() == 1e-5);
  CHECK(meta["imported"]["norm_eps_field"] == "config.json's rms_norm_eps");
  fs::remove_all(dir);
}
