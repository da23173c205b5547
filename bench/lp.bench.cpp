// The LP solver on the problems hspmd solves: random dense LPs, and the sharding-ratio LP in its
// collapsed and full forms, cold and warm (re-solve after one device slows down by 20%).
//   build/release/bench/bench.lp
#include <hspmd/lp/simplex.hpp>
#include <hspmd/synth/ratio_lp.hpp>

#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

namespace {

hspmd::lp::problem random_dense(std::size_t m, std::size_t n, std::uint64_t seed) {
  using namespace hspmd::lp;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  problem p;
  for (std::size_t j = 0; j < n; ++j)
    p.add_variable("x" + std::to_string(j), 0.0, 10.0, -u(rng));
  for (std::size_t i = 0; i < m; ++i) {
    std::vector<term> t;
    for (std::size_t j = 0; j < n; ++j)
      t.push_back({j, u(rng)});
    p.add_row("r" + std::to_string(i), t, relation::less_equal, static_cast<double>(n) * 2.0);
  }
  return p;
}

void dense_lp(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto p = random_dense(n, n, 1);
  std::size_t iterations = 0;
  for (auto _ : state) {
    const auto r = hspmd::lp::solve(p);
    iterations = r.iterations;
    benchmark::DoNotOptimize(r.objective);
  }
  state.counters["pivots"] = static_cast<double>(iterations);
}
BENCHMARK(dense_lp)->Arg(20)->Arg(60)->Unit(benchmark::kMillisecond);

// `steps` steps x `devices` devices; proportional costs collapse, jittered ones need the full form.
hspmd::synth::ratio_problem ratio(std::size_t steps, std::size_t devices, bool proportional,
                                  double slow = 1.0) {
  using namespace hspmd::synth;
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.5, 1.5);
  ratio_problem p;
  p.segments = {"batch"};
  std::vector<double> speed;
  for (std::size_t d = 0; d < devices; ++d) {
    p.devices.push_back("gpu" + std::to_string(d));
    speed.push_back(d < devices / 4 ? 1.8 : 1.0); // HAP: a quarter of V100s among P100s
  }
  speed[devices - 1] /= slow;
  for (std::size_t k = 0; k < steps; ++k) {
    ratio_step st;
    st.name = "k" + std::to_string(k);
    const double work = u(rng) * 1e-2;
    for (std::size_t d = 0; d < devices; ++d) {
      const double jitter = proportional ? 1.0 : u(rng);
      st.compute.push_back({0.0, {{0, work * jitter / speed[d]}}});
      st.comm.push_back({1e-5, {{0, work * 0.1}}});
    }
    p.steps.push_back(st);
  }
  return p;
}

void ratio_lp(benchmark::State& state) {
  const auto steps = static_cast<std::size_t>(state.range(0));
  const auto devices = static_cast<std::size_t>(state.range(1));
  const bool proportional = state.range(2) != 0;
  const bool warm = state.range(3) != 0;
  const auto p = ratio(steps, devices, proportional);
  const auto slower = ratio(steps, devices, proportional, 1.2);
  const auto base = hspmd::synth::solve_ratios(p);
  std::size_t iterations = 0;
  for (auto _ : state) {
    const auto r = hspmd::synth::solve_ratios(slower, {}, warm ? &base.basis : nullptr);
    iterations = r.iterations;
    benchmark::DoNotOptimize(r.step_time);
  }
  state.counters["pivots"] = static_cast<double>(iterations);
  state.SetLabel(std::string(proportional ? "collapsed" : "full") + (warm ? ", warm" : ", cold"));
}
BENCHMARK(ratio_lp)
    ->Args({100, 64, 1, 0})
    ->Args({100, 64, 1, 1})
    ->Args({100, 16, 0, 0})
    ->Args({100, 16, 0, 1})
    ->Args({50, 64, 0, 0})
    ->Args({50, 64, 0, 1})
    ->Unit(benchmark::kMillisecond);

} // namespace
