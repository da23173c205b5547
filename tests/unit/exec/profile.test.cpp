// Measuring a graph's compute for the cost model: one time per node, adding up to the step.
#include <hspmd/models/mlp.hpp>
#include <hspmd/sim/step.hpp>
#include <hspmd/synth/synthesize.hpp>
#include <hspmd/train/profile.hpp>

#include "../../support/deferred_backend.hpp"
#include "../../support/test_cluster.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

using namespace hspmd;

namespace {

models::mlp_config small_mlp() {
  models::mlp_config cfg;
  cfg.inputs = 64;
  cfg.hidden = {128, 128};
  return cfg;
}

} // namespace

TEST_CASE("measure_compute times every node and the optimizer, and plans take the profile") {
  models::mlp_config cfg;
  cfg.inputs = 128;
  cfg.hidden = {256, 256};
  const graph::graph g = models::trace_mlp<float>(cfg, 64);
  train::profile_options opt;
  opt.repetitions = 2;
  const synth::compute_profile p = train::measure_compute<float>(g, 2e9, opt);
  REQUIRE(p.seconds.size() == g.size());
  CHECK(p.speed == 2e9);
  CHECK(p.optimizer_seconds_per_element > 0.0);
  for (double s : p.seconds) {
    CHECK(std::isfinite(s));
    CHECK(s >= 0.0);
  }
  // The linear layers do work in forward and backward: each has a time of its own, and a
  // forward share measured apart, a fraction. (How large a share is a measurement: on a loaded
  // machine the forward's one product may take as long as the backward's two, or a tenth.)
  REQUIRE(p.forward.size() == g.size());
  for (graph::node_id i = 0; i < g.size(); ++i) {
    CHECK(p.forward[i] >= 0.0);
    CHECK(p.forward[i] <= 1.0);
    if (g[i].kind == graph::op::linear)
      CHECK(p.seconds[i] > 0.0);
  }
  synth::compute_profile bad = p;
  bad.forward[0] = 1.5;
  CHECK_THROWS_WITH(synth::cost_model(g, test::make_cluster({1e9}),
                                      synth::segment_map(g, synth::segment_policy::one), bad),
                    Catch::Contains("forward share outside [0, 1]"));
  CHECK(std::accumulate(p.seconds.begin(), p.seconds.end(), 0.0) > 0.0);

  const cluster c = test::make_cluster({2e9, 1e9});
  synth::synth_options so;
  so.profile = p;
  const synth::plan plan = synth::synthesize(g, c, so);
  CHECK(plan.step_time > 0.0);

  CHECK_THROWS_WITH(train::measure_compute<float>(g, 0.0),
                    Catch::Contains("speed must be positive"));
}

TEST_CASE("measure_compute on an asynchronous backend times the device's work, in a precision") {
  // The deferred backend runs kernels only when waited for: the nodes' times come from its
  // `timed` (as a device's events) and the step waits for the queue before reading the clock.
  models::mlp_config cfg;
  cfg.inputs = 128;
  cfg.hidden = {256, 256};
  const graph::graph g = models::trace_mlp<float>(cfg, 64);
  for (exec::precision prec : {exec::precision::f32, exec::precision::bf16}) {
    INFO(exec::name(prec));
    train::profile_options opt;
    opt.repetitions = 2;
    opt.precision = prec;
    const synth::compute_profile p =
        train::measure_compute<float, test::deferred_backend>(g, 2e9, opt);
    REQUIRE(p.seconds.size() == g.size());
    CHECK(p.optimizer_seconds_per_element > 0.0);
    for (graph::node_id i = 0; i < g.size(); ++i)
      if (g[i].kind == graph::op::linear)
        CHECK(p.seconds[i] > 0.0);
  }
}

