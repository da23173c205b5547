// GEMM through exec::cuda_backend against the same product called on cuBLAS directly, at the
// shapes of one BERT-base step (batch 32, sequence 128, hidden 768, FFN 3072, 12 heads): the
// forward, the input gradient and the weight gradient of the QKV, output and FFN projections,
// and the attention's batched products. f32 (cuBLAS's plain float compute) and bf16 (the
// backend's gemm_16: its encoding kernels included; the direct side is given operands already
// in bf16, the ceiling). Each side is timed with events on its own stream, the two alternating
// (A B A B ...), and the median of the reps reported with the ratio direct / backend (1.0 =
// no cost; the goal is >= 0.9).
//
//     build/.../bench/hspmd-gpu-gemm [reps]        # exit 77 where no GPU is usable
#include <hspmd/exec/backends/cuda.cuh>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

using hspmd::exec::transpose;

struct shape {
  const char* name;
  transpose ta, tb;
  std::size_t m, n, k, batch;
};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "hspmd-gpu-gemm: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "hspmd-gpu-gemm: %s: cuBLAS status %d\n", what, static_cast<int>(s));
    std::exit(1);
  }
}

cublasOperation_t op(transpose t) {
  return t == transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Device seconds of f() on `stream`, by events.
template <class F>
double time_on(cudaStream_t stream, F&& f) {
  cudaEvent_t a = nullptr, b = nullptr;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  check(cudaEventRecord(a, stream), "cudaEventRecord");
  f();
  check(cudaEventRecord(b, stream), "cudaEventRecord");
  check(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  return static_cast<double>(ms) * 1e-3;
}

__global__ void to_bf16(const float* in, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = hspmd::bfloat16(in[i]).bits;
}

} // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::printf("hspmd-gpu-gemm: no usable GPU (%s); nothing measured\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");

  constexpr std::size_t tokens = 32 * 128, hidden = 768, ffn = 3072, heads = 32 * 12, seq = 128,
                        head = 64;
  const transpose N = transpose::no, T = transpose::yes;
  const std::vector<shape> shapes = {
      {"qkv forward   x[4096,768] W[768,2304]", N, N, tokens, 3 * hidden, hidden, 1},
      {"out forward   x[4096,768] W[768,768]", N, N, tokens, hidden, hidden, 1},
      {"ffn1 forward  x[4096,768] W[768,3072]", N, N, tokens, ffn, hidden, 1},
      {"ffn2 forward  x[4096,3072] W[3072,768]", N, N, tokens, hidden, ffn, 1},
      {"ffn1 dX       dY[4096,3072] W^T", N, T, tokens, hidden, ffn, 1},
      {"ffn1 dW       X^T dY[4096,3072]", T, N, hidden, ffn, tokens, 1},
      {"scores        Q K^T (384 x 128x128x64)", N, T, seq, seq, head, heads},
      {"context       P V   (384 x 128x64x128)", N, N, seq, head, seq, heads},
  };

  std::size_t most = 0;
  for (const auto& s : shapes)
    most = std::max({most, s.batch * s.m * s.k, s.batch * s.k * s.n, s.batch * s.m * s.n});
  std::vector<float> host(most);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : host)
    x = u(rng);

  hspmd::exec::cuda_backend backend(0);
  auto a = backend.allocate<float>(most);
  auto b = backend.allocate<float>(most);
  auto c = backend.allocate<float>(most);
  backend.copy_from_host(a.data(), host.data(), most);
  backend.copy_from_host(b.data(), host.data(), most);

  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cublasHandle_t handle = nullptr;
  check(cublasCreate(&handle), "cublasCreate");
  check(cublasSetStream(handle, stream), "cublasSetStream");
  std::uint16_t *a16 = nullptr, *b16 = nullptr;
  check(cudaMalloc(&a16, most * 2), "cudaMalloc");
  check(cudaMalloc(&b16, most * 2), "cudaMalloc");
  to_bf16<<<1024, 256, 0, stream>>>(a.data(), a16, most);
  to_bf16<<<1024, 256, 0, stream>>>(b.data(), b16, most);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");

  std::printf("# %s (sm_%d%d), %d reps each side, alternating; TFLOP/s from device events\n",
              prop.name, prop.major, prop.minor, reps);
  std::printf("%-42s %-5s %10s %10s %8s\n", "shape", "type", "backend", "direct", "ratio");
  for (const auto& s : shapes) {
    const std::size_t lda = s.ta == T ? s.m : s.k, ldb = s.tb == T ? s.k : s.n, ldc = s.n;
    const std::size_t sa = s.m * s.k, sb = s.k * s.n, sc = s.m * s.n;
    const double flops = 2.0 * static_cast<double>(s.m * s.n * s.k * s.batch);
    for (const bool bf16 : {false, true}) {
      const auto via_backend = [&] {
        if (bf16)
          backend.gemm_strided_batched_16(hspmd::exec::precision::bf16, s.ta, s.tb, s.m, s.n, s.k,
                                          1.0f, a.data(), lda, sa, b.data(), ldb, sb, 0.0f,
                                          c.data(), ldc, sc, s.batch);
        else
          backend.gemm_strided_batched(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, sa, b.data(),
                                       ldb, sb, 0.0f, c.data(), ldc, sc, s.batch);
      };
      // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
      const auto direct = [&] {
        const float one = 1.0f, zero = 0.0f;
        const void* first = bf16 ? static_cast<const void*>(b16) : b.data();
        const void* second = bf16 ? static_cast<const void*>(a16) : a.data();
        const cudaDataType_t in = bf16 ? CUDA_R_16BF : CUDA_R_32F;
        check(cublasGemmStridedBatchedEx(
                  handle, op(s.tb), op(s.ta), static_cast<int>(s.n), static_cast<int>(s.m),
                  static_cast<int>(s.k), &one, first, in, static_cast<int>(ldb),
                  static_cast<long long>(sb), second, in, static_cast<int>(lda),
                  static_cast<long long>(sa), &zero, c.data(), CUDA_R_32F, static_cast<int>(ldc),
                  static_cast<long long>(sc), static_cast<int>(s.batch), CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT),
              "cublasGemmStridedBatchedEx");
      };
      for (int w = 0; w < 3; ++w) { // warm-up: handles, heuristics, the allocator's cache
        backend.timed(via_backend);
        (void)time_on(stream, direct);
      }
      std::vector<double> tb, td;
      for (int r = 0; r < reps; ++r) {
        tb.push_back(backend.timed(via_backend));
        td.push_back(time_on(stream, direct));
      }
      const double mb = median(tb), md = median(td);
      std::printf("%-42s %-5s %10.1f %10.1f %8.3f\n", s.name, bf16 ? "bf16" : "f32",
                  flops / mb * 1e-12, flops / md * 1e-12, md / mb);
    }
  }
  (void)cudaFree(a16);
  (void)cudaFree(b16);
  (void)cublasDestroy(handle);
  (void)cudaStreamDestroy(stream);
  return 0;
}
