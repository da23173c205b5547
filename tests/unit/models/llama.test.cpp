// Llama-style decoder at a tiny size: structure and parameter names, FLOPs of the SwiGLU MLP, a
// model gradient check in f64 through every new op (RMSNorm, rotary, SwiGLU), the causal mask
// (a later token does not change an earlier position's output), and learning a counting task.
#include "../../support/finite_difference.hpp"
#include "../../support/training.hpp"

#include <hspmd/exec/executor.hpp>
#include <hspmd/graph/io.hpp>
#include <hspmd/graph/ops.hpp>
#include <hspmd/models/llama.hpp>
#include <hspmd/models/zoo.hpp>
#include <hspmd/train/trainer.hpp>

#include <catch2/catch.hpp>

#include <random>
#include <vector>

using namespace hspmd;

namespace {
models::llama_config tiny_llama() {
  models::llama_config c;
  c.layers = 2;
  c.hidden = 16;
  c.heads = 2;
  c.ffn = 24;
  c.seq = 6;
  c.vocab = 11;
  return c;
}
} // namespace

TEST_CASE("Llama traces RMSNorm, rotary queries and keys, SwiGLU and an untied head") {
  const auto c = tiny_llama();
  const graph::graph g = models::trace_llama_lm<float>(c, 3);
  CHECK(g.find("layers.1.attn.wq.weight").has_value());
  CHECK_FALSE(g.find("layers.1.attn.wq.bias").has_value()); // no biases
  CHECK(g.find("layers.0.mlp.gate.weight").has_value());
  CHECK(g.find("layers.0.attn_norm.weight").has_value());
  CHECK(g.find("head.weight").has_value()); // untied from tok.table
  CHECK(g.parameters().size() == 1 + c.layers * 9 + 1 + 1);
  CHECK(g.of_kind(graph::op::rotary).size() == 2 * c.layers); // queries and keys
  CHECK(g.of_kind(graph::op::rms_norm).size() == 2 * c.layers + 1);
  CHECK(g.of_kind(graph::op::swiglu).size() == c.layers);
  for (graph::node_id s : g.of_kind(graph::op::softmax))
    CHECK(g[s].attrs.flag); // causal
  // The SwiGLU MLP of one layer: three (tokens x 16 x 24) products and the gate's 5 per element.
  double mlp = 0;
  for (graph::node_id i = 0; i < g.size(); ++i)
    if (g[i].name.rfind("layers.0.mlp.", 0) == 0)
      mlp += graph::cost_of(g, i).forward_flops;
  const double tokens = 3.0 * 6;
  CHECK(mlp == 3 * 2 * tokens * 16 * 24 + 5 * tokens * 24);
  CHECK(graph::from_json(graph::to_json(g)) == g);
  // The zoo traces the same model by name.
  models::model_options o;
  o.layers = 2;
  o.hidden = 16;
  o.heads = 2;
  o.ffn = 24;
  o.seq = 6;
  o.vocab = 11;
  CHECK(models::trace_model<float>("llama", o, 3) == g);
  CHECK_THROWS_WITH(models::trace_model<float>("llama", {1, 12, 0, 4, 4, 8, 0, 1.0}, 1),
                    Catch::Contains("even head sizes"));
}

TEST_CASE("Llama gradients match finite differences (f64, tiny)") {
  auto c = tiny_llama();
  c.layers = 1;
  c.seq = 4;
  const graph::graph g = models::trace_llama_lm<double>(c, 2);
  exec::executor<double> ex(g, 3);
  ex.set_input("tokens", std::vector<std::int64_t>{1, 2, 3, 4, 7, 8, 9, 10});
  ex.set_input("targets", std::vector<std::int64_t>{2, 3, 4, 5, 8, 9, 10, 0});
  ex.forward();
  ex.backward();
  std::vector<graph::node_id> params;
  for (const char* name : {"layers.0.attn.wq.weight", "layers.0.attn.wk.weight",
                           "layers.0.attn_norm.weight", "layers.0.mlp.gate.weight",
                           "layers.0.mlp.up.weight", "norm.weight", "tok.table", "head.weight"})
    params.push_back(ex.parameter(name));
  CHECK(test_support::worst_gradient_error(ex, params, 12) <= 1e-6);
}

