// VGG and ViT at tiny sizes: shapes, a model gradient check in f64, and 50 training steps on a
// learnable synthetic task (each class is a fixed random image plus noise).
#include "../../support/finite_difference.hpp"
#include "../../support/training.hpp"

#include <hspmd/exec/executor.hpp>
#include <hspmd/graph/io.hpp>
#include <hspmd/graph/ops.hpp>
#include <hspmd/models/vgg.hpp>
#include <hspmd/models/vit.hpp>
#include <hspmd/train/trainer.hpp>

#include <catch2/catch.hpp>

#include <random>
#include <vector>

using namespace hspmd;

namespace {
models::vgg_config tiny_vgg() {
  models::vgg_config c;
  c.stages = {{4}, {8, 8}};
  c.image = 8;
  c.fc = 16;
  c.pooled = 3;
  c.classes = 4;
  c.dropout = 0.0;
  return c;
}
models::vit_config tiny_vit() {
  models::vit_config c;
  c.image = 8;
  c.patch = 4;
  c.layers = 1;
  c.hidden = 16;
  c.ffn = 32;
  c.heads = 2;
  c.classes = 4;
  c.dropout = 0.0;
  return c;
}

template <class Sink>
struct element_of {
  using type = float; // exec::batch_sink<float>
};
template <class T>
struct element_of<exec::executor<T>> {
  using type = T;
};

template <class Sink, class T = typename element_of<Sink>::type>
void feed_images(Sink& ex, std::size_t batch, std::size_t image, std::size_t classes,
                 std::mt19937_64& rng) {
  static std::vector<std::vector<double>> prototypes;
  std::normal_distribution<double> nd(0.0, 1.0);
  const std::size_t values = 3 * image * image;
  if (prototypes.size() != classes || prototypes[0].size() != values) {
    std::mt19937_64 fixed(123);
    prototypes.assign(classes, std::vector<double>(values));
    for (auto& p : prototypes)
      for (auto& v : p)
        v = nd(fixed);
  }
  std::vector<T> x(batch * values);
  std::vector<std::int64_t> y(batch);
  for (std::size_t b = 0; b < batch; ++b) {
    y[b] = static_cast<std::int64_t>(rng() % classes);
    for (std::size_t i = 0; i < values; ++i)
      x[b * values + i] =
          static_cast<T>(prototypes[static_cast<std::size_t>(y[b])][i] + 0.5 * nd(rng));
  }
  ex.set_input("images", x);
  ex.set_input("labels", y);
}
} // namespace

TEST_CASE("VGG19 at full size traces 16 convolutions and the 25088-4096-4096-10 classifier") {
  const graph::graph g = models::trace_vgg<float>(models::vgg_config{}, 2);
  CHECK(g.of_kind(graph::op::conv2d).size() == 16);
  CHECK(g.of_kind(graph::op::max_pool2d).size() == 5);
  CHECK(g[*g.find("classifier.0.weight")].out.dims == std::vector<std::size_t>{25088, 4096});
  CHECK(g[*g.find("classifier.2.weight")].out.dims == std::vector<std::size_t>{4096, 10});
  // VGG19 on CIFAR: about 0.4 GFLOP forward per image in the convolutions.
  double conv = 0;
  for (auto id : g.of_kind(graph::op::conv2d))
    conv += graph::cost_of(g, id).forward_flops;
  CHECK(conv / 2 == Approx(0.798e9).epsilon(0.01)); // 2 FLOPs per multiply-add
}

TEST_CASE("ViT at full size: 64 patches + CLS, 12 layers, hidden 768") {
  const graph::graph g = models::trace_vit<float>(models::vit_config{}, 2);
  CHECK(g[*g.find("pos.table")].out.dims == std::vector<std::size_t>{65, 768});
  CHECK(g[*g.find("patch_embed.weight")].out.dims == std::vector<std::size_t>{48, 768});
  CHECK(g.find("layers.11.attn.wo.weight").has_value());
}

TEST_CASE("VGG and ViT gradients match finite differences (f64, tiny)") {
  std::mt19937_64 rng(2);
  {
    const graph::graph g = models::trace_vgg<double>(tiny_vgg(), 2);
    exec::executor<double> ex(g, 4);
    feed_images(ex, 2, 8, 4, rng);
    ex.forward();
    ex.backward();
    CHECK(test_support::worst_gradient_error(
              ex,
              {ex.parameter("features.0.weight"), ex.parameter("features.2.bias"),
               ex.parameter("classifier.0.weight"), ex.parameter("classifier.2.bias")},
              12) <= 1e-6);
  }
  {
    const graph::graph g = models::trace_vit<double>(tiny_vit(), 2);
    exec::executor<double> ex(g, 4);
    feed_images(ex, 2, 8, 4, rng);
    ex.forward();
    ex.backward();
    CHECK(
        test_support::worst_gradient_error(ex,
                                           {ex.parameter("cls"), ex.parameter("patch_embed.weight"),
                                            ex.parameter("layers.0.attn.wk.weight"),
                                            ex.parameter("pos.table"), ex.parameter("head.weight")},
                                           12) <= 1e-6);
  }
}

TEST_CASE("VGG and ViT learn the synthetic classes: loss after 50 steps <= 0.8 x the first") {
  constexpr std::size_t batch = 16;
  std::mt19937_64 rng(9);
  for (const bool vit : {false, true}) {
    const graph::graph g = vit ? models::trace_vit<float>(tiny_vit(), batch)
                               : models::trace_vgg<float>(tiny_vgg(), batch);
    train::trainer<float> tr(g, test_support::quiet_training(50, 3e-3, 5.0));
    const auto losses = tr.fit([&](exec::batch_sink<float>& e, std::size_t) {
                            feed_images(e, batch, 8, 4, rng);
                          }).losses;
    const double first = losses.front();
    const double last = (losses[47] + losses[48] + losses[49]) / 3.0;
    CAPTURE(vit, first, last);
    CHECK(last <= 0.8 * first);
  }
}

TEST_CASE("model graphs round-trip through JSON") {
  for (const auto& g :
       {models::trace_vgg<float>(tiny_vgg(), 2), models::trace_vit<float>(tiny_vit(), 2)})
    CHECK(graph::from_json(graph::to_json(g)) == g);
}
