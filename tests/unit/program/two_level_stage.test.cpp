// Two-level pipeline stages (program/two_level_stage.hpp): a stage on a group of whole nodes runs
// a program inside each node on the node's rows of the micro-batch, its gradients all-reduced
// across the nodes once a step; priced, checked for memory, simulated node by node, written and
// read as JSON, refused by a reader that cannot trace it; and chosen over one program across the
// nodes where that one would gather sharded parameters over slow links every micro-batch.
#include <hspmd/models/zoo.hpp>
#include <hspmd/program/pipeline_plan.hpp>
#include <hspmd/program/pipeline_search.hpp>
#include <hspmd/program/pipeline_svg.hpp>
#include <hspmd/sim/pipeline.hpp>

#include "../../support/test_cluster.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

using namespace hspmd;

namespace {

// `nodes` nodes of `per_node` devices (1e9 flop/s, `memory` bytes each), 1e11 B/s inside a
// node, `inter` B/s between nodes.
cluster nodes_of(std::size_t nodes, std::size_t per_node, double memory, double inter) {
  cluster c = test::make_cluster(std::vector<double>(nodes * per_node, 1e9), 1e11, memory, 2e-6);
  for (std::size_t d = 0; d < c.size(); ++d)
    c.devices[d].node = static_cast<std::int64_t>(d / per_node);
  c.inter_node = link_spec{inter, 1e-5};
  return c;
}

models::model_options small_bert() {
  models::model_options o;
  o.layers = 4;
  o.hidden = 64;
  o.heads = 2;
  o.seq = 16;
  o.vocab = 500;
  return o;
}

graph::graph bert(std::size_t rows) {
  return models::trace_model<float>("bert", small_bert(), rows);
}

program::pipeline_options two_level_options(std::vector<std::size_t> groups, std::size_t micro,
                                            std::size_t rows) {
  program::pipeline_options o;
  o.group_sizes = std::move(groups);
  o.micro = micro;
  o.model = "bert";
  o.two_level = true;
  o.trace = bert;
  o.rows = rows;
  return o;
}

} // namespace

TEST_CASE("A pipeline stage on whole nodes runs a two-level program, priced, drawn and written") {
  const cluster c = nodes_of(4, 2, 1e12, 1e9);
  const graph::graph g = bert(8);
  const program::pipeline_plan p =
      program::make_pipeline_plan(g, c, two_level_options({4, 4}, 4, 8));
  REQUIRE(p.stages.size() == 2);
  REQUIRE(p.has_two_level());
  const program::pipeline_memory mem = program::memory_of(p, g, c);
  const program::stage_costs costs = program::predicted_costs(p, g, c);
  for (std::size_t k = 0; k < 2; ++k) {
    const program::two_level_stage* t = p.two_level_at(k);
    REQUIRE(t != nullptr);
    CAPTURE(k, t->plan.node_batch, t->passes, t->sync, t->plan.cross_time);
    REQUIRE(t->plan.nodes.size() == 2);
    CHECK(t->plan.node_batch[0] + t->plan.node_batch[1] == 8);
    double rows = 0.0;
    for (std::size_t x = 0; x < 4; ++x)
      rows += t->row_share(x);
    CHECK(rows == Approx(1.0));
    CHECK(t->plan.cross_time > 0.0);
    CHECK(t->sync >= t->plan.cross_time); // (the nodes' own syncs and the one across them)
    CHECK(t->passes > 0.0);
    // the stage's program as the pipeline sees it: its passes, its once-a-step sync, its peak
    CHECK(costs.stage_forward[k] + costs.stage_backward[k] == Approx(t->passes));
    CHECK(costs.stage_sync[k] == Approx(t->sync));
    CHECK(mem.peak[k] == t->peak);
    CHECK(mem.in_flight[k] == t->in_flight);
    for (double b : t->peak)
      CHECK((b > 0.0 && b <= 1e12));
    // a node's program is over a node's two devices (a program two nodes share names the
    // first's), named as the cluster names them
    CHECK(t->plan.node_plan(1).device_names ==
          std::vector<std::string>{c.devices[4 * k].name, c.devices[4 * k + 1].name});
  }
  // 1F1B: stage 0 holds two micro-batches at once, stage 1 one
  CHECK(p.two_level_at(0)->in_flight == 2);
  CHECK(p.two_level_at(1)->in_flight == 1);

  // simulated node by node with the model's trace; without it, as priced
  const program::stage_costs sim = sim::pipeline_costs(p, g, c, bert);
  const program::stage_costs as_priced = sim::pipeline_costs(p, g, c);
  for (std::size_t k = 0; k < 2; ++k) {
    CHECK(sim.stage_forward[k] > 0.0);
    CHECK(sim.stage_sync[k] >= p.two_level_at(k)->plan.cross_time);
    CHECK(as_priced.stage_sync[k] == Approx(costs.stage_sync[k]));
  }

  const std::string text = program::explain(p, g, c);
  CHECK_THAT(text, Catch::Contains("2L ") && Catch::Contains("two-level stage"));
  CHECK_THAT(program::layout_svg(p, g, c), Catch::Contains("(two-level)"));

  // JSON: read back with the trace, the same plan; a reader without it (the trainer) refuses it
  const nlohmann::json j = program::to_json(p);
  const program::pipeline_plan back = program::pipeline_plan_from_json(j, g, "p.json", bert);
  CHECK(back.hash() == p.hash());
  REQUIRE(back.two_level_at(1) != nullptr);
  CHECK(back.two_level_at(1)->plan.node_batch == p.two_level_at(1)->plan.node_batch);
  CHECK(program::memory_of(back, g, c).peak == mem.peak);
  CHECK_THROWS_WITH(program::pipeline_plan_from_json(j, g, "p.json"),
                    Catch::Contains("p.json") && Catch::Contains("stage 0 runs a two-level") &&
                        Catch::Contains("--stage-programs one-level"));
  nlohmann::json bad = j;
  bad["stages"][1]["two_level"]["nodes"] = {{0, 1}, {2}};
  CHECK_THROWS_WITH(program::pipeline_plan_from_json(bad, g, "p.json", bert),
                    Catch::Contains("two_level.nodes"));

  // a group inside one node runs one program over its devices, whatever the option says
  const program::pipeline_plan inside =
      program::make_pipeline_plan(g, c, two_level_options({2, 2, 4}, 6, 8));
  CHECK(inside.two_level_at(0) == nullptr);
  CHECK(inside.two_level_at(1) == nullptr);
  CHECK(inside.two_level_at(2) != nullptr);
  // asked for without the trace: said
  program::pipeline_options untraced = two_level_options({4, 4}, 4, 8);
  untraced.trace = nullptr;
  CHECK_THROWS_WITH(program::make_pipeline_plan(g, c, untraced), Catch::Contains("trace"));
}

