#include "../../support/finite_difference.hpp"

#include <hspmd/exec/executor.hpp>
#include <hspmd/models/mlp.hpp>

#include <catch2/catch.hpp>

#include <random>
#include <vector>

using namespace hspmd;

TEST_CASE("MLP model: shapes and gradients (f64, tiny)") {
  models::mlp_config c;
  c.inputs = 5;
  c.hidden = {7, 6};
  c.classes = 3;
  const graph::graph g = models::trace_mlp<double>(c, 4);
  CHECK(g[*g.find("fc1.weight")].out.dims == std::vector<std::size_t>{7, 6});
  exec::executor<double> ex(g, 2);
  // Random inputs: a regular pattern put a ReLU input within 4e-7 of its kink, where central
  // differences with h = 1e-6 are meaningless.
  std::mt19937_64 rng(4);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> x(4 * 5);
  for (auto& v : x)
    v = nd(rng);
  ex.set_input("x", x);
  ex.set_input("labels", std::vector<std::int64_t>{0, 2, 1, 2});
  ex.forward();
  ex.backward();
  CHECK(test_support::worst_gradient_error(ex, {ex.parameter("fc0.weight"),
                                                ex.parameter("fc0.bias"), ex.parameter("fc1.bias"),
                                                ex.parameter("head.weight")}) <= 1e-6);
}
