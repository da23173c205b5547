#pragma once
// Checking MPI return codes. hspmd's communicators set MPI_ERRORS_RETURN, so a failed call
// returns here instead of aborting inside MPI, and the failure becomes a `comm_error` that
// carries the rank and MPI's own description of the error.

#include <hspmd/core/error.hpp>

#include <mpi.h>

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace hspmd::detail {

/// MPI's text for an error code, e.g. "MPI_ERR_ROOT: invalid root".
[[nodiscard]] inline std::string mpi_error_text(int code) {
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int len = 0;
  if (MPI_Error_string(code, text.data(), &len) != MPI_SUCCESS)
    return "MPI error code " + std::to_string(code);
  return {text.data(), static_cast<std::size_t>(len)};
}

/// The calling process's rank in MPI_COMM_WORLD, or -1 outside MPI_Init/MPI_Finalize.
[[nodiscard]] inline int world_rank() noexcept {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  int rank = -1;
  if (initialized != 0 && finalized == 0)
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

/// Throws `comm_error` for a failed MPI call; `call` is the call's source text, of which the
/// function name is kept ("MPI_Bcast(buf, n, ...)" -> "MPI_Bcast").
inline void mpi_check(int code, std::string_view call, int rank) {
  if (code != MPI_SUCCESS)
    throw comm_error(rank, std::string(call.substr(0, call.find('('))), mpi_error_text(code));
}

} // namespace hspmd::detail

/// Checks an MPI call made on behalf of a communicator whose rank is `rank`:
/// `HSPMD_MPI_CHECK(MPI_Barrier(comm), rank)`. The call's text names it in the error.
#define HSPMD_MPI_CHECK(call, rank) ::hspmd::detail::mpi_check((call), #call, (rank))
