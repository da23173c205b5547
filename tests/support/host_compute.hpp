#pragma once
// Test backends over host memory with buffers of their own (guarded pages, a capacity-limited
// pool): the compute is the host backend's, each call that touches memory wrapped in the derived
// backend's `guard()` (an RAII object: opening guarded pages, or nothing).
#include <hspmd/exec/backends/host.hpp>

#include <algorithm>
#include <cstddef>
#include <utility>

namespace hspmd::test {

/// A guard that does nothing.
struct no_guard {};

template <class Derived>
class host_compute {
public:
  template <class F>
  void for_each_index(std::size_t n, const F& f) {
    [[maybe_unused]] const auto g = self().guard();
    host_.for_each_index(n, f);
  }
  template <class T>
  void gemm(exec::transpose ta, exec::transpose tb, std::size_t m, std::size_t n, std::size_t k,
            T alpha, const T* a, std::size_t lda, const T* b, std::size_t ldb, T beta, T* c,
            std::size_t ldc) {
    [[maybe_unused]] const auto g = self().guard();
    host_.gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  template <class T>
  void gemm_strided_batched(exec::transpose ta, exec::transpose tb, std::size_t m, std::size_t n,
                            std::size_t k, T alpha, const T* a, std::size_t lda, std::size_t sa,
                            const T* b, std::size_t ldb, std::size_t sb, T beta, T* c,
                            std::size_t ldc, std::size_t sc, std::size_t batch) {
    [[maybe_unused]] const auto g = self().guard();
    host_.gemm_strided_batched(ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
                               batch);
  }
  template <class T>
  void copy_from_host(T* dst, const T* src, std::size_t n) {
    [[maybe_unused]] const auto g = self().guard();
    std::copy_n(src, n, dst);
  }
  template <class T>
  void copy_to_host(T* dst, const T* src, std::size_t n) {
    [[maybe_unused]] const auto g = self().guard();
    std::copy_n(src, n, dst);
  }
  template <class F>
  double timed(F&& f) {
    return host_.timed(std::forward<F>(f));
  }
  void synchronize() {}

private:
  Derived& self() { return static_cast<Derived&>(*this); }
  exec::host_backend host_;
};

} // namespace hspmd::test
