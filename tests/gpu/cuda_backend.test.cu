// The CUDA backend against the host backend, call by call: zeroed buffers and copies, kernel
// functors through the grid-stride launcher (GELU forward and backward, dropout masks drawn by
// the same Philox functor, which must equal the host's bit for bit), cuBLAS GEMMs for every
// transpose pair, padded leading dimensions and batches in f32 and f64, bf16 and f16 GEMMs against
// the host's GEMM of rounded operands, every op of the registry forward and backward in f32 and
// bf16, event timing, the caching
// allocator's counters, the error for a device that does not exist; then an MLP trained by the
// executor and Adam with clipping on the device against the same on the host.
//
// Built wherever nvcc is found; without a CUDA device it exits 77 (skipped) before any check.
// Where this project is built there is no GPU: this test is compiled, never run, there.

#include <hspmd/exec/backends/cuda.cuh>
#include <hspmd/exec/backends/host.hpp>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/kernels/activation.hpp>
#include <hspmd/kernels/elementwise.hpp>
#include <hspmd/kernels/normalization.hpp>
#include <hspmd/kernels/precision.hpp>
#include <hspmd/models/mlp.hpp>

#include "../support/op_by_op.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::printf("FAILED: %s\n", what.c_str());
  }
}

template <class T>
std::vector<T> to_host(hspmd::exec::cuda_backend& gpu, const T* p, std::size_t n) {
  std::vector<T> out(n);
  gpu.copy_to_host(out.data(), p, n);
  return out;
}

template <class T>
std::vector<T> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-3, 3);
  std::vector<T> v(n);
  for (T& x : v)
    x = static_cast<T>(u(rng));
  return v;
}

void buffers_and_copies(hspmd::exec::cuda_backend& gpu) {
  auto b = gpu.allocate<float>(1000);
  const auto zero = to_host(gpu, b.data(), 1000);
  bool all_zero = true;
  for (float v : zero)
    all_zero = all_zero && v == 0.0F;
  check(all_zero, "allocate zeroes the buffer");
  const auto values = random_values<float>(1000, 1);
  gpu.copy_from_host(b.data(), values.data(), values.size());
  check(to_host(gpu, b.data(), 1000) == values, "copy_from_host then copy_to_host round-trips");
  auto ids = gpu.allocate<std::int64_t>(7);
  hspmd::exec::fill(gpu, ids.data(), 7, std::int64_t{-5});
  check(to_host(gpu, ids.data(), 7) == std::vector<std::int64_t>(7, -5), "fill on int64");
}

template <class T>
void gelu_matches_host(hspmd::exec::cuda_backend& gpu) {
  using namespace hspmd::exec;
  host_backend host;
  const std::size_t n = 100003; // not a multiple of a block
  const auto x = random_values<T>(n, 2);
  const auto dy = random_values<T>(n, 3);
  std::vector<T> y_host(n), dx_host(n, T{0});
  for_each_index(host, n, map_forward<gelu_math<T>, T>{{}, x.data(), y_host.data()});
  for_each_index(
      host, n,
      map_backward<gelu_math<T>, T>{{}, x.data(), y_host.data(), dy.data(), dx_host.data()});
  auto xd = gpu.allocate<T>(n), yd = gpu.allocate<T>(n), dyd = gpu.allocate<T>(n),
       dxd = gpu.allocate<T>(n);
  gpu.copy_from_host(xd.data(), x.data(), n);
  gpu.copy_from_host(dyd.data(), dy.data(), n);
  for_each_index(gpu, n, map_forward<gelu_math<T>, T>{{}, xd.data(), yd.data()});
  for_each_index(gpu, n,
                 map_backward<gelu_math<T>, T>{{}, xd.data(), yd.data(), dyd.data(), dxd.data()});
  const auto y = to_host(gpu, yd.data(), n);
  const auto dx = to_host(gpu, dxd.data(), n);
  // The same functor and math on both sides; only FMA contraction may differ.
  const double tol = sizeof(T) == 4 ? 4e-7 : 1e-15;
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(y[i] - y_host[i])) /
                                (1 + std::abs(static_cast<double>(y_host[i]))));
    worst = std::max(worst, std::abs(static_cast<double>(dx[i] - dx_host[i])) /
                                (1 + std::abs(static_cast<double>(dx_host[i]))));
  }
  check(worst <= tol, "GELU on the device equals the host's (worst " + std::to_string(worst) + ")");
}

