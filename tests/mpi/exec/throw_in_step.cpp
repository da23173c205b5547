// Rank 1 throws during step 3 of distributed training (between its forward and backward, while
// the other ranks are inside the backward's collectives): every rank must exit non-zero within
// the outer 10 s timeout, with one line naming rank 1.
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/comm/mpi/environment.hpp>
#include <hspmd/comm/mpi/guard.hpp>
#include <hspmd/exec/distributed.hpp>
#include <hspmd/models/zoo.hpp>
#include <hspmd/synth/synthesize.hpp>

#include "../../support/test_cluster.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  hspmd::mpi_environment env(argc, argv);
  return hspmd::run_guarded([] {
    hspmd::mpi_communicator comm;
    hspmd::models::model_options o;
    o.layers = 2;
    o.hidden = 16;
    const auto g = hspmd::models::trace_model<float>("mlp", o, 8);
    const auto c =
        hspmd::test::make_cluster(std::vector<double>(std::size_t(comm.size()), 1e9), 1e9, 1e9);
    const auto p = hspmd::synth::make_baseline(g, c, hspmd::synth::baseline::dp_ev);
    hspmd::exec::distributed_executor<float, hspmd::mpi_communicator> dx(g, p, comm, 1);
    std::vector<float> x(8 * 784, 0.5F);
    std::vector<std::int64_t> y(8, 1);
    for (int step = 1; step <= 10; ++step) {
      dx.set_input("x", std::span<const float>(x));
      dx.set_input("labels", std::span<const std::int64_t>(y));
      (void)dx.forward();
      if (step == 3 && comm.rank() == 1)
        throw std::runtime_error("rank 1 failed on purpose during training step 3");
      dx.backward();
    }
    return 0;
  });
}
