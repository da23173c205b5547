#pragma once
// Kernels of the image ops (registry: graph/ops/vision.hpp).
//
// conv2d by im2col + GEMM, one image at a time. The column matrix of image b is
// (C R S) x (Ho Wo): entry ((c R + r) S + s, oh Wo + ow) is x[b, c, oh*stride - pad + r,
// ow*stride - pad + s] (0 outside the image). Forward: y_b = W col_b + bias. Backward:
// dW += dy_b col_b^T, dcol = W^T dy_b gathered back into dx (col2im: each input pixel sums the
// column entries that read it), dbias += row sums of dy_b.

#include <hspmd/core/hd.hpp>
#include <hspmd/graph/ops/vision.hpp>
#include <hspmd/kernels/common.hpp>

#include <cstddef>

namespace hspmd::exec {

/// The geometry of one conv2d: input (C, H, W), kernel (K, C, R, S), output (K, Ho, Wo).
struct conv_geometry {
  std::size_t c, h, w, k, r, s, ho, wo, stride, pad;
  [[nodiscard]] HSPMD_HD std::size_t plane() const { return ho * wo; }
  [[nodiscard]] HSPMD_HD std::size_t crs() const { return c * r * s; }
  [[nodiscard]] HSPMD_HD std::size_t image() const { return c * h * w; }
};

/// col[row, p] for one image (one index per column entry).
template <class T>
struct im2col {
  const T* x;
  T* col;
  conv_geometry g;
  HSPMD_HD void operator()(std::size_t i) const {
    const std::size_t row = i / g.plane();
    const std::size_t p = i % g.plane();
    const std::size_t ch = row / (g.r * g.s);
    const std::size_t kr = row / g.s % g.r;
    const std::size_t ks = row % g.s;
    const std::size_t ih = p / g.wo * g.stride + kr;
    const std::size_t iw = p % g.wo * g.stride + ks;
    const bool inside = ih >= g.pad && iw >= g.pad && ih - g.pad < g.h && iw - g.pad < g.w;
    col[i] = inside ? x[(ch * g.h + ih - g.pad) * g.w + iw - g.pad] : T{0};
  }
};

/// dx[c, y, x] += the column entries that read it (one index per input pixel).
template <class T>
struct col2im {
  const T* dcol;
  T* dx;
  conv_geometry g;
  HSPMD_HD void operator()(std::size_t i) const {
    const std::size_t ch = i / (g.h * g.w);
    const std::size_t y = i / g.w % g.h + g.pad;
    const std::size_t x = i % g.w + g.pad;
    T acc{0};
    for (std::size_t kr = 0; kr < g.r && kr <= y; ++kr) {
      if ((y - kr) % g.stride != 0 || (y - kr) / g.stride >= g.ho)
        continue;
      const std::size_t oh = (y - kr) / g.stride;
      for (std::size_t ks = 0; ks < g.s && ks <= x; ++ks) {
        if ((x - ks) % g.stride != 0 || (x - ks) / g.stride >= g.wo)
          continue;
        const std::size_t ow = (x - ks) / g.stride;
        const std::size_t row = (ch * g.r + kr) * g.s + ks;
        acc += dcol[row * g.plane() + oh * g.wo + ow];
      }
    }
    dx[i] += acc;
  }
};

/// Channel k of a (K, plane) output: y[k, p] += bias[k].
template <class T>
struct add_channel_bias {
  const T* bias;
  T* y;
  std::size_t plane;
  HSPMD_HD void operator()(std::size_t k) const {
    for (std::size_t p = 0; p < plane; ++p)
      y[k * plane + p] += bias[k];
  }
};
/// dbias[k] += sum over the plane of dy[k, .].
template <class T>
struct channel_bias_gradient {
  const T* dy;
  T* dbias;
  std::size_t plane;
  HSPMD_HD void operator()(std::size_t k) const {
    T s{0};
    for (std::size_t p = 0; p < plane; ++p)
      s += dy[k * plane + p];
    dbias[k] += s;
  }
};

template <>
struct kernel<graph::op::conv2d> : two_way_kernel<kernel<graph::op::conv2d>> {
  template <class T, class B>
  static conv_geometry geometry(const kernel_context<T, B>& c) {
    const auto& x = c.in_shape(0).dims;
    const auto& w = c.in_shape(1).dims;
    return {x[1],
            x[2],
            x[3],
            w[0],
            w[2],
            w[3],
            c.out_shape().dims[2],
            c.out_shape().dims[3],
            c.attrs().dims[0],
            c.attrs().dims[1]};
  }
  template <class T, class B>
  static void run(kernel_context<T, B>& c, bool backward) {
    const conv_geometry g = geometry(c);
    auto& be = c.backend();
    auto col = be.template allocate<T>(g.crs() * g.plane());
    auto dcol = be.template allocate<T>(backward ? g.crs() * g.plane() : 0);
    const std::size_t images = c.in_shape(0).dims[0];
    const bool bias = !c.skip_bias();
    for (std::size_t b = 0; b < images; ++b) {
      for_each_index(be, g.crs() * g.plane(), im2col<T>{c.in(0) + b * g.image(), col.data(), g});
      if (!backward) {
        T* y = c.out() + b * g.k * g.plane();
        gemm(c, transpose::no, transpose::no, g.k, g.plane(), g.crs(), T{1}, c.in(1), g.crs(),
             col.data(), g.plane(), T{0}, y, g.plane());
        if (bias)
          for_each_index(be, g.k, add_channel_bias<T>{c.in(2), y, g.plane()});
        continue;
      }
      const T* dy = c.dout() + b * g.k * g.plane();
      gemm(c, transpose::no, transpose::yes, g.k, g.crs(), g.plane(), T{1}, dy, g.plane(),
           col.data(), g.plane(), T{1}, c.din(1), g.crs());
      gemm(c, transpose::yes, transpose::no, g.crs(), g.plane(), g.k, T{1}, c.in(1), g.crs(), dy,
           g.plane(), T{0}, dcol.data(), g.plane());
      for_each_index(be, g.image(), col2im<T>{dcol.data(), c.din(0) + b * g.image(), g});
      if (bias)
        for_each_index(be, g.k, channel_bias_gradient<T>{dy, c.din(2), g.plane()});
    }
  }
};

/// Pooling geometry: planes of (h, w) -> (ho, wo).
struct pool_geometry {
  std::size_t h, w, ho, wo, kernel, stride;
};

/// Output o of max pooling: the window's maximum (the first one on ties) and where it is.
template <class T>
struct max_pool_forward {
  const T* x;
  T* y;
  std::size_t* arg;
  pool_geometry g;
  HSPMD_HD void operator()(std::size_t o) const {
    const std::size_t p = o / (g.ho * g.wo);
    const std::size_t i = o / g.wo % g.ho;
    const std::size_t j = o % g.wo;
    const std::size_t base = p * g.h * g.w;
    std::size_t best = base + i * g.stride * g.w + j * g.stride;
    for (std::size_t r = 0; r < g.kernel; ++r)
      for (std::size_t c = 0; c < g.kernel; ++c) {
        const std::size_t at = base + (i * g.stride + r) * g.w + j * g.stride + c;
        if (x[at] > x[best])
          best = at;
      }
    arg[o] = best;
    y[o] = x[best];
  }
};
/// Plane p of max pooling's gradient (windows may overlap: one index per plane).
template <class T>
struct max_pool_backward {
  const T* dy;
  const std::size_t* arg;
  T* dx;
  std::size_t outputs_per_plane;
  HSPMD_HD void operator()(std::size_t p) const {
    for (std::size_t o = p * outputs_per_plane; o < (p + 1) * outputs_per_plane; ++o)
      dx[arg[o]] += dy[o];
  }
};

template <>
struct kernel<graph::op::max_pool2d> {
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    const auto& x = c.in_shape(0).dims;
    const auto& out = c.out_shape().dims;
    const pool_geometry g{x[2], x[3], out[2], out[3], c.attrs().dims[0], c.attrs().dims[1]};
    for_each_index(c.backend(), c.out_size(),
                   max_pool_forward<T>{c.in(0), c.out(), c.saved_index(c.out_size()), g});
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    const auto& x = c.in_shape(0).dims;
    const auto& out = c.out_shape().dims;
    for_each_index(c.backend(), x[0] * x[1],
                   max_pool_backward<T>{c.dout(), c.saved_index(), c.din(0), out[2] * out[3]});
  }
};

