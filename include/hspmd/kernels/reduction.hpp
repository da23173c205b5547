#pragma once
// Kernels of the full reductions (registry: graph/ops/reduction.hpp). A local piece's mean
// divides by the whole tensor's element count, so the pieces' means add up to the mean.

#include <hspmd/core/hd.hpp>
#include <hspmd/kernels/common.hpp>

#include <cstddef>

namespace hspmd::exec {

/// out[0] = divisor-scaled sum of x (one index: the sum runs in order).
template <class T>
struct sum_all {
  const T* x;
  T* out;
  std::size_t n;
  T divisor;
  HSPMD_HD void operator()(std::size_t /*i*/) const {
    T s{0};
    for (std::size_t j = 0; j < n; ++j)
      s += x[j];
    out[0] = s / divisor;
  }
};
/// dx[i] += dy[0] / divisor.
template <class T>
struct spread_gradient {
  const T* dy;
  T* dx;
  T divisor;
  HSPMD_HD void operator()(std::size_t i) const { dx[i] += dy[0] / divisor; }
};

template <bool Mean>
struct reduction_kernel {
  template <class T, class B>
  static T divisor(const kernel_context<T, B>& c) {
    return Mean ? static_cast<T>(c.in_global_size(0)) : T{1};
  }
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    for_each_index(c.backend(), 1, sum_all<T>{c.in(0), c.out(), c.in_shape(0).size(), divisor(c)});
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    for_each_index(c.backend(), c.in_shape(0).size(),
                   spread_gradient<T>{c.dout(), c.din(0), divisor(c)});
  }
};

template <>
struct kernel<graph::op::sum> : reduction_kernel<false> {};
template <>
struct kernel<graph::op::mean> : reduction_kernel<true> {};

} // namespace hspmd::exec
