#pragma once
// Kernels of the row normalizations over the last dimension: softmax (optionally causal),
// log-softmax and layer norm (registry: graph/ops/normalization.hpp). One functor index per row
// (layer norm's gamma and beta gradients: one per column).

#include <hspmd/core/fastmath.hpp>
#include <hspmd/core/hd.hpp>
#include <hspmd/graph/ops/common.hpp>
#include <hspmd/kernels/common.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace hspmd::exec {

/// Row r of a softmax or log-softmax over rows of length `len`. Causal: the row is query
/// q0 + r % queries of a (..., S, S) score tensor and sees keys 0 .. q; the rest are 0.
template <class T, bool Log>
struct softmax_row {
  const T* x;
  T* y;
  std::size_t len;
  bool causal;
  std::size_t queries;
  std::size_t q0;
  template <class Team>
  HSPMD_HD void operator()(std::size_t r, const Team& t) const {
    const T* xr = x + r * len;
    T* yr = y + r * len;
    const std::size_t seen = causal ? q0 + r % queries + 1 : len;
    const T mx = t.max(xr, seen);
    if constexpr (Log) {
      const T s = t.template sum<T>(seen, [=](std::size_t j) { return math::exp(xr[j] - mx); });
      const T log_s = std::log(s);
      t.for_each(seen, [=](std::size_t j) { yr[j] = xr[j] - mx - log_s; });
    } else { // exponentials once: stored, summed, then scaled (each by the thread that stored it)
      const T s =
          t.template sum<T>(seen, [=](std::size_t j) { return yr[j] = math::exp(xr[j] - mx); });
      const T inv = T{1} / s;
      t.for_each(seen, [=](std::size_t j) { yr[j] *= inv; });
    }
    T* tail = yr + seen;
    t.for_each(len - seen, [=](std::size_t j) { tail[j] = T{0}; });
  }
};

/// Row r of the gradient: softmax dx = y (dy - sum dy y); log-softmax dx = dy - exp(y) sum dy.
template <class T, bool Log>
struct softmax_row_backward {
  const T* y;
  const T* dy;
  T* dx;
  std::size_t len;
  bool assign = false;
  template <class Team>
  HSPMD_HD void operator()(std::size_t r, const Team& t) const {
    const T* gr = dy + r * len;
    const T* yr = y + r * len;
    T* dr = dx + r * len;
    const bool store = assign;
    if constexpr (!Log) {
      const T s = t.template sum<T>(len, [&](std::size_t j) { return gr[j] * yr[j]; });
      t.for_each(len, [=](std::size_t j) { contribute(dr[j], yr[j] * (gr[j] - s), store); });
    } else {
      const T s = t.template sum<T>(len, [&](std::size_t j) { return gr[j]; });
      t.for_each(len,
                 [=](std::size_t j) { contribute(dr[j], gr[j] - math::exp(yr[j]) * s, store); });
    }
  }
};

template <bool Log>
struct softmax_kernel {
  static constexpr std::uint32_t assigns = 0b1;
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    const auto& out = c.out_shape();
    const std::size_t len = out.dims.back();
    const bool causal = !Log && c.attrs().flag;
    // Query rows: the second-to-last dimension (a local piece may start at an offset).
    const std::size_t queries = out.rank() >= 2 ? out.dims[out.rank() - 2] : 1;
    const program::node_layout* l = c.layout();
    const std::size_t q0 = l != nullptr && out.rank() >= 2 ? l->offset_of(out.rank() - 2) : 0;
    for_each_row(
        c.backend(), graph::rows_of(out),
        softmax_row<T, Log>{c.in(0), c.out(), len, causal, queries == 0 ? 1 : queries, q0});
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    const std::size_t len = c.out_shape().dims.back();
    for_each_row(c.backend(), graph::rows_of(c.out_shape()),
                 softmax_row_backward<T, Log>{c.out(), c.dout(), c.din(0), len, c.assign(0)});
  }
};

