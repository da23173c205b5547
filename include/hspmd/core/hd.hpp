#pragma once
// HSPMD_HD marks a function that compiles for the host and, under nvcc, for the device too: the
// kernel functors of exec/kernels/ are written once with it. It names no CUDA header, so every
// layer may use it. Call math qualified (std::exp) so that host and device round alike.

#if defined(__CUDACC__)
#define HSPMD_HD __host__ __device__
#else
#define HSPMD_HD
#endif