TEST_CASE("class rates from a profile reproduce its measured step in the cost model") {
  // What hspmd-profile writes per device: each class's FLOPs over its measured seconds. A cost
  // model given those rates (and no profile) prices the measured graph's nodes at what they took.
  const models::mlp_config cfg = small_mlp();
  const graph::graph g = models::trace_mlp<float>(cfg, 32);
  train::profile_options opt;
  opt.repetitions = 2;
  const synth::compute_profile p = train::measure_compute<float>(g, 1e9, opt);
  const auto rates = train::class_rates(g, p);
  for (std::size_t k = 0; k < op_class_count; ++k) {
    INFO(op_class_names[k]);
    CHECK(rates[k] > 0.0);
  }
  cluster c = test::make_cluster({1e9});
  c.devices[0].rates = rates;
  const synth::cost_model m(g, c, synth::segment_map(g, synth::segment_policy::one));
  REQUIRE(m.class_rates());
  double predicted = 0.0;
  double measured = 0.0;
  for (graph::node_id i = 0; i < g.size(); ++i) {
    predicted += m.compute(i, graph::replicated_rule(g[i].inputs.size()))[0].constant;
    measured += p.seconds[i];
  }
  CHECK(predicted == Approx(measured).epsilon(1e-9));
  // A profile of nothing measures no class.
  synth::compute_profile empty;
  empty.seconds.assign(g.size(), 0.0);
  for (double r : train::class_rates(g, empty))
    CHECK(r == 0.0);
}

TEST_CASE("a second measurement on fewer rows: each node's fixed share, kept whole where a rule "
          "divides only the rows") {
  const models::mlp_config cfg = small_mlp();
  const graph::graph g = models::trace_mlp<float>(cfg, 32);
  const graph::graph half = models::trace_mlp<float>(cfg, 16);
  CHECK(train::same_structure(g, half));
  models::mlp_config wider = cfg;
  wider.hidden = {128, 256};
  CHECK_FALSE(train::same_structure(g, models::trace_mlp<float>(wider, 16)));

  // time = fixed + per-row * rows through both points, clamped to [0, 1].
  synth::compute_profile full;
  full.seconds = {1.0, 1.0, 1.0, 1.0, 0.0};
  synth::compute_profile part;
  part.seconds = {0.75, 0.5, 1.1, 0.2, 0.0};
  train::with_fixed_shares(full, part);
  CHECK(full.fixed == std::vector<double>{0.5, 0.0, 1.0, 0.0, 0.0});
  part.seconds = {0.4, 0.25, 1.0, 1.0, 0.0};
  train::with_fixed_shares(full, part, 0.25);
  CHECK(full.fixed[0] == Approx(0.2));
  CHECK(full.fixed[1] == Approx(0.0).margin(1e-12));
  CHECK_THROWS_WITH(train::with_fixed_shares(full, part, 1.0), Catch::Contains("rows must lie"));
  part.seconds.pop_back();
  CHECK_THROWS_WITH(train::with_fixed_shares(full, part), Catch::Contains("same model"));

  // Measured: every share in [0, 1].
  train::profile_options opt;
  opt.repetitions = 2;
  synth::compute_profile p = train::measure_compute<float>(g, 1e9, opt);
  train::with_fixed_shares(p, train::measure_compute<float>(half, 1e9, opt));
  REQUIRE(p.fixed.size() == g.size());
  for (double f : p.fixed) {
    CHECK(f >= 0.0);
    CHECK(f <= 1.0);
  }

  // Priced: a linear layer with half of its time fixed, on two equal devices at half the rows
  // each, takes 3/4 of its time where its rows are divided and the weight is whole, and 1/2
  // where the rule divides the weight.
  synth::compute_profile flat;
  flat.speed = 1e9;
  flat.seconds.assign(g.size(), 1e-3);
  flat.fixed.assign(g.size(), 0.5);
  const cluster c = test::make_cluster({1e9, 1e9});
  const synth::segment_map seg(g, synth::segment_policy::one);
  const synth::cost_model m(g, c, seg, flat);
  const synth::ratio_table even{{0.5, 0.5}};
  std::size_t rows_rules = 0;
  std::size_t weight_rules = 0;
  for (graph::node_id i = 0; i < g.size(); ++i) {
    if (g[i].kind != graph::op::linear)
      continue;
    for (const graph::rule& r : graph::rules_of(g, i)) {
      if (!r.split_work || !m.split_segment(i, r))
        continue;
      const bool weight_split = r.in[1].is_split();
      const bool rows_only = r.in[0].is_split() && r.in[0].dim() == 0 && !weight_split;
      if (!weight_split && !rows_only)
        continue;
      INFO(g[i].name << (weight_split ? ": weight split" : ": rows split"));
      const double expect = weight_split ? 0.5e-3 : 0.75e-3;
      CHECK(m.compute_max(i, r, even) == Approx(expect));
      CHECK(synth::max_at(m.compute(i, r), even).first == Approx(expect));
      ++(weight_split ? weight_rules : rows_rules);
    }
  }
  CHECK(rows_rules > 0);
  CHECK(weight_rules > 0);
  // A data-parallel plan: predicted and simulated slower than the same profile without fixed
  // shares.
  synth::synth_options so;
  so.profile = flat;
  const synth::plan dp = synth::make_baseline(g, c, synth::baseline::dp_ev, so);
  synth::compute_profile proportional = flat;
  proportional.fixed.clear();
  so.profile = proportional;
  const synth::plan dp_proportional = synth::make_baseline(g, c, synth::baseline::dp_ev, so);
  CHECK(dp.compute_time > dp_proportional.compute_time * 1.2);
  const synth::cost_model m_proportional(g, c, seg, proportional);
  CHECK(sim::simulate(dp, m).step_time > sim::simulate(dp_proportional, m_proportional).step_time);
  synth::compute_profile bad = flat;
  bad.fixed[0] = -0.1;
  CHECK_THROWS_WITH(synth::cost_model(g, c, seg, bad), Catch::Contains("fixed share outside"));
}