template <>
struct kernel<graph::op::softmax> : softmax_kernel<false> {};
template <>
struct kernel<graph::op::log_softmax> : softmax_kernel<true> {};

/// Row r of layer norm; keeps the row's mean and 1 / std in saved[2r], saved[2r + 1].
template <class T>
struct layer_norm_row {
  const T* x;
  const T* gamma;
  const T* beta;
  T* y;
  T* saved;
  std::size_t len;
  T eps;
  template <class Team>
  HSPMD_HD void operator()(std::size_t r, const Team& t) const {
    const T* xr = x + r * len;
    const T mu = t.template sum<T>(len, [&](std::size_t j) { return xr[j]; }) / static_cast<T>(len);
    const T var = t.template sum<T>(len, [&](std::size_t j) {
      return (xr[j] - mu) * (xr[j] - mu);
    }) / static_cast<T>(len);
    const T rstd = T{1} / std::sqrt(var + eps);
    if (t.leader()) {
      saved[2 * r] = mu;
      saved[2 * r + 1] = rstd;
    }
    T* yr = y + r * len;
    const T* ga = gamma;
    const T* be = beta;
    t.for_each(len, [=](std::size_t j) { yr[j] = ga[j] * (xr[j] - mu) * rstd + be[j]; });
  }
};

/// Row r of layer norm's input gradient:
/// dx = rstd / L (L dxhat - sum dxhat - xhat sum dxhat xhat), dxhat = dy gamma.
template <class T>
struct layer_norm_row_backward {
  const T* x;
  const T* gamma;
  const T* dy;
  const T* saved;
  T* dx;
  std::size_t len;
  bool assign = false;
  template <class Team>
  HSPMD_HD void operator()(std::size_t r, const Team& t) const {
    const T mu = saved[2 * r];
    const T rstd = saved[2 * r + 1];
    const T* xr = x + r * len;
    const T* gr = dy + r * len;
    const auto lt = static_cast<T>(len);
    const T* g = gamma;
    const T sum_dxhat = t.template sum<T>(len, [=](std::size_t j) { return gr[j] * g[j]; });
    const T sum_dxhat_xhat =
        t.template sum<T>(len, [=](std::size_t j) { return gr[j] * g[j] * ((xr[j] - mu) * rstd); });
    // dx = a dy gamma - b - c (x - mu), the row's constants hoisted so the loop is three FMAs
    const T a = rstd;
    const T b = rstd / lt * sum_dxhat;
    const T cc = rstd * rstd / lt * sum_dxhat_xhat;
    T* dr = dx + r * len;
    const bool store = assign;
    t.for_each(len, [=](std::size_t j) {
      contribute(dr[j], a * (gr[j] * g[j]) - b - cc * (xr[j] - mu), store);
    });
  }
};

/// Layer norm's gamma and beta gradient terms of element (r, j): dy xhat and dy.
template <class T>
struct layer_norm_column_terms {
  const T* x;
  const T* dy;
  const T* saved;
  std::size_t len;
  HSPMD_HD column_terms<T, 2> operator()(std::size_t r, std::size_t j) const {
    const T mu = saved[2 * r];
    const T rstd = saved[2 * r + 1];
    const T d = dy[r * len + j];
    return {{d * ((x[r * len + j] - mu) * rstd), d}};
  }
};
/// Stores or adds the two column sums into dgamma and dbeta.
template <class T>
struct layer_norm_column_finish {
  T* dgamma;
  T* dbeta;
  bool assign_gamma = false;
  bool assign_beta = false;
  HSPMD_HD void operator()(std::size_t j, const column_terms<T, 2>& s) const {
    contribute(dgamma[j], s.v[0], assign_gamma);
    contribute(dbeta[j], s.v[1], assign_beta);
  }
};

