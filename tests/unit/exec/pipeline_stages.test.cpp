// Pipeline stages (graph/stages.hpp): a model cut at block boundaries, each stage a graph of its
// own. Every node is in one stage; the cut balances FLOPs against the stages' speeds; and the
// stages compose to the whole model: the last stage, fed the values the earlier stages send,
// gives the whole model's loss (f64, to rounding), the gradients it sends back are the whole
// model's gradients of those values, and the first stage, given them through its seeded loss,
// computes the whole model's gradients of its parameters. Shared parameters are refused.
#include <hspmd/exec/executor.hpp>
#include <hspmd/graph/stages.hpp>
#include <hspmd/models/bert.hpp>

#include "../../support/tiny_bert.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

using namespace hspmd;

namespace {

double stage_flops(const graph::graph& g, graph::node_range r) {
  double f = 0;
  for (graph::node_id i = r.first; i <= r.second; ++i) {
    const auto c = graph::cost_of(g, i);
    f += c.forward_flops + c.backward_flops;
  }
  return f;
}

} // namespace

TEST_CASE("pipeline stages: a cut at blocks covers every node once, balanced by speed") {
  const graph::graph g = models::trace_bert_lm<double>(test::tiny_bert(4), 2);
  const std::vector<double> even{1.0, 1.0};
  const auto two = graph::balanced_stages(g, even);
  REQUIRE(two.size() == 2);
  CHECK(two[0].first == 0);
  CHECK(two[1].first == two[0].second + 1);
  CHECK(two[1].second + 1 == g.size());
  // equal speeds: two layers each (the embeddings and the head make the stages a little uneven)
  const auto blocks = graph::block_ranges(g);
  REQUIRE(blocks.size() == 4);
  CHECK(two[1].first == blocks[2].first);
  // a stage three times faster takes three of the four layers
  const std::vector<double> fast_first{3.0, 1.0};
  const auto skewed = graph::balanced_stages(g, fast_first);
  CHECK(skewed[1].first == blocks[3].first);
  CHECK(stage_flops(g, skewed[0]) > 2.0 * stage_flops(g, skewed[1]));
  // three stages at chosen blocks
  const std::vector<std::size_t> at{0, 1, 3};
  const auto three = graph::stages_at_blocks(g, at);
  CHECK(three[1].first == blocks[1].first);
  CHECK(three[2].first == blocks[3].first);
  CHECK_THROWS_WITH(graph::balanced_stages(g, std::vector<double>(5, 1.0)),
                    Catch::Contains("5 stages for a model of 4 blocks"));
  const std::vector<std::size_t> bad{0, 2, 2};
  CHECK_THROWS_WITH(graph::stages_at_blocks(g, bad),
                    Catch::Contains("stage 2 starts at block 2, not after stage 1's"));
}

