// Synthesis: the rule table, the cost model, A* against exhaustive enumeration, admissibility,
// the ratio loop against the baselines, memory, and plan files.
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/graph/rules.hpp>
#include <hspmd/models/zoo.hpp>
#include <hspmd/nn/layers.hpp>
#include <hspmd/synth/synthesize.hpp>

#include "../../support/test_cluster.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

using namespace hspmd;
using namespace hspmd::synth;

namespace {

using test::make_cluster;

// x (batch, in) -> linear -> relu -> linear -> cross-entropy: 4 computed ops.
graph::graph tiny_mlp(std::size_t batch, std::size_t in, std::size_t hidden, std::size_t out) {
  constexpr std::size_t dyn = dynamic_extent;
  nn::tracer t(dtype::f32, batch);
  auto x = t.input<float, extents<hspmd::batch, dyn>>("x", in);
  auto y = t.input<std::int64_t, extents<hspmd::batch>>("y");
  const nn::linear<float, dyn, dyn> fc1("fc1", in, hidden);
  const nn::linear<float, dyn, dyn> fc2("fc2", hidden, out);
  t.set_loss(nn::cross_entropy(fc2(t, nn::relu(fc1(t, x))), y));
  return t.take();
}

// Attention-like: x (batch, s, h) -> layer norm -> linear -> softmax -> linear -> reshape ->
// cross-entropy: 6 computed ops, with a normalized axis and a reshape group.
graph::graph tiny_block(std::size_t batch, std::size_t s, std::size_t h) {
  constexpr std::size_t dyn = dynamic_extent;
  nn::tracer t(dtype::f32, batch);
  auto x = t.input<float, extents<hspmd::batch, dyn, dyn>>("x", s, h);
  auto y = t.input<std::int64_t, extents<dyn>>("y", batch * s);
  const nn::layer_norm<float, dyn> ln{"ln", 1e-5, h};
  const nn::linear<float, dyn, dyn> a("a", h, 2 * h);
  const nn::linear<float, dyn, dyn> b("b", 2 * h, h);
  auto z = b(t, nn::softmax(a(t, ln(t, x))));
  graph::attributes flat;
  flat.dims = {batch * s, h};
  const nn::value<float, extents<dyn, dyn>> logits(t, t.op(graph::op::reshape, {z.id()}, flat),
                                                   t.bind<extents<dyn, dyn>>(batch * s, h));
  t.set_loss(nn::cross_entropy(logits, y));
  return t.take();
}

bool has_rule(const graph::rule_list& rules, std::vector<placement> in, placement out) {
  return std::any_of(rules.begin(), rules.end(), [&](const graph::rule& r) {
    return r.arity == in.size() && std::equal(in.begin(), in.end(), r.in.begin()) && r.out == out;
  });
}

const placement R{};
const placement P{partial{}};
placement S(std::size_t d) {
  return placement::split_along(d);
}

} // namespace

TEST_CASE("rule table: linear has data, row, column parallel, linear and fallback rules") {
  const auto g = tiny_mlp(8, 16, 32, 4);
  const auto fc1 = *g.find("fc1.linear4");
  const auto rules = graph::rules_of(g, fc1);
  CHECK(rules.size == 5);
  CHECK(has_rule(rules, {R, R, R}, R));
  CHECK(has_rule(rules, {S(0), R, R}, S(0)));    // data parallel
  CHECK(has_rule(rules, {S(1), S(0), R}, P));    // row parallel: bias added once
  CHECK(has_rule(rules, {R, S(1), S(0)}, S(1))); // column parallel
  CHECK(has_rule(rules, {P, R, R}, P));          // linear in x
  for (const auto& r : rules)
    CHECK(r.bias_once == r.out.is_partial());
  // Compile time: the same function, constant-evaluated.
  constexpr std::array<graph::dims_view, 2> ins{
      graph::dims_view::of(std::array<std::size_t, 2>{32, 768}),
      graph::dims_view::of(std::array<std::size_t, 2>{768, 3072})};
  constexpr auto sig = graph::signature_of(
      graph::op::matmul, ins, graph::dims_view::of(std::array<std::size_t, 2>{32, 3072}));
  constexpr std::array<placement, 2> row{placement::split_along(1), placement::split_along(0)};
  static_assert(graph::result_placement(sig, graph::op::matmul, row)->is_partial());
  constexpr std::array<placement, 2> bad{placement::split_along(0), placement::split_along(0)};
  static_assert(!graph::result_placement(sig, graph::op::matmul, bad).has_value());
}