TEST_CASE("a measurement at a weight-splitting plan's pieces: each weight-split node's fixed "
          "share, kept whole where a rule divides its weight") {
  const models::mlp_config cfg = small_mlp();
  const graph::graph g = models::trace_mlp<float>(cfg, 32);
  const cluster two = test::make_cluster({1e9, 1e9});
  const synth::plan tp = synth::make_baseline(g, two, synth::baseline::tp);
  train::profile_options opt;
  opt.repetitions = 2;
  synth::compute_profile p = train::measure_compute<float>(g, 1e9, opt);
  train::with_weight_fixed_shares<float>(p, g, tp, opt);
  REQUIRE(p.weight_fixed.size() == g.size());
  // Measured where the plan divides a parameter (every linear of the tensor-parallel baseline),
  // -1 (not measured) elsewhere; the measured ones in [0, 1].
  std::size_t measured = 0;
  for (const synth::plan_step& st : tp.steps) {
    bool divides_weight = false;
    for (std::size_t k = 0; k < st.rule.arity; ++k)
      divides_weight = divides_weight || (st.rule.in[k].is_split() &&
                                          g[g[st.node].inputs[k]].kind == graph::op::parameter);
    INFO(st.name);
    if (divides_weight && p.seconds[st.node] > 0.0) {
      CHECK(p.weight_fixed[st.node] >= 0.0);
      CHECK(p.weight_fixed[st.node] <= 1.0);
      ++measured;
    } else {
      CHECK(p.weight_fixed[st.node] == -1.0);
    }
  }
  CHECK(measured >= 2);
  synth::compute_profile wrong = p;
  wrong.seconds.pop_back();
  CHECK_THROWS_WITH(train::with_weight_fixed_shares<float>(wrong, g, tp, opt),
                    Catch::Contains("node times"));

  // Priced: a linear with 0.6 of its time fixed along the weight and 0.2 along the rows, on two
  // equal devices: 0.8 of it where a rule divides the weight, 0.6 where it divides only the
  // rows; a node not measured so (-1) divides all of it with the weight.
  synth::compute_profile flat;
  flat.speed = 1e9;
  flat.seconds.assign(g.size(), 1e-3);
  flat.fixed.assign(g.size(), 0.2);
  flat.weight_fixed.assign(g.size(), 0.6);
  const synth::segment_map seg(g, synth::segment_policy::one);
  const synth::ratio_table even{{0.5, 0.5}};
  auto first = static_cast<graph::node_id>(g.size());
  for (graph::node_id i = 0; i < g.size(); ++i) {
    if (g[i].kind != graph::op::linear)
      continue;
    first = std::min(first, i);
    const synth::cost_model m(g, two, seg, flat);
    for (const graph::rule& r : graph::rules_of(g, i)) {
      if (!r.split_work || !m.split_segment(i, r))
        continue;
      const bool weight_split = r.in[1].is_split();
      const bool rows_only = r.in[0].is_split() && r.in[0].dim() == 0 && !weight_split;
      if (!weight_split && !rows_only)
        continue;
      INFO(g[i].name << (weight_split ? ": weight split" : ": rows split"));
      CHECK(m.compute_max(i, r, even) == Approx(weight_split ? 0.8e-3 : 0.6e-3));
      CHECK(synth::max_at(m.compute(i, r), even).first == Approx(weight_split ? 0.8e-3 : 0.6e-3));
    }
  }
  REQUIRE(first < g.size());
  flat.weight_fixed[first] = -1.0;
  const synth::cost_model m(g, two, seg, flat);
  for (const graph::rule& r : graph::rules_of(g, first))
    if (r.split_work && m.split_segment(first, r) && r.in[1].is_split())
      CHECK(m.compute_max(first, r, even) == Approx(0.5e-3));
  flat.weight_fixed[first] = 1.5;
  CHECK_THROWS_WITH(synth::cost_model(g, two, seg, flat), Catch::Contains("fixed share outside"));
}

