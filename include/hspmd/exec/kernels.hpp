#pragma once
// The host kernel layer: GEMM through cblas (OpenBLAS), one BLAS thread per process by default.
// The executor calls kernels only through this interface, so a CUDA implementation (cuBLAS and
// own kernels in .cuh files) can provide the same functions without touching graph or autodiff.
//
// Matrices are row-major. `trans_a` means A is stored as k x m and used transposed.

#include <hspmd/core/error.hpp>

#include <cblas.h>

#include <climits>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <type_traits>

extern "C" void openblas_set_num_threads(int num_threads); // OpenBLAS extension

namespace hspmd::exec {

/// Whether an operand is used as stored or transposed.
enum class transpose : unsigned char { no, yes };

/// Sets OpenBLAS to one thread per process unless OPENBLAS_NUM_THREADS says otherwise: with one
/// rank per core, BLAS threads would only compete with the other ranks.
inline void init_blas_threads() {
  static const bool once = [] {
    if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr)
      openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

namespace detail {
[[nodiscard]] inline int blas_int(std::size_t v, const char* what) {
  if (v > static_cast<std::size_t>(INT_MAX))
    throw shape_error("gemm",
                      std::string(what) + " " + std::to_string(v) + " exceeds the BLAS int range",
                      "split the product into smaller blocks");
  return static_cast<int>(v);
}
} // namespace detail

/// C = alpha * op(A) * op(B) + beta * C, with op(A) m x k, op(B) k x n, C m x n, row-major,
/// leading dimensions lda, ldb, ldc. float or double.
template <class T>
requires std::is_same_v<T, float> || std::is_same_v<T, double>
void gemm(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, T alpha,
          const T* a, std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
  if (m == 0 || n == 0)
    return;
  init_blas_threads();
  const auto ta_ = ta == transpose::yes ? CblasTrans : CblasNoTrans;
  const auto tb_ = tb == transpose::yes ? CblasTrans : CblasNoTrans;
  const int mi = detail::blas_int(m, "m");
  const int ni = detail::blas_int(n, "n");
  const int ki = detail::blas_int(k, "k");
  const int la = detail::blas_int(lda, "lda");
  const int lb = detail::blas_int(ldb, "ldb");
  const int lc = detail::blas_int(ldc, "ldc");
  if (k == 0) { // cblas leaves C untouched only when beta == 1; be explicit
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j)
        c[i * ldc + j] = beta == T{0} ? T{0} : beta * c[i * ldc + j];
    return;
  }
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, ta_, tb_, mi, ni, ki, alpha, a, la, b, lb, beta, c, lc);
  else
    cblas_dgemm(CblasRowMajor, ta_, tb_, mi, ni, ki, alpha, a, la, b, lb, beta, c, lc);
}

} // namespace hspmd::exec
