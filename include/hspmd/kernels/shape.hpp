#pragma once
// Kernels of the ops that move elements (registry: graph/ops/shape.hpp): reshape, permute, slice
// and concat. Copies run one functor index per contiguous run of the destination, so a run is a
// plain loop; backward adds back along the same mapping (a bijection: no two indices collide).

#include <hspmd/core/hd.hpp>
#include <hspmd/kernels/common.hpp>

#include <cstddef>
#include <cstdint>

namespace hspmd::exec {

/// y[i] = x[i] (forward) or dx[i] += dy[i] (backward).
template <class T>
struct copy_elements {
  const T* from;
  T* to;
  bool add;
  HSPMD_HD void operator()(std::size_t i) const {
    if (add)
      to[i] += from[i];
    else
      to[i] = from[i];
  }
};

template <>
struct kernel<graph::op::reshape> {
  static constexpr std::uint32_t assigns = 0b1;
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    if (c.in(0) == c.out()) // the executor keeps the value where the input lies
      return;
    for_each_index(c.backend(), c.out_size(), copy_elements<T>{c.in(0), c.out(), false});
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    for_each_index(c.backend(), c.out_size(), copy_elements<T>{c.dout(), c.din(0), !c.assign(0)});
  }
};

/// Output row o (all dimensions but the last) of a permutation: y[o, j] = x[from(o) + j * step]
/// (forward), or dx[from(o) + j * step] += dy[o, j] (backward).
template <class T>
struct permute_rows {
  const T* src;
  T* dst;
  std::size_t rank;
  std::size_t out_dims[graph::max_rank];
  std::size_t in_stride[graph::max_rank]; // stride in x of each output dimension
  bool backward;
  bool assign = false; ///< (backward: store instead of adding)
  HSPMD_HD void operator()(std::size_t o) const {
    const std::size_t len = out_dims[rank - 1];
    const std::size_t step = in_stride[rank - 1];
    std::size_t from = 0;
    std::size_t rest = o;
    for (std::size_t d = rank - 1; d-- > 0;) {
      from += (rest % out_dims[d]) * in_stride[d];
      rest /= out_dims[d];
    }
    if (backward)
      for (std::size_t j = 0; j < len; ++j)
        contribute(dst[from + j * step], src[o * len + j], assign);
    else
      for (std::size_t j = 0; j < len; ++j)
        dst[o * len + j] = src[from + j * step];
  }
};

template <>
struct kernel<graph::op::permute> : two_way_kernel<kernel<graph::op::permute>> {
  static constexpr std::uint32_t assigns = 0b1;
  template <class T, class B>
  static void run(kernel_context<T, B>& c, bool backward) {
    const auto& x = c.in_shape(0);
    const auto& perm = c.attrs().dims;
    const bool assign = backward && c.assign(0);
    if (c.swapped() || c.in_swapped(0)) { // a view: its elements are its input's, in order
      if (backward)
        for_each_index(c.backend(), c.out_size(), copy_elements<T>{c.dout(), c.din(0), !assign});
      return;
    }
    permute_rows<T> f{backward ? c.dout() : c.in(0),
                      backward ? c.din(0) : c.out(),
                      x.rank(),
                      {},
                      {},
                      backward,
                      assign};
    if (x.rank() == 0 || c.out_size() == 0) {
      if (x.rank() == 0)
        for_each_index(c.backend(), 1, copy_elements<T>{f.src, f.dst, backward && !assign});
      return;
    }
    std::size_t s = 1;
    std::size_t stride[graph::max_rank]{};
    for (std::size_t i = x.rank(); i-- > 0;) {
      stride[i] = s;
      s *= x.dims[i];
    }
    for (std::size_t i = 0; i < x.rank(); ++i) {
      f.out_dims[i] = x.dims[perm[i]];
      f.in_stride[i] = stride[perm[i]];
    }
    for_each_index(c.backend(), c.out_size() / f.out_dims[x.rank() - 1], f);
  }
};

/// Moves a block of `len` rows between a part (outer, len, inner) and a whole (outer, total,
/// inner) tensor at row `at` of the whole: one index per (outer, row).
template <class T>
struct block_rows {
  const T* src;
  T* dst;
  std::size_t len;
  std::size_t total;
  std::size_t at;
  std::size_t inner;
  bool part_to_whole;
  bool add;
  HSPMD_HD void operator()(std::size_t i) const {
    const std::size_t o = i / len;
    const std::size_t r = i % len;
    const std::size_t part = (o * len + r) * inner;
    const std::size_t whole = (o * total + at + r) * inner;
    const std::size_t s = part_to_whole ? part : whole;
    const std::size_t d = part_to_whole ? whole : part;
    for (std::size_t j = 0; j < inner; ++j) {
      if (add)
        dst[d + j] += src[s + j];
      else
        dst[d + j] = src[s + j];
    }
  }
};

/// Slice and concat move blocks along one axis (attrs.dims[0]); viewing a tensor as (outer,
/// axis, inner), input k's block of rows lands at its offset in the output's axis.
struct axis_copy_kernel : two_way_kernel<axis_copy_kernel> {
  template <class T, class B>
  static void run(kernel_context<T, B>& c, bool backward) {
    const bool slice = c.node().kind == graph::op::slice;
    const std::size_t axis = c.attrs().dims[0];
    const auto& dims = slice ? c.in_shape(0).dims : c.out_shape().dims;
    std::size_t outer = 1;
    std::size_t inner = 1;
    for (std::size_t d = 0; d < axis; ++d)
      outer *= dims[d];
    for (std::size_t d = axis + 1; d < dims.size(); ++d)
      inner *= dims[d];
    const std::size_t total = dims[axis];
    if (slice) { // the input is the whole tensor
      const std::size_t len = c.attrs().dims[2];
      const block_rows<T> f{backward ? c.dout() : c.in(0),
                            backward ? c.din(0) : c.out(),
                            len,
                            total,
                            c.attrs().dims[1],
                            inner,
                            backward,
                            backward};
      for_each_index(c.backend(), outer * len, f);
      return;
    }
    std::size_t at = 0; // concat: the output is the whole tensor
    for (std::size_t k = 0; k < c.arity(); ++k) {
      const std::size_t len = c.in_shape(k).dims[axis];
      const block_rows<T> f{backward ? c.dout() : c.in(k),
                            backward ? c.din(k) : c.out(),
                            len,
                            total,
                            at,
                            inner,
                            !backward,
                            backward};
      for_each_index(c.backend(), outer * len, f);
      at += len;
    }
  }
};

template <>
struct kernel<graph::op::slice> : axis_copy_kernel {};
template <>
struct kernel<graph::op::concat> : axis_copy_kernel {};

} // namespace hspmd::exec
