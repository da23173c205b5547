#include <hspmd/core/extents.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <type_traits>

using namespace hspmd;

TEST_CASE("static extents need no storage and are known at compile time") {
  using E = extents<2, 3, 4>;
  STATIC_REQUIRE(E::rank() == 3);
  STATIC_REQUIRE(E::rank_dynamic() == 0);
  STATIC_REQUIRE(E{}.size() == 24);
  STATIC_REQUIRE(E{}.extent(1) == 3);
  STATIC_REQUIRE_FALSE(E::has_batch);
  STATIC_REQUIRE(E::batch_dim == 3);
  STATIC_REQUIRE(std::is_empty_v<E>); // no storage at all
  STATIC_REQUIRE(sizeof(extents<batch, 768>) == sizeof(std::size_t));
}

TEST_CASE("batch and dynamic extents are bound at construction, in order") {
  using E = extents<batch, 768, dynamic_extent>;
  STATIC_REQUIRE(E::rank_dynamic() == 2);
  STATIC_REQUIRE(E::has_batch);
  STATIC_REQUIRE(E::batch_dim == 0);
  const E e(32, 12);
  CHECK(e.extent(0) == 32);
  CHECK(e.extent(1) == 768);
  CHECK(e.extent(2) == 12);
  CHECK(e.size() == 32 * 768 * 12);
  CHECK(e.shape().to_string() == "(batch=32, 768, 12)");
  CHECK(e.shape().batch_dim == 0);
  CHECK(e.shape().size() == e.size());

  CHECK_THROWS_AS(E(-1, 3), shape_error);
  CHECK(E(0, 3).size() == 0); // an empty shard is legal
}

TEST_CASE("extents compare by value across static and runtime forms") {
  CHECK(extents<2, 3>{} == extents<dynamic_extent, 3>(2));
  CHECK_FALSE(extents<2, 3>{} == extents<dynamic_extent, 3>(4));
  CHECK_FALSE(extents<2, 3>{} == extents<2, 3, 1>{});
}

TEST_CASE("from_dims checks the static dimensions and fills the runtime ones") {
  using E = extents<batch, 4>;
  CHECK(E::from_dims({7, 4}).extent(0) == 7);
  CHECK_THROWS_WITH(E::from_dims({7, 5}, "here"),
                    "here: dimension 1 is 5 but the type fixes it at 4 (make the sizes agree or "
                    "declare the dimension dynamic_extent)");
}

TEST_CASE("with_runtime_dim_t turns one static dimension into a runtime one") {
  STATIC_REQUIRE(std::is_same_v<with_runtime_dim_t<extents<8, 4>, 1>, extents<8, dynamic_extent>>);
  STATIC_REQUIRE(std::is_same_v<with_runtime_dim_t<extents<batch, 4>, 0>, extents<batch, 4>>);
  STATIC_REQUIRE(extents_may_match(3, 3));
  STATIC_REQUIRE(extents_may_match(3, batch));
  STATIC_REQUIRE_FALSE(extents_may_match(3, 4));
}
