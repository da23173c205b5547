// GEMM through hspmd's kernel layer next to cblas_sgemm called directly, on the shapes of one
// BERT-small training step (4 layers, hidden 256, FFN 1024, 4 heads, seq 128, batch 16, vocab
// 8192): forward products and the two backward products of each.
//   build/release/bench/bench.kernels
#include <hspmd/exec/backends/host.hpp>

#include <benchmark/benchmark.h>

#include <cblas.h>

#include <iterator>
#include <vector>

namespace {

struct shape {
  const char* name;
  int m, n, k;
  bool ta, tb;
};

// tokens = 16 * 128 = 2048
constexpr shape shapes[] = {
    {"qkv x.W", 2048, 768, 256, false, false},
    {"qkv dX=dY.W^T", 2048, 256, 768, false, true},
    {"qkv dW=X^T.dY", 256, 768, 2048, true, false},
    {"scores q.k^T (x64)", 128, 128, 64, false, true},
    {"context p.v (x64)", 128, 64, 128, false, false},
    {"out x.W", 2048, 256, 256, false, false},
    {"ffn1 x.W", 2048, 1024, 256, false, false},
    {"ffn1 dW=X^T.dY", 256, 1024, 2048, true, false},
    {"ffn2 x.W", 2048, 256, 1024, false, false},
    {"ffn2 dX=dY.W^T", 2048, 1024, 256, false, true},
    {"lm head x.W", 2048, 8192, 256, false, false},
    {"lm head dW=X^T.dY", 256, 8192, 2048, true, false},
};

template <bool through_hspmd>
void gemm(benchmark::State& state) {
  const shape& s = shapes[state.range(0)];
  std::vector<float> a(static_cast<std::size_t>(s.m) * s.k, 0.5F);
  std::vector<float> b(static_cast<std::size_t>(s.k) * s.n, 0.25F);
  std::vector<float> c(static_cast<std::size_t>(s.m) * s.n);
  const int lda = s.ta ? s.m : s.k;
  const int ldb = s.tb ? s.k : s.n;
  hspmd::exec::init_blas_threads(); // both variants run with one BLAS thread
  for (auto _ : state) {
    if constexpr (through_hspmd) {
      hspmd::exec::gemm(s.ta ? hspmd::exec::transpose::yes : hspmd::exec::transpose::no,
                        s.tb ? hspmd::exec::transpose::yes : hspmd::exec::transpose::no,
                        static_cast<std::size_t>(s.m), static_cast<std::size_t>(s.n),
                        static_cast<std::size_t>(s.k), 1.0F, a.data(),
                        static_cast<std::size_t>(lda), b.data(), static_cast<std::size_t>(ldb),
                        0.0F, c.data(), static_cast<std::size_t>(s.n));
    } else {
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                  s.m, s.n, s.k, 1.0F, a.data(), lda, b.data(), ldb, 0.0F, c.data(), s.n);
    }
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * s.m * s.n * s.k * state.iterations(), benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1000);
  state.SetLabel(s.name);
}
// Registered in pairs (hspmd, then cblas, shape by shape) so both see the same machine state.
const bool registered = [] {
  for (int i = 0; i < static_cast<int>(std::size(shapes)); ++i) {
    benchmark::RegisterBenchmark("gemm_hspmd", gemm<true>)->Arg(i);
    benchmark::RegisterBenchmark("gemm_cblas", gemm<false>)->Arg(i);
  }
  return true;
}();

} // namespace
