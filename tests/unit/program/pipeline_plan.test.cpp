// Pipeline plans (program/pipeline_plan.hpp): stages balanced on the groups' speeds, a plan per
// stage over its group's devices, the JSON round trip and its hash, the refusals of a damaged
// file, the stage table `explain` prints, and two-level stages.
#include <hspmd/models/bert.hpp>
#include <hspmd/models/llama.hpp>
#include <hspmd/models/zoo.hpp>
#include <hspmd/program/pipeline_plan.hpp>
#include <hspmd/program/pipeline_search.hpp>
#include <hspmd/program/pipeline_svg.hpp>
#include <hspmd/sim/pipeline.hpp>

#include "../../support/test_cluster.hpp"
#include "../../support/tiny_bert.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
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
  // the stage layout: a box per stage, the kinds of each group, well-formed text
  const std::string svg = program::layout_svg(p, g, c);
  std::size_t boxes = 0;
  for (std::size_t at = svg.find("class=\"stage\""); at != std::string::npos;
       at = svg.find("class=\"stage\"", at + 1))
    ++boxes;
  CHECK(boxes == 2);
  CHECK(svg.find("stage 1: blocks 1-3 on group 1") != std::string::npos);
  CHECK(svg.find("2 x test") != std::string::npos);
  CHECK(svg.rfind("</svg>") != std::string::npos);
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
  // a stage plan's memory for one micro-batch (its plan counts its micro-batches in flight)
  const auto one_micro_batch = [&](const program::pipeline_plan& x) {
    const graph::stage_graph sg = graph::extract_stage(g, x.cuts(g), 0);
    const cluster group = program::sub_cluster(c, 0, 1);
    const synth::cost_model m(sg.g, group, synth::segment_map(sg.g, x.stages[0].segments));
    synth::plan q = x.stages[0];
    synth::evaluate(q, m, q.ratios);
    return q.memory[0];
  };
  double first_1f1b = 0.0, last_gpipe = 0.0;
  for (const std::size_t m : {std::size_t{2}, std::size_t{4}, std::size_t{8}}) {
    const program::pipeline_plan one = plan(program::schedule_kind::one_f_one_b, m);
    const program::pipeline_plan all = plan(program::schedule_kind::gpipe, m);
    const program::pipeline_memory a = program::memory_of(one, g, c);
    const program::pipeline_memory b = program::memory_of(all, g, c);
    const double act = a.activations[0][0], plan_memory = one_micro_batch(one);
    CAPTURE(m, act, plan_memory, a.peak[0][0], b.peak[0][0]);
    REQUIRE(act > 0.0);
    CHECK(act < plan_memory); // (the plan's memory adds parameters and their state)
    CHECK(b.activations[0][0] == Approx(act));
    CHECK(a.in_flight == std::vector<std::size_t>{2, 1});
    CHECK(b.in_flight == std::vector<std::size_t>{m, m});
    CHECK(a.peak[0][0] == Approx(plan_memory + act)); // p = 2 in flight
    CHECK(b.peak[0][0] == Approx(plan_memory + static_cast<double>(m - 1) * act));
    CHECK(a.device[0][0] == Approx(a.peak[0][0])); // one chunk a group
    // the synthesizer planned each stage counting its micro-batches in flight
    CHECK(one.stages[0].memory[0] == Approx(a.peak[0][0]));
    CHECK(all.stages[0].memory[0] == Approx(b.peak[0][0]));
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

TEST_CASE("pipeline search: every depth grouped equally and by speed is planned or refused with "
          "its reason, and the fastest planned one is chosen") {
  const cluster c = test::make_cluster({3e9, 3e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9});
  const auto at = [](std::size_t rows) {
    return models::trace_bert_lm<float>(test::tiny_bert(4), rows);
  };
  CHECK(program::speed_groups(c, 2) == std::vector<std::size_t>{2, 6});
  CHECK(program::speed_groups(c, 4) == std::vector<std::size_t>{1, 1, 3, 3});
  CHECK(program::speed_groups(c, 8) == std::vector<std::size_t>(8, 1));
  CHECK(program::speed_groups(c, 16).empty());
  program::pipeline_options o = plan_options({});
  const program::pipeline_choice ch = program::choose_pipeline(at, 32, c, o);
  // 2 and 4 groups, equal and by speed; 8 groups of one device (by speed the same)
  REQUIRE(ch.tried.size() == 5);
  REQUIRE(ch.best);
  const std::vector<std::vector<std::size_t>> sizes{
      {4, 4}, {2, 6}, {2, 2, 2, 2}, {1, 1, 3, 3}, std::vector<std::size_t>(8, 1)};
  for (std::size_t k = 0; k < ch.tried.size(); ++k) {
    const program::pipeline_candidate& x = ch.tried[k];
    CAPTURE(k, x.stages, x.micro, x.refused);
    CHECK(x.group_sizes == sizes[k]);
    CHECK(x.groups == (k % 2 == 1 ? program::grouping::speed : program::grouping::equal));
    CHECK(32 % x.micro == 0);
    CHECK(x.micro >= x.stages);
    CHECK(32 / x.micro >= *std::ranges::max_element(x.group_sizes)); // rows cover a group
    if (x.stages == 8) {                                             // 4 blocks
      CHECK(!x.plan);
      CHECK_THAT(x.refused, Catch::Contains("fewer blocks than 8 stages"));
      continue;
    }
    REQUIRE(x.plan);
    CHECK(x.plan->group_sizes == sizes[k]);
    CHECK(x.imbalance >= 1.0);
    CHECK(x.step >= ch.tried[*ch.best].step);
  }
  // with the synthesizer inside, the pipeline-only baseline (equal groups, even cuts, DP-EV)
  // is tried beside at each depth and never chosen
  o.strategy = "synth";
  const program::pipeline_choice with = program::choose_pipeline(at, 32, c, o);
  std::size_t baselines = 0;
  for (const program::pipeline_candidate& x : with.tried)
    if (x.groups == program::grouping::pipeline_only) {
      ++baselines;
      if (x.plan) {
        CHECK(x.plan->stages.front().strategy == "dp-ev");
        const std::size_t stages = x.plan->first_blocks.size();
        for (std::size_t s = 0; s < stages; ++s)
          CHECK(x.plan->first_blocks[s] == s * 4 / stages); // (4 blocks, even)
      }
    }
  CHECK(baselines == 2); // (8 stages: past the 4 blocks, said once, the search stops)
  REQUIRE(with.best);
  CHECK(with.tried[*with.best].groups != program::grouping::pipeline_only);

  // a judge ranks the candidates: one that finds the cost model's pick 100x slower moves it
  REQUIRE(ch.best);
  const std::vector<std::size_t> picked = ch.tried[*ch.best].group_sizes;
  const program::stage_judge judge = [&](const program::pipeline_plan& x, const graph::graph& xg,
                                         const cluster& xc, const auto&) {
    program::stage_costs s = program::predicted_costs(x, xg, xc);
    if (x.group_sizes == picked)
      for (double& f : s.stage_forward)
        f *= 100.0;
    return s;
  };
  const program::pipeline_choice judged = program::choose_pipeline(at, 32, c, o, judge);
  REQUIRE(judged.best);
  CHECK(judged.tried[*judged.best].group_sizes != picked);
  for (const program::pipeline_candidate& x : judged.tried)
    if (x.plan) {
      CHECK(x.simulated >= judged.tried[*judged.best].simulated);
      CHECK((x.group_sizes == picked) == (x.simulated > 10.0 * x.step));
    }
}

TEST_CASE("pipeline plan: a stage's error names the cluster's ranks, not its group's") {
  CHECK(program::cluster_ranks("device v100-9.4 (rank 12) needs 9 GiB", 64) ==
        "device v100-9.4 (rank 76) needs 9 GiB");
  CHECK(program::cluster_ranks("2 x cpu (cpu0 ... cpu1, rank 0-1) need", 6) ==
        "2 x cpu (cpu0 ... cpu1, rank 6-7) need");
  CHECK(program::cluster_ranks("no rank here, rank x, rank 3", 2) ==
        "no rank here, rank x, rank 5");
  CHECK(program::cluster_ranks("rank 4", 0) == "rank 4");
}

TEST_CASE("pipeline search: candidates planned on several threads give the same table, pick and "
          "plan as one after another") {
  const cluster c = test::make_cluster({3e9, 3e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9});
  const auto at = [](std::size_t rows) {
    return models::trace_bert_lm<float>(test::tiny_bert(4), rows);
  };
  program::pipeline_options o = plan_options({});
  o.strategy = "synth";
  o.synth.search.max_expansions = 3000; // (the suite's time: the same budget for both runs)
  o.threads = 1;
  const program::pipeline_choice one = program::choose_pipeline(at, 32, c, o);
  o.threads = 3;
  const program::pipeline_choice three = program::choose_pipeline(at, 32, c, o);
  REQUIRE(one.best);
  REQUIRE(three.best);
  CHECK(*one.best == *three.best);
  REQUIRE(one.tried.size() == three.tried.size());
  for (std::size_t k = 0; k < one.tried.size(); ++k) {
    const program::pipeline_candidate& a = one.tried[k];
    const program::pipeline_candidate& b = three.tried[k];
    CAPTURE(k);
    CHECK(a.group_sizes == b.group_sizes);
    CHECK(a.micro == b.micro);
    CHECK(a.refused == b.refused);
    CHECK(a.simulated == b.simulated);
    CHECK(a.step == b.step);
    REQUIRE(a.plan.has_value() == b.plan.has_value());
    if (a.plan)
      CHECK(a.plan->hash() == b.plan->hash());
  }
  // The schedule chosen too: the pick under ZB-H1 where that is faster than under 1F1B (here:
  // its weight gradients fill the bubble of a two-kind cluster's stages).
  const program::pipeline_candidate& first = one.tried[*one.best];
  CHECK(first.plan->schedule == program::schedule_kind::one_f_one_b);
  o.choose_schedule = true;
  const program::pipeline_choice chosen = program::choose_pipeline(at, 32, c, o);
  REQUIRE(chosen.best);
  const program::pipeline_candidate& pick = chosen.tried[*chosen.best];
  CHECK(pick.plan->schedule == program::schedule_kind::zero_bubble);
  CHECK(pick.simulated < first.simulated);
  CHECK(pick.plan->make().kind == program::schedule_kind::zero_bubble);
}

TEST_CASE("pipeline stage planner: a stage that is the same problem as one planned before gets "
          "its plan, renamed for its own nodes and devices") {
  const graph::graph g = models::trace_bert_lm<float>(test::tiny_bert(8), 4);
  const cluster c = test::make_cluster(std::vector<double>(8, 1e9));
  program::pipeline_options o = plan_options({2, 2, 2, 2});
  o.strategy = "synth";
  o.first_blocks = {0, 2, 4, 6};
  program::stage_planner planner;
  const program::pipeline_plan p = program::make_pipeline_plan(g, c, o, &planner);
  // stages 1 and 2 (two blocks each, no embedding or head) on two devices alike: one synthesis
  CHECK(planner.made() == 3);
  CHECK(planner.reused() == 1);
  const auto cuts = p.cuts(g);
  for (const std::size_t k : {std::size_t{1}, std::size_t{2}}) {
    const graph::stage_graph sg = graph::extract_stage(g, cuts, k);
    const cluster group = program::sub_cluster(c, 2 * k, 2);
    synth::synth_options so = o.synth; // (its received values priced over the link)
    so.received = program::received_pricing(p, sg, c, k);
    synth::plan fresh = synth::synthesize(sg.g, group, so, "bert.stage" + std::to_string(k));
    // (the pipeline's plan counts its micro-batches in flight in its memory)
    synth::cost_model m(sg.g, group, synth::segment_map(sg.g, fresh.segments));
    m.set_activation_copies(4.0 - static_cast<double>(k));
    m.set_received(so.received->inputs, so.received->link, so.received->sharing);
    synth::evaluate(fresh, m, fresh.ratios);
    CAPTURE(k);
    CHECK(p.stages[k].device_names ==
          std::vector<std::string>{"d" + std::to_string(2 * k), "d" + std::to_string(2 * k + 1)});
    CHECK(p.stages[k].steps.front().name == sg.g[p.stages[k].steps.front().node].name);
    CHECK(synth::to_json(p.stages[k], false).dump() == synth::to_json(fresh, false).dump());
  }
  // another search's stage that is the same problem: nothing new made
  const program::pipeline_plan again = program::make_pipeline_plan(g, c, o, &planner);
  CHECK(planner.made() == 3);
  CHECK(again.hash() == p.hash());
}

TEST_CASE("pipeline plan: on two kinds at 3:1 the fast group takes three quarters of the blocks, "
          "the stages balance within 5 % and the bubble is within 10 % of 1F1B's") {
  models::llama_config lc;
  lc.layers = 24;
  lc.hidden = 64;
  lc.heads = 2;
  lc.ffn = 172;
  lc.seq = 16;
  lc.vocab = 128;
  const graph::graph g = models::trace_llama_lm<float>(lc, 4);
  const cluster c = test::make_cluster({3e9, 3e9, 1e9, 1e9}, 1e10);
  program::pipeline_options o;
  o.group_sizes = {2, 2};
  o.micro = 8;
  o.model = "llama";
  const program::pipeline_plan p = program::make_pipeline_plan(g, c, o);
  const program::stage_costs costs = program::predicted_costs(p, g, c);
  const program::pipeline_timeline t = program::simulate(p.make(), costs);
  const double fast = costs.stage_forward[0] + costs.stage_backward[0];
  const double slow = costs.stage_forward[1] + costs.stage_backward[1];
  const double theory = program::theory_bubble(p.schedule, 2, p.micro);
  CAPTURE(p.first_blocks, fast, slow, t.bubble, theory);
  CHECK(p.first_blocks == std::vector<std::size_t>{0, 18});
  CHECK(std::max(fast, slow) / ((fast + slow) / 2.0) <= 1.05);
  CHECK(std::abs(t.bubble - theory) <= 0.1 * theory);
  CHECK(theory == Approx(1.0 / 9.0));
}

TEST_CASE("pipeline plan: a boundary send is priced box to box, each node's link carrying its "
          "devices' boxes") {
  // four one-device nodes: group 0 on nodes 0 and 1, group 1 on nodes 2 and 3
  const cluster c = parse_cluster(
      R"({"version": 1, "name": "four-nodes",
          "links": {"intra_node": {"bandwidth": 1e11, "latency": 1e-6},
                    "inter_node": {"bandwidth": 1e8, "latency": 1e-5}},
          "devices": [{"name": "n0", "kind": "t", "speed": 1e9, "memory": 1e12, "node": 0},
                      {"name": "n1", "kind": "t", "speed": 1e9, "memory": 1e12, "node": 1},
                      {"name": "n2", "kind": "t", "speed": 1e9, "memory": 1e12, "node": 2},
                      {"name": "n3", "kind": "t", "speed": 1e9, "memory": 1e12, "node": 3}]})",
      "four-nodes");
  const graph::graph g = models::trace_bert_lm<float>(test::tiny_bert(4), 4);
  const program::pipeline_plan p = program::make_pipeline_plan(g, c, plan_options({2, 2}));
  double bytes = 0.0;
  for (const auto& [local, global] : graph::extract_stage(g, p.cuts(g), 1).received)
    bytes += 4.0 * static_cast<double>(g[global].out.size());
  REQUIRE(bytes > 0.0);
  // DP-EV: each device of either group holds, or takes, half the rows of each value: half the
  // bytes through each node's link (whole, through one link, before)
  const double priced = program::predicted_costs(p, g, c).transfer;
  CAPTURE(bytes, priced);
  CHECK(priced == Approx(c.inter_node->latency + 0.5 * bytes / c.inter_node->bandwidth));
}

