#pragma once
// The trainer's "cuda" device engine (exec/engine.hpp): `cuda_engine_entry<T, Optimizer>()` is
// the entry a program registers so that `train_options::device = "cuda"` (or "auto") trains one
// process on a GPU. hspmd::cuda (src/cuda_engine.cu) registers float and double with Adam and
// SGD; another optimizer or element type registers in a .cu file of the program's own:
//
//     static const exec::register_device_engine<float, my_opt> r{
//         exec::cuda_engine_entry<float, my_opt>()};
//
// nvcc only; runs only where a GPU is.

#include <hspmd/exec/backends/cuda.cuh>
#include <hspmd/exec/engine.hpp>

#if defined(HSPMD_HAS_NCCL)
#include <hspmd/comm/nccl/communicator.hpp>
#include <hspmd/exec/distributed_engine.hpp>
#endif

#include <cuda_runtime.h>

#include <concepts>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace hspmd::exec {

namespace detail {

// The devices this process sees; 0 and CUDA's error text when it sees none.
inline int cuda_devices(std::string& why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
    return 0;
  }
  if (count <= 0)
    why = "cudaGetDeviceCount found no CUDA device";
  return count > 0 ? count : 0;
}

inline std::string describe_cuda_device(int device) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "cuda:" + std::to_string(device);
  }
  char text[384];
  std::snprintf(text, sizeof text, "cuda:%d (%s, sm_%d%d, %.0f GiB)", device, p.name, p.major,
                p.minor, static_cast<double>(p.totalGlobalMem) / 1073741824.0);
  return text;
}

} // namespace detail

/// The "cuda" entry: one process on the current device (device 0 of those visible, unless the
/// program selected another with cudaSetDevice); with NCCL (HSPMD_HAS_NCCL), every rank of a
/// distributed run on its node-local GPU, the tensors' collectives over NCCL.
template <std::floating_point T, class Optimizer>
device_engine_entry<T, Optimizer> cuda_engine_entry() {
  device_engine_entry<T, Optimizer> e;
  e.name = "cuda";
  e.probe = detail::cuda_devices;
  e.make = [](const graph::graph& g, std::uint64_t seed) {
    int device = 0;
    detail::cuda_device_check(cudaGetDevice(&device), "cudaGetDevice", device);
    return std::unique_ptr<engine<T, Optimizer>>(
        std::make_unique<backend_engine<T, Optimizer, cuda_backend>>(
            g, seed, cuda_backend(device), detail::describe_cuda_device(device)));
  };
  e.measure = [](const graph::graph& g, double speed, const profile_options& o) {
    int device = 0; // rank 0 of a job: local rank 0, the device select_local_device gives it
    detail::cuda_device_check(cudaGetDevice(&device), "cudaGetDevice", device);
    return measure_compute<T, cuda_backend>(g, speed, o, cuda_backend(device));
  };
#if defined(HSPMD_HAS_NCCL)
  e.make_distributed = [](const graph::graph& g, const synth::plan& p, mpi_communicator& comm,
                          std::uint64_t seed) {
    select_local_device(comm);
    int device = 0;
    detail::cuda_device_check(cudaGetDevice(&device), "cudaGetDevice", device);
    auto nccl = std::make_shared<nccl_communicator>(comm);
    return std::unique_ptr<rank_engine<T, Optimizer>>(
        std::make_unique<distributed_engine<T, Optimizer, nccl_communicator, cuda_backend>>(
            g, p, *nccl, seed, cuda_backend(device), detail::describe_cuda_device(device), nccl));
  };
#endif
  return e;
}

} // namespace hspmd::exec