template <>
struct kernel<graph::op::layer_norm> {
  static constexpr std::uint32_t assigns = 0b111;
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    const std::size_t len = c.out_shape().dims.back();
    const std::size_t rows = graph::rows_of(c.out_shape());
    for_each_row(c.backend(), rows,
                 layer_norm_row<T>{c.in(0), c.in(1), c.in(2), c.out(), c.saved(2 * rows), len,
                                   static_cast<T>(c.attrs().scalar)});
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    const std::size_t len = c.out_shape().dims.back();
    const std::size_t rows = graph::rows_of(c.out_shape());
    for_each_row(c.backend(), rows,
                 layer_norm_row_backward<T>{c.in(0), c.in(1), c.dout(), c.saved(), c.din(0), len,
                                            c.assign(0)});
    column_sums<T, 2>(c.backend(), rows, len,
                      layer_norm_column_terms<T>{c.in(0), c.dout(), c.saved(), len},
                      layer_norm_column_finish<T>{c.din(1), c.din(2), c.assign(1), c.assign(2)});
  }
};

/// Row r of RMS norm; keeps the row's 1 / rms in saved[r].
template <class T>
struct rms_norm_row {
  const T* x;
  const T* w;
  T* y;
  T* saved;
  std::size_t len;
  T eps;
  template <class Team>
  HSPMD_HD void operator()(std::size_t r, const Team& t) const {
    const T* xr = x + r * len;
    const T ss = t.template sum<T>(len, [&](std::size_t j) { return xr[j] * xr[j]; });
    const T rrms = T{1} / std::sqrt(ss / static_cast<T>(len) + eps);
    if (t.leader())
      saved[r] = rrms;
    T* yr = y + r * len;
    const T* wt = w;
    t.for_each(len, [=](std::size_t j) { yr[j] = xr[j] * rrms * wt[j]; });
  }
};

/// Row r of RMS norm's input gradient: with xhat = x rrms and g = dy w,
/// dx = rrms (g - xhat mean(g xhat)).
template <class T>
struct rms_norm_row_backward {
  const T* x;
  const T* w;
  const T* dy;
  const T* saved;
  T* dx;
  std::size_t len;
  bool assign = false;
  template <class Team>
  HSPMD_HD void operator()(std::size_t r, const Team& t) const {
    const T rrms = saved[r];
    const T* xr = x + r * len;
    const T* gr = dy + r * len;
    const T dot =
        t.template sum<T>(len, [&](std::size_t j) { return gr[j] * w[j] * (xr[j] * rrms); });
    const T mean = dot / static_cast<T>(len);
    T* dr = dx + r * len;
    const T* wt = w;
    const bool store = assign;
    t.for_each(len, [=](std::size_t j) {
      contribute(dr[j], rrms * (gr[j] * wt[j] - xr[j] * rrms * mean), store);
    });
  }
};

/// RMS norm's weight gradient term of element (r, j): dy xhat.
template <class T>
struct rms_norm_column_term {
  const T* x;
  const T* dy;
  const T* saved;
  std::size_t len;
  HSPMD_HD column_terms<T, 1> operator()(std::size_t r, std::size_t j) const {
    return {{dy[r * len + j] * (x[r * len + j] * saved[r])}};
  }
};

template <>
struct kernel<graph::op::rms_norm> {
  static constexpr std::uint32_t assigns = 0b11;
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    const std::size_t len = c.out_shape().dims.back();
    const std::size_t rows = graph::rows_of(c.out_shape());
    for_each_row(c.backend(), rows,
                 rms_norm_row<T>{c.in(0), c.in(1), c.out(), c.saved(rows), len,
                                 static_cast<T>(c.attrs().scalar)});
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    const std::size_t len = c.out_shape().dims.back();
    const std::size_t rows = graph::rows_of(c.out_shape());
    for_each_row(c.backend(), rows,
                 rms_norm_row_backward<T>{c.in(0), c.in(1), c.dout(), c.saved(), c.din(0), len,
                                          c.assign(0)});
    column_sums<T, 1>(c.backend(), rows, len,
                      rms_norm_column_term<T>{c.in(0), c.dout(), c.saved(), len},
                      contribute_column<T>{c.din(1), T{1}, c.assign(1)});
  }
};

} // namespace hspmd::exec
