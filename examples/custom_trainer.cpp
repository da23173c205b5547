// The template for training your own model with hspmd: a model function, a feed, and the library
// trainer. Copy this file, replace `model` and `teacher`, keep `main`.
//
//   build/release/examples/custom_trainer --steps 40                        # one process
//   mpirun -np 3 build/release/examples/custom_trainer --cluster clusters/emulated-3.json
//
// The flags (--help lists them): schedule, accumulation, evaluation, plan, trace, metrics, ...
#include <hspmd/exec/train_flags.hpp> // the trainer and its flags
#include <hspmd/nn/layers.hpp>         // the model's layers and ops
#include <hspmd/nn/ops.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <vector>

namespace {
using namespace hspmd;
constexpr std::size_t features = 37, width = 53, classes = 7; // odd sizes on purpose

// The model: linear -> layer norm -> GELU, a residual block, a linear head; mean cross-entropy.
void model(nn::tracer& t) {
  auto x = t.input<float, extents<batch, features>>("x");        // (B, 37)
  auto labels = t.input<std::int64_t, extents<batch>>("labels"); // (B)
  auto h = nn::linear<float, features, width>{"fc1"}(t, x);      // (B, 53)
  h = nn::gelu(nn::layer_norm<float, width>{"ln"}(t, h));
  h = nn::add(h, nn::relu(nn::linear<float, width, width>{"fc2"}(t, h))); // residual
  t.set_loss(nn::cross_entropy(nn::linear<float, width, classes>{"head"}(t, h), labels));
}

// The data: the label is the arg-max of a fixed random projection (a teacher the model can
// learn). Batch i depends on i only, so every rank (and every run) sees the same batch i.
struct teacher {
  std::vector<float> w = std::vector<float>(features * classes);
  explicit teacher(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (auto& v : w)
      v = std::normal_distribution<float>()(rng);
  }
  void operator()(exec::batch_sink<float>& sink, std::size_t batch_size, std::uint64_t i) const {
    std::mt19937_64 rng(i * 7919 + 1);
    std::vector<float> x(batch_size * features);
    std::vector<std::int64_t> y(batch_size);
    for (auto& v : x)
      v = std::normal_distribution<float>()(rng);
    for (std::size_t b = 0; b < batch_size; ++b) {
      std::vector<float> score(classes, 0.0F);
      for (std::size_t k = 0; k < classes; ++k)
        for (std::size_t f = 0; f < features; ++f)
          score[k] += x[b * features + f] * w[f * classes + k];
      y[b] = std::ranges::max_element(score) - score.begin();
    }
    sink.set_input("x", x);
    sink.set_input("labels", y);
  }
};
} // namespace

int main(int argc, char** argv) {
  exec::train_options o;
  o.name = "custom";
  o.batch = 13; // prime: uneven shards on purpose
  o.steps = 40;
  o.lr = exec::lr_schedule::cosine(3e-3, /*warmup=*/4);
  CLI::App app{"hspmd example: train your own model with the library trainer"};
  exec::add_train_flags(app, o);
  if (const auto rc = exec::parse_flags(app, argc, argv))
    return *rc;
  try {
    const teacher data(o.seed);
    exec::trainer<float> tr(model, o); // one process, or every rank of the job with --cluster
    tr.fit([&](auto& sink, std::size_t i) { data(sink, o.batch, i); },
           [&](auto& sink, std::size_t i) { data(sink, o.batch, (1ULL << 40) + i); }); // held out
  } catch (const std::exception& e) { // one process; with --cluster the trainer ends the job
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
