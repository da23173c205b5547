// The step simulator (sim/step.hpp): where a run has nothing the additive cost model leaves out
// (equal devices, whole shards equal to the ratios, no overlap) it must give the cost model's
// time plus the two small all-reduces the model does not count; where it has, it must differ the
// way the executor does.
#include <hspmd/models/zoo.hpp>
#include <hspmd/sim/step.hpp>
#include <hspmd/synth/synthesize.hpp>

#include "../../support/test_cluster.hpp"
#include "small_bert.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

using namespace hspmd;
using namespace hspmd::synth;

namespace {

// Seconds of the loss and gradient-norm all-reduces (8 bytes each), which the cost model leaves
// out.
double small_all_reduces(const cluster& c) {
  const alpha_beta ab =
      c.cost_model().params(collective::all_reduce, uneven_algorithm::native, 8.0);
  return 2.0 * (std::max(0.0, ab.alpha) + ab.beta * 8.0);
}

plan make(const graph::graph& g, const cluster& c, std::optional<baseline> b) {
  synth_options o;
  o.search.max_expansions = 20000;
  return b ? make_baseline(g, c, *b, o, "bert") : synthesize(g, c, o, "bert");
}

} // namespace

TEST_CASE("simulating one device gives the cost model's step: compute and the optimizer") {
  const graph::graph g = test::small_bert(4);
  const cluster c = test::make_cluster({1e9});
  const plan p = make(g, c, baseline::dp_ev);
  const cost_model m(g, c, segment_map(g, p.segments));
  const sim::result r = sim::simulate(p, m);
  CHECK(r.step_time == Approx(p.step_time).epsilon(1e-9));
  CHECK(r.compute[0] == Approx(p.step_time).epsilon(1e-9));
  CHECK(r.waiting[0] == 0.0);
  CHECK(r.buckets == 0);
}

TEST_CASE("on equal devices without overlap every plan simulates to the cost model's time plus "
          "the two small all-reduces") {
  const graph::graph g = test::small_bert(8);
  const cluster c = test::make_cluster({1e9, 1e9}, 1e8);
  REQUIRE(c.overlap == 0.0);
  for (const auto& b :
       {std::optional<baseline>{}, std::optional{baseline::dp_ev}, std::optional{baseline::tp}}) {
    const plan p = make(g, c, b);
    CAPTURE(p.strategy);
    const cost_model m(g, c, segment_map(g, p.segments));
    const sim::result r = sim::simulate(p, m);
    CHECK(r.step_time == Approx(p.step_time + small_all_reduces(c)).epsilon(1e-9));
    CHECK(r.whole_shards);
    // Equal devices wait for nothing but the buckets (no overlap: the compute stops for them).
    CHECK(r.compute[0] == Approx(r.compute[1]).epsilon(1e-12));
  }
}

TEST_CASE("gradient buckets in flight hide behind the backward as far as the overlap allows") {
  const graph::graph g = test::small_bert(8);
  cluster c = test::make_cluster({1e9, 1e9}, 1e8);
  const plan p = make(g, c, baseline::dp_ev);
  std::vector<double> steps;
  sim::options o;
  o.bucket_bytes = 16384.0; // several buckets for this small model
  for (double overlap : {0.0, 0.5, 1.0}) {
    c.overlap = overlap;
    const cost_model m(g, c, segment_map(g, p.segments));
    const sim::result r = sim::simulate(p, m, o);
    REQUIRE(r.buckets > 0);
    // Never before the backward's end, nor above compute and communication in turn.
    CHECK(r.step_time >= r.backward);
    CHECK(r.step_time <= p.compute_time + p.comm_time + small_all_reduces(c) + 1e-12);
    steps.push_back(r.step_time);
  }
  CHECK(steps[1] < steps[0]);
  CHECK(steps[2] < steps[1]);
}

TEST_CASE("a device's whole rows, not its ratio, set its compute") {
  // 4 sequences on 3 equal devices: the plan's ratios are a third each, lowering cuts 2, 1, 1.
  const graph::graph g = test::small_bert(4);
  const cluster c = test::make_cluster({1e9, 1e9, 1e9}, 1e12);
  const plan p = make(g, c, baseline::dp_ev);
  const cost_model m(g, c, segment_map(g, p.segments));
  sim::options continuous;
  continuous.whole_shards = false;
  const sim::result by_ratio = sim::simulate(p, m, continuous);
  const sim::result whole = sim::simulate(p, m);
  CHECK(whole.slowest == 0);
  CHECK(whole.compute[0] > 1.3 * by_ratio.compute[0]);
  CHECK(whole.compute[1] < by_ratio.compute[1]);
  CHECK(whole.step_time > by_ratio.step_time);
  // Devices 1 and 2 wait for device 0 at the loss all-reduce and for the gradients.
  CHECK(whole.waiting[1] > 0.0);
}

