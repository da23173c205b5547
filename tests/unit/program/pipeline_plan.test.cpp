// Pipeline plans (program/pipeline_plan.hpp): stages balanced on the groups' speeds, a plan per
// stage over its group's devices, the JSON round trip and its hash, the refusals of a damaged
// file, and the stage table `explain` prints.
#include <hspmd/models/bert.hpp>
#include <hspmd/program/pipeline_plan.hpp>
#include <hspmd/program/pipeline_search.hpp>

#include "../../support/test_cluster.hpp"
#include "../../support/tiny_bert.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace hspmd;

namespace {

program::pipeline_options plan_options(std::vector<std::size_t> groups) {
  program::pipeline_options o;
  o.group_sizes = std::move(groups);
  o.micro = 4;
  o.strategy = "dp-ev";
  o.model = "bert";
  return o;
}

} // namespace

TEST_CASE("pipeline plan: a faster group takes more blocks, each stage is planned over its group") {
  const graph::graph g = models::trace_bert_lm<float>(test::tiny_bert(6), 4);
  // group 0: one device; group 1: two devices, each as fast -> twice the speed, twice the layers
  const cluster c = test::make_cluster({1e9, 1e9, 1e9});
  program::pipeline_options speed_only = plan_options({1, 2});
  speed_only.refine = 0; // cut on the groups' summed speeds alone
  const program::pipeline_plan first = program::make_pipeline_plan(g, c, speed_only);
  CHECK(first.first_blocks == std::vector<std::size_t>{0, 2});
  // cut again on the speeds the stage plans reach: never a slower simulated step, and the
  // faster group still takes at least half of the 6 blocks
  const program::pipeline_plan p = program::make_pipeline_plan(g, c, plan_options({1, 2}));
  REQUIRE(p.stages.size() == 2);
  const auto step = [&](const program::pipeline_plan& x) {
    return program::simulate(x.make(), program::predicted_costs(x, g, c)).step;
  };
  CAPTURE(p.first_blocks, step(first), step(p));
  CHECK(step(p) <= step(first));
  CHECK(p.first_blocks[1] <= 3); // (its share of the head counted)
  CHECK(p.stages[0].device_names == std::vector<std::string>{"d0"});
  CHECK(p.stages[1].device_names == std::vector<std::string>{"d1", "d2"});
  CHECK(p.group_of(0) == 0);
  CHECK(p.group_of(2) == 1);
  CHECK_THROWS_AS(p.group_of(3), config_error);
  CHECK(p.first_rank(1) == 1);

  // interleaved: 2 chunks a group, stages round the groups
  program::pipeline_options o = plan_options({1, 1, 1});
  o.schedule = program::schedule_kind::interleaved;
  o.micro = 6;
  o.chunks = 2;
  const program::pipeline_plan q = program::make_pipeline_plan(g, c, o);
  REQUIRE(q.stages.size() == 6);
  for (std::size_t k = 0; k < 6; ++k)
    CHECK(q.stages[k].device_names == std::vector<std::string>{"d" + std::to_string(k % 3)});

  CHECK_THROWS_AS(program::make_pipeline_plan(g, c, plan_options({1, 1})), config_error);
  CHECK_THROWS_AS(program::make_pipeline_plan(g, c, plan_options({1, 0, 2})), config_error);
  program::pipeline_options bad = plan_options({1, 2});
  bad.strategy = "fastest";
  CHECK_THROWS_AS(program::make_pipeline_plan(g, c, bad), config_error);
  bad = plan_options({1, 2});
  bad.first_blocks = {0, 3, 4};
  CHECK_THROWS_AS(program::make_pipeline_plan(g, c, bad), config_error);
}

