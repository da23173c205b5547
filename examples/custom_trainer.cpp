// The template for your own model: a model function, a feed and the library trainer. Copy it,
// replace `model` and `feed`, keep `main`; --help lists the flags (schedule, accumulation, ...).
//   build/release/examples/custom_trainer                                   # one process
//   mpirun -np 3 build/release/examples/custom_trainer --cluster clusters/emulated-3.json
#include <hspmd/nn/layers.hpp>         // the model's layers and ops (nn/ops.hpp too)
#include <hspmd/train/train_flags.hpp> // the trainer and its flags

#include <algorithm>
#include <cstdint>
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

std::vector<float> normals(std::size_t n, std::uint64_t seed) { // n draws of N(0, 1)
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  std::ranges::generate(v, [&] { return std::normal_distribution<float>()(rng); });
  return v;
}

// The data: labels are the arg-max of x W for a fixed random W (a teacher the model can learn).
// Batch i depends on i only, so every rank (and every run) feeds the same batch i.
void feed(exec::batch_sink<float>& sink, std::size_t batch_size, std::uint64_t i) {
  static const std::vector<float> w = normals(features * classes, 7);
  const std::vector<float> x = normals(batch_size * features, i * 7919 + 1);
  std::vector<std::int64_t> y(batch_size);
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
} // namespace

int main(int argc, char** argv) {
  train::train_options o;
  o.name = "custom";
  o.batch = 13; // prime: uneven shards on purpose
  o.steps = 60;
  o.lr = train::lr_schedule::cosine(1e-2, /*warmup=*/4);
  o.eval_batches = 4;
  CLI::App app{"hspmd example: train your own model with the library trainer"};
  train::add_train_flags(app, o);
  if (const auto rc = exec::parse_flags(app, argc, argv))
    return *rc;
  return exec::report_errors([&] {      // bad input: one line (distributed: the job ends)
    train::trainer<float> tr(model, o); // one process, or every rank of the job with --cluster
    tr.fit([&](auto& sink, std::size_t i) { feed(sink, o.batch, i); },
           [&](auto& sink, std::size_t i) { feed(sink, o.batch, (1ULL << 40) + i); }); // held out
    return 0;
  });
}
