#pragma once
// The CUDA backend: buffers in device memory from a stream-ordered caching allocator
// (exec/caching_allocator.hpp), every kernel functor launched by the grid-stride launcher
// (exec/backends/device_launch.cuh) on the backend's compute stream, GEMMs through cuBLAS
// (cublasGemmEx / cublasGemmStridedBatchedEx with fp32 or fp64 accumulation, row-major by the
// operand swap of exec/column_major_gemm.hpp), timing by CUDA events. nvcc only.
//
//     exec::cuda_backend gpu{0};                       // device 0, its own stream and handle
//     auto x = gpu.allocate<float>(n);                 // zeroed, from the cache
//     gpu.copy_from_host(x.data(), host.data(), n);
//     exec::for_each_index(gpu, n, gelu_forward<float>{x.data(), y.data()});
//     gpu.copy_to_host(out.data(), y.data(), n);       // waits for the stream
//
// Every CUDA and cuBLAS call is checked; a failure throws `device_error` naming the device and
// the call, with CUDA's error text (the last error is reset so that a later check does not
// report it again; a sticky error -- an illegal address -- stays until the process ends).
// Each call first makes the backend's device current, so backends of several devices may be
// used from one thread. Work runs on the backend's one stream (`stream()`): work on another
// stream that reads a buffer (a communicator's) waits for this one first -- by an event, as
// nccl_communicator::start_all_reduce does when given this stream, or by `synchronize()`.
//
// Compiled by the test suite wherever nvcc is found (tests/gpu/cuda_backend.test.cu); it runs
// only where a GPU is.

#include <hspmd/core/error.hpp>
#include <hspmd/exec/backends/device_launch.cuh>
#include <hspmd/exec/caching_allocator.hpp>
#include <hspmd/exec/column_major_gemm.hpp>
#include <hspmd/kernels/backend.hpp>
#include <hspmd/kernels/precision.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace hspmd::exec {

namespace detail {

// A kernel's fault is reported by whichever checked call comes next; these are sticky (the
// context is lost). The executor names the graph node where it was noticed.
[[nodiscard]] inline bool asynchronous_fault(cudaError_t code) {
  return code == cudaErrorIllegalAddress || code == cudaErrorLaunchFailure ||
         code == cudaErrorMisalignedAddress || code == cudaErrorIllegalInstruction ||
         code == cudaErrorAssert || code == cudaErrorHardwareStackError ||
         code == cudaErrorInvalidPc || code == cudaErrorLaunchTimeout;
}

inline void cuda_device_check(cudaError_t code, std::string_view call, int device) {
  if (code == cudaSuccess)
    return;
  (void)cudaGetLastError(); // reset the last (non-sticky) error
  throw device_error(device, std::string(call.substr(0, call.find('('))),
                     std::string(cudaGetErrorName(code)) + ": " + cudaGetErrorString(code),
                     asynchronous_fault(code)
                         ? "a kernel faulted before this call; run with CUDA_LAUNCH_BLOCKING=1 "
                           "to name the node that caused it (the process cannot use the device "
                           "again)"
                         : "");
}

// The devices this process sees; 0 and CUDA's error text when it sees none.
inline int cuda_devices(std::string& why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
    return 0;
  }
  if (count <= 0)
    why = "cudaGetDeviceCount found no CUDA device";
  return count > 0 ? count : 0;
}

inline std::string describe_cuda_device(int device) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "cuda:" + std::to_string(device);
  }
  char text[384];
  std::snprintf(text, sizeof text, "cuda:%d (%s, sm_%d%d, %.0f GiB)", device, p.name, p.major,
                p.minor, static_cast<double>(p.totalGlobalMem) / 1073741824.0);
  return text;
}

// The device this host thread computes on (cudaGetDevice).
inline int current_cuda_device() {
  int device = 0;
  cuda_device_check(cudaGetDevice(&device), "cudaGetDevice", device);
  return device;
}

inline void cublas_check(cublasStatus_t code, std::string_view call, int device) {
  if (code == CUBLAS_STATUS_SUCCESS)
    return;
  (void)cudaGetLastError();
  throw device_error(device, std::string(call.substr(0, call.find('('))),
                     cublasGetStatusString(code));
}

