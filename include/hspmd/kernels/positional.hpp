#pragma once
// Kernel of the rotary position embedding (registry: graph/ops/positional.hpp). The angles of the
// piece's positions are tabulated in the forward (in double, from each position's global index, so
// every piece of a split sequence rotates exactly as the whole tensor does) and kept for the
// backward; then one functor index per row of pairs.

#include <hspmd/core/hd.hpp>
#include <hspmd/kernels/common.hpp>

#include <cmath>
#include <cstddef>

namespace hspmd::exec {

/// The rotation of pair i at local position q: table[2 (q half + i)] = cos, [.. + 1] = sin of
/// (offset + q) base^(-2i / d), in double (half = d / 2 pairs per position).
template <class T>
struct rotary_table {
  T* table;
  std::size_t half;
  std::size_t offset; // the piece's first position
  double base;
  HSPMD_HD void operator()(std::size_t k) const {
    const std::size_t i = k % half;
    const double angle =
        static_cast<double>(k / half + offset) *
        std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(2 * half));
    table[2 * k] = static_cast<T>(std::cos(angle));
    table[2 * k + 1] = static_cast<T>(std::sin(angle));
  }
};

/// Rotates the pairs of row r of x (..., S, heads, d) (one head at one position) by +angle
/// (forward) or -angle (backward, adding): the row's position is found once, and the pairs run
/// in a loop the compiler vectorizes.
template <class T, bool Backward>
struct rotary_rows {
  const T* src;
  T* dst;
  const T* table;
  std::size_t d;
  std::size_t heads;
  std::size_t seq;
  HSPMD_HD void operator()(std::size_t r) const {
    const T* t = table + (r / heads % seq) * d;
    const T* x = src + r * d;
    T* y = dst + r * d;
    for (std::size_t e = 0; e + 1 < d; e += 2) {
      const T c = t[e];
      const T s = t[e + 1];
      const T x0 = x[e];
      const T x1 = x[e + 1];
      if constexpr (Backward) {
        y[e] += x0 * c + x1 * s;
        y[e + 1] += x1 * c - x0 * s;
      } else {
        y[e] = x0 * c - x1 * s;
        y[e + 1] = x0 * s + x1 * c;
      }
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
  // The angles once per forward (seq x d / 2 of them, not one pow, cos and sin per element),
  // kept for the backward.
  template <bool Backward, class T, class B>
  static void launch(kernel_context<T, B>& c) {
    const auto& x = c.out_shape();
    const std::size_t r = x.rank();
    const program::node_layout* l = c.layout();
    const std::size_t d = x.dims[r - 1];
    const std::size_t seq = x.dims[r - 3];
    const T* table = c.saved();
    if (!Backward) {
      T* fresh = c.saved(seq * d);
      for_each_index(
          c.backend(), seq * (d / 2),
          rotary_table<T>{fresh, d / 2, l != nullptr ? l->offset_of(r - 3) : 0, c.attrs().scalar});
      table = fresh;
    }
    if (d == 0)
      return;
    const rotary_rows<T, Backward> f{
        Backward ? c.dout() : c.in(0), Backward ? c.din(0) : c.out(), table, d, x.dims[r - 2], seq};
    for_each_index(c.backend(), c.out_size() / d, f);
  }
};

} // namespace hspmd::exec
