// Uses the installed hspmd::hspmd umbrella with MPI: ranks agree on the cluster fingerprint.
#include <hspmd/hspmd.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  hspmd::mpi_environment env(argc, argv);
  return hspmd::run_guarded([&] {
    hspmd::mpi_communicator comm;
    const hspmd::cluster c = hspmd::load_cluster(argc > 1 ? argv[1] : "emulated-2.json");
    hspmd::check_rank_count(c, static_cast<std::size_t>(comm.size()));
    const auto fp = hspmd::fingerprint(c);
    const bool agree = comm.all_reduce(fp, hspmd::reduce_op::min) == fp &&
                       comm.all_reduce(fp, hspmd::reduce_op::max) == fp;
    if (comm.rank() == 0)
      std::printf("with_mpi: %d ranks %s on cluster %s\n", comm.size(),
                  agree ? "agree" : "DISAGREE", c.name.c_str());
    return agree ? 0 : 1;
  });
}
