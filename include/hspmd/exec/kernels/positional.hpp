#pragma once
// Kernel of the rotary position embedding (registry: graph/ops/positional.hpp). One functor
// index per pair; angles are computed in double from the pair's global position, so every
// piece of a split sequence rotates exactly as the whole tensor does.

#include <hspmd/core/hd.hpp>
#include <hspmd/exec/kernels/common.hpp>

#include <cmath>
#include <cstddef>

namespace hspmd::exec {

/// Rotates pair p of x (..., S, heads, d) by +angle (forward) or -angle (backward, adding).
template <class T, bool Backward>
struct rotary_pairs {
  const T* src;
  T* dst;
  std::size_t d;
  std::size_t heads;
  std::size_t seq;
  std::size_t offset; // the piece's first position
  double base;
  HSPMD_HD void operator()(std::size_t p) const {
    const std::size_t e = 2 * p;
    const std::size_t i = e % d / 2;
    const std::size_t pos = e / (d * heads) % seq + offset;
    const double angle = static_cast<double>(pos) *
                         std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    const T c = static_cast<T>(std::cos(angle));
    const T s = static_cast<T>(std::sin(angle));
    const T x0 = src[e];
    const T x1 = src[e + 1];
    if constexpr (Backward) {
      dst[e] += x0 * c + x1 * s;
      dst[e + 1] += x1 * c - x0 * s;
    } else {
      dst[e] = x0 * c - x1 * s;
      dst[e + 1] = x0 * s + x1 * c;
    }
  }
};

template <>
struct kernel<graph::op::rotary> : two_way_kernel<kernel<graph::op::rotary>> {
  template <class T, class B>
  static void run(kernel_context<T, B>& c, bool backward) {
    if (backward)
      launch<true>(c);
    else
      launch<false>(c);
  }
  template <bool Backward, class T, class B>
  static void launch(kernel_context<T, B>& c) {
    const auto& x = c.out_shape();
    const std::size_t r = x.rank();
    const node_layout* l = c.layout();
    const rotary_pairs<T, Backward> f{Backward ? c.dout() : c.in(0),
                                      Backward ? c.din(0) : c.out(),
                                      x.dims[r - 1],
                                      x.dims[r - 2],
                                      x.dims[r - 3],
                                      l != nullptr ? l->offset_of(r - 3) : 0,
                                      c.attrs().scalar};
    for_each_index(c.backend(), c.out_size() / 2, f);
  }
};

} // namespace hspmd::exec