TEST_CASE("rule table: normalized axes, reshape groups, vocabulary and expert parallelism") {
  const auto g = tiny_block(4, 6, 8);
  for (graph::node_id i = 0; i < g.size(); ++i) {
    const auto& n = g[i];
    const auto rules = graph::rules_of(g, i);
    if (n.kind == graph::op::softmax || n.kind == graph::op::layer_norm)
      for (const auto& r : rules) // never split along the normalized (last) axis
        CHECK(!(r.out.is_split() && r.out.dim() == n.out.rank() - 1));
    if (n.kind == graph::op::reshape) { // (4, 6, 8) -> (24, 8): {4, 6} | {24}, {8} | {8}
      CHECK(has_rule(rules, {S(0)}, S(0)));
      CHECK(has_rule(rules, {S(2)}, S(1)));
      CHECK(!has_rule(rules, {S(1)}, S(0))); // 6 is an inner dimension of the group
    }
    if (n.kind == graph::op::cross_entropy) {
      CHECK(has_rule(rules, {S(0), S(0)}, P)); // rows: a sum
      const auto vocab = std::find_if(rules.begin(), rules.end(),
                                      [](const graph::rule& r) { return r.vocab_parallel; });
      REQUIRE(vocab != rules.end());
      CHECK(vocab->in[0] == S(1));
      CHECK(vocab->in[1] == R);
      CHECK(vocab->out == P);
    }
  }
  const auto moe = models::trace_model<float>("bert-moe", {2, 16, 32, 2, 4, 32, 4, 1.0}, 2);
  bool dispatch = false;
  bool combine = false;
  for (graph::node_id i = 0; i < moe.size(); ++i) {
    const auto rules = graph::rules_of(moe, i);
    if (moe[i].kind == graph::op::moe_dispatch) {
      dispatch = has_rule(rules, {S(0), S(0)}, S(1));
    }
    if (moe[i].kind == graph::op::moe_combine)
      combine = has_rule(rules, {S(1), S(0)}, S(0)) && has_rule(rules, {S(0), R}, P);
    // Expert FFN: buffers (E, C, H) x weights (E, H, F) split by experts.
    if (moe[i].kind == graph::op::batched_matmul &&
        moe[moe[i].inputs[1]].kind == graph::op::parameter)
      CHECK(has_rule(rules, {S(0), S(0)}, S(0)));
  }
  CHECK(dispatch);
  CHECK(combine);
}

TEST_CASE("cost model: bytes, algorithms per uneven split, duals, bucketed gradients") {
  const auto g = tiny_mlp(1000, 16, 32, 4);
  const cluster c = make_cluster({3e9, 2e9, 1e9}, 1e8, 1e12, 1e-6);
  const cost_model m(g, c, segment_map(g, segment_policy::one));
  const auto h = *g.find("fc1.linear4");
  CHECK(m.bytes(h) == 1000.0 * 32.0 * 4.0); // bytes, not elements
  const ratio_table even{{1.0 / 3, 1.0 / 3, 1.0 / 3}};
  const ratio_table skew{{0.8, 0.1, 0.1}};
  const auto cost = [&](transfer t, const ratio_table& r) { return max_at(m.comm(t, r), r).first; };
  const transfer padded{transfer_kind::all_gather, h, S(0), R, uneven_algorithm::padded};
  const transfer native{transfer_kind::all_gather, h, S(0), R, uneven_algorithm::native};
  const double b = m.bytes(h);
  // 3 ranks, one link: alpha = 2 us (n - 1 latencies), beta = 1e-8 s/B; forward + backward dual.
  CHECK(cost(padded, skew) == Approx(2.0 * (2e-6 + 1e-8 * 2.0 * 0.8 * b)));
  CHECK(cost(native, skew) == Approx(2.0 * (2e-6 + 1e-8 * (1.0 - 0.1) * b)));
  CHECK(cost(padded, even) == Approx(cost(native, even)));
  CHECK(cost(padded, skew) > 1.7 * cost(native, skew)); // why each algorithm is an instruction
  const transfer ar{transfer_kind::all_reduce, h, P, R};
  CHECK(cost(ar, even) == Approx(2.0 * (4e-6 + 1e-8 * 4.0 / 3.0 * b)));
  const transfer slice{transfer_kind::slice, h, R, S(0)};
  CHECK(cost(slice, skew) == 0.0);
  // A small weight gradient pays a fraction of a latency (bucketed with the others).
  const auto w = *g.find("fc1.bias");
  const transfer grad{transfer_kind::load, w, R, R};
  CHECK(cost(grad, even) < 4e-6);
  CHECK(cost(grad, even) > 1e-8 * 4.0 / 3.0 * m.bytes(w));
  // Compute: the share of the work under a split rule, all of it under the fallback.
  const auto rules = graph::rules_of(g, h);
  const auto split = std::find_if(rules.begin(), rules.end(), [](const graph::rule& r) {
    return r.out == S(0) && r.in[0] == S(0);
  });
  const double flops = graph::cost_of(g, h).forward_flops + graph::cost_of(g, h).backward_flops;
  CHECK(max_at(m.compute(h, *split), skew).first ==
        Approx(std::max(0.8 * flops / 3e9, 0.1 * flops / 1e9)));
  CHECK(max_at(m.compute(h, rules.items[0]), skew).first == Approx(flops / 1e9));
}

