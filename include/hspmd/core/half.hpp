#pragma once
// 16-bit floating-point storage types for mixed precision: `bfloat16` (8 exponent bits, 7
// mantissa bits: float's range, 3 significant digits) and `float16` (IEEE 754 binary16: 5
// exponent bits, 10 mantissa bits, largest finite 65504, subnormals down to 2^-24). Values are
// stored in 16 bits and computed in float: conversion from float rounds to nearest, ties to even
// (overflow gives infinity, NaN stays NaN, quiet); conversion to float is exact.
//
//     bfloat16 h{1.00390625f};    // 1 + 2^-8: halfway between 1 and 1 + 2^-7, rounds to even: 1
//     float x = h;                // 1.0f
//     float16 big{70000.f};       // +inf (above 65504 + half an ulp)
//
// The conversions are bit manipulation in HSPMD_HD functions, so kernels convert alike on the
// host and on a device (no CUDA header: cuda_bf16.h's types are layout-compatible).

#include <hspmd/core/hd.hpp>

#include <bit>
#include <cstdint>

namespace hspmd {

namespace detail {

// float -> bfloat16 bits: the upper half of float's bits, rounded to nearest even on the 16 bits
// dropped; NaN keeps its sign and becomes quiet (a NaN whose payload sits in the dropped bits
// would otherwise round to infinity).
[[nodiscard]] HSPMD_HD constexpr std::uint16_t bf16_bits(float f) noexcept {
  const auto u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffU) > 0x7f800000U)
    return static_cast<std::uint16_t>((u >> 16) | 0x0040U);
  const std::uint32_t lsb = (u >> 16) & 1U;
  return static_cast<std::uint16_t>((u + 0x7fffU + lsb) >> 16);
}

// float -> binary16 bits, round to nearest even, with subnormals, overflow to infinity and
// quiet NaN.
[[nodiscard]] HSPMD_HD constexpr std::uint16_t f16_bits(float f) noexcept {
  const auto u = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000U);
  const std::uint32_t a = u & 0x7fffffffU;
  if (a > 0x7f800000U) // NaN: quiet, the payload's top bits kept
    return static_cast<std::uint16_t>(sign | 0x7e00U | ((a >> 13) & 0x3ffU));
  if (a >= 0x477ff000U) // >= 65504 + 16 (half an ulp at the top): infinity
    return static_cast<std::uint16_t>(sign | 0x7c00U);
  if (a >= 0x38800000U) { // normal in binary16 (>= 2^-14)
    // Rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even; a carry
    // out of the mantissa steps the exponent, which is what rounding up should do.
    const std::uint32_t rebased = a - 0x38000000U;
    const std::uint32_t lsb = (rebased >> 13) & 1U;
    return static_cast<std::uint16_t>(sign | ((rebased + 0xfffU + lsb) >> 13));
  }
  if (a < 0x33000000U) // below 2^-25 (half the smallest subnormal): +-0
    return sign;
  // Subnormal: the value m 2^(e - 150) (m the 24-bit significand, e float's biased exponent,
  // 102 .. 112 here) in units of binary16's 2^-24 is m 2^(e - 126): m shifted right by 126 - e,
  // the dropped bits rounded to nearest even.
  const std::uint32_t e = a >> 23;
  const std::uint32_t m = (a & 0x7fffffU) | 0x800000U;
  const std::uint32_t shift = 126U - e; // 14 .. 24
  const std::uint32_t kept = m >> shift;
  const std::uint32_t rest = m & ((1U << shift) - 1U);
  const std::uint32_t half = 1U << (shift - 1U);
  const std::uint32_t up = rest > half || (rest == half && (kept & 1U) != 0U) ? 1U : 0U;
  return static_cast<std::uint16_t>(sign | (kept + up)); // a carry makes the smallest normal
}

[[nodiscard]] HSPMD_HD constexpr float f16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000U) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fU;
  const std::uint32_t m = h & 0x3ffU;
  if (e == 0x1fU) // inf or NaN
    return std::bit_cast<float>(sign | 0x7f800000U | (m << 13));
  if (e != 0)
    return std::bit_cast<float>(sign | ((e + 112U) << 23) | (m << 13));
  // zero or subnormal: m * 2^-24, exact in float
  const float v = static_cast<float>(m) * 5.9604644775390625e-8F;
  return sign != 0 ? -v : v;
}

} // namespace detail

/// bfloat16: float's exponent with 7 mantissa bits, stored in 16 bits (see the file comment).
struct bfloat16 {
  std::uint16_t bits = 0;

  bfloat16() = default;
  /// Rounds to nearest, ties to even.
  HSPMD_HD constexpr explicit bfloat16(float f) noexcept : bits(detail::bf16_bits(f)) {}
  /// Exact.
  HSPMD_HD constexpr operator float() const noexcept { // NOLINT: widening, like float -> double
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  [[nodiscard]] HSPMD_HD static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h;
    h.bits = b;
    return h;
  }
};

/// IEEE 754 binary16, stored in 16 bits (see the file comment).
struct float16 {
  std::uint16_t bits = 0;

  float16() = default;
  /// Rounds to nearest, ties to even; beyond 65504 + 16: infinity.
  HSPMD_HD constexpr explicit float16(float f) noexcept : bits(detail::f16_bits(f)) {}
  /// Exact.
  HSPMD_HD constexpr operator float() const noexcept { // NOLINT: widening
    return detail::f16_to_float(bits);
  }
  [[nodiscard]] HSPMD_HD static constexpr float16 from_bits(std::uint16_t b) noexcept {
    float16 h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2);

} // namespace hspmd
