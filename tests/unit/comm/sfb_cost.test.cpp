#include <hspmd/comm/sfb.hpp>

#include <catch2/catch.hpp>

#include <vector>

using namespace hspmd;

TEST_CASE("SFB wins for a small batch on a large layer and loses for a large batch") {
  const auto model = collective_cost_model::from_link(2, 5e-5, 1.3e9); // 10.4 Gbit/s
  const double speed = 1e13;
  const std::vector<std::size_t> small_batch{48, 16};
  const auto small = weight_gradient_cost(model, small_batch, 4096, 4096, 4, speed);
  CHECK(small.sfb.bytes == 64.0 * 8192 * 4);
  CHECK(small.all_reduce.bytes == Approx(4096.0 * 4096 * 4)); // 2 (n-1)/n = 1 for n = 2
  CHECK(small.sfb.flops == 2.0 * 64 * 4096 * 4096);
  CHECK(small.all_reduce.flops == 2.0 * 48 * 4096 * 4096);
  CHECK(small.sfb_wins());

  const std::vector<std::size_t> large_batch{6144, 2048};
  const auto large = weight_gradient_cost(model, large_batch, 4096, 4096, 4, speed);
  CHECK_FALSE(large.sfb_wins());
  CHECK_THROWS_AS(weight_gradient_cost(model, large_batch, 8, 8, 4, 0.0), plan_error);
}