[[nodiscard]] inline int cublas_int(std::size_t v, const char* what, int device) {
  if (v > static_cast<std::size_t>(INT_MAX))
    throw device_error(device, "gemm",
                       std::string(what) + " " + std::to_string(v) + " exceeds cuBLAS's int range",
                       "split the product into smaller blocks");
  return static_cast<int>(v);
}

} // namespace detail

/// Checks a CUDA runtime call made for device `device`.
#define HSPMD_CUDA_DEVICE_CHECK(call, device)                                                      \
  ::hspmd::exec::detail::cuda_device_check((call), #call, (device))
/// Checks a cuBLAS call made for device `device`.
#define HSPMD_CUBLAS_CHECK(call, device)                                                           \
  ::hspmd::exec::detail::cublas_check((call), #call, (device))

/// C = beta C over an m x n row-major block (leading dimension ldc), `batch` blocks stride_c
/// apart; beta == 0 writes exact zeros (what BLAS does for k == 0, which cuBLAS refuses when a
/// leading dimension is then 0).
template <class T>
struct scale_block {
  T* c;
  std::size_t n;
  std::size_t ldc;
  std::size_t rows; // m
  std::size_t stride_c;
  T beta;
  HSPMD_HD void operator()(std::size_t i) const {
    const std::size_t per = rows * n;
    const std::size_t b = i / per;
    const std::size_t r = (i % per) / n;
    const std::size_t j = i % n;
    T& e = c[b * stride_c + r * ldc + j];
    e = beta == T{0} ? T{0} : beta * e;
  }
};

/// Device memory from cudaMalloc for a caching allocator (exec/caching_allocator.hpp).
class cuda_memory {
public:
  using stream = cudaStream_t;

  explicit cuda_memory(int device = 0) noexcept : device_(device) {}

  /// nullptr when the device is out of memory; other failures throw.
  [[nodiscard]] void* allocate(std::size_t bytes, cudaStream_t /*stream*/) {
    HSPMD_CUDA_DEVICE_CHECK(cudaSetDevice(device_), device_);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    detail::cuda_device_check(e, "cudaMalloc", device_);
    return p;
  }
  void deallocate(void* p, std::size_t /*bytes*/) noexcept { (void)cudaFree(p); }
  /// Waits for every stream of the device (cudaFree would too, but only for its own call).
  void synchronize() noexcept { (void)cudaDeviceSynchronize(); }
  [[nodiscard]] int device() const noexcept { return device_; }

private:
  int device_;
};

static_assert(raw_memory<cuda_memory>);

/// Runs kernels on one CUDA device, on a stream of its own (see the file comment). Move-only;
/// buffers it allocated must be destroyed before it.
class cuda_backend {
public:
  using allocator_type = caching_allocator<cuda_memory>;
  template <class T>
  using buffer = pooled_buffer<T, allocator_type>;

  /// Selects `device`, creates a non-blocking stream, two timing events and a cuBLAS handle on
  /// that stream. Throws `device_error` when there is no such device.
  explicit cuda_backend(int device) : state_(std::make_unique<state>(device)) {}
  /// Device 0 (what `executor`'s default backend argument builds).
  cuda_backend() : cuda_backend(0) {}

  [[nodiscard]] std::string_view name() const noexcept { return "cuda"; }
  [[nodiscard]] int device() const noexcept { return state_->device; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return state_->stream; }
  /// The caching allocator's counters: reserved and peak bytes.
  [[nodiscard]] memory_stats memory() const { return state_->pool.stats(); }
  /// Returns cached device memory to the device (after synchronizing).
  void release_cached_memory() { state_->pool.release_cached(); }

  /// n zero-initialized elements in device memory (zeroed on the stream, like the host
  /// backend's value-initialized vectors).
  template <class T>
  [[nodiscard]] buffer<T> allocate(std::size_t n) {
    (void)current();
    buffer<T> b(state_->pool, n, state_->stream);
    if (n != 0)
      HSPMD_CUDA_DEVICE_CHECK(cudaMemsetAsync(b.data(), 0, n * sizeof(T), state_->stream),
                              state_->device);
    return b;
  }

  /// f(i) for i in [0, n) on the device; f's pointers must be device pointers.
  template <class F>
  void for_each_index(std::size_t n, const F& f) {
    (void)current();
    HSPMD_CUDA_DEVICE_CHECK(launch_for_each_index(n, f, state_->stream), state_->device);
  }

  /// The row functor f(r, team) for r in [0, rows) on the device: 16 threads a row
  /// (`lane_team`), reducing in the host's lane order.
  template <class F>
  void for_each_row(std::size_t rows, const F& f) {
    (void)current();
    HSPMD_CUDA_DEVICE_CHECK(launch_for_each_row(rows, f, state_->stream), state_->device);
  }

  template <class T>
  requires std::is_same_v<T, float> || std::is_same_v<T, double>
  void gemm(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, T alpha,
            const T* a, std::size_t lda, const T* b, std::size_t ldb, T beta, T* c,
            std::size_t ldc) {
    if (m == 0 || n == 0)
      return;
    const int dev = current();
    if (k == 0) {
      for_each_index(m * n, scale_block<T>{c, n, ldc, m, 0, beta});
      return;
    }
    const auto g = as_column_major(ta, tb, m, n, k, a, lda, 0, b, ldb, 0);
    HSPMD_CUBLAS_CHECK(
        cublasGemmEx(state_->blas, op(g.op_first), op(g.op_second),
                     detail::cublas_int(g.m, "m", dev), detail::cublas_int(g.n, "n", dev),
                     detail::cublas_int(g.k, "k", dev), &alpha, g.first, data_type<T>(),
                     detail::cublas_int(g.ld_first, "lda", dev), g.second, data_type<T>(),
                     detail::cublas_int(g.ld_second, "ldb", dev), &beta, c, data_type<T>(),
                     detail::cublas_int(ldc, "ldc", dev), compute_type<T>(), CUBLAS_GEMM_DEFAULT),
        dev);
  }

  template <class T>
  requires std::is_same_v<T, float> || std::is_same_v<T, double>
  void gemm_strided_batched(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k,
                            T alpha, const T* a, std::size_t lda, std::size_t stride_a, const T* b,
                            std::size_t ldb, std::size_t stride_b, T beta, T* c, std::size_t ldc,
                            std::size_t stride_c, std::size_t batch) {
    if (m == 0 || n == 0 || batch == 0)
      return;
    const int dev = current();
    if (k == 0) {
      for_each_index(batch * m * n, scale_block<T>{c, n, ldc, m, stride_c, beta});
      return;
    }
    const auto g = as_column_major(ta, tb, m, n, k, a, lda, stride_a, b, ldb, stride_b);
    HSPMD_CUBLAS_CHECK(
        cublasGemmStridedBatchedEx(
            state_->blas, op(g.op_first), op(g.op_second), detail::cublas_int(g.m, "m", dev),
            detail::cublas_int(g.n, "n", dev), detail::cublas_int(g.k, "k", dev), &alpha, g.first,
            data_type<T>(), detail::cublas_int(g.ld_first, "lda", dev),
            static_cast<long long>(g.stride_first), g.second, data_type<T>(),
            detail::cublas_int(g.ld_second, "ldb", dev), static_cast<long long>(g.stride_second),
            &beta, c, data_type<T>(), detail::cublas_int(ldc, "ldc", dev),
            static_cast<long long>(stride_c), detail::cublas_int(batch, "batch", dev),
            compute_type<T>(), CUBLAS_GEMM_DEFAULT),
        dev);
  }

  /// A float GEMM whose operands are in 16 bits (kernels/precision.hpp): A and B are encoded as
  /// bfloat16 (or binary16) on the stream and multiplied by cuBLAS with float accumulation into
  /// the float C (tensor cores). Equal to the host's float GEMM of rounded operands up to the
  /// order of the sums. Before compute capability 8.0 (no bf16 GEMMs in cuBLAS there) the
  /// operands are rounded in float copies and multiplied by the float GEMM: the same values.
  void gemm_16(precision p, transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k,
               float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb,
               float beta, float* c, std::size_t ldc) {
    gemm_strided_batched_16(p, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
  }
  /// `batch` such GEMMs, operands `stride_*` elements apart.
  void gemm_strided_batched_16(precision p, transpose ta, transpose tb, std::size_t m,
                               std::size_t n, std::size_t k, float alpha, const float* a,
                               std::size_t lda, std::size_t stride_a, const float* b,
                               std::size_t ldb, std::size_t stride_b, float beta, float* c,
                               std::size_t ldc, std::size_t stride_c, std::size_t batch) {
    if (m == 0 || n == 0 || batch == 0)
      return;
    const int dev = current();
    if (k == 0) {
      for_each_index(batch * m * n, scale_block<float>{c, n, ldc, m, stride_c, beta});
      return;
    }
    const bool at = ta == transpose::yes;
    const bool bt = tb == transpose::yes;
    const auto extent = [batch](std::size_t one, std::size_t stride) {
      return (batch - 1) * stride + one;
    };
    const std::size_t na = extent(detail::operand_extent(at ? k : m, at ? m : k, lda), stride_a);
    const std::size_t nb = extent(detail::operand_extent(bt ? n : k, bt ? k : n, ldb), stride_b);
    if (!state_->native16) {
      buffer<float> ra(state_->pool, na, state_->stream);
      buffer<float> rb(state_->pool, nb, state_->stream);
      for_each_index(na, round_elements<float>{a, ra.data(), p});
      for_each_index(nb, round_elements<float>{b, rb.data(), p});
      gemm_strided_batched(ta, tb, m, n, k, alpha, static_cast<const float*>(ra.data()), lda,
                           stride_a, static_cast<const float*>(rb.data()), ldb, stride_b, beta, c,
                           ldc, stride_c, batch);
      return;
    }
    // Scratch without allocate's zeroing: the encoding writes every element.
    buffer<std::uint16_t> ha(state_->pool, na, state_->stream);
    buffer<std::uint16_t> hb(state_->pool, nb, state_->stream);
    for_each_index(na, encode_16<float>{a, ha.data(), p});
    for_each_index(nb, encode_16<float>{b, hb.data(), p});
    const cudaDataType_t half = p == precision::f16 ? CUDA_R_16F : CUDA_R_16BF;
    const auto g =
        as_column_major(ta, tb, m, n, k, static_cast<const std::uint16_t*>(ha.data()), lda,
                        stride_a, static_cast<const std::uint16_t*>(hb.data()), ldb, stride_b);
    HSPMD_CUBLAS_CHECK(
        cublasGemmStridedBatchedEx(
            state_->blas, op(g.op_first), op(g.op_second), detail::cublas_int(g.m, "m", dev),
            detail::cublas_int(g.n, "n", dev), detail::cublas_int(g.k, "k", dev), &alpha, g.first,
            half, detail::cublas_int(g.ld_first, "lda", dev),
            static_cast<long long>(g.stride_first), g.second, half,
            detail::cublas_int(g.ld_second, "ldb", dev), static_cast<long long>(g.stride_second),
            &beta, c, CUDA_R_32F, detail::cublas_int(ldc, "ldc", dev),
            static_cast<long long>(stride_c), detail::cublas_int(batch, "batch", dev),
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        dev);
  }

  /// Copies n elements from host memory to the device; returns when the host memory may be
  /// reused (the copy is ordered on the stream after the work queued before it).
  template <class T>
  void copy_from_host(T* dst, const T* src, std::size_t n) {
    if (n == 0)
      return;
    (void)current();
    HSPMD_CUDA_DEVICE_CHECK(
        cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, state_->stream),
        state_->device);
    synchronize();
  }

  /// Copies n elements from the device to host memory, after the work queued before it.
  template <class T>
  void copy_to_host(T* dst, const T* src, std::size_t n) {
    if (n == 0)
      return;
    (void)current();
    HSPMD_CUDA_DEVICE_CHECK(
        cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, state_->stream),
        state_->device);
    synchronize();
  }

  /// Runs f (which queues work on the stream) and returns the seconds the device spent between
  /// the events recorded before and after it.
  template <class F>
  double timed(F&& f) {
    const int dev = current();
    // A timed call inside another (a traced node under --profile) takes events of its own, so
    // the outer call's start is not overwritten.
    struct events {
      cudaEvent_t start = nullptr, stop = nullptr;
      bool own = false;
      bool* busy = nullptr;
      ~events() {
        if (own) {
          (void)cudaEventDestroy(start);
          (void)cudaEventDestroy(stop);
        } else if (busy != nullptr) {
          *busy = false;
        }
      }
    } e;
    if (state_->timing) {
      e.own = true;
      HSPMD_CUDA_DEVICE_CHECK(cudaEventCreate(&e.start), dev);
      HSPMD_CUDA_DEVICE_CHECK(cudaEventCreate(&e.stop), dev);
    } else {
      e.start = state_->start;
      e.stop = state_->stop;
      e.busy = &state_->timing;
      state_->timing = true;
    }
    HSPMD_CUDA_DEVICE_CHECK(cudaEventRecord(e.start, state_->stream), dev);
    std::forward<F>(f)();
    HSPMD_CUDA_DEVICE_CHECK(cudaEventRecord(e.stop, state_->stream), dev);
    HSPMD_CUDA_DEVICE_CHECK(cudaEventSynchronize(e.stop), dev);
    float ms = 0;
    HSPMD_CUDA_DEVICE_CHECK(cudaEventElapsedTime(&ms, e.start, e.stop), dev);
    return static_cast<double>(ms) * 1e-3;
  }

  /// Waits for the work queued on the stream.
  void synchronize() {
    (void)current();
    HSPMD_CUDA_DEVICE_CHECK(cudaStreamSynchronize(state_->stream), state_->device);
  }

private:
  // Makes the backend's device current (cheap when it already is); returns its index.
  int current() const {
    HSPMD_CUDA_DEVICE_CHECK(cudaSetDevice(state_->device), state_->device);
    return state_->device;
  }

  // Everything with an address buffers and handles keep, behind one pointer so that the backend
  // moves (the executor takes it by value). The destructor waits for the stream, returns the
  // cached blocks and only then destroys the handle, the events and the stream; the pool member
  // is destroyed after that with nothing left to free.
  struct state {
    int device;
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr;
    cudaEvent_t stop = nullptr;
    cublasHandle_t blas = nullptr;
    bool native16 = false; // bf16 and f16 GEMMs in cuBLAS (compute capability 8.0 and later)
    bool timing = false;   // a `timed` call holds start/stop
    allocator_type pool;

    explicit state(int d) : device(d), pool(cuda_memory{d}) {
      int count = 0;
      HSPMD_CUDA_DEVICE_CHECK(cudaGetDeviceCount(&count), d);
      if (d < 0 || d >= count)
        throw device_error(d, "cuda_backend",
                           "no such device (" + std::to_string(count) + " CUDA devices here)",
                           "pick a device index below the count, e.g. the process's local rank");
      HSPMD_CUDA_DEVICE_CHECK(cudaSetDevice(d), d);
      HSPMD_CUDA_DEVICE_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), d);
      try {
        HSPMD_CUDA_DEVICE_CHECK(cudaEventCreate(&start), d);
        HSPMD_CUDA_DEVICE_CHECK(cudaEventCreate(&stop), d);
        HSPMD_CUBLAS_CHECK(cublasCreate(&blas), d);
        HSPMD_CUBLAS_CHECK(cublasSetStream(blas, stream), d);
        int major = 0;
        HSPMD_CUDA_DEVICE_CHECK(
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d), d);
        native16 = major >= 8;
      } catch (...) {
        destroy();
        throw;
      }
    }
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      (void)cudaSetDevice(device);
      (void)cudaStreamSynchronize(stream);
      pool.release_cached();
      destroy();
    }
    void destroy() noexcept {
      if (blas != nullptr)
        (void)cublasDestroy(blas);
      if (stop != nullptr)
        (void)cudaEventDestroy(stop);
      if (start != nullptr)
        (void)cudaEventDestroy(start);
      if (stream != nullptr)
        (void)cudaStreamDestroy(stream);
      blas = nullptr;
      stop = start = nullptr;
      stream = nullptr;
    }
  };

  [[nodiscard]] static cublasOperation_t op(transpose t) noexcept {
    return t == transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  }
  template <class T>
  [[nodiscard]] static cudaDataType_t data_type() noexcept {
    return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_64F;
  }
  template <class T>
  [[nodiscard]] static cublasComputeType_t compute_type() noexcept {
    return std::is_same_v<T, float> ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_64F;
  }

  std::unique_ptr<state> state_;
};

static_assert(backend<cuda_backend>);

} // namespace hspmd::exec
