#pragma once
// Kernels of the graph's leaves (registry: graph/ops/io.hpp): inputs are fed and parameters
// materialized by the executor, so neither computes anything.

#include <hspmd/kernels/common.hpp>

namespace hspmd::exec {

/// The kernel pair of a node that computes nothing.
struct leaf_kernel {
  template <class T, class B>
  static void forward(kernel_context<T, B>& /*c*/) {}
  template <class T, class B>
  static void backward(kernel_context<T, B>& /*c*/) {}
};

template <>
struct kernel<graph::op::input> : leaf_kernel {};
template <>
struct kernel<graph::op::parameter> : leaf_kernel {};

} // namespace hspmd::exec
