#pragma once
// The SPMD rule for failures: one rank failing must not leave the others hanging in a
// collective. `run_guarded` wraps a rank's main body; an exception on any rank prints one line
// "[hspmd rank R] message" and ends the whole job through MPI_Abort.

#include <hspmd/comm/mpi/check.hpp>
#include <hspmd/core/error.hpp>

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace hspmd {

/// Runs `body()` and returns its exit code. If it throws, prints "[hspmd rank R] what()" to
/// stderr and aborts every rank of MPI_COMM_WORLD with exit code 1 (does not return).
template <class F>
int run_guarded(F&& body) noexcept {
  std::string message;
  try {
    return static_cast<F&&>(body)();
  } catch (const std::exception& e) {
    message = error_line(e);
  } catch (...) {
    message = "unknown exception";
  }
  const int rank = detail::world_rank();
  // A comm_error already starts with "rank R: "; the prefix says it once.
  const std::string own = "rank " + std::to_string(rank) + ": ";
  if (message.rfind(own, 0) == 0)
    message.erase(0, own.size());
  std::fprintf(stderr, "[hspmd rank %d] %s\n", rank, message.c_str());
  std::fflush(stderr);
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized != 0 && finalized == 0)
    MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

} // namespace hspmd
