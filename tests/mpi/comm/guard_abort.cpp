// Rank 1 fails during step 3 of a loop of collectives while the others are inside one.
//   (no argument)  rank 1 throws: run_guarded must print one line naming rank 1 and end the
//                  whole job with a non-zero status instead of leaving the others hanging.
//   hang           rank 1 sleeps forever without failing (run with HSPMD_TIMEOUT): the others'
//                  watchdogs must name the all-reduce they wait in and end the job.
//   p2p            as hang, but rank 0 waits in a receive from rank 1.
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/comm/mpi/environment.hpp>
#include <hspmd/comm/mpi/guard.hpp>

#include <chrono>
#include <span>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  hspmd::mpi_environment env(argc, argv);
  const std::string_view mode = argc > 1 ? argv[1] : "";
  return hspmd::run_guarded([&] {
    hspmd::mpi_communicator comm;
    std::vector<double> grad(1000, 1.0);
    for (int step = 1; step <= 10; ++step) {
      comm.set_phase("step " + std::to_string(step));
      if (step == 3 && comm.rank() == 1) {
        if (mode.empty())
          throw std::runtime_error("rank 1 failed on purpose during step 3");
        for (;;)
          std::this_thread::sleep_for(std::chrono::hours(1));
      }
      if (step == 3 && mode == "p2p" && comm.rank() == 0)
        comm.recv(std::span<double>(grad), 1, 7);
      comm.all_reduce(std::span<double>(grad), hspmd::reduce_op::sum);
    }
    return 0;
  });
}