TEST_CASE("transfer kinds: one kind converts each placement pair, duals pair up, each prices "
          "itself") {
  const auto g = tiny_mlp(1000, 16, 32, 4);
  const cluster c = make_cluster({3e9, 2e9, 1e9}, 1e8, 1e12, 1e-6);
  const cost_model m(g, c, segment_map(g, segment_policy::one));
  const auto h = *g.find("fc1.linear4"); // rank 2
  const ratio_table skew{{0.8, 0.1, 0.1}};
  const std::vector<placement> all = {R, P, S(0), S(1)};
  std::size_t pairs = 0;
  for (const placement& from : all)
    for (const placement& to : all) {
      std::vector<transfer_kind> kinds;
      for (std::size_t k = 0; k < transfer_kind_count; ++k)
        if (facts(static_cast<transfer_kind>(k)).converts(from, to))
          kinds.push_back(static_cast<transfer_kind>(k));
      INFO(from.to_string() << " -> " << to.to_string());
      REQUIRE(kinds.size() == (from == to ? 0U : 1U));
      if (kinds.empty())
        continue;
      ++pairs;
      const transfer t{kinds[0], h, from, to, uneven_algorithm::native};
      const double seconds = max_at(m.comm(t, skew), skew).first;
      // Local kinds move nothing; every collective costs at least one latency each way.
      if (is_collective(t.kind))
        CHECK(seconds >= 2e-6);
      else
        CHECK(seconds == 0.0);
    }
  CHECK(pairs == 12);
  for (std::size_t k = 0; k < transfer_kind_count; ++k) {
    const auto kind = static_cast<transfer_kind>(k);
    INFO(name(kind));
    CHECK(dual(dual(kind)) == kind);
    CHECK(parse_transfer_kind(name(kind)) == kind);
    CHECK(facts(kind).forward == facts(dual(kind)).backward);
    CHECK(is_collective(kind) == facts(kind).forward.has_value());
  }
}

TEST_CASE("cost model: a measured compute profile prices nodes and the optimizer by their time") {
  const auto g = tiny_mlp(1000, 16, 32, 4);
  const cluster c = make_cluster({3e9, 2e9, 1e9});
  compute_profile prof;
  for (graph::node_id i = 0; i < g.size(); ++i)
    prof.seconds.push_back(1e-3 * static_cast<double>(i + 1));
  prof.speed = 6e9; // measured on a device rated 6e9 flop/s: twice as fast as d0
  prof.optimizer_seconds_per_element = 1e-9;
  const cost_model m(g, c, segment_map(g, segment_policy::one), prof);
  const auto h = *g.find("fc1.linear4");
  const auto rules = graph::rules_of(g, h);
  const auto split = std::find_if(rules.begin(), rules.end(), [](const graph::rule& r) {
    return r.out == S(0) && r.in[0] == S(0);
  });
  const ratio_table skew{{0.8, 0.1, 0.1}};
  const double s = prof.seconds[h];
  // Replicated: all of the measured time, scaled by speed; split: the device's share of it.
  for (std::size_t d = 0; d < 3; ++d)
    CHECK(value_at(m.compute(h, rules.items[0])[d], skew, d) ==
          Approx(s * 6e9 / c.devices[d].speed));
  CHECK(max_at(m.compute(h, *split), skew).first ==
        Approx(std::max({0.8 * s * 2.0, 0.1 * s * 3.0, 0.1 * s * 6.0})));
  // The optimizer's update of a replicated weight: seconds per element, every device.
  const auto w = *g.find("fc1.weight");
  const auto opt = m.transfer_compute({transfer_kind::load, w, R, R});
  CHECK(value_at(opt[2], skew, 2) == Approx(1e-9 * 16.0 * 32.0 * 6.0));
  // Without a profile the same node is priced by FLOPs; a profile of another graph is refused.
  const cost_model flops(g, c, segment_map(g, segment_policy::one));
  CHECK(value_at(flops.compute(h, rules.items[0])[0], skew, 0) ==
        Approx((graph::cost_of(g, h).forward_flops + graph::cost_of(g, h).backward_flops) / 3e9));
  prof.seconds.pop_back();
  CHECK_THROWS_WITH(cost_model(g, c, segment_map(g, segment_policy::one), prof),
                    Catch::Contains("node times for") && Catch::Contains("measure_compute"));
  // Synthesis and the baselines take it through the options and still plan.
  prof.seconds.push_back(1e-3);
  synth_options so;
  so.profile = prof;
  CHECK(synthesize(g, c, so).step_time > 0.0);
  CHECK(make_baseline(g, c, baseline::dp_ev, so).step_time > 0.0);
}

