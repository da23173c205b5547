#pragma once
// The trainer's "cuda" device engine (train/engine.hpp): `cuda_engine_entry<T, Optimizer>()` is
// the entry a program registers so that `train_options::device = "cuda"` (or "auto") trains one
// process on a GPU. hspmd::cuda (src/cuda_engine.cu) registers float and double with Adam and
// SGD; another optimizer or element type registers in a .cu file of the program's own:
//
//     static const train::register_device_engine<float, my_opt> r{
//         train::cuda_engine_entry<float, my_opt>()};
//
// nvcc only; runs only where a GPU is.

#include <hspmd/exec/backends/cuda.cuh>
#include <hspmd/train/engine.hpp>
#include <hspmd/train/namespace.hpp>

#if defined(HSPMD_HAS_NCCL)
#include <hspmd/comm/nccl/communicator.hpp>
#include <hspmd/train/distributed_engine.hpp>
#endif

#include <concepts>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace hspmd::train {

/// The "cuda" entry: one process on the current device (device 0 of those visible, unless the
/// program selected another with cudaSetDevice); with NCCL (HSPMD_HAS_NCCL), every rank of a
/// distributed run on its node-local GPU, the tensors' collectives over NCCL.
template <std::floating_point T, class Optimizer>
device_engine_entry<T, Optimizer> cuda_engine_entry() {
  device_engine_entry<T, Optimizer> e;
  e.name = "cuda";
  e.probe = detail::cuda_devices;
  e.make = [](const graph::graph& g, std::uint64_t seed) {
    const int device = detail::current_cuda_device();
    return std::unique_ptr<engine<T, Optimizer>>(
        std::make_unique<backend_engine<T, Optimizer, cuda_backend>>(
            g, seed, cuda_backend(device), detail::describe_cuda_device(device)));
  };
  e.measure = [](const graph::graph& g, double speed, const profile_options& o) {
    // rank 0 of a job: local rank 0, the device select_local_device gives it
    const int device = detail::current_cuda_device();
    return measure_compute<T, cuda_backend>(g, speed, o, cuda_backend(device));
  };
#if defined(HSPMD_HAS_NCCL)
  e.make_distributed = [](const graph::graph& g, const synth::plan& p, mpi_communicator& comm,
                          std::uint64_t seed) {
    select_local_device(comm);
    const int device = detail::current_cuda_device();
    auto nccl = std::make_shared<nccl_communicator>(comm);
    return std::unique_ptr<rank_engine<T, Optimizer>>(
        std::make_unique<distributed_engine<T, Optimizer, nccl_communicator, cuda_backend>>(
            g, p, *nccl, seed, cuda_backend(device), detail::describe_cuda_device(device), nccl));
  };
#endif
  return e;
}

} // namespace hspmd::train
