// A user's GPU trainer translation unit, compiled by nvcc against the *installed* hspmd: an MLP
// trained for a few Adam steps with gradient clipping on the CUDA backend, its losses and
// parameters checked against the same run on the host backend. Without a CUDA device it says so
// and exits 77 (skipped): where hspmd is built there is none, so this proves the recipe compiles
// and links, not that it runs.
#include <hspmd/exec/backends/cuda.cuh>
#include <hspmd/exec/executor.hpp>
#include <hspmd/exec/optim.hpp>
#include <hspmd/models/mlp.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices <= 0) {
    std::printf("gpu_train: compiled; no CUDA device here, nothing to run\n");
    return 77;
  }
  using namespace hspmd;
  models::mlp_config cfg;
  cfg.inputs = 32;
  cfg.hidden = {64};
  cfg.classes = 4;
  const graph::graph g = models::trace_mlp<float>(cfg, 16);
  exec::executor<float> host(g, 1);
  exec::executor<float, exec::cuda_backend> gpu(g, 1, {}, exec::cuda_backend{0});
  exec::adam host_opt(1e-2), gpu_opt(1e-2);
  std::vector<float> x(16 * 32);
  std::vector<std::int64_t> y(16);
  double worst = 0;
  for (int step = 0; step < 5; ++step) {
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = std::sin(0.37F * static_cast<float>(i) + static_cast<float>(step));
    for (std::size_t i = 0; i < y.size(); ++i)
      y[i] = static_cast<std::int64_t>((i + static_cast<std::size_t>(step)) % 4);
    host.set_input("x", std::span<const float>(x));
    gpu.set_input("x", std::span<const float>(x));
    host.set_input("labels", std::span<const std::int64_t>(y));
    gpu.set_input("labels", std::span<const std::int64_t>(y));
    const float lh = host.forward(), lg = gpu.forward();
    host.backward();
    gpu.backward();
    exec::clip_grad_norm(host, 1.0);
    exec::clip_grad_norm(gpu, 1.0);
    host_opt.step(host);
    gpu_opt.step(gpu);
    worst = std::max(worst, std::abs(static_cast<double>(lh - lg)));
    std::printf("gpu_train: step %d loss host %.6f cuda %.6f\n", step + 1, lh, lg);
  }
  std::printf("gpu_train: device memory peak %zu bytes\n", gpu.backend().memory().peak_allocated_bytes);
  return worst <= 1e-4 ? 0 : 1;
}
