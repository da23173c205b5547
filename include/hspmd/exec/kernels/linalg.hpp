#pragma once
// Kernels of the products (registry: graph/ops/linalg.hpp): GEMMs of the backend, and the bias
// of a linear layer as functors.

#include <hspmd/core/hd.hpp>
#include <hspmd/exec/kernels/common.hpp>

#include <cstddef>
#include <cstdint>

namespace hspmd::exec {

/// Row i of an (m, n) result: out[i, j] = b[j] (the GEMM then accumulates onto it).
template <class T>
struct fill_row_bias {
  const T* b;
  T* out;
  std::size_t n;
  HSPMD_HD void operator()(std::size_t i) const {
    T* row = out + i * n;
    for (std::size_t j = 0; j < n; ++j)
      row[j] = b[j];
  }
};
/// db[j] += sum over rows of dy[., j], for the columns of block b (stored with `assign`).
template <class T>
struct bias_gradient {
  const T* dy;
  T* db;
  std::size_t rows;
  std::size_t n;
  bool assign = false;
  HSPMD_HD void operator()(std::size_t b) const {
    const std::size_t j0 = b * column_block;
    const std::size_t w = n - j0 < column_block ? n - j0 : column_block;
    T s[column_block] = {};
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < w; ++j)
        s[j] += dy[i * n + j0 + j];
    for (std::size_t j = 0; j < w; ++j)
      contribute(db[j0 + j], s[j], assign);
  }
};

/// matmul and linear: x (m, k) . w (k, n) [+ b (n)], leading dimensions of x flattened into m.
struct matmul_kernel {
  static constexpr std::uint32_t assigns = 0b111; // dX, dW, db
  struct dims {
    std::size_t m, k, n;
  };
  template <class T, class B>
  static dims dims_of(const kernel_context<T, B>& c) {
    const auto& w = c.in_shape(1);
    const std::size_t k = w.dims[0];
    return {k == 0 ? 0 : c.in_shape(0).size() / k, k, w.dims[1]};
  }
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    const auto [m, k, n] = dims_of(c);
    // With a bias: rows of the bias first, the product accumulated onto them (one pass over the
    // result fewer than adding the bias after a beta-0 GEMM, which clears it first).
    const bool bias = c.arity() == 3 && !c.skip_bias();
    if (bias) {
      if constexpr (requires { c.backend().fill_rows(c.in(2), c.out(), m, n); })
        c.backend().fill_rows(c.in(2), c.out(), m, n);
      else
        for_each_index(c.backend(), m, fill_row_bias<T>{c.in(2), c.out(), n});
    }
    gemm(c, transpose::no, transpose::no, m, n, k, T{1}, c.in(0), k, c.in(1), n, bias ? T{1} : T{0},
         c.out(), n);
  }
  // dX += dY W^T ; dW += X^T dY ; db += column sums of dY (beta 0 where the gradient is stored)
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    const auto [m, k, n] = dims_of(c);
    gemm(c, transpose::no, transpose::yes, m, k, n, T{1}, c.dout(), n, c.in(1), n, beta(c, 0),
         c.din(0), k);
    gemm(c, transpose::yes, transpose::no, k, n, m, T{1}, c.in(0), k, c.dout(), n, beta(c, 1),
         c.din(1), n);
    if (c.arity() == 3 && !c.skip_bias())
      for_each_index(c.backend(), column_blocks(n),
                     bias_gradient<T>{c.dout(), c.din(2), m, n, c.assign(2)});
    else if (c.arity() == 3 && c.assign(2)) // another rank's bias: its gradient here is 0
      fill(c.backend(), c.din(2), n, T{});
  }
  /// A backward GEMM's beta: 0 where it stores input k's gradient, else 1 (adds).
  template <class T, class B>
  static T beta(const kernel_context<T, B>& c, std::size_t k) {
    return c.assign(k) ? T{0} : T{1};
  }
};

template <>
struct kernel<graph::op::matmul> : matmul_kernel {};
template <>
struct kernel<graph::op::linear> : matmul_kernel {};

template <>
struct kernel<graph::op::batched_matmul> {
  static constexpr std::uint32_t assigns = 0b11;
  struct dims {
    std::size_t batches, m, k, n;
  };
  template <class T, class B>
  static dims dims_of(const kernel_context<T, B>& c) {
    const auto& a = c.in_shape(0);
    const std::size_t r = a.rank();
    const std::size_t m = a.dims[r - 2];
    const std::size_t k = a.dims[r - 1];
    return {m * k == 0 ? 0 : a.size() / (m * k), m, k, c.out_shape().dims[r - 1]};
  }
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    const auto [batches, m, k, n] = dims_of(c);
    const bool bt = c.attrs().flag;
    gemm_strided_batched(c, transpose::no, bt ? transpose::yes : transpose::no, m, n, k, T{1},
                         c.in(0), k, m * k, c.in(1), bt ? k : n, k * n, T{0}, c.out(), n, m * n,
                         batches);
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    const auto [batches, m, k, n] = dims_of(c);
    if (batches == 0) { // no rows (a rank's empty piece): B's stored gradient is 0
      for (std::size_t i = 0; i < 2; ++i)
        if (c.assign(i))
          fill(c.backend(), c.din(i), c.in_shape(i).size(), T{});
      return;
    }
    if (!c.attrs().flag) { // C = A B: dA += dC B^T (m x k), dB += A^T dC (k x n)
      gemm_strided_batched(c, transpose::no, transpose::yes, m, k, n, T{1}, c.dout(), n, m * n,
                           c.in(1), n, k * n, matmul_kernel::beta(c, 0), c.din(0), k, m * k,
                           batches);
      gemm_strided_batched(c, transpose::yes, transpose::no, k, n, m, T{1}, c.in(0), k, m * k,
                           c.dout(), n, m * n, matmul_kernel::beta(c, 1), c.din(1), n, k * n,
                           batches);
    } else { // C = A B^T, B is n x k: dA += dC B (m x k), dB += dC^T A (n x k)
      gemm_strided_batched(c, transpose::no, transpose::no, m, k, n, T{1}, c.dout(), n, m * n,
                           c.in(1), k, k * n, matmul_kernel::beta(c, 0), c.din(0), k, m * k,
                           batches);
      gemm_strided_batched(c, transpose::yes, transpose::no, n, k, m, T{1}, c.dout(), n, m * n,
                           c.in(0), k, m * k, matmul_kernel::beta(c, 1), c.din(1), k, k * n,
                           batches);
    }
  }
};

} // namespace hspmd::exec