TEST_CASE("A* finds the optimum of exhaustive enumeration on tiny graphs") {
  struct case_ {
    graph::graph g;
    cluster c;
    ratio_table r;
  };
  std::vector<case_> cases;
  for (const auto& speeds : {std::vector<double>{1e9, 1e9}, std::vector<double>{3e9, 1e9},
                             std::vector<double>{5e9, 3e9, 1e9}}) {
    for (double bw : {1e6, 1e8, 1e10}) {
      const cluster c = make_cluster(speeds, bw);
      cases.push_back({tiny_mlp(8, 16, 32, 4), c, proportional_ratios(c, 1)});
      cases.push_back({tiny_mlp(64, 4, 256, 8), c, even_ratios(c, 1)});
      cases.push_back({tiny_block(4, 6, 8), c, proportional_ratios(c, 1)});
    }
  }
  for (const auto& k : cases) {
    const cost_model m(k.g, k.c, segment_map(k.g, segment_policy::one));
    searcher s(m, k.r);
    REQUIRE(s.order().size() <= 8);
    const auto found = s.run();
    REQUIRE(found.found);
    CHECK(found.optimal);
    const auto best = s.exhaustive();
    REQUIRE(best);
    CHECK(found.cost == Approx(*best).epsilon(1e-12));
    // The program's cost evaluated from scratch is the search's.
    const plan p = make_plan(found, m, k.r, "t", "synth");
    CHECK(p.step_time == Approx(found.cost).epsilon(1e-12));
  }
}

TEST_CASE("the heuristic never exceeds the true remaining cost (sampled states)") {
  std::mt19937 rng(7);
  std::size_t checked = 0;
  for (const auto& speeds : {std::vector<double>{1e9, 1e9}, std::vector<double>{5e9, 3e9, 1e9}})
    for (double bw : {1e6, 1e9}) {
      const cluster c = make_cluster(speeds, bw);
      for (const auto& g : {tiny_mlp(16, 8, 32, 4), tiny_block(4, 6, 8)}) {
        const cost_model m(g, c, segment_map(g, segment_policy::one));
        searcher s(m, proportional_ratios(c, 1));
        for (int sample = 0; sample < 12; ++sample) {
          // A random prefix of rule choices: a random state at a random depth.
          const std::size_t depth = rng() % (s.order().size() + 1);
          std::vector<std::size_t> prefix;
          for (std::size_t k = 0; k < depth; ++k)
            prefix.push_back(rng() % s.rules(k).size());
          const auto rest = s.exhaustive(prefix);
          if (!rest || !std::isfinite(*rest))
            continue; // that prefix is a dead end
          CHECK(s.heuristic(depth) <= *rest * (1.0 + 1e-12) + 1e-18);
          ++checked;
        }
      }
    }
  CHECK(checked >= 40);
}

namespace {

// The zoo's models at a size a test plans in milliseconds (two layers: BERT-MoE's second is its
// MoE layer).
models::model_options small_models() {
  models::model_options small;
  small.layers = 2;
  small.hidden = 32;
  small.ffn = 64;
  small.heads = 2;
  small.seq = 16;
  small.vocab = 64;
  small.experts = 4;
  return small;
}

} // namespace

TEST_CASE("synthesis is never worse than the baselines and is deterministic") {
  models::model_options small = small_models();
  for (const auto& speeds :
       {std::vector<double>{2e10, 1e10}, std::vector<double>{5e10, 3e10, 1e10}}) {
    for (double bw : {1e7, 1e10}) {
      const cluster c = make_cluster(speeds, bw);
      for (const char* name : {"mlp", "bert", "bert-moe", "vit"}) {
        small.layers = std::string(name) == "bert-moe" ? 2 : 1;
        const auto g = models::trace_model<float>(name, small, 8 * c.size());
        const plan p = synthesize(g, c, {}, name);
        double best = std::numeric_limits<double>::infinity();
        for (auto b : {baseline::dp_ev, baseline::dp_cp, baseline::tp})
          best = std::min(best, make_baseline(g, c, b, {}, name).step_time);
        INFO(name << " on " << c.size() << " devices, bandwidth " << bw);
        CHECK(p.step_time <= best * (1.0 + 1e-9));
        if (bw > 1e9 && c.size() == 3) // deterministic: the same plan, bit for bit
          CHECK(synthesize(g, c, {}, name).hash() == p.hash());
      }
    }
  }
}

TEST_CASE("search: an MoE layer's dispatch and combine route tokens alike, so lowering takes "
          "every plan") {
  models::model_options small = small_models();
  const auto token_parallel = [](const graph::rule& r) {
    return r.kind == graph::rule::family::split && r.in[1].is_split();
  };
  std::size_t layers = 0;
  for (const auto& speeds : {std::vector<double>{2e10, 1e10}, std::vector<double>{3e10, 1e10},
                             std::vector<double>{5e10, 3e10, 1e10}})
    for (double bw : {1e7, 1e9, 1e11}) {
      const cluster c = make_cluster(speeds, bw);
      const auto g = models::trace_model<float>("bert-moe", small, 8 * c.size());
      const cost_model m(g, c, segment_map(g, segment_policy::one));
      const ratio_table r = proportional_ratios(c, m.segments().count());
      // The combine forced to route one way: its dispatch follows, whatever that costs it.
      for (const bool forced : {true, false}) {
        search_options so;
        so.allow_rule = [&](graph::node_id id, const graph::rule& rule) {
          return g[id].kind != graph::op::moe_combine || token_parallel(rule) == forced;
        };
        const search_result res = search(m, r, so);
        REQUIRE(res.found);
        const plan p = make_plan(res, m, r, "bert-moe", "synth");
        INFO(c.size() << " devices, bandwidth " << bw << ", combine token parallel " << forced);
        for (const plan_step& s : p.steps)
          if (g[s.node].kind == graph::op::moe_dispatch) {
            CHECK(token_parallel(s.rule) == forced);
            ++layers;
          }
        CHECK_NOTHROW(shard_classes(g, p));
      }
      INFO(c.size() << " devices, bandwidth " << bw);
      CHECK_NOTHROW(shard_classes(g, synthesize(g, c, {}, "bert-moe")));
    }
  CHECK(layers == 2 * 9); // (one MoE layer of two)
}

