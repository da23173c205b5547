// Single-process training step of BERT-small (4 layers, hidden 256, FFN 1024, 4 heads, seq 128,
// batch 16, vocabulary 8192): forward + backward + Adam, with the share of time in GEMM-based ops
// (matmul, linear, batched_matmul, conv2d) from the executor's per-op profile.
//   build/release/bench/bench.step
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/graph/ops.hpp>
#include <hspmd/models/bert.hpp>

#include <benchmark/benchmark.h>

#include <random>
#include <vector>

namespace {

void bert_small_step(benchmark::State& state) {
  hspmd::models::bert_config c;
  c.layers = 4;
  c.hidden = 256;
  c.ffn = 1024;
  c.heads = 4;
  c.seq = 128;
  c.vocab = 8192;
  c.dropout = 0.1;
  constexpr std::size_t batch = 16;
  const auto g = hspmd::models::trace_bert_lm<float>(c, batch);
  hspmd::exec::executor<float> ex(g, 1);
  hspmd::exec::adam opt(1e-4);
  std::mt19937_64 rng(1);
  std::vector<std::int64_t> tokens(batch * c.seq);
  std::vector<std::int64_t> targets(batch * c.seq);
  for (auto& v : tokens)
    v = static_cast<std::int64_t>(rng() % c.vocab);
  for (auto& v : targets)
    v = static_cast<std::int64_t>(rng() % c.vocab);
  ex.set_input("tokens", tokens);
  ex.set_input("targets", targets);
  ex.set_profiling(true);
  std::uint64_t step = 0;
  for (auto _ : state) {
    ex.set_step(step++);
    benchmark::DoNotOptimize(ex.forward());
    ex.backward();
    opt.step(ex);
  }
  double total = 0.0;
  double gemm = 0.0;
  for (std::size_t k = 0; k < hspmd::graph::op_count; ++k) {
    const auto& e = ex.profile()[k];
    total += e.forward + e.backward;
    const auto o = static_cast<hspmd::graph::op>(k);
    if (o == hspmd::graph::op::matmul || o == hspmd::graph::op::linear ||
        o == hspmd::graph::op::batched_matmul || o == hspmd::graph::op::conv2d)
      gemm += e.forward + e.backward;
  }
  const auto cost = hspmd::graph::total_cost(g);
  state.counters["gemm_share_of_graph_time"] = gemm / total;
  state.counters["GFLOP/s"] = benchmark::Counter(
      (cost.forward_flops + cost.backward_flops) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(batch * c.seq) *
                                                      static_cast<double>(state.iterations()),
                                                  benchmark::Counter::kIsRate);
}
BENCHMARK(bert_small_step)->Unit(benchmark::kMillisecond)->MinTime(5.0);

} // namespace
