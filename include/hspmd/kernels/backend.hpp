#pragma once
// The seam between the executor and a device: a *backend* owns buffers, runs kernel functors
// over an index range and multiplies matrices. The executor and the kernels (kernels/)
// reach hardware only through it, so a device plugs in by providing one more backend.
//
//     exec::host_backend host;                          // exec/backends/host.hpp: cblas + loops
//     auto y = host.allocate<float>(n);
//     exec::for_each_index(host, n, gelu_forward<float>{x, y.data()});   // y[i] = gelu(x[i])
//     exec::gemm(host, transpose::no, transpose::no, m, n, k, 1.f, a, k, b, n, 0.f, c, n);
//
// Functors are written once with HSPMD_HD (core/hd.hpp): `f(i)` for every i in [0, n), in any
// order and possibly at once, so a functor writes only what index i owns (elementwise: element
// i; row kernels: row i).

#include <hspmd/core/hd.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace hspmd::exec {

/// Whether an operand of a GEMM is used as stored or transposed.
enum class transpose : unsigned char { no, yes };

namespace detail {
struct probe_functor {
  HSPMD_HD void operator()(std::size_t /*i*/) const {}
};
struct probe_work {
  void operator()() const {}
};
} // namespace detail

/// What the executor needs of a device. Matrices are row-major; `gemm` computes
/// C = alpha op(A) op(B) + beta C with op(A) m x k, op(B) k x n; `gemm_strided_batched` does so
/// for `batch` products whose operands lie `stride_*` elements apart. Buffers hold elements of
/// float, double, std::int64_t or std::size_t and expose data() and size(). `copy_from_host`
/// fills a buffer from host memory (inputs); `copy_to_host` reads one back once the work queued
/// before it is done; `timed(f)` runs f and returns the seconds the
/// device spent on it (host: a clock around f; a device: events on its stream).
template <class B>
concept backend = requires(B& b, const B& cb, std::size_t n, float* f, const float* cf, double* d,
                           const double* cd) {
  { cb.name() } -> std::convertible_to<std::string_view>;
  { b.template allocate<float>(n).data() } -> std::same_as<float*>;
  { b.template allocate<double>(n).size() } -> std::same_as<std::size_t>;
  { b.template allocate<std::int64_t>(n).data() } -> std::same_as<std::int64_t*>;
  b.for_each_index(n, detail::probe_functor{});
  b.gemm(transpose::no, transpose::no, n, n, n, 1.0F, cf, n, cf, n, 0.0F, f, n);
  b.gemm(transpose::no, transpose::no, n, n, n, 1.0, cd, n, cd, n, 0.0, d, n);
  b.gemm_strided_batched(transpose::no, transpose::yes, n, n, n, 1.0F, cf, n, n, cf, n, n, 0.0F, f,
                         n, n, n);
  b.gemm_strided_batched(transpose::no, transpose::yes, n, n, n, 1.0, cd, n, n, cd, n, n, 0.0, d, n,
                         n, n);
  b.copy_from_host(f, cf, n);
  b.copy_from_host(d, cd, n);
  b.copy_to_host(f, cf, n);
  b.copy_to_host(d, cd, n);
  { b.timed(detail::probe_work{}) } -> std::convertible_to<double>;
  b.synchronize();
};

/// Whether a backend's buffers are host memory that host code may read and write in place (the
/// host backend says so with `static constexpr bool host_memory = true`). Code that must work on
/// every backend reads and writes buffers of the others only through `copy_to_host` and
/// `copy_from_host`; for host memory it may skip the staging copy.
template <class B>
inline constexpr bool host_memory_v = requires {
  requires B::host_memory;
};

namespace detail {
// A backend that exists only to be named in compile-time checks (never run).
struct probe_backend {
  template <class E>
  struct buffer {
    E* data();
    [[nodiscard]] std::size_t size() const;
  };
  [[nodiscard]] std::string_view name() const;
  template <class E>
  buffer<E> allocate(std::size_t n);
  template <class F>
  void for_each_index(std::size_t n, const F& f);
  template <class T>
  void gemm(transpose, transpose, std::size_t, std::size_t, std::size_t, T, const T*, std::size_t,
            const T*, std::size_t, T, T*, std::size_t);
  template <class T>
  void gemm_strided_batched(transpose, transpose, std::size_t, std::size_t, std::size_t, T,
                            const T*, std::size_t, std::size_t, const T*, std::size_t, std::size_t,
                            T, T*, std::size_t, std::size_t, std::size_t);
  template <class T>
  void copy_from_host(T*, const T*, std::size_t);
  template <class T>
  void copy_to_host(T*, const T*, std::size_t);
  template <class F>
  double timed(F&&);
  void synchronize();
};
} // namespace detail

/// Runs f(i) for every i in [0, n) on the backend.
template <backend B, class F>
void for_each_index(B& b, std::size_t n, const F& f) {
  b.for_each_index(n, f);
}

/// out[i] = value for every i in [0, n).
template <class T>
struct fill_functor {
  T* out;
  T value;
  HSPMD_HD void operator()(std::size_t i) const { out[i] = value; }
};

/// Sets n elements at `p` (backend memory) to `value`.
template <backend B, class T>
void fill(B& b, T* p, std::size_t n, T value) {
  b.for_each_index(n, fill_functor<T>{p, value});
}

/// C = alpha op(A) op(B) + beta C on the backend (row-major, leading dimensions lda, ldb, ldc).
template <backend B, class T>
void gemm(B& b, transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, T alpha,
          const T* a, std::size_t lda, const T* bm, std::size_t ldb, T beta, T* c,
          std::size_t ldc) {
  b.gemm(ta, tb, m, n, k, alpha, a, lda, bm, ldb, beta, c, ldc);
}

/// `batch` GEMMs whose A, B and C lie stride_a, stride_b and stride_c elements apart.
template <backend B, class T>
void gemm_strided_batched(B& b, transpose ta, transpose tb, std::size_t m, std::size_t n,
                          std::size_t k, T alpha, const T* a, std::size_t lda, std::size_t stride_a,
                          const T* bm, std::size_t ldb, std::size_t stride_b, T beta, T* c,
                          std::size_t ldc, std::size_t stride_c, std::size_t batch) {
  b.gemm_strided_batched(ta, tb, m, n, k, alpha, a, lda, stride_a, bm, ldb, stride_b, beta, c, ldc,
                         stride_c, batch);
}

} // namespace hspmd::exec
