// What-if questions (sim/what_if.hpp): the changes as a user writes them, what they do to a
// cluster, and the re-planned answer.
#include <hspmd/models/zoo.hpp>
#include <hspmd/sim/what_if.hpp>

#include "small_bert.hpp"

#include <catch2/catch.hpp>

#include <cstddef>
#include <string>
#include <vector>

using namespace hspmd;

namespace {

// Two nodes of two devices: big0, big1 (kind "A100-80GB") on node 0, small0, small1 ("T4") on 1.
cluster two_nodes() {
  return parse_cluster(R"({"version": 1, "name": "two-nodes",
    "links": {"intra_node": {"bandwidth": 1e11, "latency": 1e-6},
              "inter_node": {"bandwidth": 1e10, "latency": 5e-6}},
    "devices": [
      {"name": "big0", "kind": "A100-80GB", "speed": 4e12, "memory": "80 GiB", "node": 0},
      {"name": "big1", "kind": "A100-80GB", "speed": 4e12, "memory": "80 GiB", "node": 0},
      {"name": "small0", "kind": "T4", "speed": 1e12, "memory": "16 GiB", "node": 1},
      {"name": "small1", "kind": "T4", "speed": 1e12, "memory": "16 GiB", "node": 1}]})",
                       "two-nodes");
}

} // namespace

TEST_CASE("what-if changes read as written, and bad ones say what would be accepted") {
  using k = sim::cluster_change::kind;
  const sim::cluster_change add = sim::parse_change("add 2 x a100");
  CHECK(add.what == k::add);
  CHECK(add.count == 2);
  CHECK(add.device == "a100");
  CHECK(sim::parse_change("add 3x T4").count == 3);
  const sim::cluster_change node = sim::parse_change("remove node 1");
  CHECK(node.what == k::remove_node);
  CHECK(node.node == 1);
  CHECK(sim::parse_change("remove small1").what == k::remove_device);
  const sim::cluster_change slow = sim::parse_change("slow big0 x2.5");
  CHECK(slow.what == k::slow);
  CHECK(slow.device == "big0");
  CHECK(slow.factor == 2.5);
  CHECK(sim::parse_change("slow big0 x 0.5").factor == 0.5);
  for (const char* bad : {"", "add two x a100", "add 0 x a100", "remove node one", "slow big0",
                          "slow big0 x-1", "grow big0", "remove"})
    CHECK_THROWS_WITH(sim::parse_change(bad),
                      Catch::StartsWith("what-if \"" + std::string(bad) + "\": ") &&
                          Catch::Contains("\"slow gpu7 x2\""));
}

TEST_CASE("what-if changes to a cluster") {
  const cluster c = two_nodes();
  const cluster slower = sim::apply(c, sim::parse_change("slow big1 x2"));
  CHECK(slower.devices[1].speed == 2e12);
  CHECK(slower.devices[0].speed == 4e12);
  CHECK(slower.size() == 4);
  const cluster fewer = sim::apply(c, sim::parse_change("remove node 1"));
  REQUIRE(fewer.size() == 2);
  CHECK(fewer.devices[1].name == "big1");
  CHECK(sim::apply(c, sim::parse_change("remove small0")).devices[2].name == "small1");
  // Copies of the kind a word begins, on a new node (the cluster has links between nodes).
  const cluster more = sim::apply(c, sim::parse_change("add 2 x a100"));
  REQUIRE(more.size() == 6);
  CHECK(more.devices[4].kind == "A100-80GB");
  CHECK(more.devices[4].node == 2);
  CHECK(more.devices[5].name != more.devices[4].name);
  CHECK(more.name == "two-nodes-what-if");
  CHECK(more.devices[4].name == "A100-80GB-added4");
  // A second addition names its devices apart (and goes on another new node).
  const cluster again = sim::apply(more, sim::parse_change("add 1 x t4"));
  REQUIRE(again.size() == 7);
  CHECK(again.devices[6].name == "T4-added6");
  CHECK(again.devices[6].node == 3);
  CHECK(again.description == "two-nodes with add 2 x a100; add 1 x t4");
  CHECK_THROWS_WITH(sim::apply(c, sim::parse_change("slow gpu7 x2")),
                    "what-if \"slow gpu7 x2\": no device is named \"gpu7\" (name one of the "
                    "cluster's devices: big0, big1, small0, small1)");
  CHECK_THROWS_WITH(sim::apply(c, sim::parse_change("remove node 4")),
                    Catch::Contains("no device is on node 4 (nodes are 0 to 1)"));
  CHECK_THROWS_WITH(sim::apply(c, sim::parse_change("add 1 x h100")),
                    Catch::Contains("add copies of a kind the cluster has: A100-80GB, T4"));
  const cluster one = sim::apply(c, sim::parse_change("remove node 0"));
  CHECK_THROWS_WITH(sim::apply(sim::apply(one, sim::parse_change("remove small0")),
                               sim::parse_change("remove small1")),
                    Catch::Contains("leaves no device"));
}

TEST_CASE("a what-if answer plans again and, for the same devices, re-balances the old program") {
  const graph::graph g = test::small_bert(32);
  const cluster c = two_nodes();
  synth::synth_options o;
  o.search.max_expansions = 20000;
  const synth::plan before = synth::synthesize(g, c, o, "bert");

  const sim::what_if_answer slow =
      sim::what_if(g, c, sim::apply_all(c, {"slow big0 x4"}), o, "bert", before);
  REQUIRE(slow.rebalanced.has_value());
  CHECK(slow.after.step_time > before.step_time);
  // Re-planning is never worse than re-balancing the old program alone.
  CHECK(slow.after.step_time <= slow.rebalanced->step_time * (1.0 + 1e-9));
  // The slowed device gets a smaller share than its twin.
  CHECK(slow.rebalanced->ratios[0][0] < slow.rebalanced->ratios[0][1]);
  CHECK(slow.simulated_after.step_time > 0.0);

  const sim::what_if_answer gone =
      sim::what_if(g, c, sim::apply_all(c, {"remove node 0"}), o, "bert", before);
  CHECK_FALSE(gone.rebalanced.has_value());
  CHECK(gone.after.device_names == std::vector<std::string>{"small0", "small1"});
  CHECK(gone.after.step_time > before.step_time);
}