TEST_CASE("Llama with fused attention: no scores in the graph, the same loss and gradients") {
  auto c = tiny_llama();
  const graph::graph plain = models::trace_llama_lm<double>(c, 2);
  c.fused_attention = true;
  const graph::graph fused = models::trace_llama_lm<double>(c, 2);
  CHECK(fused.of_kind(graph::op::attention).size() == c.layers);
  CHECK(fused.of_kind(graph::op::softmax).empty());
  CHECK(fused.of_kind(graph::op::batched_matmul).empty());
  CHECK(fused.parameters().size() == plain.parameters().size());
  // What a node keeps for the backward: no (S, S) score tensor is left.
  const auto scores = [&](const graph::graph& g) {
    std::size_t n = 0;
    for (graph::node_id i = 0; i < g.size(); ++i) {
      const auto& d = g[i].out.dims;
      n += d.size() >= 2 && d[d.size() - 1] == c.seq && d[d.size() - 2] == c.seq ? std::size_t{1}
                                                                                 : std::size_t{0};
    }
    return n;
  };
  CHECK(scores(plain) >= 3 * c.layers);
  CHECK(scores(fused) == 0);
  const std::vector<std::int64_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1};
  const std::vector<std::int64_t> targets = {2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 2};
  exec::executor<double> a(plain, 3);
  exec::executor<double> b(fused, 3);
  for (auto* ex : {&a, &b}) {
    ex->set_input("tokens", tokens);
    ex->set_input("targets", targets);
  }
  const double la = a.forward();
  CHECK(b.forward() == Approx(la).epsilon(1e-12));
  a.backward();
  b.backward();
  for (graph::node_id p : plain.parameters()) {
    CAPTURE(plain[p].name);
    const auto ga = a.grad(p);
    const auto gb = b.grad(b.parameter(plain[p].name));
    REQUIRE(ga.size() == gb.size());
    double worst = 0.0;
    for (std::size_t i = 0; i < ga.size(); ++i)
      worst = std::max(worst, std::abs(ga[i] - gb[i]));
    CHECK(worst <= 1e-12);
  }
}

TEST_CASE("Llama is causal: changing the last token leaves earlier positions' outputs alone") {
  const auto c = tiny_llama();
  const graph::graph g = models::trace_llama_lm<double>(c, 1);
  const auto head = *g.find("head.matmul" + std::to_string(g.size() - 3));
  exec::executor<double> ex(g, 3);
  std::vector<std::int64_t> tokens = {1, 2, 3, 4, 5, 6};
  ex.set_input("targets", std::vector<std::int64_t>(6, 0));
  ex.set_input("tokens", tokens);
  ex.forward();
  const std::vector<double> before(ex.value(head).begin(), ex.value(head).end());
  tokens.back() = 9;
  ex.set_input("tokens", tokens);
  ex.forward();
  const auto after = ex.value(head);
  const std::size_t v = c.vocab;
  for (std::size_t i = 0; i < 5 * v; ++i)
    CHECK(after[i] == before[i]);
  bool last_changed = false;
  for (std::size_t i = 5 * v; i < 6 * v; ++i)
    last_changed = last_changed || after[i] != before[i];
  CHECK(last_changed);
}

TEST_CASE("Llama learns to count: loss after 50 steps <= 0.8 x the first") {
  const auto c = tiny_llama();
  constexpr std::size_t batch = 8;
  const graph::graph g = models::trace_llama_lm<float>(c, batch);
  std::mt19937_64 rng(5);
  train::trainer<float> tr(g, test_support::quiet_training(50, 3e-3, 1.0));
  const auto losses =
      tr.fit([&](exec::batch_sink<float>& e, std::size_t) {
          std::vector<std::int64_t> tokens(batch * c.seq);
          std::vector<std::int64_t> targets(batch * c.seq);
          for (std::size_t b = 0; b < batch; ++b) {
            const std::size_t start = rng() % c.vocab;
            for (std::size_t s = 0; s < c.seq; ++s) {
              tokens[b * c.seq + s] = static_cast<std::int64_t>((start + s) % c.vocab);
              targets[b * c.seq + s] = static_cast<std::int64_t>((start + s + 1) % c.vocab);
            }
          }
          e.set_input("tokens", tokens);
          e.set_input("targets", targets);
        }).losses;
  const double first = losses.front();
  const double last = (losses[47] + losses[48] + losses[49]) / 3.0;
  CAPTURE(first, last);
  CHECK(last <= 0.8 * first);
}

