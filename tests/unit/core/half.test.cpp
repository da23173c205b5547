// bfloat16 and float16 conversions against a reference that rounds by comparing distances in
// double (not by bit tricks): every 16-bit pattern back and forth, every float whose dropped bits
// are a tie or next to one, and a dense sweep of all floats.
#include <hspmd/core/half.hpp>

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

using namespace hspmd;

namespace {

// The nearest of the representable values of a 16-bit format to x, ties to the even pattern;
// beyond the largest finite value by half an ulp or more: infinity. `to_float` decodes a pattern.
template <class Decode>
std::uint16_t reference_round(float x, Decode to_float, double max_finite, double top_ulp) {
  const double v = x;
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::abs(v);
  if (a >= max_finite + top_ulp / 2)
    return static_cast<std::uint16_t>(sign | (to_float(0x7c00) == INFINITY ? 0x7c00 : 0x7f80));
  // Binary search the largest magnitude pattern whose value is <= a (patterns are monotonic).
  std::uint32_t lo = 0, hi = 0x7f7f; // bf16's largest finite; float16 callers clamp below
  if (to_float(0x7c00) == INFINITY)
    hi = 0x7bff;
  while (lo < hi) {
    const std::uint32_t mid = (lo + hi + 1) / 2;
    if (static_cast<double>(to_float(static_cast<std::uint16_t>(mid))) <= a)
      lo = mid;
    else
      hi = mid - 1;
  }
  const double below = to_float(static_cast<std::uint16_t>(lo));
  if (below == a)
    return static_cast<std::uint16_t>(sign | lo);
  const std::uint32_t up_bits = lo + 1;
  const double above = up_bits == (to_float(0x7c00) == INFINITY ? 0x7c00U : 0x7f80U)
                           ? max_finite + top_ulp
                           : static_cast<double>(to_float(static_cast<std::uint16_t>(up_bits)));
  const double d_lo = a - below, d_hi = above - a;
  std::uint32_t pick = d_lo < d_hi ? lo : d_hi < d_lo ? up_bits : (lo % 2 == 0 ? lo : up_bits);
  return static_cast<std::uint16_t>(sign | pick);
}

float bf16_decode(std::uint16_t b) { return bfloat16::from_bits(b); }
float f16_decode(std::uint16_t b) { return float16::from_bits(b); }

void check_float(float x) {
  if (std::isnan(x)) {
    CHECK(std::isnan(static_cast<float>(bfloat16(x))));
    CHECK(std::isnan(static_cast<float>(float16(x))));
    return;
  }
  const auto want_bf = reference_round(x, bf16_decode, 3.3895313892515355e38, std::ldexp(1.0, 120));
  const auto want_h = reference_round(x, f16_decode, 65504.0, 32.0);
  INFO("float bits 0x" << std::hex << std::bit_cast<std::uint32_t>(x));
  REQUIRE(bfloat16(x).bits == want_bf);
  REQUIRE(float16(x).bits == want_h);
}

} // namespace

TEST_CASE("every 16-bit pattern converts to float exactly and back to itself") {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float fb = bfloat16::from_bits(bits);
    const float fh = float16::from_bits(bits);
    if (std::isnan(fb)) {
      CHECK(std::isnan(static_cast<float>(bfloat16(fb))));
    } else {
      REQUIRE(bfloat16(fb).bits == bits);
    }
    if (std::isnan(fh)) {
      CHECK(std::isnan(static_cast<float>(float16(fh))));
    } else {
      REQUIRE(float16(fh).bits == bits);
    }
  }
  // Spot values: float16's extremes and bfloat16 keeping float's exponent.
  CHECK(static_cast<float>(float16::from_bits(0x7bff)) == 65504.0F);
  CHECK(static_cast<float>(float16::from_bits(0x0001)) == std::ldexp(1.0F, -24));
  CHECK(static_cast<float>(float16::from_bits(0x0400)) == std::ldexp(1.0F, -14));
  CHECK(static_cast<float>(bfloat16::from_bits(0x0080)) == std::numeric_limits<float>::min());
}

TEST_CASE("float to bfloat16 and float16 round to nearest, ties to even, as the reference") {
  // Ties and their neighbours in every binade: for bfloat16 the dropped 16 bits 0x7fff, 0x8000,
  // 0x8001; for float16 (13 dropped bits in normals) the same around 0x1000.
  for (std::uint32_t upper = 0; upper <= 0xffff; upper += 1) {
    for (const std::uint32_t low : {0x0000U, 0x7fffU, 0x8000U, 0x8001U, 0x0fffU, 0x1000U, 0x1001U,
                                    0xffffU}) {
      check_float(std::bit_cast<float>((upper << 16) | low));
    }
  }
  // A dense sweep of all floats (every 8191st pattern).
  for (std::uint64_t u = 0; u <= 0xffffffffULL; u += 8191)
    check_float(std::bit_cast<float>(static_cast<std::uint32_t>(u)));
  // Named cases.
  CHECK(bfloat16(1.00390625F).bits == bfloat16(1.0F).bits); // 1 + 2^-8: a tie, to even
  CHECK(bfloat16(1.01171875F).bits == 0x3f82);               // 1 + 3 * 2^-8: a tie, up to even
  CHECK(std::isinf(static_cast<float>(float16(70000.0F))));
  CHECK(std::isinf(static_cast<float>(float16(65520.0F)))); // the tie above 65504 goes to inf
  CHECK(static_cast<float>(float16(65519.0F)) == 65504.0F);
  CHECK(float16(std::ldexp(1.0F, -25)).bits == 0);          // half the smallest subnormal: 0
  CHECK(float16(std::nextafter(std::ldexp(1.0F, -25), 1.0F)).bits == 1);
  CHECK(float16(-0.0F).bits == 0x8000);
  CHECK(bfloat16(std::numeric_limits<float>::infinity()).bits == 0x7f80);
  // A NaN whose payload lies only in the dropped bits stays NaN (it would round to inf).
  CHECK(std::isnan(static_cast<float>(bfloat16(std::bit_cast<float>(0x7f800001U)))));
  CHECK(std::isnan(static_cast<float>(float16(std::bit_cast<float>(0x7f800001U)))));
}
