// The synthesizer's second opinion (synth_options::judge, sim::judge): its final candidates are
// weighed by the judge, and the cost model's pick stands unless the judge finds another faster
// by the margin.
#include <hspmd/sim/step.hpp>
#include <hspmd/synth/plan.hpp>
#include <hspmd/synth/synthesize.hpp>

#include "../../support/test_cluster.hpp"
#include "small_bert.hpp"

#include <catch2/catch.hpp>

#include <cstdint>

using namespace hspmd;
using namespace hspmd::synth;

namespace {

// A plan's program and ratios (the LP's binding rows aside).
std::uint64_t fingerprint(plan p) {
  p.binding.clear();
  return p.hash();
}

synth_options options() {
  synth_options o;
  o.search.max_expansions = 20000;
  return o;
}

} // namespace

TEST_CASE("a judge that agrees with the cost model leaves the cost model's pick") {
  const graph::graph g = test::small_bert(8);
  const cluster c = test::make_cluster({2e9, 1e9}, 1e8);
  const plan plain = synthesize(g, c, options(), "bert");
  synth_options o = options();
  o.judge = [](const plan& p, const cost_model&) { return p.step_time; };
  const plan judged = synthesize(g, c, o, "bert");
  CHECK(judged.hash() == plain.hash());
  CHECK(judged.stats.judged >= 1); // other programs of the loop and the data-parallel one
  CHECK_FALSE(judged.stats.reranked);
  CHECK(judged.stats.judged_step == Approx(plain.step_time).epsilon(1e-12));
  CHECK(plain.stats.judged == 0);
}

TEST_CASE("the judge overrules the cost model where it finds another candidate faster by the "
          "margin") {
  const graph::graph g = test::small_bert(8);
  const cluster c = test::make_cluster({2e9, 1e9}, 1e8);
  const plan plain = synthesize(g, c, options(), "bert");
  const std::uint64_t pick = fingerprint(plain);
  synth_options o = options();
  // Doubles the cost model's pick: any other candidate within 2x of it wins.
  o.judge = [pick](const plan& p, const cost_model&) {
    return fingerprint(p) == pick ? 2.0 * p.step_time : p.step_time;
  };
  const plan judged = synthesize(g, c, o, "bert");
  CHECK(judged.stats.reranked);
  CHECK(fingerprint(judged) != pick);
  CHECK(judged.strategy == "synth");
  CHECK(judged.stats.model_pick_step == Approx(plain.step_time).epsilon(1e-12));
  CHECK(judged.stats.model_pick_judged == Approx(2.0 * plain.step_time).epsilon(1e-12));
  CHECK(judged.stats.judged_step == Approx(judged.step_time).epsilon(1e-12));
  CHECK(judged.step_time >= plain.step_time); // the cost model's pick is its own optimum
  // Within the margin the cost model's pick stands.
  o.judge = [pick](const plan& p, const cost_model&) {
    return fingerprint(p) == pick ? p.step_time : 0.995 * p.step_time;
  };
  o.judge_margin = 0.5;
  CHECK(fingerprint(synthesize(g, c, o, "bert")) == pick);
  // The choice survives the plan file.
  const plan back = plan_from_json(to_json(judged), g, "judged plan");
  CHECK(back.stats.reranked);
  CHECK(back.stats.judged_step == Approx(judged.stats.judged_step).epsilon(1e-12));
}

TEST_CASE("weighed by the simulated step, the pick simulates no slower than the cost model's pick "
          "or the data-parallel plan at speed-proportional ratios") {
  const graph::graph g = test::small_bert(8);
  for (double overlap : {0.0, 0.8}) {
    cluster c = test::make_cluster({3e9, 1e9}, 3e8);
    c.overlap = overlap;
    CAPTURE(overlap);
    const plan plain = synthesize(g, c, options(), "bert");
    const plan dp = make_baseline(g, c, baseline::dp_cp, options(), "bert");
    synth_options o = options();
    o.judge = sim::judge();
    const plan judged = synthesize(g, c, o, "bert");
    const cost_model m(g, c, segment_map(g, judged.segments));
    const double mine = sim::simulate(judged, m).step_time;
    CHECK(mine == Approx(judged.stats.judged_step).epsilon(1e-12));
    CHECK(mine <= sim::simulate(plain, m).step_time * (1.0 + 1e-9));
    CHECK(mine <= sim::simulate(dp, m).step_time * (1.0 + 1e-9));
    if (judged.stats.reranked)
      CHECK(mine < (1.0 - o.judge_margin) * sim::simulate(plain, m).step_time * (1.0 + 1e-9));
  }
}
