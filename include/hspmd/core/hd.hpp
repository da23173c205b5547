#pragma once
// HSPMD_HD marks a function that compiles for the host and, under nvcc, for the device too: the
// kernel functors of kernels/ are written once with it. It names no CUDA header, so every
// layer may use it. Call math qualified (std::exp) so that host and device round alike.

#if defined(__CUDACC__)
#define HSPMD_HD __host__ __device__
#else
#define HSPMD_HD
#endif

// HSPMD_INLINE: inlined wherever it is called, so that a kernel's element loop that calls it can
// be vectorized (a call left out of line keeps the loop scalar).
#if defined(__CUDACC__)
#define HSPMD_INLINE __forceinline__
#elif defined(__GNUC__) || defined(__clang__)
#define HSPMD_INLINE inline __attribute__((always_inline))
#else
#define HSPMD_INLINE inline
#endif
