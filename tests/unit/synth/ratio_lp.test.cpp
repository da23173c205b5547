#include <hspmd/synth/ratio_lp.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

using namespace hspmd;
using namespace hspmd::synth;

namespace {
// `steps` steps on one segment, compute = work_k / speed_d * r_d (+ communication likewise).
ratio_problem proportional(const std::vector<double>& speed, std::size_t steps,
                           double comm_per_step = 0.0) {
  ratio_problem p;
  p.segments = {"batch"};
  for (std::size_t d = 0; d < speed.size(); ++d)
    p.devices.push_back("gpu" + std::to_string(d));
  for (std::size_t k = 0; k < steps; ++k) {
    ratio_step st;
    st.name = "step" + std::to_string(k);
    const double work = 1e12 * static_cast<double>(k + 1); // flops of the whole batch
    for (double s : speed) {
      st.compute.push_back({0.0, {{0, work / s}}});
      if (comm_per_step > 0.0)
        st.comm.push_back({1e-5, {{0, comm_per_step}}});
    }
    p.steps.push_back(st);
  }
  return p;
}

double model_cost(const ratio_problem& p, const std::vector<std::vector<double>>& r) {
  double total = 0.0;
  for (const auto& st : p.steps) {
    double c = 0.0;
    double m = 0.0;
    for (std::size_t d = 0; d < st.compute.size(); ++d)
      c = std::max(c, synth::detail::evaluate(st.compute[d], r, d));
    for (std::size_t d = 0; d < st.comm.size(); ++d)
      m = std::max(m, synth::detail::evaluate(st.comm[d], r, d));
    total += c + m;
  }
  return total;
}
} // namespace

TEST_CASE("identical devices get equal ratios, as one class in the collapsed form") {
  for (std::size_t n : {1UL, 2UL, 3UL, 8UL}) {
    const auto p = proportional(std::vector<double>(n, 1.4e13), 5, 2e-3);
    const auto s = solve_ratios(p);
    REQUIRE(s.status == lp::status::optimal);
    CHECK(s.collapsed);
    for (double r : s.ratios[0])
      CHECK(r == Approx(1.0 / static_cast<double>(n)));
    CHECK(s.step_time == Approx(model_cost(p, s.ratios)));
    for (const auto& b : s.bottlenecks) // one entry per step and kind, naming the class
      CHECK(b.identical == n);
    CHECK(s.bottlenecks.size() == 10);
  }
}

TEST_CASE("a device two times faster gets 2/3 (compute-bound), in both forms") {
  const auto p = proportional({2.8e13, 1.4e13}, 4);
  for (const bool collapse : {true, false}) {
    ratio_options o;
    o.collapse = collapse;
    const auto s = solve_ratios(p, o);
    REQUIRE(s.status == lp::status::optimal);
    CHECK(s.collapsed == collapse);
    CHECK(s.ratios[0][0] == Approx(2.0 / 3.0));
    CHECK(s.ratios[0][1] == Approx(1.0 / 3.0));
    // Both devices finish together: the duals blame both computes in every step, 2:1.
    double share0 = 0.0;
    double share1 = 0.0;
    for (const auto& b : s.bottlenecks) {
      CHECK(b.what == bottleneck::kind::compute);
      CHECK_THAT(b.text, Catch::Contains(" binds (LP dual ") && !Catch::Contains("share"));
      (b.device == 0 ? share0 : share1) += b.dual;
    }
    CHECK(share0 + share1 == Approx(4.0)); // one unit of blame per step
    // HAP's testbed ratio: V100 1.8x a P100 -> 1.8 / 2.8 of the batch.
    const auto hap = solve_ratios(proportional({1.8, 1.0}, 3), o);
    CHECK(hap.ratios[0][0] == Approx(1.8 / 2.8));
  }
}

TEST_CASE("a binding memory cap limits that device, and the duals name it") {
  auto p = proportional({2.8e13, 1.4e13}, 3);
  p.memory = {{2e9, {{0, 1e10}}}, {2e9, {{0, 1e10}}}}; // 2 GB fixed + 10 GB for the whole batch
  p.capacity = {6e9, 32e9};                            // the fast device has only 6 GB
  const auto s = solve_ratios(p);
  REQUIRE(s.status == lp::status::optimal);
  CHECK(s.ratios[0][0] == Approx(0.4)); // (6 - 2) / 10
  CHECK(s.ratios[0][1] == Approx(0.6));
  const auto mem =
      std::find_if(s.bottlenecks.begin(), s.bottlenecks.end(),
                   [](const bottleneck& b) { return b.what == bottleneck::kind::memory; });
  REQUIRE(mem != s.bottlenecks.end());
  CHECK(mem->device == 0);
  CHECK_THAT(mem->text, Catch::Contains("device gpu0: memory binds"));
  // Its dual is the step time one more byte of capacity would save.
  auto more = p;
  more.capacity[0] += 1e6;
  const auto s2 = solve_ratios(more);
  CHECK((s.step_time - s2.step_time) / 1e6 == Approx(-mem->dual).epsilon(1e-6));
  // The slow device is the compute bottleneck now.
  for (const auto& b : s.bottlenecks)
    if (b.what == bottleneck::kind::compute)
      CHECK(b.device == 1);
}

