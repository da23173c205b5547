// Two-level plans (synth/hierarchical.hpp): the batch shared across nodes by speed and memory,
// one program in every node, the prediction's parts, and the refusals.
#include <hspmd/models/zoo.hpp>
#include <hspmd/synth/hierarchical.hpp>

#include "../../support/test_cluster.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

using namespace hspmd;

namespace {

// `per_node` devices in each node, node k's devices at speeds[k] flop/s and memory[k] bytes.
cluster nodes_of(std::size_t per_node, const std::vector<double>& speeds,
                 const std::vector<double>& memory, double inter_bandwidth = 1e9,
                 double inter_latency = 1e-5) {
  std::vector<double> s;
  for (double v : speeds)
    for (std::size_t i = 0; i < per_node; ++i)
      s.push_back(v);
  cluster c = test::make_cluster(s, 1e11, 1e12, 2e-6);
  for (std::size_t d = 0; d < c.size(); ++d) {
    c.devices[d].node = static_cast<std::int64_t>(d / per_node);
    c.devices[d].memory = static_cast<std::uint64_t>(memory[d / per_node]);
  }
  c.inter_node = link_spec{inter_bandwidth, inter_latency};
  return c;
}

models::model_options bert_small() {
  models::model_options o;
  o.layers = 2;
  o.hidden = 64;
  o.heads = 2;
  o.seq = 16;
  o.vocab = 500;
  return o;
}

const auto bert = [](std::size_t rows) {
  return models::trace_model<float>("bert", bert_small(), rows);
};

} // namespace

TEST_CASE("A two-level plan gives faster nodes more rows and runs one program in every node") {
  const cluster c = nodes_of(2, {4e9, 4e9, 1e9, 1e9}, {1e12, 1e12, 1e12, 1e12});
  const auto h = synth::synthesize_hierarchical(bert, 40, c);
  REQUIRE(h.nodes.size() == 4);
  CHECK(h.node_batch[0] + h.node_batch[1] + h.node_batch[2] + h.node_batch[3] == 40);
  CHECK(h.node_batch[0] > 2 * h.node_batch[2]); // 4x the speed: about 4x the rows
  CHECK(h.node_batch[0] == h.node_batch[1]);
  double slowest = 0.0;
  for (std::size_t k = 0; k < 4; ++k) {
    const synth::plan& p = h.node_plan(k);
    CHECK(p.steps.size() == h.node_plan(0).steps.size());
    for (std::size_t s = 0; s < p.steps.size(); ++s) { // the same program, rules and collectives
      CHECK(p.steps[s].rule == h.node_plan(0).steps[s].rule);
      CHECK(p.steps[s].transfers == h.node_plan(0).steps[s].transfers);
    }
    CHECK(p.device_names.size() == 2);
    slowest = std::max(slowest, p.step_time);
  }
  CHECK(h.inner_time == Approx(slowest));
  CHECK(h.step_time == Approx(h.inner_time + h.cross_time));
  CHECK(h.cross_time > 0.0);
  CHECK(h.hash() == synth::synthesize_hierarchical(bert, 40, c).hash()); // deterministic

  // one node program search (on the class with the most rows: the fast nodes'), run by all
  synth::hierarchical_options one;
  one.class_searches = 1;
  const auto h1 = synth::synthesize_hierarchical(bert, 40, c, one);
  CHECK(h1.node_batch[0] + h1.node_batch[1] + h1.node_batch[2] + h1.node_batch[3] == 40);
  CHECK(h1.node_plan(2).steps.size() == h1.node_plan(0).steps.size());
  CHECK(h1.step_time >= h.step_time * (1.0 - 1e-9)); // (never a program the full search lacks)
}

TEST_CASE("A two-level plan keeps every device within its memory, moving rows off small nodes") {
  // Node 0 is fastest but holds little: it gets fewer rows than its speed would give.
  const cluster roomy = nodes_of(2, {4e9, 1e9}, {1e12, 1e12});
  const auto free = synth::synthesize_hierarchical(bert, 40, roomy);
  const double need = *std::ranges::max_element(free.memory);
  const cluster tight = nodes_of(2, {4e9, 1e9}, {0.8 * need, 1e12});
  // Node 0's searches at its speed-proportional rows find nothing that fits and end at the
  // budget: a small one keeps the test short under the sanitizers.
  synth::hierarchical_options o;
  o.node_search_expansions = 3000;
  // Parameters whole and activations kept: sharded (FSDP) or recomputed, node 0 holds its
  // speed-proportional rows after all.
  o.inner.search.shard_parameters = synth::search_options::parameter_sharding::never;
  o.inner.search.recompute = synth::search_options::recomputation::never;
  const auto h = synth::synthesize_hierarchical(bert, 40, tight, o);
  CHECK(h.node_batch[0] < free.node_batch[0]);
  for (std::size_t d = 0; d < tight.size(); ++d)
    CHECK(h.memory[d] <= static_cast<double>(tight.devices[d].memory));
  CHECK(h.step_time > free.step_time);
}

TEST_CASE("Across many nodes, the two-level plan pays the inter-node latency per node") {
  // 16 nodes x 2: a flat ring all-reduce takes 2 x 31 inter-node latencies, the two-level one
  // 2 x 15 (the bandwidth terms are about equal: one ring per node link either way).
  const cluster c =
      nodes_of(2, std::vector<double>(16, 2e12), std::vector<double>(16, 1e12), 1e10, 1e-4);
  const std::size_t batch = 256;
  const auto h = synth::synthesize_hierarchical(bert, batch, c);
  const auto dp = synth::make_baseline(bert(batch), c, synth::baseline::dp_cp);
  INFO("two-level " << h.step_time << " s (" << h.strategy << "), DP-CP " << dp.step_time << " s");
  CHECK(h.step_time < 0.8 * dp.step_time);
}

TEST_CASE("Two-level plans are refused with the reason where they cannot apply") {
  CHECK_THROWS_WITH(synth::synthesize_hierarchical(bert, 8, test::make_cluster({1e9, 1e9})),
                    Catch::Contains("all devices are in one node"));
  cluster uneven = nodes_of(2, {1e9, 1e9}, {1e12, 1e12});
  uneven.devices.pop_back();
  CHECK_THROWS_WITH(synth::synthesize_hierarchical(bert, 8, uneven),
                    Catch::Contains("node 1 has 1 devices but node 0 has 2"));
  CHECK_THROWS_WITH(synth::synthesize_hierarchical(bert, 1, nodes_of(1, {1e9, 1e9}, {1e12, 1e12})),
                    Catch::Contains("at least one row per node"));
  hspmd::synth::hierarchical_options o;
  o.strategies = {"pipeline"};
  CHECK_THROWS_WITH(
      synth::synthesize_hierarchical(bert, 8, nodes_of(1, {1e9, 1e9}, {1e12, 1e12}), o),
      Catch::Contains("unknown inner strategy \"pipeline\""));
  // Too little memory anywhere: named, not a crash.
  CHECK_THROWS_WITH(synth::synthesize_hierarchical(bert, 8, nodes_of(2, {1e9, 1e9}, {1e5, 1e5})),
                    Catch::Contains("hierarchical plan of test"));
}