TEST_CASE("between collectives each device runs at its own pace") {
  // A data-parallel plan at even ratios on a 2:1 cluster: the fast device's forward does not wait
  // op by op, so the step is the slow device's total, as in the cost model (its per-op maxima are
  // all the slow device's); the fast device waits once per collective.
  const graph::graph g = test::small_bert(8);
  const cluster c = test::make_cluster({2e9, 1e9}, 1e12);
  const plan p = make(g, c, baseline::dp_ev);
  const cost_model m(g, c, segment_map(g, p.segments));
  const sim::result r = sim::simulate(p, m);
  CHECK(r.slowest == 1);
  CHECK(r.compute[0] == Approx(r.compute[1] / 2.0).epsilon(1e-9));
  CHECK(r.step_time == Approx(p.step_time + small_all_reduces(c)).epsilon(1e-9));
  // Every device's time is its compute, its collectives and its waits.
  for (std::size_t d = 0; d < 2; ++d)
    CHECK(r.compute[d] + r.communication[d] + r.waiting[d] == Approx(r.end[d]).epsilon(1e-12));
  CHECK(r.end[1] == r.step_time);
  CHECK(r.waiting[0] > 0.4 * r.step_time);
}

TEST_CASE("a blocking collective shares the links with a bucket in flight") {
  sim::detail::bucket_stream s;
  s.post(0.0, 2.0); // [0, 2)
  s.post(1.0, 1.0); // queued behind it: [2, 3)
  // One second of blocking collective from t = 1: with the bucket's last second, both at half
  // rate until t = 3.
  CHECK(s.contend(1.0, 1.0) == Approx(3.0));
  CHECK(s.q[0].end == Approx(3.0));
  CHECK(s.q[1].start == Approx(3.0));
  CHECK(s.q[1].end == Approx(4.0));
  // Nothing in flight after the last bucket: alone.
  CHECK(s.contend(5.0, 1.0) == Approx(6.0));
}

TEST_CASE("the simulated timeline is a trace in the executor's format") {
  const graph::graph g = test::small_bert(8);
  const cluster c = test::make_cluster({2e9, 1e9}, 1e8);
  const plan p = make(g, c, baseline::dp_cp);
  const cost_model m(g, c, segment_map(g, p.segments));
  sim::options o;
  o.traced = {0, 1};
  const sim::result r = sim::simulate(p, m, o);
  const nlohmann::json t = sim::trace_of(r, o, c, {{"simulated", true}});
  REQUIRE(t.contains("traceEvents"));
  double end = 0.0;
  std::size_t compute = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] != "X")
      continue;
    end = std::max(end, e["ts"].get<double>() + e["dur"].get<double>());
    compute += e["cat"] == "compute" ? 1U : 0U;
  }
  CHECK(compute > 2 * p.steps.size());
  CHECK(end == Approx(r.step_time * 1e6).epsilon(1e-9));
  sim::options bad;
  bad.traced = {2};
  CHECK_THROWS_WITH(sim::simulate(p, m, bad), Catch::Contains("traced device 2 of 2"));
}

TEST_CASE("a measured profile's forward shares split each op between the passes") {
  const graph::graph g = test::small_bert(4);
  const cluster c = test::make_cluster({1e9});
  const plan p = make(g, c, baseline::dp_ev);
  compute_profile prof;
  prof.speed = 1e9;
  prof.optimizer_seconds_per_element = 1e-9;
  prof.seconds.assign(g.size(), 1e-3);
  prof.forward.assign(g.size(), 0.25);
  const cost_model m(g, c, segment_map(g, p.segments), prof);
  const sim::result r = sim::simulate(p, m);
  double compute = 0.0;
  for (const plan_step& s : p.steps)
    compute += m.compute_max(s.node, s.rule, p.ratios);
  CHECK(r.forward == Approx(0.25 * compute).epsilon(1e-9));
  CHECK(r.backward == Approx(compute).epsilon(1e-9));
  prof.forward.clear(); // not measured apart: a third
  const cost_model thirds(g, c, segment_map(g, p.segments), prof);
  CHECK(sim::simulate(p, thirds).forward == Approx(compute / 3.0).epsilon(1e-9));
}