TEST_CASE("memory too small for any split is infeasible, naming the device and bytes") {
  auto p = proportional({1.4e13, 1.4e13}, 2);
  p.memory = {{1e9, {{0, 16e9}}}, {1e9, {{0, 16e9}}}};
  p.capacity = {8e9, 8e9}; // each holds at most (8 - 1) / 16 = 43.75%
  const auto s = solve_ratios(p);
  CHECK(s.status == lp::status::infeasible);
  CHECK_THAT(s.message, Catch::Contains("segment batch fits at most 87.5%"));
  CHECK_THAT(s.message, Catch::Contains("gpu0 at most 43.8%"));
  CHECK_THAT(s.message, Catch::Contains("GiB"));
  p.memory[1].constant = 9e9; // more than gpu1 has before any shard
  const auto s2 = solve_ratios(p);
  CHECK(s2.status == lp::status::infeasible);
  CHECK_THAT(s2.message, Catch::StartsWith("device gpu1 needs 8.382 GiB before any shard but has "
                                           "7.451 GiB"));
}

TEST_CASE("general programs (several segments, non-proportional costs) match a grid search") {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(0.1, 2.0);
  for (int trial = 0; trial < 40; ++trial) {
    ratio_problem p;
    p.segments = {"batch", "heads"};
    p.devices = {"a", "b"};
    for (int k = 0; k < 6; ++k) {
      ratio_step st;
      st.name = "k" + std::to_string(k);
      for (int d = 0; d < 2; ++d) {
        linear_cost c{u(rng) * 1e-3, {{static_cast<std::size_t>(k % 2), u(rng)}}};
        if (k == 5) // one step depends on both segments
          c.terms.push_back({1, u(rng)});
        st.compute.push_back(c);
        st.comm.push_back({u(rng) * 1e-4, {{0, u(rng) * 0.1}}});
      }
      p.steps.push_back(st);
    }
    const auto s = solve_ratios(p);
    REQUIRE(s.status == lp::status::optimal);
    CHECK_FALSE(s.collapsed);
    CHECK(s.step_time == Approx(model_cost(p, s.ratios)).epsilon(1e-9));
    double best = 1e300;
    for (int i = 0; i <= 100; ++i)
      for (int j = 0; j <= 100; ++j) {
        const double x = i / 100.0;
        const double y = j / 100.0;
        best = std::min(best, model_cost(p, {{x, 1 - x}, {y, 1 - y}}));
      }
    CAPTURE(trial, s.step_time, best);
    CHECK(s.step_time <= best + 1e-12);
    CHECK(s.step_time >= best - 0.02 * best); // the grid is within 1% of a vertex
  }
}

TEST_CASE("full-form LPs solve, and re-solve warm after a device slows down") {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0.5, 1.5);
  ratio_problem p;
  p.segments = {"batch"};
  const std::size_t devices = 8; // bench/lp.bench.cpp times the HAP-sized ones
  for (std::size_t d = 0; d < devices; ++d)
    p.devices.push_back("gpu" + std::to_string(d));
  for (std::size_t k = 0; k < 40; ++k) {
    ratio_step st;
    st.name = "k" + std::to_string(k);
    for (std::size_t d = 0; d < devices; ++d) {
      st.compute.push_back({u(rng) * 1e-5, {{0, u(rng) * 1e-2}}}); // not proportional: full form
      st.comm.push_back({1e-5, {{0, u(rng) * 1e-3}}});
    }
    p.steps.push_back(st);
  }
  const auto s = solve_ratios(p); // 641 rows, 88 columns: through the dual
  REQUIRE(s.status == lp::status::optimal);
  CHECK_FALSE(s.collapsed);
  double sum = 0.0;
  for (double r : s.ratios[0])
    sum += r;
  CHECK(sum == Approx(1.0));
  CHECK(s.step_time == Approx(model_cost(p, s.ratios)).epsilon(1e-9));
  // Device 3 becomes 20% slower: costs change, the old basis stays a good start.
  auto slower = p;
  for (auto& st : slower.steps)
    st.compute[3].terms[0].second *= 1.2;
  const auto cold = solve_ratios(slower);
  const auto warm = solve_ratios(slower, {}, &s.basis);
  REQUIRE(warm.status == lp::status::optimal);
  CHECK(warm.step_time == Approx(cold.step_time).epsilon(1e-9));
  CHECK(warm.ratios[0][3] < s.ratios[0][3]);
  CHECK(warm.iterations * 4 < cold.iterations);
  WARN("ratio LP 40 steps x 8 devices: cold " << cold.iterations << " iterations, warm "
                                              << warm.iterations);
}

TEST_CASE("malformed ratio problems are refused with the step and device") {
  auto p = proportional({1.0, 1.0}, 1);
  p.steps[0].compute[1].terms[0].second = -1.0;
  CHECK_THROWS_WITH(solve_ratios(p), Catch::Contains("step \"step0\" compute on gpu1"));
  p = proportional({1.0, 1.0}, 1);
  p.steps[0].compute.pop_back();
  CHECK_THROWS_AS(solve_ratios(p), plan_error);
}
