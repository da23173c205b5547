#pragma once
// Owning MPI's lifetime in a program's main().

#include <hspmd/comm/mpi/check.hpp>

#include <mpi.h>

namespace hspmd {

/// Initializes MPI (MPI_THREAD_FUNNELED) unless it already is, and finalizes it on destruction
/// if this object initialized it. Create one at the top of main(), before any communicator.
class mpi_environment {
public:
  mpi_environment(int& argc, char**& argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized != 0)
      return;
    int provided = 0;
    HSPMD_MPI_CHECK(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), -1);
    owner_ = true;
  }
  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;
  mpi_environment(mpi_environment&&) = delete;
  mpi_environment& operator=(mpi_environment&&) = delete;
  ~mpi_environment() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owner_ && finalized == 0)
      MPI_Finalize();
  }

private:
  bool owner_ = false;
};

} // namespace hspmd
