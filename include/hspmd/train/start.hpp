#pragma once
// The one place where a build with MPI and one without differ for the trainer: with hspmd::mpi
// linked, train/distributed_start.hpp starts the ranks of a distributed run; without it, a
// cluster is refused with one line. The trainer's loop (train/trainer_impl.hpp) calls
// `start_distributed` and never asks which.

#include <hspmd/train/started.hpp>

#if defined(HSPMD_HAS_MPI)
#include <hspmd/train/distributed_start.hpp>
#else
#include <hspmd/core/error.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/train/train_options.hpp>

#include <concepts>
#include <functional>

namespace hspmd::train {
template <std::floating_point T, class Optimizer>
distributed_run<T, Optimizer> start_distributed(const graph::graph&, train_options& o,
                                                const std::function<void()>&) {
  throw config_error("cluster " + o.cluster, "this build of hspmd has no MPI backend",
                     "link hspmd::mpi (or hspmd::hspmd) with MPI installed, or drop the cluster");
}
} // namespace hspmd::train
#endif
