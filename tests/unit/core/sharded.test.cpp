#include <hspmd/core/sharded.hpp>

#include <catch2/catch.hpp>

#include <type_traits>
#include <vector>

using namespace hspmd;

TEST_CASE("sharded splits along its dimension by ratios, zero-length shards included") {
  using S = sharded<float, extents<8, 6>, split<1>>;
  STATIC_REQUIRE(std::is_same_v<S::local_extents_type, extents<8, dynamic_extent>>);
  STATIC_REQUIRE(S::placement == placement::split_along(1));
  const std::vector<double> ratios{3, 0, 1};
  const std::size_t expected_len[] = {5, 0, 1}; // largest remainder of 6 * (3/4, 0, 1/4)
  const std::size_t expected_off[] = {0, 5, 5};
  tensor<float, extents<8, 6>> whole;
  fill_normal(whole, rng_key{1, 2}, 1.0);
  for (std::size_t r = 0; r < 3; ++r) {
    auto s = S::zeros(extents<8, 6>{}, ratios, r);
    CAPTURE(r);
    CHECK(s.length() == expected_len[r]);
    CHECK(s.offset() == expected_off[r]);
    CHECK(s.local().extent(0) == 8);
    s.fill_normal(rng_key{1, 2}, 1.0);
    for (std::size_t i = 0; i < 8; ++i)
      for (std::size_t j = 0; j < s.length(); ++j)
        CHECK(s.local()(i, j) == whole(i, s.offset() + j));
  }
  CHECK_THROWS_AS(S::zeros(extents<8, 6>{}, ratios, 3), plan_error);
}

TEST_CASE("replicated and partial parts have the global shape") {
  auto r = sharded<double, extents<batch, 4>, replicated>::zeros(extents<batch, 4>(5), {}, 0);
  CHECK(r.local().shape() == extents<batch, 4>(5).shape());
  CHECK(r.length() == 0);
  auto p = sharded<double, extents<3>, partial>::zeros(extents<3>{}, {}, 2);
  CHECK(p.local().size() == 3);
  STATIC_REQUIRE(decltype(p)::placement.is_partial());
}
