// Manual SPMD: placements pinned in types propagate at compile time by the rule table, are
// recorded in the graph, propagate at run time through ops whose rules need the sizes, and the
// synthesizer keeps them.
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/graph/io.hpp>
#include <hspmd/nn/layers.hpp>
#include <hspmd/sim/step.hpp>
#include <hspmd/synth/synthesize.hpp>

#include <catch2/catch.hpp>

#include <string>
#include <type_traits>

using namespace hspmd;

namespace {
template <class V>
using pin_t = typename V::placement_type;
} // namespace

TEST_CASE("pins propagate through typed ops at compile time, by the rule table") {
  nn::tracer t(dtype::f32, 8);
  auto x = t.input<float, extents<batch, 16>, split<0>>("x"); // the batch is split
  auto y = t.input<std::int64_t, extents<batch>, split<0>>("y");
  const nn::linear<float, 16, 32> fc1("fc1");
  const nn::linear<float, 32, 4> fc2("fc2");
  auto h = nn::relu(fc1(t, x)); // weight unpinned: only data parallelism fits x split<0>
  static_assert(std::is_same_v<pin_t<decltype(h)>, split<0>>);
  auto logits = fc2(t, h);
  auto loss = nn::cross_entropy(logits, y); // rows split: a partial sum
  static_assert(std::is_same_v<pin_t<decltype(loss)>, partial>);
  t.set_loss(loss);
  // Row-parallel by hand: features split, weight split along its rows -> partial.
  auto xf = t.input<float, extents<batch, 16>, split<1>>("xf");
  auto w = t.parameter<float, extents<16, 8>, split<0>>("w", {}, {});
  auto p = nn::matmul(xf, w);
  static_assert(std::is_same_v<pin_t<decltype(p)>, partial>);
  static_assert(std::is_same_v<pin_t<decltype(nn::add(p, p))>, partial>); // linear
  auto r = nn::redistribute<replicated>(p);
  static_assert(std::is_same_v<pin_t<decltype(r)>, replicated>);
  // Unpinned stays unpinned.
  auto u = t.input<float, extents<batch, 16>>("u");
  static_assert(std::is_same_v<pin_t<decltype(nn::relu(u))>, nn::unpinned>);
  // The collective a redistribution needs, decided at compile time.
  static_assert(nn::redistribution<split<0>, replicated>() == collective::all_gather_v);
  static_assert(nn::redistribution<partial, replicated>() == collective::all_reduce);
  static_assert(nn::redistribution<partial, split<1>>() == collective::reduce_scatter_v);
  static_assert(nn::redistribution<split<0>, split<1>>() == collective::all_to_all_v);
  static_assert(!nn::redistribution<replicated, split<0>>().has_value()); // a local slice

  const graph::graph g = t.take();
  CHECK(g[h.id()].pin == placement::split_along(0));
  CHECK(g[loss.id()].pin == placement{partial{}});
  CHECK(g[r.id()].pin == placement{});
  CHECK(!g[g.find("fc1.weight").value()].pin.has_value());
  // Pins survive the JSON round trip.
  CHECK(graph::from_json(graph::to_json(g)) == g);
}

TEST_CASE("pins propagate at run time through ops whose rules need the sizes") {
  nn::tracer t(dtype::f32, 4);
  auto x = t.input<float, extents<batch, 6, 8>, split<0>>("x");
  auto flat = nn::reshape(x, extents<dynamic_extent, 8>(24)); // (4, 6, 8) -> (24, 8)
  CHECK(t.graph()[flat.id()].pin == placement::split_along(0));
  auto inner = t.input<float, extents<batch, 6, 8>, split<1>>("inner");
  // 6 is an inner dimension of the (4, 6) -> 24 group: no rule keeps it split.
  CHECK_THROWS_WITH(
      nn::reshape(inner, extents<dynamic_extent, 8>(24)),
      Catch::Contains("no placement rule runs it locally on operands pinned (split(1))") &&
          Catch::Contains("insert redistribute<replicated> on operand 0"));
}