// ---- two-level stages (program/two_level_stage.hpp): a stage on a group of whole nodes runs a
// program inside each node on the node's rows of the micro-batch, its gradients all-reduced
// across the nodes once a step; priced, checked for memory, simulated node by node, written and
// read as JSON, refused by a reader that cannot trace it; and chosen over one program across the
// nodes where that one would gather sharded parameters over slow links every micro-batch. (In
// this file, not one of its own: one translation unit less to compile in the suite.)

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
  // (searches on 3,000 states, node programs' too: near-ties on these few rows cost the default
  // budget seconds under the sanitizers)
  one.synth.search.max_expansions = 3000;
  one.two_level = false;
  one.first_blocks = {0, 2};
  one.strategy = "dp-ev";
  const program::pipeline_plan replicated = program::make_pipeline_plan(g, roomy, one);
  const double need = *std::ranges::max_element(program::memory_of(replicated, g, roomy).peak[0]);
  const cluster c = nodes_of(4, 2, std::floor(0.7 * need), 1e8);

  one.strategy = "synth";
  const program::pipeline_plan across = program::make_pipeline_plan(g, c, one);
  program::pipeline_options two = two_level_options({4, 4}, 4, 8);
  two.synth.search.max_expansions = 3000;
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
  so.synth.search.max_expansions = 3000;
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
