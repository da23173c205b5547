// Optimizer arithmetic, clipping, and an MLP learning a synthetic task in 50 steps.
#include <hspmd/exec/optim.hpp>
#include <hspmd/exec/trainer.hpp>
#include <hspmd/nn/layers.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <sstream>
#include <vector>

using namespace hspmd;

namespace {
// loss = sum(w * c): the gradient of w is c, constant.
graph::graph linear_loss(std::size_t n) {
  nn::tracer t(dtype::f64, 1);
  const auto w = t.parameter<double>("w", extents<dynamic_extent>(n), nn::constant_init(1.0));
  const auto c = t.input<double, extents<dynamic_extent>>("c", n);
  t.set_loss(nn::sum(nn::mul(w, c)));
  return t.take();
}
} // namespace

TEST_CASE("SGD with momentum and Adam/AdamW update by their formulas") {
  const graph::graph g = linear_loss(2);
  exec::executor<double> ex(g);
  ex.set_input("c", std::vector<double>{2.0, -4.0});
  const auto w = ex.parameter("w");
  exec::sgd opt(0.1, 0.9, 0.0);
  for (int s = 0; s < 2; ++s) {
    ex.forward();
    ex.backward();
    opt.step(ex);
  }
  // v1 = g, w1 = 1 - 0.1 g; v2 = 0.9 g + g, w2 = w1 - 0.1 * 1.9 g = 1 - 0.29 g
  CHECK(ex.value(w)[0] == Approx(1.0 - 0.29 * 2.0));
  CHECK(ex.value(w)[1] == Approx(1.0 + 0.29 * 4.0));

  exec::executor<double> ex2(g);
  ex2.set_input("c", std::vector<double>{2.0, -4.0});
  exec::adam a(0.01, 0.9, 0.999, 1e-8, 0.1, true);
  ex2.forward();
  ex2.backward();
  a.step(ex2);
  // First Adam step moves each weight by lr * sign(g) (bias-corrected), AdamW also by lr*wd*w.
  CHECK(ex2.value(w)[0] == Approx(1.0 - 0.01 * 0.1 - 0.01));
  CHECK(ex2.value(w)[1] == Approx(1.0 - 0.01 * 0.1 + 0.01));
}

TEST_CASE("clipping by the global norm") {
  const graph::graph g = linear_loss(2);
  exec::executor<double> ex(g);
  ex.set_input("c", std::vector<double>{3.0, 4.0});
  ex.forward();
  ex.backward();
  CHECK(exec::clip_grad_norm(ex, 1.0) == Approx(5.0));
  const auto grad = ex.grad(ex.parameter("w"));
  CHECK(grad[0] == Approx(0.6));
  CHECK(grad[1] == Approx(0.8));
  CHECK(exec::clip_grad_norm(ex, 10.0) == Approx(1.0)); // below the limit: unchanged
  CHECK(grad[0] == Approx(0.6));
}

TEST_CASE("an MLP learns a teacher's labels: loss after 50 steps <= 0.8 x the first") {
  constexpr std::size_t batch = 32;
  nn::tracer t(dtype::f32, batch);
  auto x = t.input<float, extents<hspmd::batch, 16>>("x");
  auto labels = t.input<std::int64_t, extents<hspmd::batch>>("labels");
  nn::sequential mlp(nn::linear<float, 16, 64>{"fc1"}, nn::relu_layer{},
                     nn::linear<float, 64, 4>{"fc2"});
  t.set_loss(nn::cross_entropy(mlp(t, x), labels));
  const graph::graph g = t.take();
  exec::executor<float> ex(g, 3);
  // The task: class = argmax of a fixed random projection of x (learnable by the MLP).
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd(0.0F, 1.0F);
  std::vector<float> teacher(16 * 4);
  for (auto& v : teacher)
    v = nd(rng);
  exec::trainer tr(ex, exec::adam(0.01));
  tr.clip = 5.0;
  tr.samples_per_step = batch;
  std::ostringstream log;
  const auto losses = tr.run(
      50,
      [&](exec::executor<float>& e, std::size_t) {
        std::vector<float> xs(batch * 16);
        std::vector<std::int64_t> ys(batch);
        for (auto& v : xs)
          v = nd(rng);
        for (std::size_t b = 0; b < batch; ++b) {
          std::size_t best = 0;
          float best_v = -1e30F;
          for (std::size_t c = 0; c < 4; ++c) {
            float s = 0;
            for (std::size_t i = 0; i < 16; ++i)
              s += xs[b * 16 + i] * teacher[i * 4 + c];
            if (s > best_v) {
              best_v = s;
              best = c;
            }
          }
          ys[b] = static_cast<std::int64_t>(best);
        }
        e.set_input("x", xs);
        e.set_input("labels", ys);
      },
      &log);
  REQUIRE(losses.size() == 50);
  const double first = losses.front();
  const double last = (losses[47] + losses[48] + losses[49]) / 3.0;
  CAPTURE(first, last);
  CHECK(last <= 0.8 * first);
  CHECK_THAT(log.str(), Catch::Contains("step    50/50"));
  CHECK_THAT(log.str(), Catch::Contains("samples/s"));
}

TEST_CASE("profiling: time per op kind, only for kinds that ran, and a table") {
  const graph::graph g = linear_loss(4096);
  exec::executor<double> ex(g);
  ex.set_input("c", std::vector<double>(4096, 1.0));
  ex.forward(); // not profiled
  CHECK(ex.profile().empty());
  ex.set_profiling(true);
  for (int s = 0; s < 3; ++s) {
    ex.forward();
    ex.backward();
  }
  const auto& p = ex.profile();
  REQUIRE(p.size() == graph::op_count);
  const auto at = [&](graph::op o) { return p[static_cast<std::size_t>(o)]; };
  CHECK(at(graph::op::mul).forward > 0.0);
  CHECK(at(graph::op::mul).backward > 0.0);
  CHECK(at(graph::op::sum).forward > 0.0);
  CHECK(at(graph::op::linear).forward == 0.0);
  CHECK(at(graph::op::softmax).backward == 0.0);

  std::ostringstream table;
  exec::write_profile(table, ex, 3);
  const auto text = table.str();
  CHECK(text.find("mul") != std::string::npos);
  CHECK(text.find("sum") != std::string::npos);
  CHECK(text.find("graph total") != std::string::npos);
  CHECK(text.find("softmax") == std::string::npos); // kinds that never ran are not listed

  ex.set_profiling(true); // restarting clears the totals
  CHECK(ex.profile()[static_cast<std::size_t>(graph::op::mul)].forward == 0.0);
}