TEST_CASE("baselines: DP replicates every weight on even or proportional ratios, TP splits none "
          "of the batch") {
  const auto g = tiny_mlp(32, 16, 64, 4);
  const cluster c = make_cluster({3e9, 1e9});
  const plan ev = make_baseline(g, c, baseline::dp_ev);
  const plan cp = make_baseline(g, c, baseline::dp_cp);
  const plan tp = make_baseline(g, c, baseline::tp);
  CHECK(ev.ratios[0] == std::vector<double>{0.5, 0.5});
  CHECK(cp.ratios[0][0] == Approx(0.75));
  const segment_map seg(g, segment_policy::one);
  for (const auto& s : ev.steps) {
    for (const auto& t : s.transfers)
      if (g[t.tensor].kind == graph::op::parameter)
        CHECK(t.to.is_replicated());
    if (s.kind == graph::op::linear)
      CHECK(s.rule.in[0] == S(0));
  }
  for (const auto& s : tp.steps)
    for (std::size_t k = 0; k < s.rule.arity; ++k)
      if (s.rule.in[k].is_split())
        CHECK(!seg.is_batch(g[s.node].inputs[k], s.rule.in[k].dim()));
  CHECK(ev.step_time >= cp.step_time); // same program, better ratios
}

TEST_CASE("overlap: gradient all-reduces hide behind the backward by the cluster's fraction") {
  const auto g = tiny_mlp(64, 256, 512, 8);
  cluster c = make_cluster({1e9, 1e9}, 1e8);
  const plan none = make_baseline(g, c, baseline::dp_ev);
  CHECK(none.overlap_time == 0.0);
  CHECK(none.step_time == Approx(none.compute_time + none.comm_time));
  CHECK(!to_json(none).contains("overlap_time"));
  c.overlap = 1.0;
  const plan full = make_baseline(g, c, baseline::dp_ev);
  c.overlap = 0.5;
  const plan half = make_baseline(g, c, baseline::dp_ev);
  REQUIRE(full.overlap_time > 0.0);
  CHECK(half.overlap_time == Approx(0.5 * full.overlap_time));
  CHECK(full.step_time == Approx(full.compute_time + full.comm_time - full.overlap_time));
  CHECK(full.step_time < half.step_time);
  CHECK(half.step_time < none.step_time);
  // fc1's weight gradient is final only when the backward ends: its all-reduce cannot hide.
  CHECK(full.overlap_time < full.comm_time);
  const plan back = plan_from_json(to_json(full), g);
  CHECK(back.overlap_time == full.overlap_time);
  CHECK(explain(full, cost_model(g, c, segment_map(g, segment_policy::one)))
            .find("hidden behind the backward") != std::string::npos);
}

TEST_CASE("SFB replaces a weight-gradient all-reduce when the batch is small") {
  const auto g = tiny_mlp(2, 1024, 1024, 4); // 4 MiB weight, 2 rows
  const cluster c = make_cluster({1e12, 1e12}, 1e8);
  const cost_model m(g, c, segment_map(g, segment_policy::one));
  search_options only_dp; // data parallel only, so the weight is replicated
  only_dp.allow_rule = [](graph::node_id, const graph::rule& r) {
    return r.kind == graph::rule::family::replicated ||
           (r.kind == graph::rule::family::split && (r.out == S(0) || r.out.is_partial()) &&
            r.in[0] == S(0));
  };
  const auto res = search(m, even_ratios(c, 1), only_dp);
  REQUIRE(res.found);
  bool sfb = false;
  for (const auto& s : res.steps)
    for (const auto& t : s.transfers)
      sfb = sfb || (t.sfb && g[t.tensor].name == "fc1.weight");
  CHECK(sfb);
  only_dp.allow_sfb = false;
  const auto without = search(m, even_ratios(c, 1), only_dp);
  CHECK(without.cost > 5.0 * res.cost);
}

