#include <hspmd/graph/io.hpp>
#include <hspmd/nn/layers.hpp>

#include <catch2/catch.hpp>

using namespace hspmd;

namespace {
struct block {
  std::string name;
  nn::layer_norm<float, 32> ln{"ln"};
  nn::linear<float, 32, 64> up{"up"};
  nn::linear<float, 64, 32> down{"down"};
  template <class V>
  auto operator()(nn::tracer& t, const V& x) const {
    const auto scope = t.scope(name);
    return nn::add(x, down(t, nn::gelu(up(t, ln(t, x)))));
  }
};
} // namespace

TEST_CASE("modules compose and name their parameters by scope") {
  nn::tracer t(dtype::f32, 8);
  auto x = t.input<float, extents<hspmd::batch, 32>>("x");
  std::vector<block> layers;
  for (int i = 0; i < 3; ++i)
    layers.push_back(block{"layers." + std::to_string(i)});
  auto h = x;
  for (const auto& l : layers)
    h = l(t, h);
  t.set_loss(nn::sum(h));
  const graph::graph& g = t.graph();
  CHECK(g.find("layers.2.up.weight").has_value());
  CHECK(g.find("layers.0.ln.gamma").has_value());
  CHECK(g[*g.find("layers.1.down.weight")].out.to_string() == "(64, 32)");
  CHECK(g.parameters().size() == 3 * 6);
  CHECK(h.extents().extent(0) == 8);
}

TEST_CASE("calling a layer twice shares its parameters, a clash of shapes is refused") {
  nn::tracer t(dtype::f64, 4);
  auto x = t.input<double, extents<hspmd::batch, 16>>("x");
  nn::linear<double, 16, 16> shared{"shared"};
  auto y = shared(t, shared(t, x));
  CHECK(t.graph().parameters().size() == 2);
  (void)y;
  nn::linear<double, 16, 8> clash{"shared"};
  CHECK_THROWS_WITH(clash(t, x), Catch::Contains("parameter \"shared.weight\": exists with shape "
                                                 "(16, 16), asked for (16, 8)"));
}

TEST_CASE("sequential checks sizes through shape-preserving layers, runtime sizes at trace time") {
  nn::tracer t(dtype::f32, 2);
  auto x = t.input<float, extents<hspmd::batch, 10>>("x");
  nn::sequential mlp(nn::linear<float, 10, 20>{"fc1"}, nn::relu_layer{},
                     nn::linear<float, 20, 5>{"fc2"});
  auto y = mlp(t, x);
  CHECK(y.extents().shape().to_string() == "(batch=2, 5)");
  // Configured (runtime) sizes are checked when the node is added.
  nn::linear<float, dynamic_extent, dynamic_extent> wrong{"wrong", 7, 3};
  CHECK_THROWS_WITH(wrong(t, y), Catch::Contains("cannot multiply (batch=2, 5) by (7, 3)"));
}
