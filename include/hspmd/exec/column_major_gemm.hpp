#pragma once
// A row-major GEMM as the column-major call that computes it, for column-major libraries
// (cuBLAS). A row-major m x n matrix with leading dimension ld is, read column-major, its n x m
// transpose with the same ld; and (op(A) op(B))^T = op(B)^T op(A)^T. So the column-major call
// that fills row-major C = op(A) op(B) takes B first and A second, n rows and m columns, the
// transpose flags and leading dimensions as they were:
//
//     row-major:     C(2x3) = A(2x4) * B(4x3)        lda 4, ldb 3, ldc 3
//     column-major:  C'(3x2) = B'(3x4) * A'(4x2)     first B with ld 3, second A with ld 4
//
// Hardware-free, so that the mapping is tested on the host against a row-major reference.

#include <hspmd/kernels/backend.hpp>

#include <cstddef>

namespace hspmd::exec {

/// The arguments of a column-major (strided-batched) GEMM
/// C = alpha op(first) op(second) + beta C, with op(first) m x k and op(second) k x n.
template <class T>
struct column_major_gemm {
  transpose op_first;
  transpose op_second;
  std::size_t m, n, k;
  const T* first;
  std::size_t ld_first;
  std::size_t stride_first;
  const T* second;
  std::size_t ld_second;
  std::size_t stride_second;
};

/// The column-major call that computes the row-major C = op(A) op(B) (see the file comment);
/// C keeps its pointer, leading dimension and stride.
template <class T>
[[nodiscard]] constexpr column_major_gemm<T>
as_column_major(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, const T* a,
                std::size_t lda, std::size_t stride_a, const T* b, std::size_t ldb,
                std::size_t stride_b) noexcept {
  return {tb, ta, n, m, k, b, ldb, stride_b, a, lda, stride_a};
}

} // namespace hspmd::exec
