// Rank 1 throws while the others wait in a collective: run_guarded must print one line naming
// rank 1 and end the whole job with a non-zero status instead of leaving the others hanging.
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/comm/mpi/environment.hpp>
#include <hspmd/comm/mpi/guard.hpp>

#include <stdexcept>

int main(int argc, char** argv) {
  hspmd::mpi_environment env(argc, argv);
  return hspmd::run_guarded([] {
    const hspmd::mpi_communicator comm;
    if (comm.rank() == 1)
      throw std::runtime_error("rank 1 failed on purpose");
    comm.barrier(); // never completes: rank 1 does not arrive
    return 0;
  });
}