void dropout_masks_equal_host(hspmd::exec::cuda_backend& gpu) {
  using namespace hspmd::exec;
  host_backend host;
  const std::size_t blocks = 25000;
  const std::size_t n = 4 * blocks;
  const auto x = random_values<float>(n, 4);
  const hspmd::rng_key key{0x1234, 17};
  const std::uint64_t threshold = 1288490189; // ceil(0.3 * 2^32)
  const float keep = 1.0F / 0.7F;
  std::vector<float> mask_host(n), out_host(n);
  for_each_index(
      host, blocks,
      dropout_aligned<float>{key, 5, threshold, keep, x.data(), mask_host.data(), out_host.data()});
  auto xd = gpu.allocate<float>(n), md = gpu.allocate<float>(n), od = gpu.allocate<float>(n);
  gpu.copy_from_host(xd.data(), x.data(), n);
  for_each_index(gpu, blocks,
                 dropout_aligned<float>{key, 5, threshold, keep, xd.data(), md.data(), od.data()});
  check(to_host(gpu, md.data(), n) == mask_host, "dropout masks equal the host's bit for bit");
  check(to_host(gpu, od.data(), n) == out_host, "dropout outputs equal the host's bit for bit");
}

template <class T>
void gemm_matches_host(hspmd::exec::cuda_backend& gpu) {
  using namespace hspmd::exec;
  host_backend host;
  for (const transpose ta : {transpose::no, transpose::yes})
    for (const transpose tb : {transpose::no, transpose::yes}) {
      const std::size_t m = 37, n = 53, k = 29, batch = 3;
      const std::size_t lda = (ta == transpose::no ? k : m) + 3;
      const std::size_t ldb = (tb == transpose::no ? n : k) + 1;
      const std::size_t ldc = n + 2;
      const std::size_t sa = (ta == transpose::no ? m : k) * lda;
      const std::size_t sb = (tb == transpose::no ? k : n) * ldb;
      const std::size_t sc = m * ldc;
      const auto a = random_values<T>(batch * sa, 5);
      const auto b = random_values<T>(batch * sb, 6);
      const auto c0 = random_values<T>(batch * sc, 7);
      std::vector<T> want = c0;
      host.gemm_strided_batched(ta, tb, m, n, k, T(0.5), a.data(), lda, sa, b.data(), ldb, sb,
                                T(-1), want.data(), ldc, sc, batch);
      auto ad = gpu.allocate<T>(a.size()), bd = gpu.allocate<T>(b.size()),
           cd = gpu.allocate<T>(c0.size());
      gpu.copy_from_host(ad.data(), a.data(), a.size());
      gpu.copy_from_host(bd.data(), b.data(), b.size());
      gpu.copy_from_host(cd.data(), c0.data(), c0.size());
      gpu.gemm_strided_batched(ta, tb, m, n, k, T(0.5), ad.data(), lda, sa, bd.data(), ldb, sb,
                               T(-1), cd.data(), ldc, sc, batch);
      const auto got = to_host(gpu, cd.data(), c0.size());
      // One product alone, through gemm, must equal the first of the batch.
      gpu.copy_from_host(cd.data(), c0.data(), c0.size());
      gpu.gemm(ta, tb, m, n, k, T(0.5), ad.data(), lda, bd.data(), ldb, T(-1), cd.data(), ldc);
      const auto one = to_host(gpu, cd.data(), sc);
      const double tol = sizeof(T) == 4 ? 2e-4 : 1e-12; // TF32 is off: cuBLAS's default is fp32
      double worst = 0, worst_one = 0;
      for (std::size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(got[i] - want[i])));
      for (std::size_t i = 0; i < sc; ++i)
        worst_one = std::max(worst_one, std::abs(static_cast<double>(one[i] - want[i])));
      const std::string what = std::string(sizeof(T) == 4 ? "f32" : "f64") + " gemm " +
                               (ta == transpose::yes ? "T" : "N") +
                               (tb == transpose::yes ? "T" : "N");
      check(worst <= tol,
            what + " strided-batched equals the host (worst " + std::to_string(worst) + ")");
      check(worst_one <= tol, what + " equals the host (worst " + std::to_string(worst_one) + ")");
    }
}

