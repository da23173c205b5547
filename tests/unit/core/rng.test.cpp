#include <hspmd/core/rng.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

using namespace hspmd;

TEST_CASE("philox4x32_10 matches Random123's known-answer vectors") {
  using w4 = std::array<std::uint32_t, 4>;
  STATIC_REQUIRE(philox4x32_10({0, 0, 0, 0}, {0, 0}) ==
                 w4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  STATIC_REQUIRE(
      philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
      w4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  STATIC_REQUIRE(
      philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
      w4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("uniform01 and normal01 are pure functions with the right moments") {
  const rng_key k{2024, 3};
  CHECK(uniform01(k, 17) == uniform01(k, 17));
  CHECK(uniform01(k, 17) != uniform01(k, 18));
  CHECK(uniform01(k, 17) != uniform01(rng_key{2024, 4}, 17));
  CHECK(uniform01(k, 17) != uniform01(rng_key{2025, 3}, 17));

  constexpr int n = 200000;
  double su = 0;
  double sn = 0;
  double sn2 = 0;
  for (int i = 0; i < n; ++i) {
    const double u = uniform01(k, static_cast<std::uint64_t>(i));
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    su += u;
    const double z = normal01(k, static_cast<std::uint64_t>(i));
    REQUIRE(std::isfinite(z));
    sn += z;
    sn2 += z * z;
  }
  // Standard errors: 1/sqrt(12 n) ~ 6.5e-4 for the uniform mean, 1/sqrt(n) ~ 2.2e-3 for the
  // normal mean, sqrt(2/n) ~ 3.2e-3 for its variance; allow about 5 of them.
  CHECK(std::abs(su / n - 0.5) < 3.5e-3);
  CHECK(std::abs(sn / n) < 1.2e-2);
  CHECK(std::abs(sn2 / n - 1.0) < 1.6e-2);
}

TEST_CASE("fill_uniform01_u32: any slice draws the full fill's values at its global indices") {
  const rng_key k{7, 11};
  constexpr std::size_t n = 1003;
  std::vector<double> full(n);
  fill_uniform01_u32(k, 0, n, full.data());
  // Slices that start and end inside a Philox block, and one of length zero.
  for (const auto& [first, len] :
       {std::pair<std::size_t, std::size_t>{0, 1}, {1, 6}, {3, 1}, {5, 0}, {6, 997}, {998, 5}}) {
    std::vector<float> part(len);
    fill_uniform01_u32(k, first, len, part.data());
    for (std::size_t i = 0; i < len; ++i)
      REQUIRE(part[i] == static_cast<float>(full[first + i]));
  }
  // Four words per block are used: neighbours differ, and values match the block's words.
  const auto b = philox4x32_10({1, 0, 11, 0}, {7, 0});
  for (std::size_t w = 0; w < 4; ++w)
    CHECK(full[4 + w] == static_cast<double>(b[w]) * 0x1.0p-32);
  double s = 0;
  for (double u : full) {
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    s += u;
  }
  CHECK(std::abs(s / n - 0.5) < 5.0 / std::sqrt(12.0 * n));
}