TEST_CASE("measure_shards times a plan's ops at every device's pieces, and the simulation takes "
          "them") {
  const models::mlp_config cfg = small_mlp();
  const graph::graph g = models::trace_mlp<float>(cfg, 32);
  const cluster c = test::make_cluster({2e9, 1e9});
  train::profile_options opt;
  opt.repetitions = 2;
  for (const auto b : {synth::baseline::dp_ev, synth::baseline::dp_cp, synth::baseline::tp}) {
    const synth::plan p = synth::make_baseline(g, c, b);
    const sim::shard_times t = train::measure_shards<float>(g, p, opt);
    REQUIRE(t.seconds.size() == 2);
    REQUIRE(t.optimizer.size() == 2);
    for (std::size_t d = 0; d < 2; ++d) {
      REQUIRE(t.seconds[d].size() == g.size());
      CHECK(t.optimizer[d] > 0.0);
      for (graph::node_id i = 0; i < g.size(); ++i) {
        const bool op = g[i].kind != graph::op::input && g[i].kind != graph::op::parameter;
        INFO(g[i].name << " on device " << d);
        CHECK((t.seconds[d][i] >= 0.0) == op); // every op of the plan, and nothing else
      }
    }
    if (b == synth::baseline::dp_ev) // the same pieces: measured once
      CHECK(t.seconds[0] == t.seconds[1]);
  }
  // The simulation prices each device's ops by them, converted to its rate (device 1 half as
  // fast): nothing measured but the optimizer leaves the optimizer and the collectives.
  const synth::plan p = synth::make_baseline(g, c, synth::baseline::dp_cp);
  const synth::cost_model m(g, c, synth::segment_map(g, p.segments));
  sim::shard_times none;
  none.seconds.assign(2, std::vector<double>(g.size(), 0.0));
  none.optimizer = {0.5, 0.5};
  sim::options o;
  o.measured = &none;
  const sim::result only_optimizer = sim::simulate(p, m, o);
  CHECK(only_optimizer.compute[0] == Approx(0.5));
  CHECK(only_optimizer.compute[1] == Approx(1.0));
  CHECK(only_optimizer.step_time >= 1.0);
  CHECK(only_optimizer.step_time < 1.1);
  sim::shard_times slow = none;
  for (auto& d : slow.seconds)
    for (graph::node_id i = 0; i < g.size(); ++i)
      d[i] = g[i].kind == graph::op::linear ? 0.25 : -1.0; // the rest from the rates
  o.measured = &slow;
  const sim::result linear = sim::simulate(p, m, o);
  CHECK(linear.compute[0] > 0.5 + 3 * 0.25); // three layers, and the rest
  CHECK(linear.compute[1] > 2.0 * (0.5 + 3 * 0.25));
}