// 16-bit GEMMs: the device's native bf16/f16 GEMM (cuBLAS, float accumulation) against the host's
// float GEMM of the rounded operands (kernels/precision.hpp): equal up to the order of the sums
// (the products are exact), for every transpose pair, padding and batches.
void gemm_16_matches_host(hspmd::exec::cuda_backend& gpu) {
  using namespace hspmd::exec;
  host_backend host;
  for (const precision p : {precision::bf16, precision::f16})
    for (const transpose ta : {transpose::no, transpose::yes})
      for (const transpose tb : {transpose::no, transpose::yes}) {
        const std::size_t m = 37, n = 53, k = 129, batch = 3;
        const std::size_t lda = (ta == transpose::no ? k : m) + 3;
        const std::size_t ldb = (tb == transpose::no ? n : k) + 1;
        const std::size_t sa = (ta == transpose::no ? m : k) * lda;
        const std::size_t sb = (tb == transpose::no ? k : n) * ldb;
        const auto a = random_values<float>(batch * sa, 8);
        const auto b = random_values<float>(batch * sb, 9);
        std::vector<float> want(batch * m * n, 0.0F);
        gemm_strided_batched_in(host, p, ta, tb, m, n, k, 1.0F, a.data(), lda, sa, b.data(), ldb,
                                sb, 0.0F, want.data(), n, m * n, batch);
        auto ad = gpu.allocate<float>(a.size()), bd = gpu.allocate<float>(b.size()),
             cd = gpu.allocate<float>(want.size());
        gpu.copy_from_host(ad.data(), a.data(), a.size());
        gpu.copy_from_host(bd.data(), b.data(), b.size());
        gemm_strided_batched_in(gpu, p, ta, tb, m, n, k, 1.0F, ad.data(), lda, sa, bd.data(), ldb,
                                sb, 0.0F, cd.data(), n, m * n, batch);
        const auto got = to_host(gpu, cd.data(), want.size());
        double worst = 0, scale = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
          worst = std::max(worst, std::abs(static_cast<double>(got[i] - want[i])));
          scale = std::max(scale, std::abs(static_cast<double>(want[i])));
        }
        check(worst <= 1e-5 * scale, std::string(name(p)) + " gemm " +
                                         (ta == transpose::yes ? "T" : "N") +
                                         (tb == transpose::yes ? "T" : "N") +
                                         " equals the host's of rounded operands (worst " +
                                         std::to_string(worst / scale) + " relative)");
      }
}

// Every op of the registry, forward and backward, on the device against the host
// (tests/support/op_by_op.hpp): f32 to 1e-5, bf16 to 2e-2 of each tensor's magnitude.
void every_op_matches_host(int device) {
  using namespace hspmd::exec;
  for (const precision p : {precision::f32, precision::bf16}) {
    const double tol = p == precision::f32 ? 1e-5 : 2e-2;
    const auto diffs =
        hspmd::test::compare_every_op<cuda_backend>([device] { return cuda_backend(device); }, p);
    check(diffs.size() >= 80, "op-by-op: every example call compared");
    double worst = 0;
    for (const auto& d : diffs) {
      check(d.error <= tol, std::string(name(p)) + " " + d.what + " equals the host's (" +
                                std::to_string(d.error) + " relative)");
      worst = std::max(worst, d.error);
    }
    std::printf("op-by-op %s: %zu tensors compared, worst relative difference %.3g (tolerance "
                "%.0e)\n",
                std::string(name(p)).c_str(), diffs.size(), worst, tol);
  }
}

