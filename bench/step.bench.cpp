// Single-process training steps, forward + backward + Adam, with the share of time in GEMM-based
// ops (matmul, linear, batched_matmul, conv2d) from the executor's per-op profile:
//   BERT-small (4 layers, hidden 256, FFN 1024, 4 heads, seq 128, batch 16, vocabulary 8192)
//   Llama-small (models::llama_config's defaults: 2 layers, hidden 256, 4 heads, SwiGLU 688,
//   seq 64, vocabulary 2000; batch 16)
//   build/release/bench/bench.step
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/graph/ops.hpp>
#include <hspmd/models/bert.hpp>
#include <hspmd/models/llama.hpp>

#include <benchmark/benchmark.h>

#include <random>
#include <vector>

namespace {

// Trains `g` (inputs "tokens" and "targets" over `vocab`) and reports step time, GFLOP/s,
// tokens/s and the GEMM share.
void train_steps(benchmark::State& state, const hspmd::graph::graph& g, std::size_t tokens_per_step,
                 std::size_t vocab) {
  hspmd::exec::executor<float> ex(g, 1);
  hspmd::exec::adam opt(1e-4);
  std::mt19937_64 rng(1);
  std::vector<std::int64_t> tokens(tokens_per_step);
  std::vector<std::int64_t> targets(tokens_per_step);
  for (auto& v : tokens)
    v = static_cast<std::int64_t>(rng() % vocab);
  for (auto& v : targets)
    v = static_cast<std::int64_t>(rng() % vocab);
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
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens_per_step) *
                                                      static_cast<double>(state.iterations()),
                                                  benchmark::Counter::kIsRate);
}

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
  train_steps(state, hspmd::models::trace_bert_lm<float>(c, batch), batch * c.seq, c.vocab);
}
BENCHMARK(bert_small_step)->Unit(benchmark::kMillisecond)->MinTime(5.0);

void llama_small_step(benchmark::State& state) {
  const hspmd::models::llama_config c; // Llama-small
  constexpr std::size_t batch = 16;
  train_steps(state, hspmd::models::trace_llama_lm<float>(c, batch), batch * c.seq, c.vocab);
}
BENCHMARK(llama_small_step)->Unit(benchmark::kMillisecond)->MinTime(5.0);

} // namespace