TEST_CASE("Over slow links between nodes, a stage that must shard its parameters is faster "
          "two-level, and the search picks it") {
  // Memory that holds a stage's parameters and optimizer state sharded over a node's two
  // devices but not replicated on each: one program over a group of two nodes shards them
  // over all four devices and gathers them over the slow link every micro-batch.
  const graph::graph g = bert(8);
  const cluster roomy = nodes_of(4, 2, 1e12, 1e8);
  program::pipeline_options one = two_level_options({4, 4}, 4, 8);
  one.two_level = false;
  one.first_blocks = {0, 2};
  one.strategy = "dp-ev";
  const program::pipeline_plan replicated = program::make_pipeline_plan(g, roomy, one);
  const double need = *std::ranges::max_element(program::memory_of(replicated, g, roomy).peak[0]);
  const cluster c = nodes_of(4, 2, std::floor(0.7 * need), 1e8);

  one.strategy = "synth";
  const program::pipeline_plan across = program::make_pipeline_plan(g, c, one);
  program::pipeline_options two = two_level_options({4, 4}, 4, 8);
  two.first_blocks = {0, 2};
  const program::pipeline_plan nodes = program::make_pipeline_plan(g, c, two);
  REQUIRE(nodes.has_two_level());
  CHECK_NOTHROW(program::check_memory(nodes, g, c));
  const auto step = [&](const program::pipeline_plan& x) {
    return program::simulate(x.make(), program::predicted_costs(x, g, c)).step;
  };
  CAPTURE(need, step(across), step(nodes));
  CHECK(step(nodes) < step(across));

  // the search: with two-level stages allowed it tries them beside one program a group, with
  // micro-batches of a row per node at least, and picks the fastest
  program::pipeline_options so;
  so.model = "bert";
  so.two_level = true;
  so.threads = 1;
  const program::pipeline_choice ch = program::choose_pipeline(bert, 32, c, so);
  REQUIRE(ch.best);
  bool tried_two_level = false;
  for (const program::pipeline_candidate& k : ch.tried) {
    if (!k.two_level)
      continue;
    tried_two_level = true;
    CHECK(k.groups != program::grouping::pipeline_only);
    CHECK(32 / k.micro >= 2); // (a group spans two nodes or more)
    if (k.plan)
      CHECK(k.simulated >= ch.tried[*ch.best].simulated);
  }
  CHECK(tried_two_level);
  CHECK(ch.tried[*ch.best].two_level);
  // the same pick and plan on three threads (node programs shared between candidates)
  so.threads = 3;
  const program::pipeline_choice three = program::choose_pipeline(bert, 32, c, so);
  REQUIRE(three.best);
  CHECK(*three.best == *ch.best);
  CHECK(three.tried[*three.best].plan->hash() == ch.tried[*ch.best].plan->hash());
}