// Row functors with 16 threads a row on the device against one thread a row on the host: an
// odd row count, rows shorter than, not a multiple of and longer than the team, causal softmax.
void rows_match_host(hspmd::exec::cuda_backend& gpu) {
  using namespace hspmd::exec;
  host_backend host;
  for (const std::size_t len : {std::size_t{5}, std::size_t{37}, std::size_t{300}}) {
    const std::size_t rows = 41;
    const auto x = random_values<float>(rows * len, 30);
    const auto gamma = random_values<float>(len, 31);
    const auto beta = random_values<float>(len, 32);
    std::vector<float> y_host(rows * len), saved_host(2 * rows), soft_host(rows * len);
    for_each_row(host, rows,
                 layer_norm_row<float>{x.data(), gamma.data(), beta.data(), y_host.data(),
                                       saved_host.data(), len, 1e-5F});
    for_each_row(host, rows,
                 softmax_row<float, false>{x.data(), soft_host.data(), len, true, len, 0});
    auto xd = gpu.allocate<float>(x.size()), gd = gpu.allocate<float>(len),
         bd = gpu.allocate<float>(len), yd = gpu.allocate<float>(x.size()),
         sd = gpu.allocate<float>(2 * rows), softd = gpu.allocate<float>(x.size());
    gpu.copy_from_host(xd.data(), x.data(), x.size());
    gpu.copy_from_host(gd.data(), gamma.data(), len);
    gpu.copy_from_host(bd.data(), beta.data(), len);
    for_each_row(
        gpu, rows,
        layer_norm_row<float>{xd.data(), gd.data(), bd.data(), yd.data(), sd.data(), len, 1e-5F});
    for_each_row(gpu, rows, softmax_row<float, false>{xd.data(), softd.data(), len, true, len, 0});
    const auto y = to_host(gpu, yd.data(), x.size());
    const auto saved = to_host(gpu, sd.data(), 2 * rows);
    const auto soft = to_host(gpu, softd.data(), x.size());
    double worst = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(y[i] - y_host[i])));
      worst = std::max(worst, std::abs(static_cast<double>(soft[i] - soft_host[i])));
    }
    for (std::size_t i = 0; i < saved.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(saved[i] - saved_host[i])) /
                                  (1 + std::abs(static_cast<double>(saved_host[i]))));
    check(worst <= 1e-5, "layer norm and causal softmax rows of " + std::to_string(len) +
                             " equal the host's (worst " + std::to_string(worst) + ")");
  }
}

// k == 0: C = beta C, exact zeros for beta 0 (cuBLAS would refuse the zero leading dimension).
void empty_products(hspmd::exec::cuda_backend& gpu) {
  using namespace hspmd::exec;
  const std::vector<float> c0{1, 2, 3, 4, 5, 6};
  auto cd = gpu.allocate<float>(6);
  gpu.copy_from_host(cd.data(), c0.data(), 6);
  gpu.gemm(transpose::no, transpose::no, 2, 3, 0, 1.0F, cd.data(), 0, cd.data(), 3, 2.0F, cd.data(),
           3);
  check(to_host(gpu, cd.data(), 6) == std::vector<float>{2, 4, 6, 8, 10, 12}, "k = 0: C = beta C");
  gpu.gemm_strided_batched(transpose::no, transpose::no, 1, 3, 0, 1.0F, cd.data(), 0, 0, cd.data(),
                           3, 0, 0.0F, cd.data(), 3, 3, 2);
  check(to_host(gpu, cd.data(), 6) == std::vector<float>(6, 0.0F), "k = 0, beta 0: zeros");
}

