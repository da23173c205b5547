#pragma once
// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11).
//
// A value is a pure function of (seed, stream, index): there is no generator state to advance.
// That is what lets rank r materialize rows [a, b) of a parameter, or draw the dropout mask of
// its shard, and get exactly the numbers a single-device run draws at the same global indices.

#include <hspmd/core/hd.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>

namespace hspmd {

/// One Philox4x32-10 block: 4 random words from a 128-bit counter and a 64-bit key. Inlined
/// into its callers (as `random_block` is): a kernel's loop over blocks then vectorizes (with
/// AVX-512 the 32 x 32 -> 64-bit products become 64-bit lane multiplies); a call per block had
/// kept dropout's mask loop scalar, ~4 ns an element.
[[nodiscard]] HSPMD_INLINE constexpr std::array<std::uint32_t, 4>
philox4x32_10(std::array<std::uint32_t, 4> ctr, std::array<std::uint32_t, 2> key) noexcept {
  constexpr std::uint32_t m0 = 0xD2511F53U; // round multipliers
  constexpr std::uint32_t m1 = 0xCD9E8D57U;
  constexpr std::uint32_t w0 = 0x9E3779B9U; // key schedule (golden ratio, sqrt(3) - 1)
  constexpr std::uint32_t w1 = 0xBB67AE85U;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = std::uint64_t{m0} * ctr[0];
    const std::uint64_t p1 = std::uint64_t{m1} * ctr[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32U);
    const auto lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32U);
    const auto lo1 = static_cast<std::uint32_t>(p1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
    key[0] += w0;
    key[1] += w1;
  }
  return ctr;
}

/// Addresses one random block: the user's seed, a stream (e.g. one per parameter tensor) and
/// the global element index.
struct rng_key {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;
};

namespace detail {
[[nodiscard]] HSPMD_INLINE constexpr std::array<std::uint32_t, 4>
rng_block(rng_key k, std::uint64_t index) noexcept {
  const auto lo = [](std::uint64_t v) { return static_cast<std::uint32_t>(v); };
  const auto hi = [](std::uint64_t v) { return static_cast<std::uint32_t>(v >> 32U); };
  return philox4x32_10({lo(index), hi(index), lo(k.stream), hi(k.stream)},
                       {lo(k.seed), hi(k.seed)});
}
// 53 random bits -> [0, 1) exactly representable in double.
[[nodiscard]] constexpr double to_unit(std::uint32_t a, std::uint32_t b) noexcept {
  const std::uint64_t bits = (std::uint64_t{a} << 21U) ^ (std::uint64_t{b} >> 11U);
  return static_cast<double>(bits & ((std::uint64_t{1} << 53U) - 1U)) * 0x1.0p-53;
}
} // namespace detail

/// The four random words of block `block` of stream `k` (`fill_uniform01_u32` gives element i
/// word i % 4 of block i / 4).
[[nodiscard]] HSPMD_INLINE constexpr std::array<std::uint32_t, 4>
random_block(rng_key k, std::uint64_t block) noexcept {
  return detail::rng_block(k, block);
}

/// Uniform in [0, 1) for element `index` of stream `k`.
[[nodiscard]] constexpr double uniform01(rng_key k, std::uint64_t index) noexcept {
  const auto b = detail::rng_block(k, index);
  return detail::to_unit(b[0], b[1]);
}

/// Uniform in [0, 1) at 32-bit resolution for elements [first, first + n) of stream `k`,
/// written to out[0 .. n). Element i takes word i % 4 of block i / 4, so one Philox block feeds
/// four elements (a quarter of uniform01's cost) and a slice starting anywhere draws exactly the
/// values a full-range fill draws at the same global indices. For masks and sampling, where 2^-32
/// resolution is plenty.
template <class T>
constexpr void fill_uniform01_u32(rng_key k, std::uint64_t first, std::uint64_t n,
                                  T* out) noexcept {
  std::uint64_t i = first;
  const std::uint64_t end = first + n;
  while (i < end) {
    const auto b = detail::rng_block(k, i / 4U);
    for (auto w = i % 4U; w < 4U && i < end; ++w, ++i)
      *out++ = static_cast<T>(static_cast<double>(b[w]) * 0x1.0p-32);
  }
}

/// Standard normal for element `index` of stream `k` (Box-Muller on one Philox block).
[[nodiscard]] inline double normal01(rng_key k, std::uint64_t index) noexcept {
  const auto b = detail::rng_block(k, index);
  const double u1 = 1.0 - detail::to_unit(b[0], b[1]); // (0, 1]: log is finite
  const double u2 = detail::to_unit(b[2], b[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

} // namespace hspmd
