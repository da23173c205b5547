#pragma once
// The host backend: buffers in host memory, functors in a plain loop (the compiler vectorizes
// the simple ones), GEMM through cblas (OpenBLAS) with one BLAS thread per process by default.

#include <hspmd/core/error.hpp>
#include <hspmd/exec/backends/blas.hpp>
#include <hspmd/kernels/backend.hpp>

#include <cblas.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// The BLAS set up once: its widest kernels for this CPU, one thread per process unless
/// OPENBLAS_NUM_THREADS says otherwise (exec/backends/blas.hpp).
inline void init_blas_threads() {
  static const bool once = [] {
    (void)blas::ensure();
    return true;
  }();
  (void)once;
}

/// Host memory for the executor's buffers: blocks of 2 MiB or more are aligned to 2 MiB and
/// offered to the kernel as transparent huge pages (madvise; where THP is "madvise" only, as on
/// the development machine, nothing else asks for them), so streaming kernels and the GEMM's
/// packing walk 512 times fewer pages. On a virtual machine a TLB miss is a two-level page walk:
/// GELU over cold 12 MiB buffers took about twice as long on 4 KiB pages (docs/benchmarks.md).
/// Smaller blocks come from operator new.
template <class T>
struct host_allocator {
  using value_type = T;
  static constexpr std::size_t huge_page = std::size_t{2} << 20;

  host_allocator() = default;
  template <class U>
  explicit(false) host_allocator(const host_allocator<U>& /*other*/) noexcept {}

  [[nodiscard]] T* allocate(std::size_t n) {
    if (n > SIZE_MAX / sizeof(T) - huge_page)
      throw std::bad_array_new_length();
    const std::size_t bytes = n * sizeof(T);
    if (bytes < huge_page)
      return std::allocator<T>{}.allocate(n);
    const std::size_t rounded = (bytes + huge_page - 1) / huge_page * huge_page;
    void* p = std::aligned_alloc(huge_page, rounded);
    if (p == nullptr)
      throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)::madvise(p, rounded, MADV_HUGEPAGE); // advice only: on failure, ordinary pages
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n * sizeof(T) < huge_page)
      std::allocator<T>{}.deallocate(p, n);
    else
      std::free(p);
  }
  friend bool operator==(const host_allocator&, const host_allocator&) noexcept {
    return true;
  }
};

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

/// Runs kernels on this process's CPU (see kernels/backend.hpp).
class host_backend {
public:
  template <class T>
  using buffer = std::vector<T, host_allocator<T>>;
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

  /// out[i, j] = row[j] for the m rows of n: a result the GEMM then accumulates onto. Past the
  /// L2 (4 MiB and more) with AVX-512, by non-temporal stores: they skip reading every line
  /// before writing it, and the GEMM reads the result once (BERT-small's FFN-up: fill and GEMM
  /// 9.5 -> 9.1 ms a call, docs/benchmarks.md).
  template <class T>
  void fill_rows(const T* row, T* out, std::size_t m, std::size_t n) const {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
      if (m * n * sizeof(T) >= (std::size_t{4} << 20) && n % 16 == 0 &&
          reinterpret_cast<std::uintptr_t>(out) % 64 == 0) {
        for (std::size_t i = 0; i < m; ++i)
          for (std::size_t j = 0; j < n; j += 16)
            _mm512_stream_ps(out + i * n + j, _mm512_loadu_ps(row + j));
        _mm_sfence();
        return;
      }
    }
#endif
    for (std::size_t i = 0; i < m; ++i)
      std::copy_n(row, n, out + i * n);
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