TEST_CASE("pipeline stages: the stages' graphs compose to the whole model (loss and gradients)") {
  const graph::graph g = models::trace_bert_lm<double>(test::tiny_bert(4), 2);
  const std::vector<std::size_t> at{0, 2};
  const auto cuts = graph::stages_at_blocks(g, at);
  const graph::stage_graph first = graph::extract_stage(g, cuts, 0);
  const graph::stage_graph last = graph::extract_stage(g, cuts, 1);
  REQUIRE(first.g.loss().has_value()); // the seeded loss
  REQUIRE(last.g.loss().has_value());
  CHECK(last.gradient_inputs.empty());
  REQUIRE(first.gradient_inputs.size() == first.sent.size());
  REQUIRE_FALSE(first.sent.empty());
  // what stage 1 receives is exactly what stage 0 sends
  REQUIRE(last.received.size() == first.sent.size());
  for (std::size_t k = 0; k < first.sent.size(); ++k)
    CHECK(last.received[k].second == first.global[first.sent[k]]);
  // every parameter in exactly one stage, under its own name
  std::size_t params = first.g.parameters().size() + last.g.parameters().size();
  CHECK(params == g.parameters().size());

  // the worst difference of two vectors, relative to the second's largest element
  const auto worst_relative = [](const std::vector<double>& got, const std::vector<double>& want) {
    REQUIRE(got.size() == want.size());
    double worst = 0, scale = 1e-30;
    for (std::size_t k = 0; k < got.size(); ++k) {
      worst = std::max(worst, std::abs(got[k] - want[k]));
      scale = std::max(scale, std::abs(want[k]));
    }
    return worst / scale;
  };

  const std::vector<std::int64_t> tokens = {1, 2, 3, 4, 7, 8, 9, 10};
  const std::vector<std::int64_t> targets = {2, 3, 4, 5, 8, 9, 10, 0};
  exec::executor<double> whole(g, 11);
  whole.set_input("tokens", tokens);
  whole.set_input("targets", targets);
  const double want = whole.forward();
  whole.backward();

  exec::executor<double> tail(last.g, 11); // parameters by name and seed: the same values
  for (graph::node_id i : last.g.inputs()) {
    const std::string& name = last.g[i].name;
    if (name == "targets")
      tail.set_input(name, targets);
    else if (name == "tokens")
      tail.set_input(name, tokens);
    else {
      const auto v = whole.value_to_host(last.global[i]);
      tail.set_input(name, std::span<const double>(v));
    }
  }
  const double got = tail.forward();
  CHECK(got == Approx(want).epsilon(1e-12));
  tail.backward();
  for (const auto& [local, global] : last.received) {
    CAPTURE(last.g[local].name);
    CHECK(worst_relative(tail.grad_to_host(local), whole.grad_to_host(global)) <= 1e-12);
  }
  // and the tail's parameters' gradients are the whole model's
  for (graph::node_id p : last.g.parameters()) {
    CAPTURE(last.g[p].name);
    CHECK(worst_relative(tail.grad_to_host(p), whole.grad_to_host(*g.find(last.g[p].name))) <=
          1e-12);
  }

  // the first stage, given the gradients of what it sent, has the whole model's gradients
  exec::executor<double> head(first.g, 11);
  head.set_input("tokens", tokens);
  for (std::size_t k = 0; k < first.sent.size(); ++k) {
    const auto gx = whole.grad_to_host(first.global[first.sent[k]]);
    head.set_input(first.g[first.gradient_inputs[k]].name, std::span<const double>(gx));
  }
  (void)head.forward();
  for (std::size_t k = 0; k < first.sent.size(); ++k) { // it computes the same values it sends
    CAPTURE(first.g[first.sent[k]].name);
    CHECK(worst_relative(head.value_to_host(first.sent[k]),
                         whole.value_to_host(first.global[first.sent[k]])) <= 1e-15);
  }
  head.backward();
  for (graph::node_id p : first.g.parameters()) {
    CAPTURE(first.g[p].name);
    CHECK(worst_relative(head.grad_to_host(p), whole.grad_to_host(*g.find(first.g[p].name))) <=
          1e-12);
  }
}

TEST_CASE("pipeline stages: a parameter two stages read is refused, naming it") {
  // a tiny graph whose second stage reads a first-stage weight again
  const auto dims = [](std::size_t a, std::size_t b) {
    hspmd::shape s;
    s.dims = {a, b};
    return s;
  };
  graph::graph g;
  graph::node x;
  x.kind = graph::op::input;
  x.name = "x";
  x.out = dims(2, 4);
  const auto xi = g.add(x);
  graph::node w;
  w.kind = graph::op::parameter;
  w.name = "layers.0.w";
  w.out = dims(4, 4);
  const auto wi = g.add(w);
  graph::node m;
  m.kind = graph::op::matmul;
  m.name = "matmul0";
  m.inputs = {xi, wi};
  m.out = dims(2, 4);
  const auto mi = g.add(m);
  graph::node w1 = w;
  w1.name = "layers.1.w";
  const auto w1i = g.add(w1);
  graph::node m1 = m;
  m1.name = "matmul1";
  m1.inputs = {mi, w1i};
  const auto m1i = g.add(m1);
  graph::node m2 = m;
  m2.name = "matmul2";
  m2.inputs = {m1i, wi}; // layers.0.w again, in stage 1
  g.add(m2);
  const std::vector<graph::node_range> cuts{{0, 2}, {3, 5}};
  CHECK_THROWS_WITH(graph::extract_stage(g, cuts, 1),
                    Catch::Contains("parameter layers.0.w is read by stage 0 and stage 1") &&
                        Catch::Contains("untie the shared weight"));
}
