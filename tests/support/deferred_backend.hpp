#pragma once
// A test backend that is asynchronous like a GPU's stream: kernels and GEMMs are queued and run
// only when something waits for them (synchronize, a copy to or from the host, timed, or a
// stream-ordered collective started after them), and freeing a buffer is queued behind the work
// that may still read it (a stream-ordered allocator). Code that reads a buffer without waiting
// for the work that writes it -- or hands it to a collective without ordering the two -- sees
// stale values here and fails the equivalence tests, as it would on a device.
// (The matching device communicator over MPI: stream_communicator.hpp.)
#include <hspmd/exec/backends/host.hpp>
#include <hspmd/kernels/backend.hpp>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace hspmd::test {

// The queue of one deferred backend and what it counts.
struct deferred_queue {
  std::vector<std::function<void()>> work;
  std::size_t synchronizations = 0; // host waits for the whole queue (synchronize, timed)
  std::size_t stream_waits = 0;     // collectives ordered after the queue without a host wait

  void run() {
    // Run in order; work queued while running (none today) would go after.
    for (std::size_t i = 0; i < work.size(); ++i)
      work[i]();
    work.clear();
  }
};

class deferred_backend {
public:
  template <class T>
  class buffer {
  public:
    buffer() = default;
    buffer(std::shared_ptr<deferred_queue> q, std::size_t n)
        : q_(std::move(q)), v_(std::make_unique<std::vector<T>>(n)) {}
    buffer(buffer&&) noexcept = default;
    buffer& operator=(buffer&& o) noexcept {
      if (this != &o) {
        release();
        q_ = std::move(o.q_);
        v_ = std::move(o.v_);
      }
      return *this;
    }
    buffer(const buffer&) = delete;
    buffer& operator=(const buffer&) = delete;
    ~buffer() { release(); }

    [[nodiscard]] T* data() const noexcept { return v_ ? v_->data() : nullptr; }
    [[nodiscard]] std::size_t size() const noexcept { return v_ ? v_->size() : 0; }
    [[nodiscard]] T* begin() const noexcept { return data(); }
    [[nodiscard]] T* end() const noexcept { return data() + size(); }

  private:
    // Freed after the queued work (which may read it), as a stream-ordered allocator does.
    void release() noexcept {
      if (v_ && q_ && !q_->work.empty()) {
        auto keep = std::make_shared<std::unique_ptr<std::vector<T>>>(std::move(v_));
        q_->work.emplace_back([keep] { keep->reset(); });
      }
      v_.reset();
    }
    std::shared_ptr<deferred_queue> q_;
    std::unique_ptr<std::vector<T>> v_;
  };

  /// The "stream": what a stream-ordered collective waits for.
  struct stream_handle {
    deferred_queue* q;
  };

  [[nodiscard]] std::string_view name() const { return "deferred host memory"; }
  [[nodiscard]] stream_handle stream() const { return {q_.get()}; }
  [[nodiscard]] const deferred_queue& queue() const { return *q_; }

  /// Zero-filled on the queue, as a device's allocator zeroes on its stream: until the queue
  /// runs, the buffer holds NaN (integers: all bits set), so a read that does not wait for the
  /// queue sees garbage instead of the zeros.
  template <class T>
  [[nodiscard]] buffer<T> allocate(std::size_t n) {
    buffer<T> b(q_, n);
    T* p = b.data();
    if constexpr (std::is_floating_point_v<T>)
      std::fill_n(p, n, std::numeric_limits<T>::quiet_NaN());
    else
      std::fill_n(p, n, static_cast<T>(~T{}));
    if (n != 0)
      q_->work.emplace_back([p, n] { std::fill_n(p, n, T{}); });
    return b;
  }
  template <class F>
  void for_each_index(std::size_t n, const F& f) {
    q_->work.emplace_back([n, f] { exec::host_backend{}.for_each_index(n, f); });
  }
  template <class T>
  void gemm(exec::transpose ta, exec::transpose tb, std::size_t m, std::size_t n, std::size_t k,
            T alpha, const T* a, std::size_t lda, const T* b, std::size_t ldb, T beta, T* c,
            std::size_t ldc) {
    q_->work.emplace_back(
        [=] { exec::host_backend{}.gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
  }
  template <class T>
  void gemm_strided_batched(exec::transpose ta, exec::transpose tb, std::size_t m, std::size_t n,
                            std::size_t k, T alpha, const T* a, std::size_t lda, std::size_t sa,
                            const T* b, std::size_t ldb, std::size_t sb, T beta, T* c,
                            std::size_t ldc, std::size_t sc, std::size_t batch) {
    q_->work.emplace_back([=] {
      exec::host_backend{}.gemm_strided_batched(ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb,
                                                beta, c, ldc, sc, batch);
    });
  }
  // Copies wait for the queue first (the CUDA backend's copies synchronize the same way).
  template <class T>
  void copy_from_host(T* dst, const T* src, std::size_t n) {
    q_->run();
    std::copy_n(src, n, dst);
  }
  template <class T>
  void copy_to_host(T* dst, const T* src, std::size_t n) {
    q_->run();
    std::copy_n(src, n, dst);
  }
  template <class F>
  double timed(F&& f) {
    return exec::host_backend{}.timed([&] {
      std::forward<F>(f)();
      ++q_->synchronizations;
      q_->run();
    });
  }
  void synchronize() {
    ++q_->synchronizations;
    q_->run();
  }

private:
  // Queued work holds no pointer to the backend (the executor moves it into place).
  std::shared_ptr<deferred_queue> q_ = std::make_shared<deferred_queue>();
};
static_assert(hspmd::exec::backend<deferred_backend>);
static_assert(!hspmd::exec::host_memory_v<deferred_backend>);

} // namespace hspmd::test
