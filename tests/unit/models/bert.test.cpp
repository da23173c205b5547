// BERT-LM at a tiny size: shapes, parameter names, FLOPs of the attention projections, a model
// gradient check in f64, and 50 training steps on a learnable synthetic task.
#include "../../support/finite_difference.hpp"
#include "../../support/training.hpp"

#include <hspmd/exec/executor.hpp>
#include <hspmd/graph/io.hpp>
#include <hspmd/graph/ops.hpp>
#include <hspmd/models/bert.hpp>
#include <hspmd/train/trainer.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

using namespace hspmd;

namespace {
models::bert_config tiny() {
  models::bert_config c;
  c.layers = 2;
  c.hidden = 16;
  c.ffn = 32;
  c.heads = 2;
  c.seq = 6;
  c.vocab = 11;
  c.dropout = 0.0;
  return c;
}

// Sequences counting up modulo the vocabulary from a random start: next = current + 1.
template <class Sink>
void feed_counting(Sink& ex, const models::bert_config& c, std::size_t batch,
                   std::mt19937_64& rng) {
  std::vector<std::int64_t> tokens(batch * c.seq);
  std::vector<std::int64_t> targets(batch * c.seq);
  for (std::size_t b = 0; b < batch; ++b) {
    const std::size_t start = rng() % c.vocab;
    for (std::size_t s = 0; s < c.seq; ++s) {
      tokens[b * c.seq + s] = static_cast<std::int64_t>((start + s) % c.vocab);
      targets[b * c.seq + s] = static_cast<std::int64_t>((start + s + 1) % c.vocab);
    }
  }
  ex.set_input("tokens", tokens);
  ex.set_input("targets", targets);
}
} // namespace

TEST_CASE("BERT-LM traces with named parameters and counts its attention projections") {
  const auto c = tiny();
  const graph::graph g = models::trace_bert_lm<float>(c, 3);
  CHECK(g.find("layers.1.attn.wq.weight").has_value());
  CHECK(g.find("layers.0.ln2.gamma").has_value());
  CHECK(g.find("head.weight").has_value());
  CHECK(g.parameters().size() == 1 + 1 + c.layers * 16 + 2 + 2);
  // The four projections of one layer: 4 x (2 * tokens * H * H + tokens * H) forward FLOPs.
  double projections = 0;
  for (graph::node_id i = 0; i < g.size(); ++i)
    if (g[i].kind == graph::op::linear && g[i].name.rfind("layers.0.attn.", 0) == 0)
      projections += graph::cost_of(g, i).forward_flops;
  const double tokens = 3.0 * 6;
  CHECK(projections == 4 * (2 * tokens * 16 * 16 + tokens * 16));
}

TEST_CASE("BERT-LM gradients match finite differences (f64, tiny)") {
  auto c = tiny();
  c.layers = 1;
  c.seq = 4;
  const graph::graph g = models::trace_bert_lm<double>(c, 2);
  exec::executor<double> ex(g, 3);
  std::vector<std::int64_t> tokens = {1, 2, 3, 4, 7, 8, 9, 10};
  std::vector<std::int64_t> targets = {2, 3, 4, 5, 8, 9, 10, 0};
  ex.set_input("tokens", tokens);
  ex.set_input("targets", targets);
  ex.forward();
  ex.backward();
  std::vector<graph::node_id> params;
  for (const char* name :
       {"layers.0.attn.wq.weight", "layers.0.attn.wv.bias", "layers.0.fc1.weight",
        "layers.0.ln1.gamma", "pos.table", "tok.table", "head.weight"})
    params.push_back(ex.parameter(name));
  const double worst = test_support::worst_gradient_error(ex, params, 12);
  CHECK(worst <= 1e-6);
}

TEST_CASE("BERT-LM learns to count: loss after 50 steps <= 0.8 x the first") {
  const auto c = tiny();
  constexpr std::size_t batch = 8;
  const graph::graph g = models::trace_bert_lm<float>(c, batch);
  std::mt19937_64 rng(5);
  train::trainer<float> tr(g, test_support::quiet_training(50, 3e-3, 1.0));
  const auto losses = tr.fit([&](exec::batch_sink<float>& e, std::size_t) {
                          feed_counting(e, c, batch, rng);
                        }).losses;
  const double first = losses.front();
  const double last = (losses[47] + losses[48] + losses[49]) / 3.0;
  CAPTURE(first, last);
  CHECK(last <= 0.8 * first);
}

TEST_CASE("BERT-MoE: experts in every second layer, gradients, and learning") {
  auto c = tiny();
  c.moe_experts = 4;
  const graph::graph g = models::trace_bert_lm<float>(c, 4);
  CHECK(g.find("layers.1.moe.experts.w1").has_value());
  CHECK_FALSE(g.find("layers.0.moe.experts.w1").has_value());
  CHECK(g[*g.find("layers.1.moe.experts.w1")].out.dims == std::vector<std::size_t>{4, 16, 32});
  CHECK(g.of_kind(graph::op::moe_dispatch).size() == 1);
  CHECK(graph::from_json(graph::to_json(g)) == g);

  auto small = c;
  small.layers = 2;
  small.seq = 4;
  const graph::graph gd = models::trace_bert_lm<double>(small, 2);
  exec::executor<double> ex(gd, 3);
  ex.set_input("tokens", std::vector<std::int64_t>{1, 2, 3, 4, 7, 8, 9, 10});
  ex.set_input("targets", std::vector<std::int64_t>{2, 3, 4, 5, 8, 9, 10, 0});
  ex.forward();
  ex.backward();
  CHECK(test_support::worst_gradient_error(
            ex,
            {ex.parameter("layers.1.moe.gate.weight"), ex.parameter("layers.1.moe.experts.w1"),
             ex.parameter("layers.1.moe.experts.b2"), ex.parameter("layers.0.fc2.weight")},
            12) <= 1e-6);

  constexpr std::size_t batch = 8;
  const graph::graph gt = models::trace_bert_lm<float>(c, batch);
  std::mt19937_64 rng(6);
  train::trainer<float> tr(gt, test_support::quiet_training(50, 3e-3, 1.0));
  const auto losses = tr.fit([&](exec::batch_sink<float>& e, std::size_t) {
                          feed_counting(e, c, batch, rng);
                        }).losses;
  CHECK((losses[47] + losses[48] + losses[49]) / 3.0 <= 0.8 * losses.front());
}
