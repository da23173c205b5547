// Trains a tiny model through the installed library trainer on every rank of the job, with the
// plan synthesized for the cluster file given (mpirun -np 2 train emulated-2.json [DEVICE]).
#include <hspmd/hspmd.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: train CLUSTER.json [DEVICE]\n");
    return 2;
  }
  hspmd::train::train_options o;
  o.name = "package";
  o.batch = 10;
  o.steps = 5;
  o.cluster = argv[1];
  if (argc == 3)
    o.device = argv[2]; // "cuda": the engine of hspmd::cuda, linked from the package
  o.lr = hspmd::train::lr_schedule::cosine(1e-2, 1);
  hspmd::train::trainer<float> tr(
      [](hspmd::nn::tracer& t) {
        auto x = t.input<float, hspmd::extents<hspmd::batch, 6>>("x");
        auto y = t.input<std::int64_t, hspmd::extents<hspmd::batch>>("y");
        auto h = hspmd::nn::relu(hspmd::nn::linear<float, 6, 16>{"fc1"}(t, x));
        t.set_loss(hspmd::nn::cross_entropy(hspmd::nn::linear<float, 16, 2>{"fc2"}(t, h), y));
      },
      o);
  const auto r = tr.fit([](hspmd::exec::batch_sink<float>& b, std::size_t step) {
    std::vector<float> x(60);
    std::vector<std::int64_t> y(10);
    for (std::size_t i = 0; i < 60; ++i)
      x[i] = static_cast<float>((i * 7 + step * 3) % 11) / 11.0F - 0.5F;
    for (std::size_t s = 0; s < 10; ++s)
      y[s] = x[s * 6] > 0.0F ? 1 : 0;
    b.set_input("x", x);
    b.set_input("y", y);
  });
  return r.losses.size() == 5 ? 0 : 1;
}
