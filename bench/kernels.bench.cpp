// GEMM through hspmd's kernel layer next to cblas_sgemm called directly, on the shapes of one
// BERT-small training step (4 layers, hidden 256, FFN 1024, 4 heads, seq 128, batch 16, vocab
// 8192): forward products and the two backward products of each. Then the element-wise kernels
// of a BERT-small step (FFN 3072, seq 64, batch 16) as the host loop runs them, and Adam's update
// with math::sqrt next to the same update with std::sqrt (which does not vectorize under the
// default -fmath-errno).
//   build/release/bench/bench.kernels
//   build/release/bench/bench.kernels --benchmark_filter='gelu|layer_norm|adam'
#include <hspmd/exec/backends/host.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/kernels/registry.hpp>

#include <benchmark/benchmark.h>

#include <cblas.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
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
  std::vector<float> a(static_cast<std::size_t>(s.m) * static_cast<std::size_t>(s.k), 0.5F);
  std::vector<float> b(static_cast<std::size_t>(s.k) * static_cast<std::size_t>(s.n), 0.25F);
  std::vector<float> c(static_cast<std::size_t>(s.m) * static_cast<std::size_t>(s.n));
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
      benchmark::Counter(2.0 * s.m * s.n * s.k * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.SetLabel(s.name);
}
// The element-wise kernels: one call on BERT-small's tensors (rows = 16 * 64 tokens).
constexpr std::size_t rows = 1024;
constexpr std::size_t ffn = 3072;
constexpr std::size_t hidden = 256;

std::vector<float> ramp(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(i % 1000) / 250.0F - 2.0F;
  return v;
}

void gelu_forward(benchmark::State& state) {
  const auto x = ramp(rows * ffn);
  std::vector<float> y(x.size());
  const hspmd::exec::host_backend be;
  for (auto _ : state) {
    be.for_each_index(x.size(), hspmd::exec::map_forward<hspmd::exec::gelu_math<float>, float>{
                                    {}, x.data(), y.data()});
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(
      static_cast<std::int64_t>(static_cast<std::size_t>(state.iterations()) * x.size() * 8));
}
void gelu_backward(benchmark::State& state) {
  const auto x = ramp(rows * ffn);
  const std::vector<float> y(x.size()), dy(x.size(), 0.1F);
  std::vector<float> dx(x.size());
  const hspmd::exec::host_backend be;
  for (auto _ : state) {
    be.for_each_index(x.size(), hspmd::exec::map_backward<hspmd::exec::gelu_math<float>, float>{
                                    {}, x.data(), y.data(), dy.data(), dx.data()});
    benchmark::DoNotOptimize(dx.data());
  }
  state.SetBytesProcessed(
      static_cast<std::int64_t>(static_cast<std::size_t>(state.iterations()) * x.size() * 12));
}
void layer_norm_backward(benchmark::State& state) {
  const auto x = ramp(rows * hidden);
  const std::vector<float> gamma(hidden, 1.0F), dy(x.size(), 0.1F);
  std::vector<float> dx(x.size()), saved(2 * rows, 0.5F);
  const hspmd::exec::host_backend be;
  for (auto _ : state) {
    hspmd::exec::for_each_row(be, rows,
                              hspmd::exec::layer_norm_row_backward<float>{x.data(), gamma.data(),
                                                                          dy.data(), saved.data(),
                                                                          dx.data(), hidden});
    benchmark::DoNotOptimize(dx.data());
  }
}

// Adam's update as exec::adam_update, with std::sqrt in place of math::sqrt.
struct adam_update_std_sqrt {
  hspmd::exec::adam_update<float> u;
  void operator()(std::size_t i) const {
    const float wi = u.w[i];
    const float gi = u.g[i] * u.scale + u.l2 * wi;
    const float mi = u.b1 * u.m[i] + (1.0F - u.b1) * gi;
    const float vi = u.b2 * u.v[i] + (1.0F - u.b2) * gi * gi;
    u.m[i] = mi;
    u.v[i] = vi;
    u.w[i] = wi * u.keep - u.step_size * mi / (std::sqrt(vi) * u.inv_sqrt_c2 + u.eps);
  }
};
template <bool std_sqrt>
void adam(benchmark::State& state) {
  const std::size_t n = 4723664; // BERT-small's parameters
  std::vector<float> w(n, 0.1F), g(n, 0.01F), m(n), v(n);
  const hspmd::exec::adam_update<float> u{w.data(), g.data(), m.data(), v.data(), 1.0F, 0.9F,
                                          0.999F,   1e-3F,    1.0F,     1e-8F,    1.0F, 0.0F};
  const hspmd::exec::host_backend be;
  for (auto _ : state) {
    if constexpr (std_sqrt)
      be.for_each_index(n, adam_update_std_sqrt{u});
    else
      be.for_each_index(n, u);
    benchmark::DoNotOptimize(w.data());
  }
  state.SetBytesProcessed(
      static_cast<std::int64_t>(static_cast<std::size_t>(state.iterations()) * n * 28));
}

// Registered in pairs (hspmd, then cblas, shape by shape) so both see the same machine state.
const bool registered = [] {
  for (int i = 0; i < static_cast<int>(std::size(shapes)); ++i) {
    benchmark::RegisterBenchmark("gemm_hspmd", gemm<true>)->Arg(i);
    benchmark::RegisterBenchmark("gemm_cblas", gemm<false>)->Arg(i);
  }
  benchmark::RegisterBenchmark("gelu_forward", gelu_forward)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("gelu_backward", gelu_backward)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("layer_norm_backward_rows", layer_norm_backward)
      ->Unit(benchmark::kMillisecond);
  for (int r = 0; r < 3; ++r) { // alternating, so both see the same machine state
    benchmark::RegisterBenchmark("adam_math_sqrt", adam<false>)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("adam_std_sqrt", adam<true>)->Unit(benchmark::kMillisecond);
  }
  return true;
}();

} // namespace
