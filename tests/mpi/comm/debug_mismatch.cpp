// With HSPMD_DEBUG=detail, ranks that call mismatched collectives must all fail with both
// fingerprints in the message instead of hanging or corrupting data.
//   debug_mismatch count : rank 1 all-reduces 3 elements, the others 2
//   debug_mismatch op    : rank 1 broadcasts while the others all-reduce
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/comm/mpi/environment.hpp>
#include <hspmd/comm/mpi/guard.hpp>

#include <cstdio>
#include <span>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  hspmd::mpi_environment env(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "count";
  return hspmd::run_guarded([&] {
    hspmd::mpi_communicator comm;
    std::vector<float> v(comm.rank() == 1 && mode == "count" ? 3 : 2, 1.0F);
    comm.all_reduce(std::span<float>(v), hspmd::reduce_op::sum); // #0 matches in "op" mode
    if (comm.rank() == 1 && mode == "op")
      comm.broadcast(std::span<float>(v), 0);
    else
      comm.all_reduce(std::span<float>(v), hspmd::reduce_op::sum);
    std::printf("rank %d: no mismatch detected\n", comm.rank());
    return 0;
  });
}