TEST_CASE("Llama with grouped-query attention equals Llama with each key/value head repeated, "
          "through products or the fused op") {
  auto c = tiny_llama();
  c.heads = 4; // head size 4
  c.kv_heads = 2;
  const graph::graph grouped = models::trace_llama_lm<double>(c, 2);
  c.fused_attention = true;
  const graph::graph fused = models::trace_llama_lm<double>(c, 2);
  c.kv_heads = 0;
  const graph::graph full = models::trace_llama_lm<double>(c, 2);
  const auto wk = *grouped.find("layers.0.attn.wk.weight");
  CHECK(grouped[wk].out.dims == std::vector<std::size_t>{16, 8}); // 2 heads of 4
  CHECK(fused.of_kind(graph::op::broadcast).empty()); // the op reads the groups as they are
  CHECK(grouped.of_kind(graph::op::broadcast).size() == 2 * c.layers);
  const std::vector<std::int64_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1};
  const std::vector<std::int64_t> targets = {2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 2};
  exec::executor<double> a(grouped, 3);
  exec::executor<double> b(fused, 3);
  exec::executor<double> m(full, 3);
  for (auto* ex : {&a, &b, &m}) {
    ex->set_input("tokens", tokens);
    ex->set_input("targets", targets);
  }
  // The full model's key and value weights: column h d + i is the grouped model's column
  // (h / 2) d + i; every other parameter the same.
  for (graph::node_id p : grouped.parameters()) {
    const auto from = a.value(p);
    std::ranges::copy(from, b.value(b.parameter(grouped[p].name)).begin());
    const auto to = m.value(m.parameter(grouped[p].name));
    if (to.size() == from.size()) {
      std::ranges::copy(from, to.begin());
      continue;
    }
    for (std::size_t r = 0; r < 16; ++r)
      for (std::size_t col = 0; col < 16; ++col)
        to[r * 16 + col] = from[r * 8 + (col / 4) / 2 * 4 + col % 4];
  }
  const double lm = m.forward();
  CHECK(a.forward() == Approx(lm).epsilon(1e-12));
  CHECK(b.forward() == Approx(lm).epsilon(1e-12));
  a.backward();
  b.backward();
  m.backward();
  // The grouped gradient of a key/value column is the sum over its repeats.
  for (graph::node_id p : grouped.parameters()) {
    CAPTURE(grouped[p].name);
    const auto ga = a.grad(p);
    const auto gb = b.grad(b.parameter(grouped[p].name));
    const auto gm = m.grad(m.parameter(grouped[p].name));
    std::vector<double> want(gm.begin(), gm.end());
    if (gm.size() != ga.size()) {
      want.assign(ga.size(), 0.0);
      for (std::size_t r = 0; r < 16; ++r)
        for (std::size_t col = 0; col < 16; ++col)
          want[r * 8 + (col / 4) / 2 * 4 + col % 4] += gm[r * 16 + col];
    }
    double worst = 0.0;
    for (std::size_t i = 0; i < ga.size(); ++i)
      worst = std::max({worst, std::abs(ga[i] - want[i]), std::abs(gb[i] - want[i])});
    CHECK(worst <= 1e-12);
  }
  c.kv_heads = 3;
  CHECK_THROWS_WITH(models::trace_llama_lm<double>(c, 2),
                    Catch::Contains("3 key/value heads for 4 query heads"));
}

TEST_CASE("size presets trace the big planning models without weights, given sizes win") {
  const auto parameters = [](const graph::graph& g) {
    double n = 0.0;
    for (graph::node_id i = 0; i < g.size(); ++i)
      if (g[i].kind == graph::op::parameter)
        n += static_cast<double>(g[i].out.size());
    return n;
  };
  const struct {
    const char* name;
    double billions;
  } expect[] = {{"bert-large", 0.3654}, {"llama-7b", 6.74},
                {"llama-13b", 13.02},   {"llama-70b", 68.98}, // 8 key/value heads
                {"gpt3-175b", 175.2},   {"moe-19b", 19.33}};
  for (const auto& e : expect) {
    CAPTURE(e.name);
    REQUIRE(models::find_preset(e.name) != nullptr);
    const graph::graph g = models::trace_model<float>(e.name, {}, 4);
    CHECK(parameters(g) / 1e9 == Approx(e.billions).epsilon(0.005));
  }
  models::model_options two;
  two.layers = 2;
  const graph::graph small = models::trace_model<float>("llama-70b", two, 1);
  // Per layer: q and o (2 h^2), k and v (2 h 1024: 8 heads of 128) and SwiGLU (3 h ffn);
  // embedding and head (2 vocab h).
  constexpr std::size_t h_size = 8192;
  const double h = 8192.0;
  CHECK(parameters(small) ==
        Approx(2.0 * (2.0 * h * h + 2.0 * h * 1024.0 + 3.0 * h * 28672.0) + 2.0 * 32000.0 * h)
            .epsilon(0.001));
  CHECK(small.of_kind(graph::op::attention).size() == 2);
  // --heads alone: full multi-head attention; --kv-heads sets the groups.
  two.heads = 32;
  const graph::graph mha = models::trace_model<float>("llama-70b", two, 1);
  CHECK(mha[*mha.find("layers.0.attn.wk.weight")].out.dims ==
        std::vector<std::size_t>{h_size, h_size});
  two.kv_heads = 4;
  const graph::graph gqa = models::trace_model<float>("llama-70b", two, 1);
  CHECK(gqa[*gqa.find("layers.0.attn.wk.weight")].out.dims ==
        std::vector<std::size_t>{h_size, 4 * 256});
  CHECK_THROWS_WITH(models::trace_model<float>("bert", two, 1),
                    Catch::Contains("only llama has grouped-query attention"));
  // GPT-3's preset keeps no scores either.
  models::model_options one;
  one.layers = 1;
  const graph::graph gpt3 = models::trace_model<float>("gpt3-175b", one, 1);
  CHECK(gpt3.of_kind(graph::op::attention).size() == 1);
  CHECK_THROWS_WITH(models::trace_model<float>("llama-8b", {}, 1),
                    Catch::Contains("llama-7b") && Catch::Contains("moe-19b"));
}