void timing_and_memory(hspmd::exec::cuda_backend& gpu) {
  using namespace hspmd::exec;
  const std::size_t n = std::size_t{1} << 24;
  auto a = gpu.allocate<float>(n);
  const double s = gpu.timed([&] { fill(gpu, a.data(), n, 1.0F); });
  check(s > 0 && s < 1, "timed returns the device's seconds (" + std::to_string(s) + ")");
  const memory_stats m = gpu.memory();
  check(m.allocated_bytes >= n * sizeof(float), "allocated bytes count the live buffer");
  check(m.reserved_bytes >= m.allocated_bytes, "reserved >= allocated");
  check(m.peak_reserved_bytes >= m.reserved_bytes, "peak >= reserved");
  const auto before = gpu.memory().device_allocations;
  a = gpu.allocate<float>(0); // the big block goes back to the cache ...
  auto again = gpu.allocate<float>(n);
  check(gpu.memory().device_allocations == before, "... and serves the next request of its size");
}

void mlp_trains_as_on_host() {
  using namespace hspmd;
  models::mlp_config cfg;
  cfg.inputs = 24;
  cfg.hidden = {32, 16};
  cfg.classes = 5;
  const graph::graph g = models::trace_mlp<float>(cfg, 8);
  exec::executor<float> host(g, 9);
  exec::executor<float, exec::cuda_backend> gpu(g, 9);
  exec::adam host_opt(1e-2), gpu_opt(1e-2);
  std::vector<std::int64_t> labels(8);
  double worst_loss = 0;
  for (int step = 0; step < 4; ++step) {
    const auto x = random_values<float>(8 * 24, 20 + static_cast<unsigned>(step));
    for (std::size_t i = 0; i < labels.size(); ++i)
      labels[i] = static_cast<std::int64_t>((i * 7 + static_cast<std::size_t>(step)) % 5);
    host.set_input("x", std::span<const float>(x));
    gpu.set_input("x", std::span<const float>(x));
    host.set_input("labels", std::span<const std::int64_t>(labels));
    gpu.set_input("labels", std::span<const std::int64_t>(labels));
    const float lh = host.forward();
    const float lg = gpu.forward();
    host.backward();
    gpu.backward();
    exec::clip_grad_norm(host, 0.5);
    exec::clip_grad_norm(gpu, 0.5);
    host_opt.step(host);
    gpu_opt.step(gpu);
    worst_loss = std::max(worst_loss, std::abs(static_cast<double>(lg - lh)) / std::abs(lh));
  }
  check(worst_loss <= 1e-5, "the MLP's losses on the device equal the host's (worst relative " +
                                std::to_string(worst_loss) + ")");
  double worst = 0;
  for (graph::node_id p : g.parameters()) {
    const auto want = host.value_to_host(p);
    const auto got = gpu.value_to_host(p);
    for (std::size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(got[i] - want[i])));
  }
  check(worst <= 1e-4, "the MLP's parameters after 4 steps equal the host's (worst " +
                           std::to_string(worst) + ")");
}

} // namespace

int main() {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices <= 0) {
    std::printf("gpu.cuda_backend: compiled; no CUDA device here (%s), nothing to run\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
    return 77;
  }
  try {
    hspmd::exec::cuda_backend gpu{0};
    buffers_and_copies(gpu);
    gelu_matches_host<float>(gpu);
    gelu_matches_host<double>(gpu);
    dropout_masks_equal_host(gpu);
    gemm_matches_host<float>(gpu);
    gemm_matches_host<double>(gpu);
    gemm_16_matches_host(gpu);
    every_op_matches_host(0);
    rows_match_host(gpu);
    empty_products(gpu);
    timing_and_memory(gpu);
    mlp_trains_as_on_host();
  } catch (const std::exception& ex) {
    std::printf("FAILED: %s\n", ex.what());
    return 1;
  }
  try {
    hspmd::exec::cuda_backend none{devices + 3};
    check(false, "a device index past the count throws");
  } catch (const hspmd::device_error& ex) {
    check(std::string(ex.what()).find("no such device") != std::string::npos,
          std::string("the error names the cause: ") + ex.what());
  }
  std::printf("gpu.cuda_backend: %d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