TEST_CASE("pipeline plan: the JSON round trip keeps the plan and its hash, damage is named") {
  const graph::graph g = models::trace_bert_lm<float>(test::tiny_bert(4), 2);
  const cluster c = test::make_cluster({2e9, 1e9, 1e9});
  program::pipeline_options o = plan_options({1, 2});
  o.strategy = "synth";
  o.schedule = program::schedule_kind::zero_bubble;
  const program::pipeline_plan p = program::make_pipeline_plan(g, c, o);
  const nlohmann::json j = program::to_json(p);
  const program::pipeline_plan back = program::pipeline_plan_from_json(j, g, "p.json");
  CHECK(back.hash() == p.hash());
  CHECK(program::to_json(back, false) == program::to_json(p, false));
  CHECK(back.schedule == program::schedule_kind::zero_bubble);

  program::pipeline_plan other = p;
  other.micro = 8;
  CHECK(other.hash() != p.hash());

  const auto refused = [&](const nlohmann::json& damaged, const std::string& field) {
    try {
      (void)program::pipeline_plan_from_json(damaged, g, "p.json");
      FAIL("accepted a plan with a damaged " << field);
    } catch (const config_error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(what.find("p.json") != std::string::npos);
      CHECK(what.find(field) != std::string::npos);
    }
  };
  nlohmann::json d = j;
  d["kind"] = "spmd";
  refused(d, "kind");
  d = j;
  d["micro"] = 0;
  refused(d, "micro");
  d = j;
  d["first_blocks"] = {0};
  refused(d, "first_blocks");
  d = j;
  d["stages"].erase(1);
  refused(d, "stages");
  d = j;
  d["group_sizes"] = {1, 1}; // stage 1's plan is for two devices
  refused(d, "stages");
  d = j;
  d["schedule"] = "fastest";
  CHECK_THROWS_AS(program::pipeline_plan_from_json(d, g, "p.json"), config_error);
}

TEST_CASE("pipeline plan: explain prints a row per stage, what each holds in flight and the "
          "simulated step") {
  const graph::graph g = models::trace_bert_lm<float>(test::tiny_bert(4), 2);
  const cluster c = test::make_cluster({1e9, 1e9, 1e9});
  program::pipeline_options o = plan_options({1, 2});
  o.micro = 6;
  const program::pipeline_plan p = program::make_pipeline_plan(g, c, o);
  const std::string text = program::explain(p, g, c);
  CAPTURE(text);
  CHECK(text.find("2 stages on 2 groups (3 devices), schedule 1f1b, 6 micro-batches") !=
        std::string::npos);
  CHECK(text.find("d1,d2") != std::string::npos);
  CHECK(text.find(" 0.5 ") != std::string::npos); // dp-ev: even shares in the group
  CHECK(text.find("predicted step") != std::string::npos);
  // 1F1B: stage 0 holds p = 2 micro-batches, stage 1 one
  CHECK(text.find(" 2         1 ") != std::string::npos);
  CHECK(text.find(" 1         0.5 ") != std::string::npos);
  const program::pipeline_timeline t = program::simulate(p.make(), program::predicted_costs(p));
  CHECK(t.step > 0.0);
  CHECK(t.bubble > 0.0);
  CHECK(t.bubble < 1.0);
  // priced on the cluster: stage 0 sends stage 1 its values (f32) over the link, whole
  const program::stage_costs priced = program::predicted_costs(p, g, c);
  double bytes = 0.0;
  for (const auto& [local, global] : graph::extract_stage(g, p.cuts(g), 1).received)
    bytes += 4.0 * static_cast<double>(g[global].out.size());
  REQUIRE(bytes > 0.0);
  CHECK(priced.transfer == Approx(c.intra_node.latency + bytes / c.intra_node.bandwidth));
  // stage 1's group of two all-reduces its gradients once a step, after its last pass, not once
  // a micro-batch; stage 0's group of one has none
  REQUIRE(priced.stage_sync.size() == 2);
  CHECK(priced.stage_sync[0] == 0.0);
  CHECK(priced.stage_sync[1] > 0.0);
  program::stage_costs unsynced = priced;
  unsynced.stage_sync.clear();
  const double with_sync = program::simulate(p.make(), priced).step;
  const double unsynced_step = program::simulate(p.make(), unsynced).step;
  CHECK(with_sync > unsynced_step); // (device 1 ends first: what stays is what passes device 0)
  CHECK(with_sync <= unsynced_step + priced.stage_sync[1] * (1.0 + 1e-9));
  program::stage_costs unsent = priced;
  unsent.transfer = 0.0;
  CHECK(with_sync > program::simulate(p.make(), unsent).step);
  CHECK(text.find("boundary send") != std::string::npos);
  CHECK(text.find("stage balance: group 1's stages take") != std::string::npos);
  // (p - 1) / (m + p - 1) = 1 / 7
  CHECK(text.find("the schedule's ideal with equal stages: 14.3 %") != std::string::npos);
}

