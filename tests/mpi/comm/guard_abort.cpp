// Rank 1 throws during step 3 of a loop of collectives while the others are inside one:
// run_guarded must print one line naming rank 1 and end the whole job with a non-zero status
// instead of leaving the others hanging.
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/comm/mpi/environment.hpp>
#include <hspmd/comm/mpi/guard.hpp>

#include <span>
#include <stdexcept>
#include <vector>

int main(int argc, char** argv) {
  hspmd::mpi_environment env(argc, argv);
  return hspmd::run_guarded([] {
    hspmd::mpi_communicator comm;
    std::vector<double> grad(1000, 1.0);
    for (int step = 1; step <= 10; ++step) {
      if (step == 3 && comm.rank() == 1)
        throw std::runtime_error("rank 1 failed on purpose during step 3");
      comm.all_reduce(std::span<double>(grad), hspmd::reduce_op::sum);
    }
    return 0;
  });
}
