// Activation recomputation in the planner: which values a block does not keep (the executor's
// rule, graph/blocks.hpp), what that saves and costs in the plan's memory and step time, and
// synthesis choosing it only when nothing fits without it.
#include <hspmd/graph/blocks.hpp>
#include <hspmd/models/zoo.hpp>
#include <hspmd/synth/plan_cache.hpp>
#include <hspmd/synth/synthesize.hpp>

#include "../../support/test_cluster.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

using namespace hspmd;
using namespace hspmd::synth;

namespace {

graph::graph small_llama(std::size_t layers, std::size_t batch) {
  models::model_options o;
  o.layers = layers;
  o.hidden = 64;
  o.heads = 2;
  o.seq = 32;
  o.vocab = 100;
  return models::trace_model<float>("llama", o, batch);
}

double peak(const plan& p) {
  return *std::max_element(p.memory.begin(), p.memory.end());
}

// Data parallel with parameters whole: recomputation is the only way to save memory. (A small
// budget: a search that finds nothing within memory spends all of it; under the sanitizers the
// default took a minute.)
synth_options data_parallel_only(const graph::graph& g) {
  synth_options o;
  o.search.max_expansions = 4000;
  o.search.shard_parameters = search_options::parameter_sharding::never;
  o.search.allow_rule = [&g](graph::node_id id, const graph::rule& r) {
    for (std::size_t k = 0; k < r.arity; ++k)
      if (g[g[id].inputs[k]].kind == graph::op::parameter && !r.in[k].is_replicated())
        return false;
    return r.kind != graph::rule::family::linear;
  };
  return o;
}

} // namespace

TEST_CASE("a block's recomputed values are the ones only the block reads") {
  const graph::graph g = small_llama(3, 4);
  const graph::block_layout b = graph::layout_blocks(g, graph::block_ranges(g));
  REQUIRE(b.ranges.size() == 3);
  std::size_t recomputed = 0;
  for (graph::node_id i = 0; i < g.size(); ++i) {
    if (!b.recomputed[i])
      continue;
    ++recomputed;
    CAPTURE(g[i].name);
    CHECK(b.block_of[i] != graph::block_layout::none);
    CHECK(g[i].kind != graph::op::parameter);
    CHECK(g[i].kind != graph::op::input);
    CHECK(g.loss() != i);
  }
  CHECK(recomputed > 10 * b.ranges.size());
  // Every reader of a recomputed value (or of a view of it) lies in its block; each block's
  // output, read by the next block or the head, is kept.
  for (graph::node_id j = 0; j < g.size(); ++j)
    for (graph::node_id in : g[j].inputs) {
      graph::node_id src = in;
      while (graph::is_view(g, g[src]))
        src = g[src].inputs[0];
      if (b.recomputed[src]) {
        CAPTURE(g[src].name, g[j].name);
        CHECK(b.block_of[j] == b.block_of[src]);
      }
    }
  for (const auto& [first, last] : b.ranges) {
    bool kept_output = false;
    for (graph::node_id i = first; i <= last; ++i)
      kept_output = kept_output || (!b.recomputed[i] && g[i].kind != graph::op::parameter &&
                                    b.readers_in[i] != b.block_of[i]);
    CHECK(kept_output);
  }
}

