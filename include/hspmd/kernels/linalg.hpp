#pragma once
// Kernels of the products (registry: graph/ops/linalg.hpp): GEMMs of the backend, and the bias
// of a linear layer as functors.

#include <hspmd/core/hd.hpp>
#include <hspmd/kernels/common.hpp>

#include <cstddef>
#include <cstdint>

namespace hspmd::exec {

/// Columns [j0, j0 + w) of row i of an (m, n) result: out[i, j] = b[j] (the GEMM then
/// accumulates onto it).
template <class T>
struct fill_row_bias {
  const T* b;
  T* out;
  std::size_t n;
  HSPMD_HD void operator()(std::size_t i, std::size_t j0, std::size_t w) const {
    T* row = out + i * n + j0;
    for (std::size_t j = 0; j < w; ++j)
      row[j] = b[j0 + j];
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
        for_each_row_slice(c.backend(), m, n, fill_row_bias<T>{c.in(2), c.out(), n});
    }
    gemm(c, transpose::no, transpose::no, m, n, k, T{1}, c.in(0), k, c.in(1), n, bias ? T{1} : T{0},
         c.out(), n);
  }
  // dX += dY W^T ; dW += X^T dY ; db += column sums of dY (beta 0 where the gradient is stored);
  // each only where wanted (a split backward)
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    const auto [m, k, n] = dims_of(c);
    if (c.wants(0))
      gemm(c, transpose::no, transpose::yes, m, k, n, T{1}, c.dout(), n, c.in(1), n, beta(c, 0),
           c.din(0), k);
    if (c.wants(1))
      gemm(c, transpose::yes, transpose::no, k, n, m, T{1}, c.in(0), k, c.dout(), n, beta(c, 1),
           c.din(1), n);
    if (c.arity() == 3 && !c.wants(2))
      return;
    if (c.arity() == 3 && !c.skip_bias())
      column_sums<T, 1>(c.backend(), m, n, matrix_column<T>{c.dout(), n},
                        contribute_column<T>{c.din(2), T{1}, c.assign(2)});
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
  /// Where an operand's matrices lie: rows `ld` apart, matrices `inner` apart within a group of
  /// `heads` (dimension 1 of a rank-4 operand), groups `outer` apart. A swapped operand (a
  /// permute {0, 2, 1, 3} read by strides) interleaves its heads' rows.
  struct strides {
    std::size_t ld, inner, outer;
  };
  static strides strides_of(bool swapped, std::size_t rows, std::size_t cols, std::size_t heads) {
    return swapped ? strides{heads * cols, cols, heads * rows * cols}
                   : strides{cols, rows * cols, heads * rows * cols};
  }
  /// C = alpha op(A) op(B) + beta C over every matrix: one strided batch, or one per group of
  /// heads where an operand is swapped.
  template <class T, class B>
  static void product(const kernel_context<T, B>& c, bool grouped, std::size_t batches,
                      std::size_t heads, transpose ta, transpose tb, std::size_t m, std::size_t n,
                      std::size_t k, const T* a, strides sa, const T* b, strides sb, T beta, T* out,
                      strides so) {
    if (!grouped) {
      gemm_strided_batched(c, ta, tb, m, n, k, T{1}, a, sa.ld, sa.inner, b, sb.ld, sb.inner, beta,
                           out, so.ld, so.inner, batches);
      return;
    }
    for (std::size_t g = 0; heads != 0 && g < batches / heads; ++g)
      gemm_strided_batched(c, ta, tb, m, n, k, T{1}, a + g * sa.outer, sa.ld, sa.inner,
                           b + g * sb.outer, sb.ld, sb.inner, beta, out + g * so.outer, so.ld,
                           so.inner, heads);
  }
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    const auto [batches, m, k, n] = dims_of(c);
    const bool bt = c.attrs().flag;
    const bool grouped = c.in_swapped(0) || c.in_swapped(1) || c.swapped();
    const std::size_t heads = c.out_shape().rank() == 4 ? c.out_shape().dims[1] : 1;
    product(c, grouped, batches, heads, transpose::no, bt ? transpose::yes : transpose::no, m, n, k,
            c.in(0), strides_of(c.in_swapped(0), m, k, heads), c.in(1),
            strides_of(c.in_swapped(1), bt ? n : k, bt ? k : n, heads), T{0}, c.out(),
            strides_of(c.swapped(), m, n, heads));
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
    const bool bt = c.attrs().flag;
    const bool grouped = c.in_swapped(0) || c.in_swapped(1) || c.swapped();
    const std::size_t heads = c.out_shape().rank() == 4 ? c.out_shape().dims[1] : 1;
    const strides sa = strides_of(c.in_swapped(0), m, k, heads);
    const strides sb = strides_of(c.in_swapped(1), bt ? n : k, bt ? k : n, heads);
    const strides sc = strides_of(c.swapped(), m, n, heads);
    if (!bt) { // C = A B: dA += dC B^T (m x k), dB += A^T dC (k x n)
      product(c, grouped, batches, heads, transpose::no, transpose::yes, m, k, n, c.dout(), sc,
              c.in(1), sb, matmul_kernel::beta(c, 0), c.din(0), sa);
      product(c, grouped, batches, heads, transpose::yes, transpose::no, k, n, m, c.in(0), sa,
              c.dout(), sc, matmul_kernel::beta(c, 1), c.din(1), sb);
    } else { // C = A B^T, B is n x k: dA += dC B (m x k), dB += dC^T A (n x k)
      product(c, grouped, batches, heads, transpose::no, transpose::no, m, k, n, c.dout(), sc,
              c.in(1), sb, matmul_kernel::beta(c, 0), c.din(0), sa);
      product(c, grouped, batches, heads, transpose::yes, transpose::no, n, k, m, c.dout(), sc,
              c.in(0), sa, matmul_kernel::beta(c, 1), c.din(1), sb);
    }
  }
};

} // namespace hspmd::exec