TEST_CASE("memory: a device too small for any plan is named with bytes, a tight cap changes the "
          "plan") {
  const auto g = tiny_mlp(8, 1024, 1024, 4);
  const cluster tiny = make_cluster({1e9, 1e9}, 1e9, 1e5);
  try {
    (void)synthesize(g, tiny);
    FAIL("expected a memory error");
  } catch (const plan_error& e) {
    // Every device short: one line, grouped by kind, naming the range and the bytes.
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("2 of 2 devices cannot hold every tensor") &&
                         Catch::Contains("2 x test (d0 ... d1, rank 0-1) need up to") &&
                         Catch::Contains("MiB but have 97.66 KiB"));
  }
  // MLP 784-1024-1024-10, batch 4096, fast devices on a 1 GB/s link: unconstrained, the first
  // layer runs replicated (no gather of its output). 10 % less memory than that plan needs
  // forces another program, slower but within the cap.
  models::model_options mlp;
  mlp.layers = 2;
  mlp.hidden = 1024;
  const auto big = models::trace_model<float>("mlp", mlp, 4096);
  const plan free_plan = synthesize(big, make_cluster({1e13, 1e13}, 1e9, 1e12));
  const double peak = *std::max_element(free_plan.memory.begin(), free_plan.memory.end());
  const double cap = std::floor(0.9 * peak);
  const plan capped = synthesize(big, make_cluster({1e13, 1e13}, 1e9, cap));
  CHECK(capped.hash() != free_plan.hash());
  bool differs = false;
  for (std::size_t i = 0; i < capped.steps.size(); ++i)
    differs = differs || !(capped.steps[i].rule == free_plan.steps[i].rule);
  CHECK(differs);
  for (double b : capped.memory)
    CHECK(b <= cap);
  CHECK(capped.step_time > free_plan.step_time);
}

TEST_CASE("parameters too large to replicate are kept split and gathered for use (FSDP)") {
  // fc1 and fc2 hold 2 x 1024 x 1024 weights: 33.6 MB with gradient and Adam state. Four
  // devices of 20 MB: no device holds them whole; rules that split a weight (tensor
  // parallelism) are left out, so only sharded parameters can fit.
  const auto g = tiny_mlp(8, 1024, 1024, 1024);
  const double cap = 20e6;
  const cluster c = make_cluster({1e12, 1e12, 1e12, 1e12}, 1e10, cap);
  synth_options o;
  o.search.allow_rule = [&g](graph::node_id id, const graph::rule& r) {
    for (std::size_t k = 0; k < r.arity; ++k)
      if (g[g[id].inputs[k]].kind == graph::op::parameter && r.in[k].is_split())
        return false;
    return true;
  };
  o.search.shard_parameters = search_options::parameter_sharding::never;
  CHECK_THROWS_WITH(synthesize(g, c, o), Catch::Contains("no plan fits in memory"));
  o.search.shard_parameters = search_options::parameter_sharding::when_needed;
  const plan p = synthesize(g, c, o);
  std::size_t sharded = 0;
  for (const plan_step& s : p.steps)
    for (std::size_t k = 0; k < s.transfers.size(); ++k) {
      const transfer& t = s.transfers[k];
      if (t.kind != transfer_kind::load || g[t.tensor].kind != graph::op::parameter)
        continue;
      CAPTURE(g[t.tensor].name);
      CHECK(t.to.is_split()); // every parameter is stored split ...
      if (s.rule.in[1].is_replicated() && t.tensor == g[s.node].inputs[1]) {
        REQUIRE(k + 1 < s.transfers.size()); // ... and a replicated use gathers it first
        CHECK(s.transfers[k + 1].tensor == t.tensor);
        CHECK(s.transfers[k + 1].kind == transfer_kind::all_gather);
        ++sharded;
      }
    }
  CHECK(sharded == 2);
  for (double b : p.memory) {
    CHECK(b <= cap);
    // A quarter of the state, plus one gathered copy at a time: fc1's is dead (and gathered
    // again for the backward) before fc2's is made.
    CHECK(b > 33.6e6 / 4 + 4.2e6);
    CHECK(b < 33.6e6 / 4 + 2 * 4.2e6);
  }
  // On roomy devices sharding is never needed; forced, it trades time for memory.
  const cluster roomy = make_cluster({1e12, 1e12, 1e12, 1e12}, 1e10, 1e9);
  o.search.shard_parameters = search_options::parameter_sharding::when_needed;
  const plan whole = synthesize(g, roomy, o);
  o.search.shard_parameters = search_options::parameter_sharding::always;
  const plan forced = synthesize(g, roomy, o);
  CHECK(*std::max_element(forced.memory.begin(), forced.memory.end()) <
        0.6 * *std::max_element(whole.memory.begin(), whole.memory.end()));
  CHECK(forced.step_time >= whole.step_time);
}

