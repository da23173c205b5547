#include <hspmd/core/dtype.hpp>

#include <catch2/catch.hpp>

#include <cstdint>

using namespace hspmd;

TEST_CASE("dtype sizes, names and round trips") {
  STATIC_REQUIRE(size_of(dtype::f32) == 4);
  STATIC_REQUIRE(size_of(dtype::f64) == 8);
  STATIC_REQUIRE(size_of(dtype::i32) == 4);
  STATIC_REQUIRE(size_of(dtype::i64) == 8);
  STATIC_REQUIRE(size_of(dtype::bf16) == 2);
  STATIC_REQUIRE(size_of(dtype::f16) == 2);
  for (dtype t : {dtype::f32, dtype::f64, dtype::i32, dtype::i64, dtype::bf16, dtype::f16}) {
    CAPTURE(name(t));
    CHECK(parse_dtype(name(t)) == t);
  }
  CHECK_FALSE(parse_dtype("float").has_value());
  CHECK_FALSE(parse_dtype("").has_value());
  CHECK(is_floating(dtype::bf16));
  CHECK_FALSE(is_floating(dtype::i64));
}

TEST_CASE("dtype_of maps the host element types and agrees with sizeof") {
  STATIC_REQUIRE(dtype_of<float> == dtype::f32);
  STATIC_REQUIRE(dtype_of<double> == dtype::f64);
  STATIC_REQUIRE(dtype_of<std::int32_t> == dtype::i32);
  STATIC_REQUIRE(dtype_of<std::int64_t> == dtype::i64);
  STATIC_REQUIRE(size_of(dtype_of<float>) == sizeof(float));
  STATIC_REQUIRE(size_of(dtype_of<std::int64_t>) == sizeof(std::int64_t));
  STATIC_REQUIRE_FALSE(element_type<char>);
  STATIC_REQUIRE_FALSE(element_type<unsigned>);
}
