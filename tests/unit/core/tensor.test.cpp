#include <hspmd/core/tensor.hpp>
#include <hspmd/core/tensor_ops.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <type_traits>
#include <vector>

using namespace hspmd;

TEST_CASE("tensors are zero-filled, row-major and bounds-checked with at()") {
  tensor<float, extents<2, 3>> t;
  STATIC_REQUIRE(sizeof(t) == sizeof(std::vector<float>)); // static extents cost nothing
  CHECK(t.size() == 6);
  CHECK(t.size_bytes() == 24);
  STATIC_REQUIRE(decltype(t)::element_dtype == dtype::f32);
  for (float v : t.values())
    CHECK(v == 0.0F);
  t(1, 2) = 5.0F;
  CHECK(t[5] == 5.0F);
  CHECK(t.at(1, 2) == 5.0F);
  CHECK_THROWS_AS(t.at(2, 0), shape_error);
  CHECK_THROWS_AS(t.at(0, -1), shape_error);

  tensor<double, extents<batch, 4>> b(3);
  CHECK(b.shape().to_string() == "(batch=3, 4)");
  tensor<std::int64_t, extents<batch, 2>> filled(extents<batch, 2>(2), 7);
  CHECK(filled[3] == 7);
}

TEST_CASE("matmul of typed tensors matches the definition") {
  tensor<double, extents<batch, 3>> a(2);
  tensor<double, extents<3, 2>> b;
  for (std::size_t i = 0; i < a.size(); ++i)
    a[i] = static_cast<double>(i + 1); // [[1 2 3] [4 5 6]]
  for (std::size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<double>(i) - 2.0; // [[-2 -1] [0 1] [2 3]]
  const auto c = matmul(a, b);
  STATIC_REQUIRE(std::is_same_v<decltype(c)::extents_type, extents<batch, 2>>);
  CHECK(c.shape().to_string() == "(batch=2, 2)");
  CHECK(c(0, 0) == 1 * -2 + 2 * 0 + 3 * 2);
  CHECK(c(0, 1) == 1 * -1 + 2 * 1 + 3 * 3);
  CHECK(c(1, 0) == 4 * -2 + 5 * 0 + 6 * 2);
  CHECK(c(1, 1) == 4 * -1 + 5 * 1 + 6 * 3);
}

TEST_CASE("runtime shape mismatches throw shape_error naming both shapes") {
  tensor<float, extents<dynamic_extent, dynamic_extent>> a(2, 3);
  tensor<float, extents<dynamic_extent, dynamic_extent>> b(4, 5);
  CHECK_THROWS_WITH(matmul(a, b), "matmul: inner extents differ: A is (2, 3) and B is (4, 5) (A's "
                                  "columns must equal B's rows)");
  CHECK_THROWS_WITH(add(a, b), "add: shapes differ: (2, 3) and (4, 5) (elementwise ops need equal "
                               "extents)");
  tensor<float, extents<dynamic_extent, 3>> c(2);
  tensor<float, extents<dynamic_extent, 3>> d(2);
  CHECK_NOTHROW(sub(c, d));
}

TEST_CASE("elementwise ops") {
  tensor<std::int32_t, extents<3>> a;
  tensor<std::int32_t, extents<dynamic_extent>> b(3);
  for (std::int32_t i = 0; i < 3; ++i) {
    a(i) = i + 1;
    b(i) = 10 * (i + 1);
  }
  const auto s = add(a, b);
  STATIC_REQUIRE(std::is_same_v<decltype(s)::extents_type, extents<3>>);
  CHECK(s(2) == 33);
  CHECK(sub(b, a)(1) == 18);
  CHECK(mul(a, b)(2) == 90);
}

TEST_CASE("fill_normal of a slice equals that slice of the whole tensor, along any dimension") {
  const rng_key key{42, 7};
  tensor<float, extents<6, 4, 5>> whole;
  fill_normal(whole, key, 0.02);
  for (std::size_t dim = 0; dim < 3; ++dim) {
    const std::size_t full = whole.extent(dim);
    for (std::size_t offset = 0; offset <= full; ++offset)
      for (std::size_t len = 0; offset + len <= full; ++len) {
        std::array<std::size_t, 3> dims{6, 4, 5};
        dims[dim] = len;
        tensor<float, extents<dynamic_extent, dynamic_extent, dynamic_extent>> part(
            dims[0], dims[1], dims[2]);
        fill_normal(part, key, 0.02, dim, offset, full);
        bool same = true;
        for (std::size_t i = 0; i < dims[0]; ++i)
          for (std::size_t j = 0; j < dims[1]; ++j)
            for (std::size_t k = 0; k < dims[2]; ++k) {
              std::array<std::size_t, 3> g{i, j, k};
              g[dim] += offset;
              same = same && part(i, j, k) == whole(g[0], g[1], g[2]);
            }
        CAPTURE(dim, offset, len);
        CHECK(same);
      }
  }
  tensor<float, extents<dynamic_extent, 4>> too_long(3);
  CHECK_THROWS_AS(fill_normal(too_long, key, 1.0, 0, 5, 6), shape_error);
}
