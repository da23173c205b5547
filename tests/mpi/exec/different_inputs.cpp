// Ranks that feed different whole batches: the library trainer's distributed executor compares
// a hash of each input at every feed (by default, no debug setting) and ends the job naming the
// input, the step and the rank (else each rank would silently train on its own mixture).
#include <hspmd/hspmd.hpp>

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  hspmd::mpi_environment env(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  hspmd::train::train_options o;
  o.batch = 6;
  o.steps = 3;
  o.cluster = argc > 1 ? argv[1] : "clusters/emulated-2.json";
  o.out = nullptr;
  hspmd::train::trainer<float> tr(
      [](hspmd::nn::tracer& t) {
        auto x = t.input<float, hspmd::extents<hspmd::batch, 4>>("x");
        auto y = t.input<std::int64_t, hspmd::extents<hspmd::batch>>("y");
        t.set_loss(hspmd::nn::cross_entropy(hspmd::nn::linear<float, 4, 3>{"fc"}(t, x), y));
      },
      o);
  tr.fit([&](hspmd::exec::batch_sink<float>& b, std::size_t step) {
    std::vector<float> x(6 * 4, 0.5F);
    if (step == 1 && rank == 1)
      x[5] = 0.25F; // rank 1 reads another batch at step 1
    b.set_input("x", x);
    b.set_input("y", std::vector<std::int64_t>{0, 1, 2, 0, 1, 2});
  });
  return 0;
}