/// Plane p of adaptive average pooling: each output cell averages its window (forward), or
/// spreads its gradient over it (backward; windows may overlap: one index per plane).
template <class T>
struct adaptive_pool_plane {
  const T* src;
  T* dst;
  pool_geometry g;
  bool backward;
  HSPMD_HD void operator()(std::size_t p) const {
    for (std::size_t i = 0; i < g.ho; ++i)
      for (std::size_t j = 0; j < g.wo; ++j) {
        const auto rows = graph::adaptive_window(i, g.h, g.ho);
        const auto cols = graph::adaptive_window(j, g.w, g.wo);
        const auto count = static_cast<T>((rows.end - rows.begin) * (cols.end - cols.begin));
        const std::size_t o = (p * g.ho + i) * g.wo + j;
        T acc{0};
        for (std::size_t r = rows.begin; r < rows.end; ++r)
          for (std::size_t c = cols.begin; c < cols.end; ++c) {
            const std::size_t at = (p * g.h + r) * g.w + c;
            if (backward)
              dst[at] += src[o] / count;
            else
              acc += src[at];
          }
        if (!backward)
          dst[o] = acc / count;
      }
  }
};

template <>
struct kernel<graph::op::adaptive_avg_pool2d>
    : two_way_kernel<kernel<graph::op::adaptive_avg_pool2d>> {
  template <class T, class B>
  static void run(kernel_context<T, B>& c, bool backward) {
    const auto& x = c.in_shape(0).dims;
    const auto& out = c.out_shape().dims;
    const pool_geometry g{x[2], x[3], out[2], out[3], 0, 0};
    for_each_index(c.backend(), x[0] * x[1],
                   adaptive_pool_plane<T>{backward ? c.dout() : c.in(0),
                                          backward ? c.din(0) : c.out(), g, backward});
  }
};

} // namespace hspmd::exec
