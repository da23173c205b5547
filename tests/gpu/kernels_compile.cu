// Compile-only: every op's kernel pair, in f32 and f64, with every functor launched through the
// device launcher (exec/backends/device_launch.cuh). Built for sm_80, sm_90 and the oldest
// architecture the toolkit supports (sm_70 before CUDA 13, sm_75 from it) whenever nvcc is found;
// nothing here runs a kernel (the CUDA backend that runs them, with cuBLAS for the GEMMs, is
// separate work). Run, it only checks for a device and exits 77 without one.

#include <hspmd/core/half.hpp>
#include <hspmd/exec/backends/device_launch.cuh>
#include <hspmd/kernels/box.hpp>
#include <hspmd/kernels/registry.hpp>

#include <cuda_runtime.h>

#include <cstdio>

namespace kernels_compile {

// A backend whose launches go to the device; its GEMMs are declared only (cuBLAS is wired by the
// CUDA backend), so this TU proves the functors compile for the device, not that they run.
struct device_compile_backend {
  template <class E>
  struct buffer {
    E* ptr = nullptr;
    std::size_t n = 0;
    E* data() { return ptr; }
    [[nodiscard]] std::size_t size() const { return n; }
  };
  [[nodiscard]] std::string_view name() const { return "device (compile only)"; }
  template <class E>
  buffer<E> allocate(std::size_t n) {
    buffer<E> b;
    b.n = n;
    return b;
  }
  template <class F>
  void for_each_index(std::size_t n, const F& f) {
    (void)hspmd::exec::launch_for_each_index(n, f);
  }
  template <class F>
  void for_each_row(std::size_t rows, const F& f) {
    (void)hspmd::exec::launch_for_each_row(rows, f);
  }
  template <class T>
  void gemm(hspmd::exec::transpose, hspmd::exec::transpose, std::size_t, std::size_t, std::size_t,
            T, const T*, std::size_t, const T*, std::size_t, T, T*, std::size_t) {}
  template <class T>
  void gemm_strided_batched(hspmd::exec::transpose, hspmd::exec::transpose, std::size_t,
                            std::size_t, std::size_t, T, const T*, std::size_t, std::size_t,
                            const T*, std::size_t, std::size_t, T, T*, std::size_t, std::size_t,
                            std::size_t) {}
  template <class T>
  void copy_from_host(T*, const T*, std::size_t) {}
  template <class T>
  void copy_to_host(T*, const T*, std::size_t) {}
  template <class F>
  double timed(F&& f) {
    f();
    return 0.0;
  }
  void synchronize() {}
};
static_assert(hspmd::exec::backend<device_compile_backend>);

template <class T>
void instantiate_every_kernel(hspmd::exec::kernel_context<T, device_compile_backend>& c) {
  hspmd::exec::run_kernel(c, false);
  hspmd::exec::run_kernel(c, true);
  std::vector<std::size_t> dims{2, 3};
  float* p = nullptr;
  hspmd::exec::copy_box(c.backend(), p, dims, dims, p, dims, dims, dims, true);
}

// The 16-bit storage types convert on the device with the host's bit manipulation.
struct to_half {
  const float* x;
  hspmd::bfloat16* b;
  hspmd::float16* h;
  float* back;
  __host__ __device__ void operator()(std::size_t i) const {
    b[i] = hspmd::bfloat16(x[i]);
    h[i] = hspmd::float16(x[i]);
    back[i] = static_cast<float>(b[i]) + static_cast<float>(h[i]);
  }
};
void launch_half_conversions(std::size_t n, const float* x, hspmd::bfloat16* b, hspmd::float16* h,
                             float* back) {
  (void)hspmd::exec::launch_for_each_index(n, to_half{x, b, h, back});
}

// Instantiated, never called with a real graph.
template void
instantiate_every_kernel<float>(hspmd::exec::kernel_context<float, device_compile_backend>&);
template void
instantiate_every_kernel<double>(hspmd::exec::kernel_context<double, device_compile_backend>&);

} // namespace kernels_compile

int main() {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices <= 0) {
    std::printf("gpu.kernels_compile: compiled for %s; no CUDA device here (%s), nothing to run\n",
                HSPMD_KERNEL_ARCHS, e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
    return 77;
  }
  std::printf("gpu.kernels_compile: %d CUDA device(s); this test only compiles the kernels\n",
              devices);
  return 0;
}
