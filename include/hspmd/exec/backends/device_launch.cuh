#pragma once
// The device side of `for_each_index` and `for_each_row`: one grid-stride __global__ launcher
// runs any HSPMD_HD kernel functor (kernels/) on a CUDA stream, and row functors run with
// 16 threads a row that reduce in the host's lane order. nvcc only; the CUDA backend launches
// every kernel through them.

#include <hspmd/kernels/common.hpp>

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

/// The device's row team: 16 threads of a warp own one row (kernels/common.hpp
/// `serial_team` is the host's). Thread `lane` takes elements lane, lane + 16, ... -- the host's
/// reduction lane l -- and sums are combined by shuffles 8, 4, 2, 1 apart: the host's pairwise
/// order, so a row reduces as on the host (up to FMA contraction).
struct lane_team {
  unsigned lane; ///< 0 .. 15
  unsigned mask; ///< this half-warp's 16 threads
  static constexpr unsigned width = 16;
  static_assert(width == reduce_lanes, "a row team has one thread per host reduction lane");

  // Host-device so that host-device functors may call them; only the device runs them (the
  // host branch is the serial team's, never reached through this type).
  template <class F>
  HSPMD_HD void for_each(std::size_t n, const F& f) const {
    for (std::size_t j = lane; j < n; j += width)
      f(j);
  }
  template <class T, class F>
  HSPMD_HD T sum(std::size_t n, const F& term) const {
#ifdef __CUDA_ARCH__
    T acc{};
    for (std::size_t j = lane; j < n; j += width)
      acc += term(j);
    for (unsigned w = width / 2; w > 0; w /= 2)
      acc += __shfl_down_sync(mask, acc, w, width);
    return __shfl_sync(mask, acc, 0, width);
#else
    return lane_sum<T>(n, term);
#endif
  }
  template <class T>
  HSPMD_HD T max(const T* x, std::size_t n) const {
#ifdef __CUDA_ARCH__
    T acc = x[0];
    for (std::size_t j = lane; j < n; j += width)
      acc = x[j] > acc ? x[j] : acc;
    for (unsigned w = width / 2; w > 0; w /= 2) {
      const T other = __shfl_down_sync(mask, acc, w, width);
      acc = other > acc ? other : acc;
    }
    return __shfl_sync(mask, acc, 0, width);
#else
    return lane_max(x, n);
#endif
  }
  /// The thread that writes the row's single results.
  HSPMD_HD bool leader() const {
    return lane == 0;
  }
  /// Whether `for_each` gives element j to this thread.
  HSPMD_HD bool owns(std::size_t j) const {
    return j % width == lane;
  }
};

/// f(r, team) for every row r in [0, rows): 16 threads a row, 16 rows a block of 256, grid-stride.
/// Each half-warp shuffles within its own mask, so a half-warp past the last row takes no part,
/// and two half-warps may run rows of different lengths: that needs independent thread
/// scheduling (sm_70 and later; the only architectures built).
template <class F>
__global__ void for_each_row_kernel(std::size_t rows, F f) {
  constexpr unsigned width = lane_team::width;
  const unsigned half = (threadIdx.x % 32) / width;
  const lane_team team{threadIdx.x % width, 0xFFFFu << (width * half)};
  const std::size_t per_grid = static_cast<std::size_t>(gridDim.x) * (blockDim.x / width);
  for (std::size_t r =
           static_cast<std::size_t>(blockIdx.x) * (blockDim.x / width) + threadIdx.x / width;
       r < rows; r += per_grid)
    f(r, team);
}

/// Launches the row functor `f` over [0, rows) on `stream`; returns the launch's error code.
template <class F>
cudaError_t launch_for_each_row(std::size_t rows, const F& f, cudaStream_t stream = nullptr) {
  if (rows == 0)
    return cudaSuccess;
  constexpr unsigned threads = 256;
  constexpr unsigned rows_per_block = threads / lane_team::width;
  const auto blocks = static_cast<unsigned>(
      std::min<std::size_t>((rows + rows_per_block - 1) / rows_per_block, 65535));
  for_each_row_kernel<<<blocks, threads, 0, stream>>>(rows, f);
  return cudaGetLastError();
}

} // namespace hspmd::exec