TEST_CASE("a deep model the search cannot fit within its budget falls back to data parallelism "
          "with sharded parameters (FSDP), which fits") {
  // 16 Llama blocks on devices of 30 and 12 MiB: cheap partial plans keep activations whole
  // and run out of memory blocks later; 50 expansions find nothing that fits.
  models::model_options o;
  o.layers = 16;
  o.hidden = 64;
  o.heads = 2;
  o.seq = 32;
  o.vocab = 100;
  const graph::graph g = models::trace_model<float>("llama", o, 8);
  cluster c = make_cluster({4e12, 1e12, 4e12, 1e12}, 1e10, 30.0 * 1024 * 1024, 1e-5);
  c.devices[1].memory = c.devices[3].memory = 12 * 1024 * 1024;
  synth_options opt;
  opt.search.max_expansions = 50;
  const plan p = synthesize(g, c, opt, "llama");
  CHECK(p.stats.fsdp_fallback);
  for (std::size_t d = 0; d < c.size(); ++d)
    CHECK(p.memory[d] <= static_cast<double>(c.devices[d].memory));
  const segment_map seg(g, segment_policy::one);
  for (const plan_step& s : p.steps) {
    for (std::size_t k = 0; k < s.rule.arity; ++k)
      if (s.rule.in[k].is_split())
        CHECK(seg.is_batch(g[s.node].inputs[k], s.rule.in[k].dim())); // data parallel
    for (const transfer& t : s.transfers)
      if (t.kind == transfer_kind::load && g[t.tensor].kind == graph::op::parameter)
        CHECK(t.to.is_split()); // sharded
  }
  CHECK(plan_from_json(to_json(p), g, "plan.json").stats.fsdp_fallback);
  // With 2 000 the search completes a plan that fits itself, faster than the fallback: from
  // the deepest state it reached, each later block runs the program of the block before it
  // (the cheapest op at every step, the completion before, ran out of memory here).
  opt.search.max_expansions = 2000;
  const plan repeated = synthesize(g, c, opt, "llama");
  CHECK_FALSE(repeated.stats.fsdp_fallback);
  CHECK_FALSE(repeated.stats.optimal);
  for (std::size_t d = 0; d < c.size(); ++d)
    CHECK(repeated.memory[d] <= static_cast<double>(c.devices[d].memory));
  CHECK(repeated.step_time < p.step_time);
  opt.search.max_expansions = 50;
  // Without sharding (or recomputation) there is nothing to fall back to.
  opt.search.shard_parameters = search_options::parameter_sharding::never;
  opt.search.recompute = search_options::recomputation::never;
  CHECK_THROWS_WITH(synthesize(g, c, opt, "llama"), Catch::Contains("no plan fits in memory"));
}

TEST_CASE(
    "plans round-trip through JSON, hash alike, explain themselves, and refuse another graph") {
  const auto g = tiny_block(4, 6, 8);
  const cluster c = make_cluster({3e9, 2e9, 1e9}, 1e7);
  const plan p = synthesize(g, c, {}, "block");
  const auto j = to_json(p);
  const plan q = plan_from_json(nlohmann::json::parse(j.dump()), g, "plan.json");
  CHECK(q.steps == p.steps);
  CHECK(q.ratios == p.ratios);
  CHECK(q.hash() == p.hash());
  CHECK(q.device_compute == p.device_compute);
  // Each device's compute over all steps is at most the sum of per-step maxima.
  REQUIRE(p.device_compute.size() == 3);
  for (double s : p.device_compute) {
    CHECK(s > 0.0);
    CHECK(s <= p.compute_time * (1.0 + 1e-12));
  }
  const cost_model m(g, c, segment_map(g, segment_policy::one));
  const std::string table = explain(p, m);
  CHECK(table.find("predicted step time") != std::string::npos);
  CHECK(table.find("ln.layer_norm") != std::string::npos);
  CHECK(table.find("d2:") != std::string::npos);
  // Another graph: refused naming the field.
  const auto other = tiny_block(4, 6, 16);
  CHECK_THROWS_WITH(plan_from_json(j, other, "plan.json"),
                    Catch::Contains("plan.json: field graph.hash") &&
                        Catch::Contains("another graph"));
  // A hand-edited rule the op does not have.
  auto bad = j;
  bad["steps"][0]["out"] = "split(5)";
  CHECK_THROWS_WITH(plan_from_json(bad, g, "plan.json"),
                    Catch::Contains("plan.json: field steps[0]") &&
                        Catch::Contains("no such rule"));
}

TEST_CASE("budgets end the search with a complete plan and an honest gap") {
  models::model_options small;
  small.layers = 2;
  small.hidden = 32;
  small.heads = 2;
  small.seq = 8;
  small.vocab = 64;
  const auto g = models::trace_model<float>("bert", small, 8);
  const cluster c = make_cluster({3e9, 2e9, 1e9}, 1e7);
  const cost_model m(g, c, segment_map(g, segment_policy::one));
  const auto r = proportional_ratios(c, 1);
  const auto best = search(m, r);
  REQUIRE(best.optimal);
  search_options tight;
  tight.max_expansions = 3;
  const auto cut = search(m, r, tight);
  REQUIRE(cut.found);
  CHECK(!cut.optimal);
  CHECK(cut.steps.size() == best.steps.size()); // every op placed
  CHECK(cut.cost >= best.cost * (1.0 - 1e-12));
  CHECK(cut.lower_bound <= best.cost * (1.0 + 1e-12));
  CHECK(make_plan(cut, m, r, "t", "synth").step_time == Approx(cut.cost).epsilon(1e-12));
  synth_options so;
  so.search.max_expansions = 3;
  const plan p = synthesize(g, c, so);
  CHECK(!p.stats.optimal);
  CHECK(p.stats.gap >= 0.0);
}