TEST_CASE("the synthesizer keeps every pin") {
  // The same graph twice, once with pins: the first layer's output forced replicated and the
  // second layer column-parallel (vocabulary-parallel loss). Unpinned, the optimum keeps the
  // large activation split, so the pins visibly constrain the plan.
  const cluster c = parse_cluster(R"({"version": 1, "name": "two", "links": {"intra_node":
      {"bandwidth": 1e9, "latency": 1e-6}}, "devices": [{"name": "a", "kind": "cpu",
      "speed": 1e10, "memory": "1 GiB", "count": 2}]})",
                                  "two");
  const auto trace = [](bool pinned) {
    nn::tracer t(dtype::f32, 512);
    auto x = t.input<float, extents<batch, 64>>("x");
    auto y = t.input<std::int64_t, extents<batch>>("y");
    auto w1 = t.parameter<float, extents<64, 256>>("fc1.weight", {}, {});
    auto h = nn::relu(nn::matmul(x, w1));
    if (!pinned) {
      auto same = nn::reshape(h, h.extents()); // the identity node redistribute records
      auto w2 = t.parameter<float, extents<256, 8>>("fc2.weight", {}, {});
      t.set_loss(nn::cross_entropy(nn::matmul(same, w2), y));
      return t.take();
    }
    auto whole = nn::redistribute<replicated>(h);
    auto w2 = t.parameter<float, extents<256, 8>, split<1>>("fc2.weight", {}, {});
    auto logits = nn::matmul(whole, w2); // column parallel: split<1>
    static_assert(std::is_same_v<pin_t<decltype(logits)>, split<1>>);
    auto loss = nn::cross_entropy(logits, y); // vocabulary parallel: partial
    static_assert(std::is_same_v<pin_t<decltype(loss)>, partial>);
    t.set_loss(loss);
    return t.take();
  };
  const auto free_graph = trace(false);
  const auto pinned_graph = trace(true);
  REQUIRE(free_graph.size() == pinned_graph.size());
  const auto free_plan = synth::synthesize(free_graph, c);
  const auto plan = synth::synthesize(pinned_graph, c);
  std::size_t pinned_nodes = 0;
  for (const auto& s : plan.steps) {
    if (const auto& pin = pinned_graph[s.node].pin) {
      CHECK(s.rule.out == *pin);
      ++pinned_nodes;
    }
    for (const auto& tr : s.transfers)
      if (const auto& pin = pinned_graph[tr.tensor].pin;
          pin && tr.kind == synth::transfer_kind::load)
        CHECK(tr.to == *pin);
  }
  CHECK(pinned_nodes == 3); // redistribute, fc2, the loss
  bool differs = false;
  for (std::size_t i = 0; i < plan.steps.size(); ++i)
    differs = differs || !(plan.steps[i].rule == free_plan.steps[i].rule);
  CHECK(differs);
  CHECK(plan.step_time >= free_plan.step_time); // the pinned space is a subset
}

TEST_CASE("pinned tensor-parallel weights plan with the simulator weighing candidates") {
  // Megatron's MLP pinned by hand: the first weight column-split, the second row-split. The
  // trainer's default weighs the final candidates by the simulated step, among them a data-
  // parallel program, which cannot give a split weight: that candidate is skipped, not an error.
  const cluster c = parse_cluster(R"({"version": 1, "name": "two", "links": {"intra_node":
      {"bandwidth": 1e9, "latency": 1e-6}}, "devices": [
      {"name": "a", "kind": "cpu", "speed": 2e10, "memory": "1 GiB"},
      {"name": "b", "kind": "cpu", "speed": 1e10, "memory": "1 GiB"}]})",
                                  "two");
  nn::tracer t(dtype::f32, 32);
  auto x = t.input<float, extents<batch, 64>>("x");
  auto y = t.input<std::int64_t, extents<batch>>("y");
  auto w1 = t.parameter<float, extents<64, 256>, split<1>>("fc1.weight", {}, {});
  auto w2 = t.parameter<float, extents<256, 8>, split<0>>("fc2.weight", {}, {});
  auto whole = nn::redistribute<replicated>(x);
  auto h = nn::relu(nn::matmul(whole, w1)); // column parallel: split<1>
  auto out = nn::matmul(h, w2);             // row parallel: partial
  t.set_loss(nn::cross_entropy(nn::redistribute<replicated>(out), y));
  const graph::graph g = t.take();
  synth::synth_options so;
  so.judge = sim::judge();
  synth::plan p;
  REQUIRE_NOTHROW(p = synth::synthesize(g, c, so));
  for (const auto& s : p.steps)
    if (const auto& pin = g[s.node].pin)
      CHECK(s.rule.out == *pin);
}

TEST_CASE("a search that fails because of pins names the pins and the fix") {
  const cluster c = parse_cluster(R"({"version": 1, "name": "two", "links": {"intra_node":
      {"bandwidth": 1e9, "latency": 1e-6}}, "devices": [
      {"name": "a", "kind": "gpu", "speed": 2e9, "memory": "1 GiB"},
      {"name": "b", "kind": "gpu", "speed": 1e9, "memory": "1 GiB"}]})");
  nn::tracer t(dtype::f32, 8);
  auto x = t.input<float, extents<hspmd::batch, 4>, split<0>>("x");
  auto y = t.input<std::int64_t, extents<hspmd::batch>>("y");
  auto whole = nn::redistribute<replicated>(x); // straight from the pinned input
  t.set_loss(nn::cross_entropy(nn::linear<float, 4, 3>{"fc"}(t, whole), y));
  const graph::graph g = t.take();
  CHECK_THROWS_WITH(synth::synthesize(g, c),
                    Catch::Contains("the search found no plan that keeps the model's pins: x "
                                    "split(0), redistribute") &&
                        Catch::Contains("replicated (a pinned input is only loaded in its pinned "
                                        "placement"));
}