TEST_CASE("pipeline plan: stage 0 holds p micro-batches' activations under 1F1B at any m, GPipe "
          "m, a device too small for the schedule recomputes, or is refused, named") {
  const graph::graph g = models::trace_bert_lm<float>(test::tiny_bert(4), 2);
  cluster c = test::make_cluster({1e9, 1e9});
  using recomputation = synth::search_options::recomputation;
  const auto plan = [&](program::schedule_kind s, std::size_t m,
                        recomputation r = recomputation::when_needed) {
    program::pipeline_options o = plan_options({1, 1});
    o.schedule = s;
    o.micro = m;
    o.synth.search.recompute = r;
    return program::make_pipeline_plan(g, c, o);
  };
  double first_1f1b = 0.0, last_gpipe = 0.0;
  for (const std::size_t m : {std::size_t{2}, std::size_t{4}, std::size_t{8}}) {
    const program::pipeline_plan one = plan(program::schedule_kind::one_f_one_b, m);
    const program::pipeline_plan all = plan(program::schedule_kind::gpipe, m);
    const program::pipeline_memory a = program::memory_of(one, g, c);
    const program::pipeline_memory b = program::memory_of(all, g, c);
    const double act = a.activations[0][0], plan_memory = one.stages[0].memory[0];
    CAPTURE(m, act, plan_memory, a.peak[0][0], b.peak[0][0]);
    REQUIRE(act > 0.0);
    CHECK(act < plan_memory); // (the plan's memory adds parameters and their state)
    CHECK(b.activations[0][0] == Approx(act));
    CHECK(a.in_flight == std::vector<std::size_t>{2, 1});
    CHECK(b.in_flight == std::vector<std::size_t>{m, m});
    CHECK(a.peak[0][0] == Approx(plan_memory + act)); // p = 2 in flight
    CHECK(b.peak[0][0] == Approx(plan_memory + static_cast<double>(m - 1) * act));
    CHECK(a.device[0][0] == Approx(a.peak[0][0])); // one chunk a group
    if (m == 2)
      first_1f1b = a.peak[0][0];
    CHECK(a.peak[0][0] == Approx(first_1f1b)); // 1F1B: the same at every m
    CHECK(b.peak[0][0] > last_gpipe);          // GPipe: grows with m
    last_gpipe = b.peak[0][0];
  }
  // a device that holds 1F1B's peak at m = 8 but not GPipe's: 1F1B as before; GPipe's stages
  // planned again recomputing their blocks (they fit), or refused where that is not allowed
  c.devices[0].memory = static_cast<std::uint64_t>((first_1f1b + last_gpipe) / 2.0);
  CHECK(!plan(program::schedule_kind::one_f_one_b, 8).stages[0].recompute);
  const program::pipeline_plan again = plan(program::schedule_kind::gpipe, 8);
  CHECK(again.stages[0].recompute);
  CHECK(program::memory_of(again, g, c).device[0][0] <= static_cast<double>(c.devices[0].memory));
  CHECK_THROWS_WITH(plan(program::schedule_kind::gpipe, 8, recomputation::never),
                    Catch::Contains("device d0") && Catch::Contains("under gpipe") &&
                        Catch::Contains("holds 8 micro-batches") &&
                        Catch::Contains("1f1b holds at most p"));
}

TEST_CASE("pipeline depth: every power of two the devices split into is planned or refused with "
          "its reason, and the fastest planned one is chosen") {
  const cluster c = test::make_cluster({3e9, 3e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9});
  const auto at = [](std::size_t rows) {
    return models::trace_bert_lm<float>(test::tiny_bert(4), rows);
  };
  program::pipeline_options o = plan_options({});
  const program::pipeline_choice ch = program::choose_pipeline(at, 32, c, o);
  REQUIRE(ch.tried.size() == 3); // 2, 4 and 8 groups
  REQUIRE(ch.best);
  for (std::size_t k = 0; k < ch.tried.size(); ++k) {
    const program::pipeline_candidate& x = ch.tried[k];
    CAPTURE(x.stages, x.micro, x.refused);
    CHECK(x.stages == std::size_t{2} << k);
    CHECK(32 % x.micro == 0);
    CHECK(x.micro >= x.stages);
    if (x.stages == 8) { // 4 blocks
      CHECK(!x.plan);
      CHECK_THAT(x.refused, Catch::Contains("fewer blocks than 8 stages"));
      continue;
    }
    REQUIRE(x.plan);
    CHECK(x.plan->group_sizes == std::vector<std::size_t>(x.stages, 8 / x.stages));
    CHECK(x.step >= ch.tried[*ch.best].step);
  }
}
