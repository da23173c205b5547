// Measuring a graph's compute for the cost model: one time per node, adding up to the step.
#include <hspmd/exec/profile.hpp>
#include <hspmd/models/mlp.hpp>
#include <hspmd/synth/synthesize.hpp>

#include "../../support/deferred_backend.hpp"
#include "../../support/test_cluster.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>

using namespace hspmd;

TEST_CASE("measure_compute times every node and the optimizer, and plans take the profile") {
  models::mlp_config cfg;
  cfg.inputs = 128;
  cfg.hidden = {256, 256};
  const graph::graph g = models::trace_mlp<float>(cfg, 64);
  exec::profile_options opt;
  opt.repetitions = 2;
  const synth::compute_profile p = exec::measure_compute<float>(g, 2e9, opt);
  REQUIRE(p.seconds.size() == g.size());
  CHECK(p.speed == 2e9);
  CHECK(p.optimizer_seconds_per_element > 0.0);
  for (double s : p.seconds) {
    CHECK(std::isfinite(s));
    CHECK(s >= 0.0);
  }
  // The linear layers do work in forward and backward: each has a time of its own, and a
  // forward share measured apart (one product forward, two backward: well inside (0, 1)).
  REQUIRE(p.forward.size() == g.size());
  for (graph::node_id i = 0; i < g.size(); ++i) {
    CHECK(p.forward[i] >= 0.0);
    CHECK(p.forward[i] <= 1.0);
    if (g[i].kind == graph::op::linear) {
      CHECK(p.seconds[i] > 0.0);
      CHECK(p.forward[i] > 0.05);
      CHECK(p.forward[i] < 0.95);
    }
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

  CHECK_THROWS_WITH(exec::measure_compute<float>(g, 0.0),
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
    exec::profile_options opt;
    opt.repetitions = 2;
    opt.precision = prec;
    const synth::compute_profile p =
        exec::measure_compute<float, test::deferred_backend>(g, 2e9, opt);
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
  models::mlp_config cfg;
  cfg.inputs = 64;
  cfg.hidden = {128, 128};
  const graph::graph g = models::trace_mlp<float>(cfg, 32);
  exec::profile_options opt;
  opt.repetitions = 2;
  const synth::compute_profile p = exec::measure_compute<float>(g, 1e9, opt);
  const auto rates = exec::class_rates(g, p);
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
  for (double r : exec::class_rates(g, empty))
    CHECK(r == 0.0);
}
