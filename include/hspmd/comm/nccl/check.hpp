#pragma once
// Checking CUDA and NCCL return codes: one macro each. A CUDA failure becomes a `comm_error`
// with cudaGetErrorString's text, and CUDA's sticky error is cleared so later calls do not
// report it again. NCCL failures carry ncclGetErrorString and ncclGetLastError.

#include <hspmd/core/error.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>
#include <string_view>

namespace hspmd::detail {

inline void cuda_check(cudaError_t code, std::string_view call, int rank) {
  if (code == cudaSuccess)
    return;
  (void)cudaGetLastError(); // clear the sticky error
  throw comm_error(rank, std::string(call.substr(0, call.find('('))),
                   std::string(cudaGetErrorName(code)) + ": " + cudaGetErrorString(code));
}

[[nodiscard]] inline std::string nccl_error_text(ncclResult_t code, ncclComm_t comm) {
  std::string text = ncclGetErrorString(code);
  if (const char* last = ncclGetLastError(comm); last != nullptr && *last != '\0')
    text += std::string(" (") + last + ")";
  return text;
}

} // namespace hspmd::detail

/// Checks a CUDA runtime call on behalf of rank `rank`.
#define HSPMD_CUDA_CHECK(call, rank) ::hspmd::detail::cuda_check((call), #call, (rank))
