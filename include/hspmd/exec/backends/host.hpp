#pragma once
// The host backend: buffers in host memory, functors in a plain loop (the compiler vectorizes
// the simple ones), GEMM through cblas (OpenBLAS) with one BLAS thread per process by default.

#include <hspmd/core/error.hpp>
#include <hspmd/exec/backend.hpp>

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

extern "C" void openblas_set_num_threads(int num_threads); // OpenBLAS extension

namespace hspmd::exec {

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
/// leading dimensions lda, ldb, ldc; float or double, through cblas.
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

/// Runs kernels on this process's CPU (see exec/backend.hpp).
class host_backend {
public:
  template <class T>
  using buffer = std::vector<T>;
  /// Buffers are host memory: host code may use them in place.
  static constexpr bool host_memory = true;

  [[nodiscard]] std::string_view name() const noexcept { return "host"; }

  /// n zero-initialized elements.
  template <class T>
  [[nodiscard]] buffer<T> allocate(std::size_t n) const {
    return buffer<T>(n, T{});
  }

  // A copy of the functor: its pointers then live in registers, not behind a reference that
  // every store through them might change, and the loop vectorizes.
  template <class F>
  void for_each_index(std::size_t n, const F& f) const {
    const F local = f;
    for (std::size_t i = 0; i < n; ++i)
      local(i);
  }

  template <class T>
  void gemm(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, T alpha,
            const T* a, std::size_t lda, const T* b, std::size_t ldb, T beta, T* c,
            std::size_t ldc) const {
    exec::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

  template <class T>
  void gemm_strided_batched(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k,
                            T alpha, const T* a, std::size_t lda, std::size_t stride_a, const T* b,
                            std::size_t ldb, std::size_t stride_b, T beta, T* c, std::size_t ldc,
                            std::size_t stride_c, std::size_t batch) const {
    for (std::size_t i = 0; i < batch; ++i)
      exec::gemm(ta, tb, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
                 c + i * stride_c, ldc);
  }

  template <class T>
  void copy_from_host(T* dst, const T* src, std::size_t n) const {
    std::copy_n(src, n, dst);
  }

  template <class T>
  void copy_to_host(T* dst, const T* src, std::size_t n) const {
    std::copy_n(src, n, dst);
  }

  /// Runs f; the seconds it took on the clock (host work is done when f returns).
  template <class F>
  double timed(F&& f) const {
    const auto start = std::chrono::steady_clock::now();
    std::forward<F>(f)();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  /// Host work is done when the call returns.
  void synchronize() const noexcept {}
};

static_assert(backend<host_backend>);

} // namespace hspmd::exec