namespace {
// The rules of one `kind` node over inputs of the given dims (compile-time evaluable).
constexpr graph::rule_list rules_for(graph::op kind, std::span<const graph::dims_view> ins,
                                     const graph::dims_view& out) {
  return graph::rules_of(graph::signature_of(kind, ins, out), kind);
}
constexpr graph::dims_view dims(std::initializer_list<std::size_t> d) {
  graph::dims_view v;
  for (std::size_t x : d)
    v.d[v.rank++] = x;
  return v;
}
} // namespace

TEST_CASE("rule table: rms_norm splits the batch and the sequence, never the features") {
  constexpr std::array<graph::dims_view, 2> ins{dims({4, 6, 8}), dims({8})};
  constexpr auto rules = rules_for(graph::op::rms_norm, ins, dims({4, 6, 8}));
  CHECK(has_rule(rules, {S(0), R}, S(0)));
  CHECK(has_rule(rules, {S(1), R}, S(1)));
  for (const auto& r : rules)
    CHECK(!(r.out.is_split() && r.out.dim() == 2));
  CHECK(!has_rule(rules, {P, R}, P)); // not linear
}

TEST_CASE("rule table: rotary embeddings split batch, sequence and heads, never the pairs") {
  constexpr std::array<graph::dims_view, 1> ins{dims({2, 6, 4, 8})}; // (B, S, heads, d)
  constexpr auto rules = rules_for(graph::op::rotary, ins, dims({2, 6, 4, 8}));
  CHECK(has_rule(rules, {S(0)}, S(0)));
  CHECK(has_rule(rules, {S(1)}, S(1))); // a piece of the sequence rotates by global positions
  CHECK(has_rule(rules, {S(2)}, S(2))); // head parallel
  CHECK(!has_rule(rules, {S(3)}, S(3)));
  CHECK(has_rule(rules, {P}, P)); // a rotation is linear
}

TEST_CASE("rule table: swiglu splits every dimension and is linear in its value operand") {
  constexpr std::array<graph::dims_view, 2> ins{dims({8, 32}), dims({8, 32})};
  constexpr auto rules = rules_for(graph::op::swiglu, ins, dims({8, 32}));
  CHECK(has_rule(rules, {S(0), S(0)}, S(0)));
  CHECK(has_rule(rules, {S(1), S(1)}, S(1))); // after column-parallel gate and up projections
  CHECK(has_rule(rules, {R, P}, P));
  CHECK(!has_rule(rules, {P, R}, P)); // silu is not linear
}

TEST_CASE("times print with a unit at every magnitude") {
  CHECK(seconds_text(0.0) == "0");
  CHECK(seconds_text(3.2e-9) == "3.2 ns");
  CHECK(seconds_text(1e-300) == "1e-291 ns");
  CHECK(seconds_text(12.3e-6) == "12.3 us");
  CHECK(seconds_text(4.56e-3) == "4.56 ms");
  CHECK(seconds_text(1.234) == "1.234 s");
  CHECK(seconds_text(150.0) == "2.5 min");
  CHECK(seconds_text(3.2 * 3600.0) == "3.20 h");
  CHECK(seconds_text(4.1 * 86400.0) == "4.1 days");
  CHECK(seconds_text(1e30) == "3.17e+22 years");
  CHECK(seconds_text(std::numeric_limits<double>::infinity()) == "infinite");
  CHECK(seconds_text(-0.5) == "-500.00 ms");
  CHECK(milliseconds_text(0.01234) == "12.34 ms");
  CHECK(milliseconds_text(1e30) == "3.17e+22 years");
}

TEST_CASE("a cluster built in code is held to the reader's limits, the search survives "
          "infinite prices") {
  cluster c = make_cluster({1e9, 1e9});
  c.devices[0].speed = 1e-306;
  CHECK_THROWS_WITH(validated(c, "train_options::cluster_spec"),
                    Catch::Contains("train_options::cluster_spec: field devices[0].speed: is "
                                    "absurdly small: 1e-306 < 1e+06"));
  // The synthesizer itself, given such a cluster anyway, must not dereference a missing
  // transfer: it returns a plan (or refuses) instead of crashing.
  models::model_options o;
  o.layers = 1;
  o.hidden = 8;
  const auto g = models::trace_model<float>("mlp", o, 4);
  c.devices[1].speed = 1e-306;
  try {
    const plan p = synthesize(g, c);
    CHECK(p.device_names.size() == 2);
  } catch (const hspmd::error& e) {
    CHECK(std::string(e.what()).size() > 0);
  }
}
