#pragma once
// The device side of `for_each_index`: one grid-stride __global__ launcher runs any HSPMD_HD
// kernel functor (exec/kernels/) on a CUDA stream. nvcc only; the CUDA backend launches every
// kernel through it.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

namespace hspmd::exec {

/// f(i) for i in [0, n), grid-stride.
template <class F>
__global__ void for_each_index_kernel(std::size_t n, F f) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    f(i);
}

/// Launches `f` over [0, n) on `stream` (256 threads a block, at most 65535 blocks); returns
/// the launch's error code.
template <class F>
cudaError_t launch_for_each_index(std::size_t n, const F& f, cudaStream_t stream = nullptr) {
  if (n == 0)
    return cudaSuccess;
  constexpr unsigned threads = 256;
  const auto blocks =
      static_cast<unsigned>(std::min<std::size_t>((n + threads - 1) / threads, 65535));
  for_each_index_kernel<<<blocks, threads, 0, stream>>>(n, f);
  return cudaGetLastError();
}

} // namespace hspmd::exec