TEST_CASE("recomputation prices one block's values at a time and each inner op's forward twice") {
  const graph::graph g = small_llama(4, 8);
  const cluster c = test::make_cluster({2e12, 1e12}, 1e10);
  synth_options o = data_parallel_only(g);
  o.search.allow_sfb = false; // (SFB keeps its layer's input)
  o.search.recompute = search_options::recomputation::never;
  plan keep = synthesize(g, c, o, "llama");
  CHECK_FALSE(keep.recompute);
  const cost_model m(g, c, segment_map(g, keep.segments));
  evaluate(keep, m, keep.ratios); // (memory at the continuous shares, as `again`'s)
  plan again = keep;
  again.recompute = true;
  evaluate(again, m, keep.ratios);
  // Time: each recomputed op's forward share once more (the program moves nothing here that a
  // replay would move again: data parallel on two devices keeps the blocks local).
  double replay = 0.0;
  for (const plan_step& s : keep.steps)
    if (m.recomputed_block(s.node) != cost_model::none)
      replay += forward_share * m.compute_max(s.node, s.rule, keep.ratios);
  CHECK(replay > 0.0);
  CHECK(again.compute_time == Approx(keep.compute_time + replay).epsilon(1e-9));
  CHECK(again.comm_time >= keep.comm_time);
  // Memory: every block's recomputed outputs go, the largest block's come back once.
  for (std::size_t d = 0; d < c.size(); ++d) {
    std::vector<double> per_block(4, 0.0);
    for (const plan_step& s : keep.steps)
      if (const std::size_t b = m.recomputed_block(s.node);
          b != cost_model::none && !graph::is_view(g, g[s.node]))
        per_block.at(b) += value_at(m.memory_of(s.node, s.rule.out), keep.ratios, d);
    double all = 0.0;
    for (double x : per_block)
      all += x;
    const double largest = *std::max_element(per_block.begin(), per_block.end());
    CAPTURE(d, all, largest);
    CHECK(largest > 0.0);
    CHECK(again.memory[d] == Approx(keep.memory[d] - all + largest).epsilon(1e-9));
    CHECK(again.memory[d] < keep.memory[d] - 2.0 * largest);
  }
  // The plan carries it: JSON, hash and explanation.
  CHECK(again.hash() != keep.hash());
  const plan read = plan_from_json(to_json(again), g, "plan.json");
  CHECK(read.recompute);
  CHECK(read.hash() == again.hash());
  CHECK_FALSE(plan_from_json(to_json(keep), g, "plan.json").recompute);
  CHECK_FALSE(to_json(keep).contains("recompute")); // plans without it hash as before
  CHECK_THAT(explain(again, m), Catch::Contains("activations recomputed"));
  nlohmann::json bad = to_json(again);
  bad["recompute"] = "yes";
  CHECK_THROWS_WITH(plan_from_json(bad, g, "plan.json"),
                    Catch::Contains("recompute") && Catch::Contains("true or false"));
}

TEST_CASE("synthesis recomputes activations only when nothing fits without it") {
  const graph::graph g = small_llama(4, 8);
  const cluster roomy = test::make_cluster({2e12, 1e12}, 1e10);
  synth_options o = data_parallel_only(g);
  const plan free_plan = synthesize(g, roomy, o, "llama");
  CHECK_FALSE(free_plan.recompute);
  o.search.recompute = search_options::recomputation::always;
  const plan forced = synthesize(g, roomy, o, "llama");
  CHECK(forced.recompute);
  CHECK(forced.step_time > free_plan.step_time);
  CHECK(peak(forced) < 0.8 * peak(free_plan));
  // Devices between the two: only the recomputing plan fits.
  const double cap = std::floor(0.5 * (peak(forced) + peak(free_plan)));
  const cluster tight = test::make_cluster({2e12, 1e12}, 1e10, cap);
  o.search.recompute = search_options::recomputation::never;
  CHECK_THROWS_WITH(synthesize(g, tight, o, "llama"), Catch::Contains("no plan fits in memory"));
  o.search.recompute = search_options::recomputation::when_needed;
  const plan fitted = synthesize(g, tight, o, "llama");
  CHECK(fitted.recompute);
  for (double b : fitted.memory)
    CHECK(b <= cap);
  // The baselines too.
  const plan dp = make_baseline(g, tight, baseline::dp_cp, o, "llama");
  CHECK(dp.recompute);
  for (double b : dp.memory)
    CHECK(b <= cap);
  // A model without blocks has nothing to recompute: the search says what does not fit.
  models::model_options mo;
  mo.layers = 2;
  mo.hidden = 512;
  const graph::graph mlp = models::trace_model<float>("mlp", mo, 64);
  if (graph::block_ranges(mlp).empty()) {
    const cluster one_byte = test::make_cluster({1e12, 1e12}, 1e10, 1e3);
    CHECK_THROWS_WITH(synthesize(mlp, one_byte), Catch::Contains("no plan fits in memory"));
  }
}

TEST_CASE("cached plans are keyed by the recomputation option") {
  synth_options a;
  synth_options b = a;
  b.search.recompute = search_options::recomputation::always;
  const graph::graph g = small_llama(1, 2);
  const cluster c = test::make_cluster({1e12, 1e12});
  CHECK(plan_shape_key(g, c, a, "llama") != plan_shape_key(g, c, b, "llama"));
  b = a;
  b.search.shard_parameters = search_options::parameter_sharding::always;
  CHECK(plan_shape_key(g, c, a, "llama") != plan_shape_key(g, c, b, "llama"));
}
